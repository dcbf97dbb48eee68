"""Goals behind the real door: ``dsh run --example acp-agent`` over real stdio, driven by the
official SDK client, the JSONL session log on disk. The rounds are autonomous turns the client
sees after its prompt answered; a cancel pauses the goal; another dsh process resuming the
session gets the goal back from the log, disarmed, and starts no round on its own."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from acp import text_block

from dsh_testing import SHIPPED_EXAMPLES, session_log

pytestmark = pytest.mark.anyio


async def _until(check: Any, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.02)


def _turns(home: Any, sid: str) -> list[tuple[int, bool, str | None]]:
    events = session_log(home, sid)[1:]
    ends = {e["turn"]: e["reason"] for e in events if e["type"] == "turn/end"}
    return [(e["turn"], e.get("autonomous", False), ends.get(e["turn"])) for e in events if e["type"] == "turn/start"]


def _goal_notes(home: Any, sid: str) -> list[tuple[str, Any]]:
    return [(e["kind"], e["data"]) for e in session_log(home, sid)[1:]
            if e["type"] == "note" and e["kind"].startswith("goal/")]


async def test_a_goal_runs_its_rounds_as_autonomous_turns_the_client_sees(acp_agent, scripted):
    script = scripted({"rules": [
        {"when": "^finish the report", "steps": [
            {"tool": "create_goal", "args": {"objective": "report.txt is written", "max_goal_rounds": 4}},
            {"text": "goal set"}]},
        {"when": "Round: 1/4", "steps": [
            {"tool": "write", "args": {"file_path": "report.txt", "content": "draft\n"}}, {"text": "drafted"}]},
        {"when": "Round: 2/4", "steps": [
            {"tool": "get_goal", "args": {}},
            {"tool": "update_goal", "args": {"goal_id": "goal-1", "revision": 1, "action": "complete"}},
            {"text": "The report is written."}]}]})
    async with acp_agent(script, env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("finish the report")])
        assert resp.stop_reason == "end_turn"
        await _until(lambda: "The report is written." in run.client.text(sid))
        await _until(lambda: _turns(acp_agent.home, sid)[-1][2] is not None)
        assert run.client.text(sid) == ["goal set", "drafted", "The report is written."]
        assert (run.cwd / "report.txt").read_text() == "draft\n"
        assert await run.close_stdin() == 0
    assert _turns(acp_agent.home, sid) == [(1, False, "completed"), (2, True, "completed"), (3, True, "completed")]
    notes = _goal_notes(acp_agent.home, sid)
    assert [(k, d.get("operation"), d.get("round")) for k, d in notes] == [
        ("goal/change", "create", None), ("goal/round", None, 1), ("goal/round", None, 2),
        ("goal/change", "complete", None)]
    assert notes[-1][1]["goal"] == {"id": "goal-1", "revision": 2, "objective": "report.txt is written",
                                    "phase": "complete", "maxGoalRounds": 4}


async def test_cancel_pauses_the_goal_and_a_resumed_session_gets_it_back_disarmed(acp_agent, scripted):
    script = scripted({"rules": [
        {"when": "^keep at it", "steps": [{"tool": "create_goal", "args": {"objective": "x"}}, {"text": "on it"}]},
        {"when": "<goal_round>", "steps": [{"partial": "working", "mark": "round-started", "delay_ms": 600000}]},
        {"when": "^where", "steps": [{"tool": "get_goal", "args": {}}, {"text": "{tool_result}"}]}]})
    async with acp_agent(script, env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("keep at it")])).stop_reason == "end_turn"
        await _until(lambda: (run.cwd / "round-started").exists())
        await run.conn.cancel(session_id=sid)
        await _until(lambda: _turns(acp_agent.home, sid)[-1][2] is not None)
        await _until(lambda: _goal_notes(acp_agent.home, sid)[-1][1].get("operation") == "pause")
        assert await run.close_stdin() == 0
    assert _turns(acp_agent.home, sid) == [(1, False, "completed"), (2, True, "aborted")]
    (run.cwd / "round-started").unlink()

    async with acp_agent(script, env=SHIPPED_EXAMPLES) as run:  # another dsh process, later
        await run.conn.initialize(protocol_version=1)
        await run.conn.resume_session(session_id=sid, cwd=str(run.cwd))
        await anyio.sleep(0.5)
        assert run.client.updates == [] and len(_turns(acp_agent.home, sid)) == 2  # no round on its own
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("where are we?")])).stop_reason == "end_turn"
        (answer,) = run.client.text(sid)
        assert json.loads(answer) == {"goal": {"id": "goal-1", "revision": 2, "objective": "x", "phase": "paused",
                                               "roundsStarted": 1, "maxGoalRounds": 256}, "activation": "disarmed"}
        assert await run.close_stdin() == 0
    assert not (run.cwd / "round-started").exists()
