"""What the person sees when something does not go as asked (issue 42), over a real ``dsh run
--example acp-editor`` with the official SDK client: ``/compact``'s failure reason (bug 6), a
retried model call and a long silent one (bug 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
from acp import text_block

from dsh_testing import REPO, SHIPPED_EXAMPLES

pytestmark = pytest.mark.anyio


def _mine(run, sid, kind):
    return [u for s, u in run.client.updates if s == sid and u.session_update == kind]


async def _ask(run, sid, text: str) -> str:
    before = len(run.client.text(sid))
    resp = await run.conn.prompt(session_id=sid, prompt=[text_block(text)])
    assert resp.stop_reason == "end_turn"
    (answer,) = run.client.text(sid)[before:]
    return answer


async def test_compact_says_why_nothing_was_compacted(acp_agent, scripted):
    script = scripted({
        "capabilities": {"context_window": 40000},
        "rules": [{"when": "^<transcript>", "steps": [{"error": "auth"}]}],
        "default": [{"text": "noted"}],
    })
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        assert await _ask(run, sid, "short") == "noted"
        assert await _ask(run, sid, "/compact") == ("Nothing was compacted: nothing older than the retained "
                                                    "messages to summarise.")
        for n in range(3):
            await _ask(run, sid, f"note {n}: " + "z" * 8000)
        assert await _ask(run, sid, "/compact") == ("Nothing was compacted: the summary call failed: simulated "
                                                    "provider error (HTTP 401).")
        assert await run.close_stdin() == 0


async def test_a_retried_model_call_is_shown_with_why(acp_agent, scripted):
    script = scripted({"default": [{"error": "server"}, {"text": "answered after a retry"}]})
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        assert await _ask(run, sid, "hello") == "answered after a retry"
        (thought,) = _mine(run, sid, "agent_thought_chunk")
        assert thought.content.text.startswith(
            "The model call failed (simulated provider error (HTTP 500): server error); trying again in ")
        assert "(retry 1 of 2)" in thought.content.text
        assert await run.close_stdin() == 0


def _waiting_example(tmp_path: Path, seconds: float) -> dict[str, str]:
    """acp-editor as shipped, with ``waiting`` shortened so the test need not wait 5 s."""
    root = tmp_path / "examples" / "acp-editor"
    root.mkdir(parents=True)
    text = (REPO / "examples" / "acp-editor" / "example.toml").read_text()
    assert "\nwaiting = 5\n" in text
    (root / "example.toml").write_text(text.replace("\nwaiting = 5\n", f"\nwaiting = {seconds}\n"))
    return {"DSH_EXAMPLES_PATH": str(root.parent)}


async def test_a_silent_model_call_is_said_to_be_waited_for(acp_agent, scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^slow", "steps": [{"text": "slow answer", "delay_ms": 2600}]},
        {"when": "^quick", "steps": [{"text": "quick answer"}]},
    ]})
    async with acp_agent(script, example="acp-editor", env=_waiting_example(tmp_path, 1)) as run:
        sid = await run.start()
        assert await _ask(run, sid, "quick") == "quick answer"
        assert not _mine(run, sid, "agent_thought_chunk")  # nothing said of a call that was not slow
        assert await _ask(run, sid, "slow") == "slow answer"
        thoughts = _mine(run, sid, "agent_thought_chunk")
        texts = [t.content.text for t in thoughts]  # at 1 s and 2 s (a loaded machine may answer after 3 s)
        assert texts[0] == "Still waiting for the model: 1 s" and texts[1:] == [f", {n} s" for n in range(2, len(texts) + 1)]
        assert len(texts) >= 2
        assert len({t.message_id for t in thoughts}) == 1  # one silence, one growing thought
        updates = [u.session_update for s, u in run.client.updates if s == sid]
        assert updates[-1] == "agent_message_chunk" and updates[-2] == "agent_thought_chunk"  # then the answer
        assert await run.close_stdin() == 0


async def test_session_load_shows_commands_as_the_person_typed_them(acp_agent, scripted):
    """Issue 42 bug 7: a reloaded session shows ``/init …`` as typed (not the instruction it
    became), and a command that answered by itself (``/status``) with its answer."""
    script = scripted({"rules": [{"when": "^Write AGENTS.md", "steps": [{"text": "init ran"}]}],
                       "default": [{"text": "the model answered: {prompt}"}]})
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        assert await _ask(run, sid, "hello") == "the model answered: hello"
        status = await _ask(run, sid, "/status")
        assert await _ask(run, sid, "/init cover the tests") == "init ran"
        assert await run.close_stdin() == 0
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        await run.conn.load_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
        shown = [(u.session_update, u.content.text) for s, u in run.client.updates
                 if s == sid and u.session_update in ("user_message_chunk", "agent_message_chunk")]
        assert shown == [
            ("user_message_chunk", "hello"), ("agent_message_chunk", "the model answered: hello"),
            ("user_message_chunk", "/status"), ("agent_message_chunk", status),
            ("user_message_chunk", "/init cover the tests"), ("agent_message_chunk", "init ran"),
        ]
        assert await run.close_stdin() == 0
