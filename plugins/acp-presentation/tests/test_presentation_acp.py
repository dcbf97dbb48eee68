"""What an editor sees of a turn (acp-editor, through acp-presentation), with the official SDK
client over a real ``dsh run`` on stdio; every frame is validated against the ACP schema by the
harness. acp-agent, which does not mount the plugin, sends none of it."""

from __future__ import annotations

import pytest
from acp import text_block

from dsh_testing import SHIPPED_EXAMPLES, until

pytestmark = pytest.mark.anyio

SCRIPT = {"default": [
    {"reasoning": "First write the notes, then look at them.",
     "tools": [{"name": "write", "args": {"file_path": "notes.txt", "content": "one\ntwo\n"}},
               {"name": "bash", "args": {"description": "Run the command", "command": "cat notes.txt"}},
               {"name": "edit", "args": {"file_path": "notes.txt", "old_string": "two", "new_string": "2"}},
               {"name": "read", "args": {"file_path": "missing.txt"}}]},
    {"tool": "todo_write", "args": {"todos": [{"content": "write the notes", "status": "completed"},
                                              {"content": "review them", "status": "in_progress"}]},
     "usage": {"inputTokens": 1200, "outputTokens": 30}},
    {"text": "Done.", "usage": {"inputTokens": 1300, "outputTokens": 5}},
]}


def _updates(run, sid):
    return [u for s, u in run.client.updates if s == sid]


async def test_acp_editor_shows_tool_cards_diffs_thoughts_and_the_plan(acp_agent, scripted):
    async with acp_agent(scripted(SCRIPT), example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("write notes")])
        assert resp.stop_reason == "end_turn"
        await until(lambda: any(u.session_update == "session_info_update" for u in _updates(run, sid)))
        updates = _updates(run, sid)
        assert await run.close_stdin() == 0
    assert updates[0].session_update == "available_commands_update"  # session-controls: after session/new's answer
    updates = updates[1:]
    kinds = [u.session_update for u in updates]
    assert kinds[0] == "agent_thought_chunk" and updates[0].content.text == "First write the notes, then look at them."
    starts = [u for u in updates if u.session_update == "tool_call"]
    assert [(u.kind, u.title, u.status) for u in starts] == [
        ("edit", "write notes.txt", "pending"), ("execute", "bash: cat notes.txt", "pending"),
        ("edit", "edit notes.txt", "pending"), ("read", "read missing.txt", "pending"),
        ("other", "todo_write", "pending")]
    assert starts[0].locations[0].path == str(run.cwd / "notes.txt")
    assert starts[0].raw_input == {"file_path": "notes.txt", "content": "one\ntwo\n"}
    ends = {u.tool_call_id: u for u in updates if u.session_update == "tool_call_update" and u.status in ("completed", "failed")}
    write, bash, edit, read, todo = (ends[s.tool_call_id] for s in starts)
    assert todo.status == "completed"
    assert write.status == "completed"
    diff = next(c for c in write.content if c.type == "diff")
    assert (diff.path, diff.old_text, diff.new_text) == (str(run.cwd / "notes.txt"), None, "one\ntwo\n")
    assert bash.status == "completed" and "one\ntwo" in bash.content[0].content.text
    diff = next(c for c in edit.content if c.type == "diff")
    assert (diff.old_text, diff.new_text) == ("one\ntwo\n", "one\n2\n")  # the whole file, before and after
    assert read.status == "failed" and read.content[0].content.text.startswith("Error:")
    for start in starts:  # each card: pending, then in_progress, then its end, in that order
        mine = [u for u in updates if getattr(u, "tool_call_id", None) == start.tool_call_id]
        live = [u for u in mine[2:-1] if u.status == "in_progress"]  # bash: its output so far, while it runs
        assert [u.status for u in mine[:2]] == ["pending", "in_progress"] and mine[-1].status in ("completed", "failed")
        assert len(mine) == 3 + len(live) and (not live or start.title.startswith("bash"))
        assert all(u.content[0].content.text == "one\ntwo\n" for u in live)
    (plan,) = [u for u in updates if u.session_update == "plan"]
    assert [(e.content, e.status) for e in plan.entries] == [("write the notes", "completed"), ("review them", "in_progress")]
    assert kinds.index("plan") > kinds.index("tool_call_update")
    assert run.client.text(sid) == ["Done."]
    usage = [u for u in updates if u.session_update == "usage_update"]
    assert [(u.used, u.size) for u in usage] == [(1230, 128000), (1305, 128000)]  # one per model call that reported usage
    (info,) = [u for u in updates if u.session_update == "session_info_update"]
    assert info.title == "write notes" and info.updated_at.endswith("Z")  # the title call had no text: the first line
    assert kinds[-1] == "session_info_update"  # after the first turn's answer


async def test_acp_agent_shows_none_of_it(acp_agent, scripted):
    async with acp_agent(scripted(SCRIPT)) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("write notes")])
        assert resp.stop_reason == "end_turn"
        assert [u.session_update for u in _updates(run, sid)] == ["agent_message_chunk"]
        assert await run.close_stdin() == 0
