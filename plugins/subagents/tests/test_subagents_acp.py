"""In-process subagents behind the real door: the official SDK client drives ``dsh run`` over
real stdio (every frame validated against ACP's schema by the harness). acp-agent sends the
committed answer only; acp-editor streams a delegation's progress into its card; cancel and
stdin EOF end the children."""

from __future__ import annotations

import pytest
from acp import text_block

from dsh_testing import SHIPPED_EXAMPLES, session_log, until

pytestmark = pytest.mark.anyio

SCRIPT = {
    "rules": [
        {"when": "^delegate", "steps": [
            {"tool": "subagent", "args": {"description": "look around", "prompt": "child: look",
                                          "run_in_background": False}},
            {"text": "parent: {tool_result}"}]},
        {"when": "^child: look", "steps": [
            {"text": "STEP ONE", "tool": "list_agents", "args": {}},
            {"text": "CHILD FINAL"}]},
        {"when": "^hang", "steps": [
            {"tool": "subagent", "args": {"description": "slow", "prompt": "child: hang",
                                          "run_in_background": False}},
            {"text": "unreachable"}]},
        {"when": "^background", "steps": [
            {"tool": "subagent", "args": {"description": "slow", "prompt": "child: hang"}},
            {"text": "started in the background"}]},
        {"when": "^child: hang", "steps": [{"partial": "WORKING", "mark": "child-started", "delay_ms": 600000}]},
    ],
}


def _children(home, parent_sid):
    logs = sorted((home / "sessions").glob("*.jsonl"))
    return [p.stem for p in logs if session_log(home, p.stem)[0].get("parentSession") == parent_sid]


async def test_the_editor_watches_a_delegation_work_in_its_card(acp_agent, scripted):
    async with acp_agent(scripted(SCRIPT), example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("delegate")])
        assert resp.stop_reason == "end_turn"
        mine = [u for s, u in run.client.updates if s == sid]
        (card,) = [u for u in mine if u.session_update == "tool_call"]
        assert card.title == "subagent look around" and card.kind == "think"
        on_card = [u for u in mine if u.session_update == "tool_call_update" and u.tool_call_id == card.tool_call_id]
        shown = [u.content[0].content.text for u in on_card if u.content]
        assert shown == ["STEP ONE", "CHILD FINAL", "CHILD FINAL"]  # progress twice, then the result
        assert on_card[-1].status == "completed"
        assert "".join(run.client.text(sid)).endswith("parent: CHILD FINAL")
        # the child's own tool call is its own business: no card of the child's reaches the parent's session
        assert all(u.tool_call_id == card.tool_call_id for u in mine if u.session_update.startswith("tool_call"))


async def test_the_automation_door_sends_the_committed_answer_only(acp_agent, scripted):
    async with acp_agent(scripted(SCRIPT), env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("delegate")])
        assert resp.stop_reason == "end_turn"
        kinds = {u.session_update for s, u in run.client.updates if s == sid}
        assert kinds <= {"agent_message_chunk"}, kinds
        assert "".join(run.client.text(sid)) == "parent: CHILD FINAL"
        (child,) = _children(acp_agent.home, sid)
        header = session_log(acp_agent.home, child)[0]
        assert header["delegationDepth"] == 1 and header["parentCall"] == "call_1"


async def test_cancelling_the_prompt_cancels_a_foreground_child_and_keeps_its_partial_text(acp_agent, scripted):
    async with acp_agent(scripted(SCRIPT), env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        import anyio

        async with anyio.create_task_group() as tg:
            stops: list[str] = []

            async def prompt() -> None:
                stops.append((await run.conn.prompt(session_id=sid, prompt=[text_block("hang")])).stop_reason)

            tg.start_soon(prompt)
            await until(lambda: (run.cwd / "child-started").exists())
            await run.conn.cancel(session_id=sid)
        assert stops == ["cancelled"]
        events = session_log(acp_agent.home, sid)
        (result,) = [e for e in events if e["type"] == "tool/result"]
        assert result["code"] == "ABORTED" and result["result"]["content"][0]["text"].endswith(
            "Partial output before the run ended:\nWORKING")
        (child,) = _children(acp_agent.home, sid)
        assert [e["reason"] for e in session_log(acp_agent.home, child) if e["type"] == "turn/end"] == ["aborted"]


async def test_stdin_eof_ends_a_background_child_with_the_session(acp_agent, scripted):
    async with acp_agent(scripted(SCRIPT), env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("background")])
        assert resp.stop_reason == "end_turn" and "".join(run.client.text(sid)) == "started in the background"
        await until(lambda: (run.cwd / "child-started").exists())
        (child,) = _children(acp_agent.home, sid)
        assert session_log(acp_agent.home, child)[-1]["type"] != "turn/end"  # still working
        assert await run.close_stdin() == 0  # the process exits promptly: the child did not keep it
        ends = [e for e in session_log(acp_agent.home, child) if e["type"] == "turn/end"]
        assert [(e["reason"], e.get("abortKind")) for e in ends] == [("aborted", "disposed")]


RESTART = {
    "rules": [
        {"when": "^background quick", "steps": [
            {"tool": "subagent", "args": {"description": "quick", "prompt": "child: quick"}}, {"text": "started"}]},
        {"when": "^list them", "steps": [{"tool": "list_agents", "args": {}}, {"text": "{tool_result}"}]},
        {"when": "^more please", "steps": [
            {"tool": "send_message", "args": {"subagent_id": "{started_id}", "message": "child: again"}},
            {"text": "{tool_result}"}]},
        {"when": "^child: quick", "steps": [{"text": "QUICK_DONE"}]},
        {"when": "^child: again", "steps": [{"text": "AGAIN_DONE after {prompt}"}]},
        {"when": "^news", "steps": [{"text": "read the news"}]},
    ],
}


async def test_after_a_restart_a_resumed_parent_lists_its_child_ready_and_send_message_resumes_it(acp_agent, scripted):
    script = scripted(RESTART)
    async with acp_agent(script, env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("background quick")])
        await until(lambda: any(e["type"] == "subagent/settled" for e in session_log(acp_agent.home, sid)))
        (child,) = _children(acp_agent.home, sid)
        assert await run.close_stdin() == 0
    async with acp_agent(script, env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        await run.conn.resume_session(session_id=sid, cwd=str(run.cwd))
        await run.conn.prompt(session_id=sid, prompt=[text_block("list them")])
        assert run.client.text(sid)[-1] == f"{child} [ready] — quick"  # named by its session id
        await run.conn.prompt(session_id=sid, prompt=[text_block("more please")])
        assert run.client.text(sid)[-1] == f"message queued as the next turn for subagent {child}"
        await until(lambda: [e["type"] for e in session_log(acp_agent.home, child)].count("turn/end") == 2)
        assert _children(acp_agent.home, sid) == [child]  # the same child, its log continued
        turns = [e for e in session_log(acp_agent.home, child) if e["type"] == "assistant/message"]
        assert [t["message"]["content"][0]["text"] for t in turns] == ["QUICK_DONE", "AGAIN_DONE after child: again"]
        await until(lambda: [e["type"] for e in session_log(acp_agent.home, sid)].count("subagent/settled") == 2)
        await run.conn.prompt(session_id=sid, prompt=[text_block("news")])
        notices = [e["message"]["content"][0]["text"] for e in session_log(acp_agent.home, sid)
                   if e["type"] == "user/message" and e["message"].get("source") == "notice"]
        assert notices[-1] == (f"Background subagent {child} finished and will do no further work unless you send it "
                               "more.\nIts closing message:\nAGAIN_DONE after child: again")
