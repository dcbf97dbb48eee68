"""A running command's output on its card (acp-editor, through ``dsh_present_progress``), with the
official SDK client over a real ``dsh run`` on stdio and the real sandbox (once per mechanism):
``in_progress`` updates carrying the tail so far, bounded in size and rate, then the final update.
acp-agent, which mounts no presenter, watches nothing and sends none of it."""

from __future__ import annotations

import json
import time
from itertools import pairwise

import pytest
from acp import text_block
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from dsh_core.progress import EVERY_S, TAIL_BYTES, TAIL_LINES
from dsh_testing import SHIPPED_EXAMPLES, session_log

pytestmark = pytest.mark.anyio

TICKS = "for i in 1 2 3; do echo tick$i; sleep 0.4; done"


def _script(command: str) -> dict:
    return {"default": [{"tool": "bash", "args": {"description": "Run the command", "command": command}},
                        {"text": "Done."}]}


def _card(run, sid):
    """The bash call's updates, in order: (status, card text or None, rawOutput)."""
    updates = [u for s, u in run.client.updates if s == sid]
    (start,) = [u for u in updates if u.session_update == "tool_call"]
    mine = [u for u in updates if u.session_update == "tool_call_update" and u.tool_call_id == start.tool_call_id]
    return [(u.status, u.content[0].content.text if u.content else None, u.raw_output) for u in mine]


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_running_command_shows_its_growing_output_then_its_result(acp_agent, scripted, mechanism):
    require_mechanism(mechanism)
    env = {**SHIPPED_EXAMPLES, "DSH_SANDBOX_MECHANISM": mechanism}
    async with acp_agent(scripted(_script(TICKS)), example="acp-editor", env=env) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("tick")])
        assert resp.stop_reason == "end_turn"
        card = _card(run, sid)
        assert await run.close_stdin() == 0
    assert card[0] == ("in_progress", None, None)  # the card opens as before
    live = [text for status, text, _ in card[1:-1]]
    assert all(status == "in_progress" for status, _, _ in card[1:-1])
    assert len(live) >= 2, card  # at least two updates while it ran, each the tail so far
    assert live[0].startswith("tick1")
    for shorter, longer in pairwise(live):  # the tail grows: each one extends the last
        assert longer.startswith(shorter.rstrip("\n")) and len(longer) > len(shorter)
    status, text, raw = card[-1]  # the final update replaces it, as before
    assert status == "completed" and text == "tick1\ntick2\ntick3\n"
    assert raw == {"output": "tick1\ntick2\ntick3\n", "isError": False}
    log = json.dumps(session_log(acp_agent.home, sid))
    assert "tick1\\ntick2\"" not in log  # progress is never durable: only the result is in the log
    assert [e["type"] for e in session_log(acp_agent.home, sid)].count("tool/result") == 1


async def test_a_megabyte_of_output_is_shown_as_a_bounded_tail_at_a_bounded_rate(acp_agent, scripted):
    # 1 MB in 10 000 lines, written over about a second
    command = ("for i in $(seq 1 10); do head -c 100000 /dev/zero | tr '\\0' y | fold -w 99 | sed \"s/^/$i:/\"; "
               "sleep 0.1; done")
    async with acp_agent(scripted(_script(command)), example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        began = time.monotonic()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("flood")])
        took = time.monotonic() - began
        assert resp.stop_reason == "end_turn"
        card = _card(run, sid)
        wire = bytes(run.stdout)
        assert await run.close_stdin() == 0
    live = [text for status, text, _ in card[1:-1]]
    assert live and all(status == "in_progress" for status, _, _ in card[1:-1])
    for text in live:  # each is a few KiB of whole lines, never the megabyte
        assert len(text.encode()) <= TAIL_BYTES and len(text.splitlines()) <= TAIL_LINES
        whole = text.splitlines()[:-1]  # the last one may still be being written
        assert whole and all(line.split(":")[0].isdigit() and set(line.split(":")[1]) == {"y"} for line in whole)
    assert len(live) <= took / EVERY_S + 1  # at most one per 250 ms (not one per chunk of output)
    assert card[-1][0] == "completed" and card[-1][1].startswith("…")  # the final card: the result's bounded tail
    assert len(wire) < 400_000  # the whole session's frames: the megabyte never crossed the wire


async def test_acp_agent_watches_no_progress(acp_agent, scripted):
    async with acp_agent(scripted(_script(TICKS))) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("tick")])
        assert resp.stop_reason == "end_turn"
        assert [u.session_update for s, u in run.client.updates if s == sid] == ["agent_message_chunk"]
        assert "tick1" not in bytes(run.stdout).decode()
        assert await run.close_stdin() == 0
