"""subagent-acp's roster, end to end: the official SDK client drives `dsh run` (the parent) over
real stdio; its scripted model picks ACP agents by name with `subagent_acp {description, prompt,
run_in_background?, agent}`. The children are real processes: the SDK's echo agent (the
agent-subagent scenario's workspace/echo_agent.py, also the benchmarks' peer) and dsh itself."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from acp import text_block
from dsh_acp.client import tree_pids

from conftest import live
from dsh_testing import Recorder, until

pytestmark = pytest.mark.anyio

ECHO = Path(__file__).parent.parent / "snapshots" / "acp-subagents" / "agent-subagent" / "workspace" / "echo_agent.py"


def sub(description: str, prompt: str, agent: str, **more: Any) -> dict[str, Any]:
    return {"tool": "subagent_acp", "args": {"description": description, "prompt": prompt, "agent": agent, **more}}


SCRIPT = {
    "rules": [
        {"when": "^greet", "steps": [sub("echo a greeting", "hello", "echo"), {"text": "got: {tool_result}"}]},
        {"when": "^write", "steps": [sub("write a file", "child: write", "dsh"), {"text": "got: {tool_result}"}]},
        {"when": "^child: write", "steps": [
            {"tool": "guarded_write", "args": {"path": "out.txt", "content": "hello"}},
            {"text": "child: {tool_result}"}]},
        {"when": "^missing", "steps": [sub("use codex", "do it", "codex"), {"text": "got: {tool_result}"}]},
        {"when": "^unknown", "steps": [sub("use nobody", "do it", "nobody"), {"text": "got: {tool_result}"}]},
        {"when": "^long", "steps": [sub("cut short", "child: long", "dsh"), {"text": "got: {tool_result}"}]},
        {"when": "^child: long", "steps": [{"text": "the first half", "finish": "length"}]},
        {"when": "^background", "steps": [
            sub("echo in the background", "from the job", "echo", run_in_background=True),
            {"text": "started: {tool_result}"}]},
        {"when": "^read it", "steps": [
            {"tool": "job_output", "args": {"job_id": "subagent-1", "wait": True}}, {"text": "{tool_result}"}]},
        {"when": "^hang in the background", "steps": [
            sub("hang", "child: hang", "dsh", run_in_background=True), {"text": "started: {tool_result}"}]},
        {"when": "^child: hang", "steps": [{"partial": "child partial", "mark": "child-streamed", "delay_ms": 60000}]},
        {"when": "^kill it", "steps": [
            {"tool": "job_kill", "args": {"job_id": "subagent-1"}}, {"text": "{tool_result}"}]},
    ],
    "default": [{"text": "noted"}],
}  # fmt: skip


def write_example(root: Path, name: str, *, permission: str = "reject", jobs: bool = True) -> str:
    """The roster composition under ``root``; returns the DSH_EXAMPLES_PATH that finds it."""
    d = root / name
    d.mkdir(parents=True)
    plugins = ["acp-transport", "jsonl-persistence", "scripted-model", "subagent-acp", "testkit-approval"]
    plugins += ["jobs"] if jobs else []
    (d / "example.toml").write_text(f"""\
[example]
description = "subagent-acp roster test composition"
front-door = "acp-stdio"
plugins = {json.dumps(plugins)}

[route]
provider = "scripted"
model = "set-by-test.json"

[config.acp-transport]
permission-timeout = 10

[config.subagent-acp]
example = "{name}"
permission = "{permission}"
inherit-env = ["DSH_HOME", "DSH_EXAMPLES_PATH"]
max-depth = 1
eof-grace = 1.0
term-grace = 1.0

[config.subagent-acp.agents.dsh]
description = "dsh itself"

[config.subagent-acp.agents.echo]
command = {json.dumps([sys.executable, str(ECHO)])}
description = "echoes the prompt"

[config.subagent-acp.agents.codex]
command = ["codex-acp-not-installed-here"]
description = "OpenAI Codex over ACP"
""")
    return str(root)


def events(home: Path, sid: str) -> list[dict]:
    return [json.loads(line) for line in (home / "sessions" / f"{sid}.jsonl").read_text().splitlines()]


def results(home: Path, sid: str) -> list[tuple[str, bool]]:
    return [("".join(b.get("text", "") for b in e["result"]["content"]), bool(e["result"].get("isError")))
            for e in events(home, sid) if e["type"] == "tool/result"]



async def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    await until(predicate, timeout)


async def test_the_model_picks_an_agent_by_name_and_gets_its_answer(acp_agent, scripted, tmp_path):
    path = write_example(tmp_path / "examples", "roster")
    async with acp_agent(scripted(SCRIPT), example="roster", env={"DSH_EXAMPLES_PATH": path}) as run:
        sid = await run.start()
        resp = await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block("greet")]), 120)
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid) == ["got: echo: hello"]
        tree = tree_pids(run.proc.pid)
        assert await run.close_stdin() == 0
    assert live(tree) == []
    (call,) = [e for e in events(acp_agent.home, sid) if e["type"] == "tool/call"]
    assert json.loads(call["arguments"]) == {"description": "echo a greeting", "prompt": "hello", "agent": "echo"}


@pytest.mark.parametrize("answer, written", [("allow-once", True), ("reject-once", False)])
async def test_a_childs_permission_request_is_asked_of_the_parents_client_never_auto_approved(
    acp_agent, scripted, tmp_path, answer, written
):
    """`permission = "allow"` is only the answer when nobody can be asked: here the parent's
    client is asked, about the parent's own call, and its answer is the one the child gets."""
    path = write_example(tmp_path / "examples", "roster", permission="allow")
    client = Recorder(permission_answers=[answer])
    async with acp_agent(scripted(SCRIPT), example="roster", client=client, env={"DSH_EXAMPLES_PATH": path}) as run:
        sid = await run.start()
        resp = await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block("write")]), 120)
        assert resp.stop_reason == "end_turn"
        said = "child: wrote out.txt" if written else "child: not written: approval rejected"
        assert run.client.text(sid) == [f"got: {said}"]
    (req_sid, tool_call, _options) = client.permission_requests[0]
    assert len(client.permission_requests) == 1
    assert req_sid == sid and tool_call.tool_call_id == "call_1"
    assert (run.cwd / "out.txt").exists() is written
    log = events(acp_agent.home, sid)
    (asked,) = [e for e in log if e["type"] == "approval/asked"]
    assert asked["reason"].startswith("subagent dsh (ACP) asks to run guarded_write")
    (decided,) = [e for e in log if e["type"] == "approval/decided"]
    assert (decided["outcome"], decided["answeredBy"]) == ("allowed-once" if written else "rejected", "acp")


async def test_a_child_that_did_not_complete_is_an_error_with_the_originals_headline(acp_agent, scripted, tmp_path):
    path = write_example(tmp_path / "examples", "roster")
    async with acp_agent(scripted(SCRIPT), example="roster", env={"DSH_EXAMPLES_PATH": path}) as run:
        sid = await run.start()
        for prompt in ("long", "missing", "unknown"):
            await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block(prompt)]), 120)
    (cut, cut_error), (missing, missing_error), (unknown, unknown_error) = results(acp_agent.home, sid)
    assert cut == ("Error: subagent run hit its token limit before finishing\n"
                   "Partial output before the run ended:\nthe first half") and cut_error
    assert missing.startswith("Error: subagent run failed\nDiagnostic: ") and missing_error
    assert "codex-acp-not-installed-here" in missing
    assert unknown_error and unknown == "Error: `agent` must be one of dsh, echo, codex (not 'nobody')."


async def test_in_the_background_it_is_a_job_whose_end_wakes_the_idle_parent(acp_agent, scripted, tmp_path):
    path = write_example(tmp_path / "examples", "roster")
    async with acp_agent(scripted(SCRIPT), example="roster", env={"DSH_EXAMPLES_PATH": path}) as run:
        sid = await run.start()
        await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block("background")]), 120)
        assert run.client.text(sid)[0] == "started: started background subagent job subagent-1"
        notice = "background job subagent-1 (subagent: echo in the background) finished [status: completed]"

        def woken() -> bool:
            log = events(acp_agent.home, sid)
            return any(e["type"] == "turn/end" for e in log[[e["type"] for e in log].index("job/settled"):]) \
                if any(e["type"] == "job/settled" for e in log) else False

        await wait_for(woken)
        log = events(acp_agent.home, sid)
        notices = ["".join(b.get("text", "") for b in e["message"]["content"])
                   for e in log if e["type"] == "user/message" and e["message"].get("source") == "notice"]
        assert any(notice in n for n in notices), notices
        await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block("read it")]), 120)
    output, is_error = results(acp_agent.home, sid)[-1]
    assert output == "echo: from the job\n[status: completed]" and not is_error


async def test_job_kill_stops_a_background_child_and_leaves_no_process(acp_agent, scripted, tmp_path):
    path = write_example(tmp_path / "examples", "roster")
    async with acp_agent(scripted(SCRIPT), example="roster", env={"DSH_EXAMPLES_PATH": path}) as run:
        sid = await run.start()
        await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block("hang in the background")]), 120)
        await wait_for(lambda: (run.cwd / "child-streamed").exists())
        children = [p for p in tree_pids(run.proc.pid) if p != run.proc.pid]
        assert children
        await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block("kill it")]), 120)
        await wait_for(lambda: any(e["type"] == "job/settled" for e in events(acp_agent.home, sid)), 15)
        (settled,) = [e for e in events(acp_agent.home, sid) if e["type"] == "job/settled"]
        assert settled["status"] == "killed"
        assert live(children) == []
        assert await run.close_stdin() == 0


async def test_without_jobs_run_in_background_is_not_offered(acp_agent, scripted, tmp_path):
    path = write_example(tmp_path / "examples", "roster", jobs=False)
    async with acp_agent(scripted(SCRIPT), example="roster", env={"DSH_EXAMPLES_PATH": path}) as run:
        sid = await run.start()
        await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block("background")]), 120)
    ((text, is_error),) = results(acp_agent.home, sid)
    assert is_error and "run_in_background" in text  # the spine refuses an undeclared argument


PROBE = Path(__file__).parent / "probe_agent.py"


@pytest.mark.parametrize("mechanism", ["bwrap", "landlock", "unconfined"])
async def test_an_agent_with_sandbox_session_runs_confined_like_bash(acp_agent, scripted, tmp_path, mechanism):
    """`sandbox = "session"`: the child starts through the host's confinement at the session's
    tier (workspace-write): it writes in the workspace, not outside the roots, and sees no
    credential-shaped variable. The same agent with `sandbox = "none"` does write outside (the
    check can fail)."""
    from dsh_sandbox_tools.testing import require_mechanism

    if mechanism != "unconfined":
        require_mechanism(mechanism)
    outside = Path("/var/tmp") / f"dsh-subagent-probe-{tmp_path.name[-12:]}-{mechanism}"
    outside.mkdir(parents=True, exist_ok=True)
    try:
        root = tmp_path / "examples"
        write_example(root, "roster")
        manifest = root / "roster" / "example.toml"
        text = manifest.read_text().replace('"subagent-acp",', '"sandbox-tools", "subagent-acp",')
        sandbox = "none" if mechanism == "unconfined" else "session"
        text += (f'\n[config.subagent-acp.agents.probe]\ncommand = {json.dumps([sys.executable, str(PROBE)])}\n'
                 f'description = "probes its confinement"\nsandbox = "{sandbox}"\n')
        if mechanism != "unconfined":
            text += f'\n[config.sandbox-tools]\nmechanism = "{mechanism}"\n'
        manifest.write_text(text)
        script = {"rules": [{"when": "^probe", "steps": [
            sub("probe", str(outside / "escaped.txt"), "probe"), {"text": "got: {tool_result}"}]}]}
        env = {"DSH_EXAMPLES_PATH": str(root), "DEEPSEEK_API_KEY": "sk-never-leak",
               "DSH_PERMISSION_MODE": "workspace-write"}
        async with acp_agent(scripted(script), example="roster", env=env) as run:
            sid = await run.start()
            await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block("probe")]), 120)
            (said,) = run.client.text(sid)
        assert said.startswith("got: inside: ok; outside: ")
        if mechanism == "unconfined":
            assert (outside / "escaped.txt").read_text() == "escaped"  # what the sandbox stops
        else:
            assert "outside: denied" in said and not (outside / "escaped.txt").exists()
        assert "keys: [" in said and "DEEPSEEK_API_KEY" not in said  # set in dsh's environment, never passed on
        assert (run.cwd / "inside.txt").read_text() == "fine"
    finally:
        import shutil

        shutil.rmtree(outside, ignore_errors=True)
