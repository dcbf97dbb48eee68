"""Issue 42 bug 2, over a real ``dsh run --example acp-editor`` with the official SDK client: a
session the person set to read-only, in a workspace-write deployment, offers the next tier up
(workspace-write) for a refused write, and that is the tier the permission card then asks for."""

from __future__ import annotations

import pytest
from acp import text_block

from dsh_testing import SHIPPED_EXAMPLES, Recorder, session_log

pytestmark = pytest.mark.anyio

SCRIPT = {
    "rules": [
        {"when": "^write it", "steps": [
            {"tool": "write", "args": {"file_path": "a.txt", "content": "x"}},
            {"tool": "write", "args": {"file_path": "a.txt", "content": "x", "sandbox_permissions": "workspace-write",
                                       "justification": "the person asked for a.txt"}},
            {"text": "done: {tool_result}"}]},
    ],
    "default": [{"text": "ok"}],
}


async def test_read_only_offers_workspace_write_first_and_the_card_asks_for_it(acp_agent, scripted):
    client = Recorder(permission_answers=["allow-once"])
    async with acp_agent(scripted(SCRIPT), example="acp-editor", env=SHIPPED_EXAMPLES, client=client) as run:
        sid = await run.start()
        await run.conn.set_session_mode(session_id=sid, mode_id="read-only")
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("write it")])
        assert resp.stop_reason == "end_turn"
        failed = [u for s, u in client.updates if s == sid
                  and u.session_update == "tool_call_update" and u.status == "failed"]
        shown = failed[0].content[0].content.text  # what the refused write's card says
        assert "read-only" in shown
        assert 'sandbox_permissions="workspace-write" or "danger-full-access"' in shown  # the next tier first
        (asked,) = client.permission_requests
        _, call, _options = asked
        assert call.title.endswith("→ workspace-write") and call.raw_input["tier"] == "workspace-write"
        assert (run.cwd / "a.txt").read_text() == "x"  # approved once, in workspace-write
        assert await run.close_stdin() == 0
    told = [e["message"]["content"][0]["text"] for e in session_log(acp_agent.home, sid)
            if e["type"] == "user/message" and e["message"].get("source") == "hook"]
    assert len(told) == 1 and 'sandbox_permissions="workspace-write"' in told[0]  # the model knew the way out
