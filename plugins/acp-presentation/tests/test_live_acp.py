"""Live text (``[config.acp-transport] stream = "live"``, acp-editor's default), with the
official SDK client over a real ``dsh run`` on stdio: the answer's text and the thinking go out
as the model writes them, under the id the committed message gets, and are not sent again when
it commits; a cancel leaves exactly what was shown in the log. acp-agent stays committed-only."""

from __future__ import annotations

import asyncio

import pytest
from acp import text_block

from dsh_testing import SHIPPED_EXAMPLES, session_log, until

pytestmark = pytest.mark.anyio


def _chunks(run, sid, kind="agent_message_chunk"):
    return [u for s, u in run.client.updates if s == sid and u.session_update == kind]


async def test_live_text_goes_out_as_it_is_written_under_the_committed_id(acp_agent, scripted):
    script = scripted({"default": [{"partial": "Hello, ", "mark": "streamed", "delay_ms": 2000,
                                    "reasoning": "then finish the greeting", "text": "world."}]})
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        prompt = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("greet")]))
        await until(lambda: _chunks(run, sid))
        assert not prompt.done()  # shown while the model is still writing
        assert _chunks(run, sid)[0].content.text == "Hello, "
        assert (await prompt).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    chunks = _chunks(run, sid)
    assert [c.content.text for c in chunks] == ["Hello, ", "world."]  # each piece once, none again at commit
    (committed,) = [e for e in session_log(acp_agent.home, sid) if e["type"] == "assistant/message"]
    assert {c.message_id for c in chunks} == {committed["message"]["id"]}
    (thought,) = _chunks(run, sid, "agent_thought_chunk")  # live, and not again when the message committed
    assert thought.content.text == "then finish the greeting" and thought.message_id == committed["message"]["id"]


async def test_a_cancel_leaves_in_the_log_what_the_editor_was_shown(acp_agent, scripted):
    script = scripted({"default": [{"partial": "Half an ans", "mark": "streamed", "delay_ms": 60000}]})
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        prompt = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("answer slowly")]))
        await until(lambda: _chunks(run, sid))
        await run.conn.cancel(session_id=sid)
        assert (await prompt).stop_reason == "cancelled"
        assert await run.close_stdin() == 0
    assert [c.content.text for c in _chunks(run, sid)] == ["Half an ans"]
    (kept,) = [e for e in session_log(acp_agent.home, sid) if e["type"] == "assistant/message"]
    assert kept["message"]["content"][0]["text"] == "Half an ans"


async def test_acp_agent_stays_committed_only(acp_agent, scripted):
    script = scripted({"default": [{"partial": "Hello, ", "mark": "streamed", "delay_ms": 500, "text": "world."}]})
    async with acp_agent(script) as run:
        sid = await run.start()
        prompt = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("greet")]))
        await until(lambda: (run.cwd / "streamed").exists())
        await asyncio.sleep(0.2)
        assert _chunks(run, sid) == [] and not prompt.done()  # nothing before the message commits
        assert (await prompt).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    assert [c.content.text for c in _chunks(run, sid)] == ["Hello, world."]
