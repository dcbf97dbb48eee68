"""Issue 42's row "Remembered approvals", over a real ``dsh run --example acp-editor`` with the
official SDK client (every frame schema-checked): a sandbox escalation offers allow_always and
reject_always; either is a rule for this session, tool and exact tier, answered without asking,
kept in the session log through a resume in a new process, listed and cleared by ``/approvals``.
acp-agent still asks once each time (ACP-9)."""

from __future__ import annotations

import pytest
from acp import text_block

from dsh_testing import SHIPPED_EXAMPLES, Recorder, session_log

pytestmark = pytest.mark.anyio

# a read-only deployment: bash may ask for workspace-write or danger-full-access
ENV = {**SHIPPED_EXAMPLES, "DSH_PERMISSION_MODE": "read-only"}


def _bash(prompt: str, tier: str) -> dict:
    return {"when": f"^{prompt}$", "steps": [
        {"tool": "bash", "args": {"description": prompt, "command": f"printf '{prompt}\\n'",
                                  "sandbox_permissions": tier, "justification": "the person asked for it"}},
        {"text": "done: {tool_result}"}]}


SCRIPT = {
    "rules": [_bash(f"ww {n}", "workspace-write") for n in range(1, 5)]
    + [_bash(f"full {n}", "danger-full-access") for n in range(1, 5)],
    "default": [{"text": "ok"}],
}


async def _say(run, sid: str, text: str) -> str:
    before = len(run.client.updates)
    resp = await run.conn.prompt(session_id=sid, prompt=[text_block(text)])
    assert resp.stop_reason == "end_turn"
    return "".join(u.content.text for s, u in run.client.updates[before:]
                   if s == sid and u.session_update == "agent_message_chunk")


def _finals(run, sid: str) -> list:
    return [u for s, u in run.client.updates if s == sid and u.session_update == "tool_call_update"
            and u.status in ("completed", "failed")]


async def test_always_answers_become_rules_that_survive_a_resume_and_clear(acp_agent, scripted):
    script = scripted(SCRIPT)
    client = Recorder(permission_answers=["allow-always", "reject-always"])
    async with acp_agent(script, example="acp-editor", env=ENV, client=client) as run:
        sid = await run.start()
        # 1. asked, with the four answers a person reads in Zed or Toad
        assert "done: ww 1" in await _say(run, sid, "ww 1")
        (_, call, options), = client.permission_requests
        assert call.title.endswith("→ workspace-write")
        assert [(o.option_id, o.kind, o.name) for o in options] == [
            ("allow-once", "allow_once", "Allow once"),
            ("allow-always", "allow_always", "Always allow bash in workspace-write for this session"),
            ("reject-once", "reject_once", "Reject once"),
            ("reject-always", "reject_always", "Always reject bash in workspace-write for this session"),
        ]
        # 2. the same tool and tier again: answered by the rule, not asked; its card shows what ran
        assert "done: ww 2" in await _say(run, sid, "ww 2")
        assert len(client.permission_requests) == 1
        ran = _finals(run, sid)[-1]
        assert ran.status == "completed" and "ww 2" in ran.content[0].content.text
        # 3. a wider tier is asked: the rule never widens; "always reject" it
        answer = await _say(run, sid, "full 1")
        assert len(client.permission_requests) == 2
        assert client.permission_requests[1][1].title.endswith("→ danger-full-access")
        assert 'the user rejected escalating this command to "danger-full-access"' in answer
        # 4. refused by the rule without asking; nothing ran
        answer = await _say(run, sid, "full 2")
        assert len(client.permission_requests) == 2
        assert 'the user rejected escalating this command to "danger-full-access"' in answer
        assert _finals(run, sid)[-1].status == "failed"
        # /approvals lists both, as Markdown lines
        listed = await _say(run, sid, "/approvals")
        assert "- always allow `bash` in workspace-write" in listed
        assert "- always reject `bash` in danger-full-access" in listed
        assert await run.close_stdin() == 0
    rules = [e["data"] for e in session_log(acp_agent.home, sid) if e["type"] == "note"
             and e["kind"] == "acp/approval-rule"]
    assert rules == [{"tool": "bash", "tier": "workspace-write", "decision": "allow"},
                     {"tool": "bash", "tier": "danger-full-access", "decision": "reject"}]

    # a new process: the rules come back from the log
    client = Recorder(permission_answers=["allow-once"])
    async with acp_agent(script, example="acp-editor", env=ENV, client=client) as run:
        await run.conn.initialize(protocol_version=1)
        await run.conn.resume_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
        assert "done: ww 3" in await _say(run, sid, "ww 3")
        assert 'the user rejected escalating this command to "danger-full-access"' in await _say(run, sid, "full 3")
        assert client.permission_requests == []
        cleared = await _say(run, sid, "/approvals clear")
        assert cleared.startswith("Forgot 2 remembered approvals")
        assert (await _say(run, sid, "/approvals")).startswith("No remembered approvals in this session.")
        assert "done: ww 4" in await _say(run, sid, "ww 4")  # asked again, allowed once
        assert len(client.permission_requests) == 1
        assert await run.close_stdin() == 0
    kinds = [e["kind"] for e in session_log(acp_agent.home, sid) if e["type"] == "note"
             and e["kind"].startswith("acp/approval")]
    assert kinds == ["acp/approval-rule", "acp/approval-rule", "acp/approval-rules-cleared"]


async def test_an_allow_rule_for_danger_full_access_is_not_taken_from_the_log(acp_agent, scripted):
    """A log anyone with the data dir can edit never grants unconfined commands by itself: the
    rule is listed as not restored and the escalation is asked again (a reject rule is kept)."""
    script = scripted(SCRIPT)
    client = Recorder(permission_answers=["allow-always"])
    async with acp_agent(script, example="acp-editor", env=ENV, client=client) as run:
        sid = await run.start()
        assert "done: full 1" in await _say(run, sid, "full 1")
        assert "done: full 2" in await _say(run, sid, "full 2")
        assert len(client.permission_requests) == 1
        assert await run.close_stdin() == 0
    client = Recorder(permission_answers=["reject-once"])
    async with acp_agent(script, example="acp-editor", env=ENV, client=client) as run:
        await run.conn.initialize(protocol_version=1)
        await run.conn.load_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
        listed = await _say(run, sid, "/approvals")
        assert "not restored from the session log" in listed and "- always allow `bash` in danger-full-access" in listed
        assert "rejected" in await _say(run, sid, "full 3")
        assert len(client.permission_requests) == 1  # asked again
        assert await run.close_stdin() == 0


async def test_acp_agent_asks_once_each_time(acp_agent, scripted):
    """ACP-9: the automation door offers exactly allow_once and reject_once, remembers nothing
    (an answer it did not offer is a rejection), and has no /approvals."""
    client = Recorder(permission_answers=["allow-always", "allow-once"])
    async with acp_agent(scripted(SCRIPT), env=ENV, client=client) as run:
        sid = await run.start()
        assert "rejected" in await _say(run, sid, "full 1")
        assert "done: full 2" in await _say(run, sid, "full 2")
        assert len(client.permission_requests) == 2
        for _, _, options in client.permission_requests:
            assert [(o.option_id, o.kind) for o in options] == [("allow-once", "allow_once"), ("reject-once", "reject_once")]
        assert await run.close_stdin() == 0
    assert not [e for e in session_log(acp_agent.home, sid) if e["type"] == "note"
                and e["kind"].startswith("acp/approval")]
