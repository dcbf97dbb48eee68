"""Compaction shown (acp-editor, through acp-presentation): with the official SDK client over a real
``dsh run`` on stdio, a person sees the conversation being compacted and what that saved, whether
the context passed its threshold or they typed ``/compact``, and why when it failed; a reopened
session (``session/load``) shows it again. acp-agent shows none of it (it stays in the log)."""

from __future__ import annotations

import re

import pytest
from acp import text_block

from dsh_testing import SHIPPED_EXAMPLES, session_log

pytestmark = pytest.mark.anyio

SUMMARY = {"when": "^<transcript>", "steps": [{"text": "The user sent long notes; each was noted."}]}
WINDOW = 9000  # acp-editor's prefix (system prompt and tool schemas) is a little over half of it


def _thoughts(run, sid) -> list[tuple[str, str]]:
    return [(u.message_id, u.content.text) for s, u in run.client.updates
            if s == sid and u.session_update == "agent_thought_chunk"]


def _said(thoughts: list[tuple[str, str]]) -> dict[str, str]:
    """Each thought's whole text, by its messageId (a thought grows chunk by chunk)."""
    out: dict[str, str] = {}
    for mid, text in thoughts:
        out[mid] = out.get(mid, "") + text
    return out


async def test_a_compaction_under_pressure_is_shown_with_what_it_saved(acp_agent, scripted):
    script = scripted({"capabilities": {"context_window": WINDOW}, "rules": [SUMMARY],
                       "default": [{"text": "noted {prompt}"}]})
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        for n in range(8):
            resp = await run.conn.prompt(session_id=sid, prompt=[text_block(f"note {n}: " + "z" * 1200)])
            assert resp.stop_reason == "end_turn"
        thoughts = _thoughts(run, sid)
        assert await run.close_stdin() == 0
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:  # reopened: shown again
        await run.conn.initialize(protocol_version=1)
        await run.conn.load_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
        replayed = _thoughts(run, sid)
        assert await run.close_stdin() == 0
    assert list(_said(replayed).values()) == [t for t in _said(thoughts).values() if "ompact" in t]
    (summary,) = [e for e in session_log(acp_agent.home, sid) if e["type"] == "compaction/summary"][:1]
    shown = [t for t in _said(thoughts).values() if "ompact" in t]
    assert shown, thoughts
    start, outcome = shown[0].split("\n")[:2]  # one thought: its start, then its outcome
    assert start.startswith("Compacting the conversation (about ") and " of the model's 9,000 tokens" in start
    match = re.fullmatch(r"Compacted: (\d+) older messages? summarised, (\d+) kept as they were; the context went "
                         r"from about ([\d,]+) to about ([\d,]+) tokens\.", outcome)
    assert match, outcome
    assert int(match[1]) == summary["coveredTo"] - summary["coveredFrom"] and int(match[2]) == summary["retained"]
    before, after = (int(match[i].replace(",", "")) for i in (3, 4))
    assert (before, after) == (summary["tokensBefore"], summary["tokensAfter"]) and after < before


async def test_slash_compact_is_shown_and_a_failed_one_says_why(acp_agent, scripted):
    # the second summary call (its transcript holds the first summary) fails
    fails = {"when": r"^<transcript>[\s\S]*each was noted", "steps": [{"error": "server"}]}
    script = scripted({"capabilities": {"context_window": 12_000}, "rules": [fails, SUMMARY],  # never under pressure
                       "default": [{"text": "noted {prompt}"}]})
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        for n in range(3):
            await run.conn.prompt(session_id=sid, prompt=[text_block(f"note {n}: " + "z" * 1200)])
        before = len(_thoughts(run, sid))
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("/compact")])
        assert resp.stop_reason == "end_turn"
        done = _said(_thoughts(run, sid)[before:])
        for n in range(3, 5):
            await run.conn.prompt(session_id=sid, prompt=[text_block(f"note {n}: " + "z" * 1200)])
        before = len(_thoughts(run, sid))
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("/compact")])
        failed = _said(_thoughts(run, sid)[before:])
        assert await run.close_stdin() == 0
    (text,) = done.values()
    assert text.startswith("Compacting the conversation (asked for with /compact)…\nCompacted: ")
    (text,) = failed.values()
    assert text.startswith("Compacting the conversation (asked for with /compact)…\nThe compaction failed: "
                           "the summary call failed: ")
    assert text.endswith(". The conversation is unchanged.\n")


async def test_acp_agent_shows_no_compaction(acp_agent, scripted):
    script = scripted({"capabilities": {"context_window": 4000}, "rules": [SUMMARY],
                       "default": [{"text": "noted {prompt}"}]})
    async with acp_agent(script) as run:
        sid = await run.start()
        for n in range(5):
            await run.conn.prompt(session_id=sid, prompt=[text_block(f"note {n}: " + "z" * 1200)])
        assert await run.close_stdin() == 0
    assert any(e["type"] == "compaction/summary" for e in session_log(acp_agent.home, sid))
    assert not _thoughts(run, sid) and "ompact" not in bytes(run.stdout).decode()
