"""Code-mode benchmark: what one program costs and saves, against the native path in the same run.

1. An empty ``run_code`` end to end through the agent (the run_code tool call to its result:
   spawn the confined Python process, boot, run, collect). Goal <= 150 ms (median).
2. 100 ``read`` calls made by one program (``asyncio.gather``) vs the same 100 calls as
   native tool calls of one assistant message. Goal: code <= 1.5x the native time.
3. Model calls and prompt tokens of a scripted 10-file task (read each file, then edit it)
   done natively, one tool call per step, vs in one program — through the deepseek-model
   plugin against the loopback fake DeepSeek server (a real HTTP server; token counts are
   the fake's). Prints the saving.

The workspace sandbox is the real one (bubblewrap or Landlock, as probed).

    python bench/code_mode.py [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins" / "deepseek-model" / "tests"))

from fake_deepseek import FakeDeepSeek, Turn  # noqa: E402

from dsh_core.compose import load_composition  # noqa: E402
from dsh_core.contracts import AgentSpec, new_id  # noqa: E402
from dsh_core.host import open_host  # noqa: E402
from dsh_core.types import TextBlock, ToolCallEvent, ToolResultEvent, UserMessage  # noqa: E402

EMPTY_GOAL_MS = 150.0
RATIO_GOAL = 1.5
FILES = 10


async def _turn(example: str, workspace: Path, steps: list[dict[str, Any]], tmp: Path) -> list[Any]:
    """One scripted turn on the example's real composition; returns the session's events."""
    script = tmp / f"script-{new_id()}.json"
    script.write_text(json.dumps({"default": steps}))
    composition = load_composition(example)
    config = {**composition.config, "jsonl-persistence": {}}
    composition = dataclasses.replace(composition, config=config)
    async with open_host(composition, provider="scripted", model=str(script)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text="go")]))
        await agent.wait_idle()
        _, events = await host.session_store.read(agent.session_id)
    return events


def _tool_span_ms(events: list[Any]) -> float:
    """From the first tool/call to the last tool/result of the turn, in ms (the agent's own timestamps)."""
    start = min(e.time for e in events if isinstance(e, ToolCallEvent))
    end = max(e.time for e in events if isinstance(e, ToolResultEvent))
    return (end - start) * 1000


def _run_code(code: str) -> dict[str, Any]:
    return {"tool": "run_code", "args": {"code": textwrap.dedent(code), "description": "bench"}}


async def empty_run(workspace: Path, tmp: Path, repeat: int) -> list[float]:
    await _turn("code-mode", workspace, [_run_code("pass"), {"text": "ok"}], tmp)  # warm: probe, imports
    return [_tool_span_ms(await _turn("code-mode", workspace, [_run_code("pass"), {"text": "ok"}], tmp))
            for _ in range(repeat)]


async def hundred_reads(workspace: Path, tmp: Path, repeat: int) -> tuple[list[float], list[float]]:
    for i in range(100):
        (workspace / "reads" / f"f{i}.txt").write_text("".join(f"line {j} of file {i}\n" for j in range(50)))
    native_steps = [{"tools": [{"name": "read", "args": {"path": f"reads/f{i}.txt"}} for i in range(100)]},
                    {"text": "ok"}]
    program = _run_code('''
        import asyncio
        got = await asyncio.gather(*[tools.read(path=f"reads/f{i}.txt") for i in range(100)])
        return sum(r["total_lines"] for r in got)
    ''')
    native, code = [], []
    for _ in range(repeat):
        native.append(_tool_span_ms(await _turn("both-mode", workspace, native_steps, tmp)))
        events = await _turn("both-mode", workspace, [program, {"text": "ok"}], tmp)
        result = next(e for e in events if isinstance(e, ToolResultEvent))
        assert result.result.content[0].text == "5000", result.result.content
        code.append(_tool_span_ms(events))
    return native, code


def _task_native() -> list[Turn]:
    turns = []
    for i in range(FILES):
        turns.append(Turn(reasoning=f"Read module {i}.", tool_calls=[("read", json.dumps({"path": f"src/m{i}.py"}))]))
        turns.append(Turn(reasoning=f"Mark module {i} reviewed.", tool_calls=[("edit", json.dumps(
            {"path": f"src/m{i}.py", "old_string": "# TODO: review", "new_string": "# reviewed"}))]))
    turns.append(Turn(content=f"Reviewed {FILES} modules."))
    return turns


def _task_code() -> list[Turn]:
    program = textwrap.dedent(f'''
        done = []
        for i in range({FILES}):
            path = f"src/m{{i}}.py"
            r = await tools.read(path=path)
            if "# TODO: review" in r["text"]:
                await tools.edit(path=path, old_string="# TODO: review", new_string="# reviewed")
                done.append(path)
        return f"reviewed {{len(done)}} modules"
    ''')
    return [Turn(reasoning="One program does all of it.",
                 tool_calls=[("run_code", json.dumps({"code": program, "description": "review every module"}))]),
            Turn(content=f"Reviewed {FILES} modules.")]


async def ten_files(tmp: Path, example: str, turns: list[Turn]) -> tuple[int, int, bool]:
    workspace = tmp / f"task-{example}"
    (workspace / "src").mkdir(parents=True)
    for i in range(FILES):
        body = "".join(f"def f{i}_{j}(x):\n    return x * {j}\n\n" for j in range(12))
        (workspace / "src" / f"m{i}.py").write_text(f'"""Module {i}."""\n# TODO: review\n\n' + body)
    fake = FakeDeepSeek(keepalive_every_s=0.05).start()
    os.environ["DEEPSEEK_BASE_URL"] = fake.base_url
    os.environ["DEEPSEEK_API_KEY"] = fake.api_key  # a dummy: the fake's own key
    fake.push(*turns)
    try:
        composition = load_composition(example)
        config = {**composition.config, "deepseek-model": {"dotenv": False, "deadline": 20.0}}
        composition = dataclasses.replace(composition, config=config)
        async with open_host(composition, provider="deepseek", model="deepseek-flash") as host:
            agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="deepseek", model="deepseek-flash"))
            agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text="Review every module in src/.")]))
            await agent.wait_idle()
    finally:
        fake.stop()
    chats = fake.chat_requests
    bad = [r.status for r in chats if r.status != 200]
    if bad:
        raise SystemExit(f"the fake rejected requests: HTTP {bad}")
    done = all("# reviewed" in (workspace / "src" / f"m{i}.py").read_text() for i in range(FILES))
    return len(chats), sum(r.prompt_tokens for r in chats), done


def startup_floor_ms(repeat: int) -> tuple[float, float]:
    """The floor under (1) on this machine: a bare ``python -I -S -c pass``, and one importing asyncio."""
    import subprocess
    import time

    def once(code: str) -> float:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", code], check=True)
        return (time.perf_counter() - t) * 1000

    return (statistics.median(once("pass") for _ in range(repeat)),
            statistics.median(once("import asyncio") for _ in range(repeat)))


async def main_async(repeat: int) -> int:
    with tempfile.TemporaryDirectory(prefix="dsh-bench-code-") as d:
        tmp = Path(d)
        os.environ["DSH_HOME"] = str(tmp / "home")
        os.environ.setdefault("DSH_PERMISSION_MODE", "workspace-write")
        workspace = tmp / "work"
        (workspace / "reads").mkdir(parents=True)
        empty = await empty_run(workspace, tmp, repeat)
        native, code = await hundred_reads(workspace, tmp, repeat)
        n_calls, n_tokens, n_done = await ten_files(tmp, "acp-agent", _task_native())
        c_calls, c_tokens, c_done = await ten_files(tmp, "code-mode", _task_code())
    floor, floor_asyncio = startup_floor_ms(repeat)
    med_empty = statistics.median(empty)
    med_native, med_code = statistics.median(native), statistics.median(code)
    ratio = med_code / med_native
    print(f"code mode, median of {repeat} runs (sandbox as probed; DSH_PERMISSION_MODE={os.environ['DSH_PERMISSION_MODE']})")
    print(f"(1) empty run_code, tool call -> result          {med_empty:8.1f} ms   goal <= {EMPTY_GOAL_MS:.0f} ms -> "
          f"{'meets' if med_empty <= EMPTY_GOAL_MS else 'MISSES'}")
    print(f"    floor on this machine: python -I -S -c pass {floor:.1f} ms, + import asyncio {floor_asyncio:.1f} ms")
    print(f"(2) 100 reads: native, one message                {med_native:8.1f} ms")
    print(f"    100 reads: one program (asyncio.gather)       {med_code:8.1f} ms   code/native {ratio:.2f}x, goal <= "
          f"{RATIO_GOAL}x -> {'meets' if ratio <= RATIO_GOAL else 'MISSES'}")
    print(f"(3) {FILES}-file task (read + edit each) through the fake DeepSeek server:")
    print(f"    {'':<28}{'model calls':>12}{'prompt tokens':>15}{'task done':>11}")
    print(f"    {'native, one call per step':<28}{n_calls:>12}{n_tokens:>15,}{n_done!s:>11}")
    print(f"    {'one run_code program':<28}{c_calls:>12}{c_tokens:>15,}{c_done!s:>11}")
    print(f"    saving: {n_calls - c_calls} model calls ({1 - c_calls / n_calls:.0%}), "
          f"{n_tokens - c_tokens:,} prompt tokens ({1 - c_tokens / n_tokens:.0%})")
    return 0 if (n_done and c_done) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    return asyncio.run(main_async(parser.parse_args().repeat))


if __name__ == "__main__":
    sys.exit(main())
