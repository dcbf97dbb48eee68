"""subagent-acp end to end: the official SDK client drives `dsh run` (the parent) over real
stdio; the parent's scripted model calls `subagent_acp`, which spawns a child `dsh run`
(or a third-party peer) through the ACP client module."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from acp import text_block
from dsh_acp.client import tree_pids

from conftest import live, peer_command
from dsh_testing import Recorder, until

pytestmark = pytest.mark.anyio

SCRIPT = {
    "rules": [
        {"when": "^delegate-write", "steps": [
            {"tool": "subagent_acp", "args": {"task": "write it"}}, {"text": "parent got: {tool_result}"}]},
        {"when": "^write it", "steps": [
            {"tool": "guarded_write", "args": {"path": "out.txt", "content": "hello"}},
            {"text": "child: {tool_result}"}]},
        {"when": "^delegate-hang", "steps": [
            {"tool": "subagent_acp", "args": {"task": "hang"}}, {"text": "unreachable"}]},
        {"when": "^delegate-long", "steps": [
            {"tool": "subagent_acp", "args": {"task": "long"}}, {"text": "parent got: {tool_result}"}]},
        {"when": "^long", "steps": [{"finish": "length", "text": "the first half"}]},
        {"when": "^hang", "steps": [{"partial": "child partial", "mark": "child-streamed", "delay_ms": 60000}]},
        {"when": "^recurse", "steps": [
            {"tool": "subagent_acp", "args": {"task": "recurse"}}, {"text": "level: {tool_result}"}]},
        {"when": "^three", "steps": [
            {"tools": [{"name": "subagent_acp", "args": {"task": "slow"}}] * 3}, {"text": "{tool_result}"}]},
        {"when": "^slow", "steps": [{"text": "slow done", "delay_ms": 600}]},
        {"when": "^peer", "steps": [
            {"tool": "subagent_acp", "args": {"task": "peer task"}}, {"text": "parent got: {tool_result}"}]},
        {"when": "^outside", "steps": [
            {"tool": "subagent_acp", "args": {"task": "x", "cwd": "/"}}, {"text": "{tool_result}"}]},
    ]
}  # fmt: skip


def events(home: Path, sid: str) -> list[dict]:
    return [json.loads(line) for line in (home / "sessions" / f"{sid}.jsonl").read_text().splitlines()]


def tool_results(home: Path, sid: str) -> list[str]:
    return [
        "".join(b.get("text", "") for b in e["result"]["content"])
        for e in events(home, sid)
        if e["type"] == "tool/result"
    ]



async def wait_for(predicate, timeout: float = 15.0) -> None:
    await until(predicate, timeout)


async def delegate_and_hang(run, home: Path) -> tuple[str, asyncio.Task, list[int]]:
    """A session whose prompt delegated to a child that hangs: its id, the prompt in flight, and the
    process tree once the child has started (the parent dsh and its child)."""
    sid = await run.start()
    pending = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("delegate-hang")]))
    await wait_for(lambda: child_started(home, sid))
    return sid, pending, tree_pids(run.proc.pid)


def child_started(home: Path, parent_sid: str) -> bool:
    sessions = home / "sessions"
    if not sessions.is_dir():
        return False
    return any(p.stem != parent_sid and "turn/start" in p.read_text() for p in sessions.glob("*.jsonl"))


@pytest.mark.parametrize(
    "answer, child_says, written",
    [("allow-once", "child: wrote out.txt", True), ("reject-once", "child: not written: approval rejected", False)],
)
async def test_nested_permission_is_answered_by_the_outermost_client(
    acp_agent, scripted, examples, answer, child_says, written
):
    path = examples("sub")
    client = Recorder(permission_answers=[answer])
    async with acp_agent(scripted(SCRIPT), example="sub", client=client, env={"DSH_EXAMPLES_PATH": path}) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("delegate-write")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid) == [f"parent got: [subagent completed]\n{child_says}"]
        # the child's question reached the top as a question about the parent's own tool call
        (req_sid, tool_call, _options) = client.permission_requests[0]
        assert req_sid == sid and tool_call.tool_call_id == "call_1"
    assert (run.cwd / "out.txt").exists() is written
    log = events(acp_agent.home, sid)
    decided = [e for e in log if e["type"] == "approval/decided"]
    assert [(d["outcome"], d["answeredBy"]) for d in decided] == [
        ("allowed-once" if written else "rejected", "acp")
    ]


async def test_a_child_cut_by_max_tokens_is_reported_as_stopped_not_completed(acp_agent, scripted, examples):
    """The child's door answers end_turn (ACP-7) with ``_meta.dsh.turnEnd = "max-tokens"``; the
    parent's tool result says the child was cut short."""
    path = examples("sub")
    async with acp_agent(scripted(SCRIPT), example="sub", env={"DSH_EXAMPLES_PATH": path}) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("delegate-long")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid) == ["parent got: [subagent stopped: max tokens]\nthe first half"]


async def test_without_a_channel_the_static_policy_answers(tmp_path, scripted, examples):
    """In-process host, no front door: nobody can answer, so `permission = "allow"` applies."""
    from dsh_core.compose import load_composition
    from dsh_core.contracts import AgentSpec
    from dsh_core.host import open_host
    from dsh_core.types import TextBlock, UserMessage

    path = examples("sub-allow", subagent={"permission": "allow"})
    os.environ["DSH_EXAMPLES_PATH"] = path
    try:
        comp = load_composition(str(Path(path.split(os.pathsep)[0]) / "sub-allow"))
        script = scripted(SCRIPT)
        async with open_host(comp, provider="scripted", model=str(script)) as host:
            agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
            agent.submit(UserMessage(id="m1", content=[TextBlock(text="delegate-write")]))
            await agent.wait_idle()
    finally:
        del os.environ["DSH_EXAMPLES_PATH"]
    assert (tmp_path / "out.txt").read_text() == "hello"


async def test_cancelling_the_parent_cancels_the_child_and_reports_aborted_with_partial_output(
    acp_agent, scripted, examples
):
    path = examples("sub")
    async with acp_agent(scripted(SCRIPT), example="sub", env={"DSH_EXAMPLES_PATH": path}) as run:
        sid, pending, tree = await delegate_and_hang(run, acp_agent.home)
        assert len(tree) >= 2  # the parent and its child
        await wait_for(lambda: (run.cwd / "child-streamed").exists())  # the child's partial is out
        await run.conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(pending, 10)).stop_reason == "cancelled"
        (result,) = tool_results(acp_agent.home, sid)
        assert result == "[subagent aborted]\npartial output:\nchild partial"
        child_sid = next(p.stem for p in (acp_agent.home / "sessions").glob("*.jsonl") if p.stem != sid)
        child_end = [e for e in events(acp_agent.home, child_sid) if e["type"] == "turn/end"]
        assert child_end[-1]["reason"] == "aborted" and child_end[-1]["abortKind"] == "user"  # session/cancel
        await wait_for(lambda: live([p for p in tree if p != run.proc.pid]) == [], 5)  # child already gone
        assert await run.close_stdin() == 0
    assert live(tree) == []


async def ended_turn(run, prompt: str, timeout: float = 30) -> str:
    """A new session whose one prompt ran to ``end_turn`` within ``timeout`` seconds: its id."""
    sid = await run.start()
    resp = await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block(prompt)]), timeout)
    assert resp.stop_reason == "end_turn"
    return sid


async def test_parent_teardown_disposes_live_children_leaving_no_process(acp_agent, scripted, examples):
    path = examples("sub")
    async with acp_agent(scripted(SCRIPT), example="sub", env={"DSH_EXAMPLES_PATH": path}) as run:
        _, pending, tree = await delegate_and_hang(run, acp_agent.home)
        started = time.monotonic()
        assert await run.close_stdin() == 0
        assert time.monotonic() - started < 4.0
        assert (await asyncio.wait_for(pending, 5)).stop_reason == "cancelled"
    assert len(tree) >= 2 and live(tree) == []


async def test_depth_limit_stops_runaway_delegation(acp_agent, scripted, examples):
    path = examples("sub", subagent={"max-depth": 2})
    async with acp_agent(scripted(SCRIPT), example="sub", env={"DSH_EXAMPLES_PATH": path}) as run:
        sid = await ended_turn(run, "recurse")
        (text,) = run.client.text(sid)
    assert text.startswith("level: [subagent completed]\nlevel: [subagent completed]\nlevel: Error: subagent depth")
    assert "depth 2, the limit is 2" in text
    assert text.count("[subagent completed]") == 2


async def test_the_live_children_cap_refuses_extra_delegations(acp_agent, scripted, examples):
    path = examples("sub", subagent={"max-live": 2})
    async with acp_agent(scripted(SCRIPT), example="sub", env={"DSH_EXAMPLES_PATH": path}) as run:
        sid = await ended_turn(run, "three")
    results = tool_results(acp_agent.home, sid)
    assert sorted(r.split("\n")[0] for r in results) == [
        "Error: 2 subagents are already running (the cap is 2); wait for one to finish.",
        "[subagent completed]",
        "[subagent completed]",
    ]


async def test_env_is_scrubbed_unless_configured_and_depth_is_passed(acp_agent, scripted, examples):
    secret = {"DEEPSEEK_API_KEY": "sk-never-leak", "DSH_SUBAGENT_ACP_COMMAND": peer_command("env")}
    path = examples("sub")
    async with acp_agent(scripted(SCRIPT), example="sub", env={"DSH_EXAMPLES_PATH": path, **secret}) as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("peer")])
        (text,) = run.client.text(sid)
    report = json.loads(text.split("\n", 1)[1])
    assert report["has_deepseek_key"] is False
    assert report["depth"] == "1" and report["max_depth"] == "2"
    assert report["dsh_vars"] == ["DSH_EXAMPLES_PATH", "DSH_HOME", "DSH_SKILLS_USER_ROOTS", "DSH_SUBAGENT_DEPTH",
                                  "DSH_SUBAGENT_MAX_DEPTH"]  # the default inherit-env, then the depth
    assert report["session_cwd"] == str(run.cwd)

    path = examples("sub-keyed", subagent={"inherit-env": ["DEEPSEEK_API_KEY"], "env": {"PEER_EXTRA": "configured"}})
    async with acp_agent(scripted(SCRIPT), example="sub-keyed", env={"DSH_EXAMPLES_PATH": path, **secret}) as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("peer")])
        (text,) = run.client.text(sid)
    report = json.loads(text.split("\n", 1)[1])
    assert report["has_deepseek_key"] is True and report["extra"] == "configured"
    assert report["dsh_vars"] == ["DSH_SUBAGENT_DEPTH", "DSH_SUBAGENT_MAX_DEPTH"]  # inherit-env replaced the default


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("answer", "parent got: [subagent completed]\npeer: peer task"),
        ("stop:max_tokens", "parent got: [subagent stopped: max tokens]\ntext"),
        ("stop:refusal", "parent got: [subagent refusal]\ntext"),
        ("crash", "parent got: [subagent error] session/prompt failed: the agent closed the connection (exit status 3)"
                  "\npartial"),
    ],
)
async def test_third_party_agents_through_the_tool(acp_agent, scripted, examples, mode, expected):
    path = examples("sub")
    env = {"DSH_EXAMPLES_PATH": path, "DSH_SUBAGENT_ACP_COMMAND": peer_command(mode)}
    async with acp_agent(scripted(SCRIPT), example="sub", env=env) as run:
        sid = await ended_turn(run, "peer", 15)
        assert run.client.text(sid) == [expected]


async def test_third_party_permission_request_reaches_the_outermost_client(acp_agent, scripted, examples):
    path = examples("sub")
    env = {"DSH_EXAMPLES_PATH": path, "DSH_SUBAGENT_ACP_COMMAND": peer_command("permission")}
    client = Recorder(permission_answers=["allow-once"])
    async with acp_agent(scripted(SCRIPT), example="sub", env=env, client=client) as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("peer")])
        assert run.client.text(sid) == ["parent got: [subagent completed]\npeer permission: once"]
    asked = [e for e in events(acp_agent.home, sid) if e["type"] == "approval/asked"]
    assert "rm -rf build" in asked[0]["reason"]


async def test_cwd_outside_the_workspace_is_refused(acp_agent, scripted, examples):
    path = examples("sub")
    async with acp_agent(scripted(SCRIPT), example="sub", env={"DSH_EXAMPLES_PATH": path}) as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("outside")])
        (text,) = run.client.text(sid)
    assert text.startswith("Error: cwd '/' is outside the working directory")


async def test_session_close_with_a_subagent_child_alive_leaves_no_process(acp_agent, scripted, examples):
    """Issue 17: ``session/close`` disposes the session's agent children first, as at teardown."""
    path = examples("sub")
    async with acp_agent(scripted(SCRIPT), example="sub", env={"DSH_EXAMPLES_PATH": path}) as run:
        sid, pending, tree = await delegate_and_hang(run, acp_agent.home)
        children = [p for p in tree if p != run.proc.pid]
        assert children  # the child dsh is running
        await asyncio.wait_for(run.conn.close_session(session_id=sid), 15)
        assert (await asyncio.wait_for(pending, 10)).stop_reason == "cancelled"
        assert live(children) == []  # gone by the time close answered
        assert run.proc.returncode is None  # the agent process serves on
        assert await run.close_stdin() == 0
