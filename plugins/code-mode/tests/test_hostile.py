"""The child is hostile input: garbage, floods, huge values, fork bombs and budgets end as clean error results."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import anyio
import pytest
from dsh_code_mode.limits import PIDS_V1, ProcessBound

from conftest import run
from dsh_core.types import AssistantMessageEvent, CodeDispatch, ToolResultEvent

pytestmark = pytest.mark.anyio

FD = "int(__import__('sys').argv[1])"  # the program can find the channel; it gains nothing by it


async def _one(code_host, code: str, **config) -> tuple[ToolResultEvent, object]:
    """Run ``code``, then a second program in the same session: the session must keep serving."""
    steps = [run(textwrap.dedent(code)), run('return "still serving"'), {"text": "done"}]
    with anyio.fail_after(60):
        async with code_host(steps, **config) as turn:
            await turn.agent.wait_idle()
    first, second = turn.of(ToolResultEvent)
    assert second.result.content[0].text == "still serving"
    assert turn.of(AssistantMessageEvent)[-1].message.content[0].text == "done"
    return first, turn


def _text(result: ToolResultEvent) -> str:
    return result.result.content[0].text


async def test_garbage_on_the_channel_is_invalid_output(code_host):
    result, _ = await _one(code_host, f'''
        import os
        print("about to lie")
        os.write({FD}, b"this is not json\\n")
        await asyncio.sleep(5)
    ''')
    assert result.result.is_error and result.code == "CODE_INVALID_OUTPUT"
    assert _text(result).startswith("code run failed (invalid-output): the program's runtime sent an invalid message")
    assert _text(result).endswith("\nabout to lie")


@pytest.mark.parametrize("message", [
    b'{"t": "call", "id": 1, "name": "bash", "args": "not an object"}',
    b'{"t": "launch", "id": 1}',
    b'[1, 2, 3]',
    b'{"t": "done", "ok": true, "value": 1, "extra": 2}',
    b'{"t":"ready"}',  # the program process said it once, before the program came: never the program's
])
async def test_well_formed_json_of_the_wrong_shape_is_invalid_output(code_host, message):
    result, _ = await _one(code_host, f'''
        import os
        os.write({FD}, {message!r} + b"\\n")
        await asyncio.sleep(5)
    ''')
    assert result.code == "CODE_INVALID_OUTPUT"


async def test_a_reused_call_id_is_invalid_output(code_host):
    result, _ = await _one(code_host, f'''
        import os
        line = b'{{"t": "call", "id": 7, "name": "glob", "args": {{"pattern": "*"}}}}\\n'
        os.write({FD}, line + line)
        await asyncio.sleep(5)
    ''')
    assert result.code == "CODE_INVALID_OUTPUT" and "reused call id 7" in _text(result)


async def test_an_endless_line_on_the_channel_is_cut_at_the_message_limit(code_host):
    result, _ = await _one(code_host, f'''
        import os
        os.set_blocking({FD}, True)
        chunk = b"x" * (1 << 20)
        for _ in range(20):
            os.write({FD}, chunk)
        await asyncio.sleep(5)
    ''')
    assert result.code == "CODE_OUTPUT_LIMIT" and "larger than 16777216 bytes" in _text(result)


async def test_a_flood_of_calls_is_refused_past_the_in_flight_cap(code_host):
    result, turn = await _one(code_host, '''
        import asyncio
        await asyncio.gather(*[tools.bash(description="Run the command", command="sleep 0.01") for _ in range(2000)])
    ''')
    assert result.code == "CODE_EXCEPTION", _text(result)
    assert "ToolCallError: bash: 256 tool calls are already in flight; await some first" in _text(result)
    assert len(turn.of(CodeDispatch)) <= 256 + 10


async def test_a_raw_flood_of_call_messages_ends_cleanly(code_host):
    result, _ = await _one(code_host, f'''
        import os
        data = b"".join(b'{{"t":"call","id":%d,"name":"nope","args":{{}}}}\\n' % i for i in range(1, 20001))
        os.set_blocking({FD}, True)
        os.write({FD}, data)
        return "flooded"
    ''')
    assert _text(result) == "flooded"


async def test_the_total_number_of_calls_is_capped(code_host):
    result, _ = await _one(code_host, '''
        for i in range(10):
            await tools.glob(pattern="*")
    ''', max_calls=5)
    assert "ToolCallError: glob: this program already made 5 tool calls; no more are allowed" in _text(result)


async def test_a_1_gib_return_value_is_a_clean_error(code_host):
    result, _ = await _one(code_host, 'return "x" * (1 << 30)')
    assert result.result.is_error and _text(result).startswith("code run failed (exception): MemoryError")


async def test_a_return_value_over_the_limit_is_output_limit(code_host):
    result, _ = await _one(code_host, 'return "x" * 5000', max_value_bytes=4096)
    assert _text(result) == ("code run failed (output-limit): the return value is 5002 bytes as JSON; "
                             "the limit is 4096 bytes")


async def test_printing_past_the_output_limit_stops_the_program(code_host):
    result, _ = await _one(code_host, '''
        while True:
            print("y" * 100)
    ''', max_output_bytes=10_000)
    assert result.code == "CODE_OUTPUT_LIMIT"
    head, _, captured = _text(result).partition("\n")
    assert head == "code run failed (output-limit): the program printed more than 10000 bytes"
    assert 9_000 < len(captured) <= 10_000


async def test_a_spin_past_the_compute_budget_is_a_timeout(code_host):
    result, _ = await _one(code_host, 'while True:\n    pass', compute_seconds=1)
    assert _text(result) == "code run failed (timeout): the program used its compute budget of 1 s of CPU time"


async def test_a_program_past_the_wall_budget_is_a_timeout(code_host):
    result, _ = await _one(code_host, 'print("waiting")\nawait asyncio.sleep(30)', wall_seconds=1)
    assert _text(result) == "code run failed (timeout): the program ran past its wall-clock budget of 1 s\nwaiting"


async def test_a_process_that_dies_is_worker_exit(code_host):
    result, _ = await _one(code_host, 'import os\nprint("bye")\nos._exit(7)')
    assert result.code == "CODE_WORKER_EXIT"
    assert _text(result).startswith("code run failed (worker-exit): the program's process ended without finishing")
    assert _text(result).endswith("\nbye")


def _bound_kind() -> str:
    bound = ProcessBound.create(4)
    try:
        return bound.kind
    finally:
        bound.close()


async def test_a_fork_bomb_is_bounded_and_leaves_nothing(code_host):
    kind = _bound_kind()
    if kind == "none":
        pytest.skip("root without a writable pids cgroup hierarchy: no process bound to test (see README)")
    # This process's run cgroups only (``dsh-code-<pid>-…``): another dsh on the machine (a
    # parallel test run) makes and removes its own meanwhile.
    def ours() -> set[Path]:
        return set(PIDS_V1.glob(f"dsh-code-{os.getpid()}-*"))

    before = ours() if kind == "pids-cgroup" else set()
    result, _ = await _one(code_host, '''
        import os
        while True:
            os.fork()
    ''', max_processes=32)
    assert result.result.is_error
    assert "BlockingIOError" in _text(result) or "Resource temporarily unavailable" in _text(result)
    if kind == "pids-cgroup":
        assert ours() == before  # the run's cgroup is gone, so were its processes


async def test_every_thread_and_process_of_a_run_is_in_its_cgroup(code_host):
    """The program process joins its cgroup through ``tasks`` (one thread moved, no global lock):
    what it starts afterwards, a thread or a process, is in the run's cgroup too, and nothing of
    the run is anywhere else (the cgroup's ``cgroup.procs`` lists the program process)."""
    if _bound_kind() != "pids-cgroup":
        pytest.skip("not root, or no writable pids cgroup hierarchy: runs have no cgroup (see README)")
    result, _ = await _one(code_host, '''
        import os, subprocess, threading
        def pids(path):
            return next(line.split(":", 2)[2].strip() for line in open(path) if ":pids:" in line)
        mine = pids("/proc/self/cgroup")
        seen = []
        t = threading.Thread(target=lambda: seen.append(pids("/proc/thread-self/cgroup")))
        t.start(); t.join()
        child = subprocess.run(["cat", "/proc/self/cgroup"], capture_output=True, text=True).stdout
        child = next(line.split(":", 2)[2] for line in child.splitlines() if ":pids:" in line)
        listed = open(f"/sys/fs/cgroup/pids{mine}/cgroup.procs").read().split()
        return [mine, seen[0], child, str(os.getpid()) in listed]
    ''')
    assert not result.result.is_error, _text(result)
    mine, thread, child, listed = json.loads(_text(result))
    assert mine.startswith(f"/dsh-code-{os.getpid()}-"), mine
    assert thread == mine and child == mine and listed is True
