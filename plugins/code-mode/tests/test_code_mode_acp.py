"""code mode over real stdio: `dsh run --example code-mode` driven by the official ACP SDK client."""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import time
from pathlib import Path

import pytest
from acp import text_block
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from dsh_testing import live_processes
from dsh_testing import until as wait_for

pytestmark = pytest.mark.anyio
ENV = {"DSH_PERMISSION_MODE": "workspace-write"}


def step(code: str) -> dict:
    return {"tool": "run_code", "args": {"code": textwrap.dedent(code), "description": "test program"}}


def _log(home: Path, sid: str) -> list[dict]:
    return [json.loads(line) for line in (home / "sessions" / f"{sid}.jsonl").read_text().splitlines()]


async def test_code_mode_serves_acp_offering_only_run_code_and_commits_the_program_output(acp_agent, scripted):
    program = '''
        w = await tools.write(file_path="report.txt", content="written by a program\\n")
        r = await tools.bash(description="Run the command", command="cat report.txt; wc -c < report.txt")
        print(f"created={w['created']}")
        return r["output"].strip()
    '''
    script = scripted({"default": [step(program), {"text": "{tool_result}"}]})
    async with acp_agent(script, example="code-mode", env=ENV) as run:
        sid = await run.start()
        reply = await run.conn.prompt(session_id=sid, prompt=[text_block("make a report")])
        assert reply.stop_reason == "end_turn"
        assert run.client.text(sid) == ["created=True\nwritten by a program\n21"]
    assert (run.cwd / "report.txt").read_text() == "written by a program\n"
    log = _log(acp_agent.home, sid)
    (header,) = [e for e in log if e["type"] == "request/header"]
    assert [t["name"] for t in header["tools"]] == ["run_code"]
    assert [e["callId"] for e in log if e["type"] == "tool/code-dispatch"] == ["call_1:code:1", "call_1:code:2"]
    # nothing but committed text went on the wire (no tool cards for nested calls)
    assert all(f.get("method") != "session/update" or f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
               for f in run.frames)


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize(("answer", "written"), [("allow-once", True), ("reject-once", False)])
async def test_an_escalation_inside_code_is_a_one_shot_permission_request(acp_agent, scripted, tmp_path, answer,
                                                                          written, mechanism):
    from dsh_testing import Recorder

    require_mechanism(mechanism)

    target = Path("/var/tmp") / f"dsh-code-escalation-{os.getpid()}-{answer}.txt"
    program = f'''
        r = await tools.bash(description="Run the command", command="echo out > {target}", sandbox_permissions="danger-full-access",
                             justification="write outside")
        again = await tools.bash(description="Run the command", command="echo again > {target}.2")
        return [r["exit_code"] == 0, again["exit_code"] == 0]
    '''
    script = scripted({"default": [step(program), {"text": "{tool_result}"}]})
    client = Recorder(permission_answers=[answer])
    try:
        async with acp_agent(script, example="code-mode", env={**ENV, "DSH_SANDBOX_MECHANISM": mechanism},
                             client=client) as run:
            sid = await run.start()
            assert (await run.conn.prompt(session_id=sid, prompt=[text_block("go")])).stop_reason == "end_turn"
            (request,) = client.permission_requests
            assert request[1].tool_call_id == "call_1:code:1"
            text = run.client.text(sid)[-1]
        assert target.exists() is written
        assert not Path(f"{target}.2").exists()  # nothing is remembered: the next call is confined again
        if written:
            assert json.loads(text) == [True, False]
        else:
            assert "code run failed (exception): ToolCallError: bash: the user rejected escalating" in text
    finally:
        target.unlink(missing_ok=True)
        Path(f"{target}.2").unlink(missing_ok=True)


def _processes(pred) -> list[int]:
    """Live (not zombie) processes whose argv, cwd and comm match ``pred``."""
    return live_processes(pred, comm=True)


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("kind", ["bash-sleep", "python-spin"])
async def test_cancel_kills_the_program_and_everything_it_started(acp_agent, scripted, kind, mechanism):
    require_mechanism(mechanism)
    marker = f"{os.getpid() % 1000}.{time.time_ns() % 10**6}"
    if kind == "bash-sleep":
        program = f'await tools.bash(description="Run the command", command="(sleep {marker} & sleep {marker}; wait) & wait")'
    else:  # a pure-Python spin with a process of its own started beside it
        program = f'''
            import subprocess
            subprocess.Popen(["sleep", "{marker}"])
            while True:
                pass
        '''
    script = scripted({"rules": [{"when": "go", "steps": [step(program)]}], "default": [{"text": "still here"}]})
    async with acp_agent(script, example="code-mode", env={**ENV, "DSH_SANDBOX_MECHANISM": mechanism}) as run:
        sid = await run.start()
        ws = str(run.cwd)

        def sleepers():
            return _processes(lambda cmd, cwd, comm: cmd[:2] == [b"sleep", marker.encode()])

        def programs():  # the run's program process (a fork of the warm one, named so)
            return _processes(lambda cmd, cwd, comm: comm == "dsh-code-run" and cwd == ws)

        def warm():
            return _processes(lambda cmd, cwd, comm: comm == "dsh-code-warm" and cwd == ws)

        pending = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("go")]))
        await wait_for(lambda: len(sleepers()) >= 1 and programs())
        await run.conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(pending, 10)).stop_reason == "cancelled"
        await wait_for(lambda: not sleepers() and not programs(), timeout=5)
        assert len(warm()) == 1  # the session's warm runtime outlives the cancelled run…
        # the session keeps serving
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("hello")])).stop_reason == "end_turn"
        assert run.client.text(sid)[-1] == "still here"
    assert not warm()  # … and dies with the session
    log = _log(acp_agent.home, sid)
    ends = [e for e in log if e["type"] == "turn/end"]
    assert ends[0]["reason"] == "aborted" and ends[1]["reason"] == "completed"
    results = [e for e in log if e["type"] == "tool/result"]
    assert results[0]["code"] == "ABORTED"
