"""Issue 42's rows of acp-editor over a real ``dsh run`` with the official SDK client, each beside
acp-agent's answer, which does not change: the ``refusal`` stop reason, ``rawOutput`` on a tool
card's last update, live streaming by default, and ``logout``."""

from __future__ import annotations

import pytest
from acp import RequestError, text_block

from dsh_testing import SHIPPED_EXAMPLES

pytestmark = pytest.mark.anyio

FILTERED = {"default": [{"error": "content_filter"}]}


async def test_a_content_filter_stop_is_a_refusal_in_acp_editor(acp_agent, scripted):
    async with acp_agent(scripted(FILTERED), example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("say something it filters")])
        assert resp.stop_reason == "refusal"  # not an error: the person sees the model declined
        assert await run.close_stdin() == 0
    (answer,) = [f for f in run.frames if f.get("result", {}).get("stopReason") == "refusal"]
    assert "error" not in answer


async def test_acp_agent_keeps_the_content_filter_an_error(acp_agent, scripted):
    """ACP-7: a turn that ended in a provider error fails its prompt (internal error); acp-agent's
    wire does not change."""
    async with acp_agent(scripted(FILTERED)) as run:
        sid = await run.start()
        with pytest.raises(RequestError) as failed:
            await run.conn.prompt(session_id=sid, prompt=[text_block("say something it filters")])
        assert failed.value.code == -32603 and "content_filter" in str(failed.value.data or failed.value)
        assert await run.close_stdin() == 0


TOOLS = {"default": [
    {"tool": "bash", "args": {"description": "Say hello", "command": "printf 'hello\\n'"}},
    {"tool": "read", "args": {"file_path": "missing.txt"}},
    {"text": "done"},
]}


def _final(updates, sid):
    return [u for s, u in updates if s == sid and u.session_update == "tool_call_update"
            and u.status in ("completed", "failed")]


async def test_the_final_tool_call_update_carries_raw_output(acp_agent, scripted):
    async with acp_agent(scripted(TOOLS), example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("go")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    ran, failed = _final(run.client.updates, sid)
    assert ran.status == "completed" and ran.raw_output["isError"] is False
    assert ran.raw_output["output"].startswith("hello\n") and "truncated" not in ran.raw_output
    assert ran.raw_output["output"] == ran.content[0].content.text  # the card shows the same result
    assert failed.status == "failed" and failed.raw_output["isError"] is True
    assert failed.raw_output["code"] == "NOT_FOUND" and "missing.txt" in failed.raw_output["output"]
    progress = [u for s, u in run.client.updates if s == sid and u.session_update == "tool_call_update"
                and u.status == "in_progress"]
    assert progress and all(u.raw_output is None for u in progress)  # only the final update has it


async def test_acp_agent_sends_no_tool_cards(acp_agent, scripted):
    async with acp_agent(scripted(TOOLS)) as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("go")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    assert [u.session_update for s, u in run.client.updates if s == sid] == ["agent_message_chunk"]
