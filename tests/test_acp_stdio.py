"""Real-stdio tests: `dsh run --example …` as a subprocess, driven by the official ACP SDK
client. Every stdout byte is checked against ACP's schema when each run closes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from acp import RequestError, text_block
from acp.helpers import (
    audio_block,
    embedded_blob_resource,
    embedded_text_resource,
    resource_block,
    resource_link_block,
)
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from dsh_testing import Recorder, session_log, sleepers
from dsh_testing import until as wait_for

pytestmark = pytest.mark.anyio

# "hang": stream a partial, create the file "streamed-<prompt>" in the cwd, then wait a minute
HANG = {"rules": [{"when": "hang", "steps": [{"partial": "partial", "mark": "streamed-{prompt}", "delay_ms": 60000}]}]}


async def test_text_turn_end_to_end(acp_agent, scripted):
    script = scripted({"rules": [{"when": "ping", "steps": [{"text": "PONG"}]}]})
    async with acp_agent(script) as run:
        init = await run.conn.initialize(protocol_version=1)
        assert init.protocol_version == 1
        assert init.agent_capabilities.prompt_capabilities.image is False
        assert init.agent_info.name == "dsh"
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("ping")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid) == ["PONG"]
        assert await run.close_stdin() == 0
    # the chunk was written before the response (ACP-5/6, docs/acp-contract.md)
    kinds = [f.get("method") or ("result" if "result" in f else "error") for f in run.frames]
    assert kinds.index("session/update") < len(kinds) - 1
    log = session_log(acp_agent.home, sid)
    assert log[0]["type"] == "session" and log[0]["cwd"] == str(run.cwd)
    types = [e["type"] for e in log[1:]]
    assert types[:3] == ["user/message", "agent/inbox/claimed", "turn/start"]
    assert types[-1] == "turn/end"


@pytest.mark.parametrize("offered", [0, 2, 999])
async def test_version_fallback_answers_1(acp_agent, scripted, offered):
    async with acp_agent(scripted({})) as run:
        init = await run.conn.initialize(protocol_version=offered)
        assert init.protocol_version == 1


async def test_resource_link_is_flattened_in_the_durable_user_event(acp_agent, scripted):
    async with acp_agent(scripted({"default": [{"text": "ok"}]})) as run:
        sid = await run.start()
        resp = await run.conn.prompt(
            session_id=sid,
            prompt=[text_block("read "), text_block("this:"), resource_link_block("notes.md", "file:///tmp/notes.md")],
        )
        assert resp.stop_reason == "end_turn"
    (user,) = [e for e in session_log(acp_agent.home, sid) if e["type"] == "user/message"]
    assert user["message"]["content"] == [
        {"type": "text", "text": "read this:\n[Resource link: notes.md <file:///tmp/notes.md>]"}
    ]


async def test_embedded_text_resource_is_flattened_naming_its_uri(acp_agent, scripted):
    async with acp_agent(scripted({"default": [{"text": "ok"}]})) as run:
        init = await run.conn.initialize(protocol_version=1)
        assert init.agent_capabilities.prompt_capabilities.embedded_context is True
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        resp = await run.conn.prompt(session_id=sid, prompt=[
            text_block("explain @notes.md"),
            resource_block(embedded_text_resource("file:///w/notes.md", "line one\nline two\n")),
        ])
        assert resp.stop_reason == "end_turn"
    (user,) = [e for e in session_log(acp_agent.home, sid) if e["type"] == "user/message"]
    assert user["message"]["content"] == [{"type": "text", "text": (
        "explain @notes.md\n[Resource: file:///w/notes.md]\nline one\nline two\n[End of resource: file:///w/notes.md]")}]


@pytest.mark.parametrize(
    "blocks, message",
    [
        ([text_block("   ")], "Invalid params: empty prompt"),
        ([audio_block("AAAA", "audio/wav")], "Invalid params: audio prompt content is not supported"),
        (
            [text_block("look"), resource_block(embedded_blob_resource("file:///x.bin", "AAAA"))],
            "Invalid params: embedded binary resources are not supported (file:///x.bin); send text, or a resource_link",
        ),
    ],
)
async def test_bad_prompts_are_invalid_params_and_the_session_lives(acp_agent, scripted, blocks, message):
    async with acp_agent(scripted({})) as run:
        sid = await run.start()
        with pytest.raises(RequestError) as err:
            await run.conn.prompt(session_id=sid, prompt=blocks)
        assert err.value.code == -32602
        assert message in str(err.value)
        assert err.value.data == {"details": message.removeprefix("Invalid params: ")}  # what Toad shows
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("hi")])).stop_reason == "end_turn"


async def test_cancel_mid_delay_then_next_prompt_works(acp_agent, scripted):
    async with acp_agent(scripted(HANG)) as run:
        sid = await run.start()
        pending = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("hang")]))
        await wait_for(lambda: (run.cwd / "streamed-hang").exists())  # the partial is out
        await run.conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(pending, 10)).stop_reason == "cancelled"
        assert run.client.text(sid) == ["partial"]  # the interrupted message is committed and delivered
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("again")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid)[-1] == "echo: again"
    log = session_log(acp_agent.home, sid)
    interrupted = [e for e in log if e["type"] == "assistant/message" and e.get("interrupted")]
    assert len(interrupted) == 1
    assert {"type": "turn/end", "reason": "aborted", "abortKind": "user"}.items() <= next(
        e for e in log if e["type"] == "turn/end"
    ).items()


async def test_overlapping_prompt_is_refused_and_the_first_is_unaffected(acp_agent, scripted):
    script = scripted({"rules": [{"when": "slow", "steps": [{"text": "slow answer", "mark": "started", "delay_ms": 1500}]}]})
    async with acp_agent(script) as run:
        sid = await run.start()
        first = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("slow")]))
        await wait_for(lambda: (run.cwd / "started").exists())  # the first turn is in its model call
        with pytest.raises(RequestError) as err:
            await run.conn.prompt(session_id=sid, prompt=[text_block("second")])
        assert err.value.code == -32602
        assert "a prompt is already in flight for this session" in str(err.value)
        assert (await first).stop_reason == "end_turn"
        assert run.client.text(sid) == ["slow answer"]


async def test_five_concurrent_sessions_are_demultiplexed(acp_agent, scripted):
    script = scripted({"default": [{"text": "answer to {prompt}", "delay_ms": 50}]})
    async with acp_agent(script) as run:
        await run.conn.initialize(protocol_version=1)
        sids = [(await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id for _ in range(5)]
        assert len(set(sids)) == 5
        results = await asyncio.gather(
            *(run.conn.prompt(session_id=s, prompt=[text_block(f"q{i}")]) for i, s in enumerate(sids))
        )
        assert all(r.stop_reason == "end_turn" for r in results)
        for i, s in enumerate(sids):
            assert run.client.text(s) == [f"answer to q{i}"]


async def test_cancelling_one_session_leaves_the_others_intact(acp_agent, scripted):
    script = scripted({**HANG, "default": [{"text": "done {prompt}", "delay_ms": 300}]})
    async with acp_agent(script) as run:
        a = await run.start()
        b = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        pa = asyncio.create_task(run.conn.prompt(session_id=a, prompt=[text_block("hang")]))
        pb = asyncio.create_task(run.conn.prompt(session_id=b, prompt=[text_block("b")]))
        await wait_for(lambda: (run.cwd / "streamed-hang").exists())
        await run.conn.cancel(session_id=a)
        assert (await pa).stop_reason == "cancelled"
        assert (await pb).stop_reason == "end_turn"
        assert run.client.text(b) == ["done b"]


PERMISSION_SCRIPT = {
    "rules": [
        {
            "when": "write",
            "steps": [
                {"tool": "guarded_write", "args": {"path": "out.txt", "content": "hello"}},
                {"text": "result: {tool_result}"},
            ],
        }
    ]
}


@pytest.mark.parametrize(
    "answer, expected, written",
    [
        ("allow-once", "result: wrote out.txt", True),
        ("reject-once", "result: not written: approval rejected", False),
        (RuntimeError("client blew up"), "result: not written: approval unavailable", False),
        ("bogus-option", "result: not written: approval rejected", False),
    ],
)
async def test_permission_is_one_shot_and_fails_closed(acp_agent, scripted, answer, expected, written):
    client = Recorder(permission_answers=[answer])
    async with acp_agent(scripted(PERMISSION_SCRIPT), example="acp-testkit", client=client) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("write it")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid) == [expected]
        (req_sid, tool_call, options) = client.permission_requests[0]
        assert req_sid == sid and tool_call.tool_call_id == "call_1"
        assert [(o.option_id, o.kind) for o in options] == [("allow-once", "allow_once"), ("reject-once", "reject_once")]
    assert (run.cwd / "out.txt").exists() is written
    perm = next(f for f in run.frames if f.get("method") == "session/request_permission")
    assert perm["params"]["toolCall"] == {  # what the testkit tool told the approval seam
        "toolCallId": "call_1", "kind": "edit", "title": "guarded_write: out.txt",
        "content": [{"type": "content", "content": {"type": "text", "text": "write out.txt"}}],  # the tool's reason
        "rawInput": {"path": "out.txt", "content": "hello"}}
    log = session_log(acp_agent.home, sid)
    asked = [e for e in log if e["type"] == "approval/asked"]
    decided = [e for e in log if e["type"] == "approval/decided"]
    assert len(asked) == len(decided) == 1


async def test_cancel_withdraws_an_outstanding_permission_request(acp_agent, scripted):
    async with acp_agent(scripted(PERMISSION_SCRIPT), example="acp-testkit") as run:
        sid, pending = await run.prompt_held_at_permission("write it")
        await run.conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(pending, 10)).stop_reason == "cancelled"
    withdrawn = [f for f in run.frames if f.get("method") == "$/cancel_request"]
    perm = next(f for f in run.frames if f.get("method") == "session/request_permission")
    assert withdrawn and withdrawn[0]["params"] == {"requestId": perm["id"]}
    assert not (run.cwd / "out.txt").exists()
    decided = [e for e in session_log(acp_agent.home, sid) if e["type"] == "approval/decided"]
    assert [d["outcome"] for d in decided] == ["cancelled"]


async def test_stray_stdout_from_a_plugin_never_reaches_the_client(acp_agent, scripted):
    script = scripted({"default": [{"tool": "shout", "args": {}}, {"text": "still clean"}]})
    async with acp_agent(script, example="acp-testkit") as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("go")])).stop_reason == "end_turn"
        assert run.client.text(sid) == ["still clean"]
    # check_frames (on close) proved every stdout byte is a schema-valid frame; the noise went to stderr
    assert b"NOISY" not in bytes(run.stdout)
    for marker in (b"print at import", b"fd 1 at import", b"print at configure", b"print from a tool",
                   b"fd 1 from a tool", b"child process stdout"):
        assert marker in bytes(run.stderr)




async def test_stdin_eof_with_prompts_in_flight_exits_promptly_without_descendants(acp_agent, scripted):
    async with acp_agent(scripted(HANG)) as run:
        await run.conn.initialize(protocol_version=1)
        sids = [(await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id for _ in range(3)]
        pending = [asyncio.create_task(run.conn.prompt(session_id=s, prompt=[text_block(f"hang {i}")]))
                   for i, s in enumerate(sids)]
        await wait_for(lambda: all((run.cwd / f"streamed-hang {i}").exists() for i in range(3)))
        pgid = os.getpgid(run.proc.pid)
        started = time.monotonic()
        code = await run.close_stdin()
        elapsed = time.monotonic() - started
        assert code == 0
        assert elapsed < 2.0, f"took {elapsed:.2f}s to exit after stdin EOF"
        results = await asyncio.gather(*pending, return_exceptions=True)
        assert all(getattr(r, "stop_reason", None) == "cancelled" for r in results), results
    leftovers = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pgid]
    assert leftovers == []


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


# --------------------------------------------------------------------------- the sandbox through ACP

OUTSIDE = "/var/tmp/dsh-stdio-escalation.txt"
BASH_ESCALATION = {
    "rules": [{"when": "escalate", "steps": [
        {"tool": "bash", "args": {"description": "Run the command", "command": f"echo escalated > {OUTSIDE}",
                                  "sandbox_permissions": "danger-full-access",
                                  "justification": "the report lives outside the workspace"}},
        {"text": "model saw: {tool_result}"}]}],
    "default": [{"tool": "bash", "args": {"description": "Run the command", "command": f"echo confined > {OUTSIDE}"}}, {"text": "model saw: {tool_result}"}],
}


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize(
    "answer, written, seen",
    [
        ("allow-once", True, "model saw: "),
        ("reject-once", False, 'rejected escalating this command to "danger-full-access"'),
        (RuntimeError("client exploded"), False, "no approval channel is available"),
    ],
)
async def test_bash_escalation_is_one_shot_over_acp(acp_agent, scripted, answer, written, seen, mechanism):
    require_mechanism(mechanism)
    Path(OUTSIDE).unlink(missing_ok=True)
    client = Recorder(permission_answers=[answer])
    try:
        async with acp_agent(scripted(BASH_ESCALATION), client=client,
                             env={"DSH_PERMISSION_MODE": "workspace-write", "DSH_SANDBOX_MECHANISM": mechanism}) as run:
            sid = await run.start()
            assert (await run.conn.prompt(session_id=sid, prompt=[text_block("escalate")])).stop_reason == "end_turn"
            assert Path(OUTSIDE).exists() is written
            assert seen in run.client.text(sid)[-1]
            # no grant is remembered: the next unescalated write outside the root is denied by the kernel
            Path(OUTSIDE).unlink(missing_ok=True)
            assert (await run.conn.prompt(session_id=sid, prompt=[text_block("again")])).stop_reason == "end_turn"
            assert not Path(OUTSIDE).exists()
            assert "escalation" in run.client.text(sid)[-1]
            assert len(client.permission_requests) == 1
            # the SDK client parsed a toolCall a person can judge (and check_frames validates the frame on close)
            (_, tool_call, _) = client.permission_requests[0]
            assert tool_call.kind == "execute"
            assert tool_call.title == f"bash: echo escalated > {OUTSIDE} → danger-full-access"
            assert tool_call.raw_input == {"description": "Run the command", "command": f"echo escalated > {OUTSIDE}",
                                           "tier": "danger-full-access",
                                           "justification": "the report lives outside the workspace"}
    finally:
        Path(OUTSIDE).unlink(missing_ok=True)


async def test_a_write_escalation_shows_why_and_the_diff(acp_agent, scripted, tmp_path):
    """What Toad and Zed render from a permission request is toolCall.title and .content: the
    justification, and for write/edit a diff (their review view), not rawInput."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.txt").write_text("old line\n")
    client = Recorder(permission_answers=["reject-once"])
    script = scripted({"default": [{"tool": "write", "args": {
        "file_path": str(outside / "notes.txt"), "content": "new line\n", "sandbox_permissions": "danger-full-access",
        "justification": "the notes live outside the workspace"}}, {"text": "{tool_result}"}]})
    async with acp_agent(script, client=client, env={"DSH_PERMISSION_MODE": "workspace-write"}) as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("write it")])).stop_reason == "end_turn"
        (_, tool_call, _) = client.permission_requests[0]
    reason, diff = tool_call.content
    assert (reason.type, reason.content.text) == ("content", "the notes live outside the workspace")
    assert (diff.type, diff.path, diff.old_text, diff.new_text) == (
        "diff", str(outside / "notes.txt"), "old line\n", "new line\n")
    assert (outside / "notes.txt").read_text() == "old line\n"  # rejected: untouched


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_cancelling_a_running_bash_kills_its_grandchild(acp_agent, scripted, mechanism):
    require_mechanism(mechanism)
    marker = f"{os.getpid() % 1000}.{time.time_ns() % 10**6}"  # a unique sleep length to find the processes by
    script = scripted({"default": [{"tool": "bash", "args": {
        "description": "Start sleepers", "command": f"(sleep {marker} & sleep {marker}; wait) & touch started; wait"}}]})
    env = {"DSH_PERMISSION_MODE": "workspace-write", "DSH_SANDBOX_MECHANISM": mechanism}
    async with acp_agent(script, env=env) as run:
        sid = await run.start()
        pending = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("go")]))
        await wait_for(lambda: len(sleepers(marker)) >= 2)
        await run.conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(pending, 10)).stop_reason == "cancelled"
        await wait_for(lambda: not sleepers(marker), timeout=5)


async def test_sigterm_shuts_down_like_eof(acp_agent, scripted):
    import signal

    async with acp_agent(scripted(HANG)) as run:
        sid = await run.start()
        pending = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("hang")]))
        await wait_for(lambda: (run.cwd / "streamed-hang").exists())
        started = time.monotonic()
        run.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(run.proc.wait(), 5) == 0
        assert time.monotonic() - started < 2.0
        assert (await asyncio.wait_for(pending, 5)).stop_reason == "cancelled"
    assert b"SIGTERM" in bytes(run.stderr)
