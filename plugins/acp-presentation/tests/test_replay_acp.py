"""``session/load`` in acp-editor shows the session again as it was shown live (issue 42 bug 7,
its tool-call part), over a real ``dsh run`` in a second process with the official SDK client:
each tool call's card with its final status and output, the thoughts, the plan, in log order
around the replayed text. acp-agent's load replays only the text (tests/test_session_lifecycle.py)."""

from __future__ import annotations

import pytest
from acp import text_block

from dsh_testing import SHIPPED_EXAMPLES, until

pytestmark = pytest.mark.anyio

SCRIPT = {"default": [
    {"reasoning": "LOOK-FIRST", "tool": "bash", "args": {"description": "Run the command", "command": "echo BASH-OUT"}},
    {"tool": "bash", "args": {"description": "Run the command", "command": "exit 3"}},
    {"tool": "todo_write", "args": {"todos": [{"content": "write the notes", "status": "completed"},
                                              {"content": "check them", "status": "in_progress"}]}},
    {"text": "all done"},
]}


def _shown(run, sid):
    out = []
    for s, u in run.client.updates:
        if s != sid:
            continue
        kind = u.session_update
        if kind in ("user_message_chunk", "agent_message_chunk", "agent_thought_chunk"):
            out.append((kind, u.content.text))
        elif kind == "tool_call":
            out.append((kind, u.title, u.kind))
        elif kind == "tool_call_update" and u.status in ("completed", "failed"):
            out.append((kind, u.status, u.content[0].content.text if u.content else None))
        elif kind == "plan":
            out.append((kind, [(e.content, e.status) for e in u.entries]))
    return out


async def test_session_load_shows_tool_cards_thoughts_and_the_plan_again(acp_agent, scripted):
    script = scripted(SCRIPT)
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("do it")])
        assert resp.stop_reason == "end_turn"
        live = _shown(run, sid)
        assert await run.close_stdin() == 0
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        await run.conn.load_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
        replayed = _shown(run, sid)
        assert await run.close_stdin() == 0
    assert replayed == [
        ("user_message_chunk", "do it"),
        ("agent_thought_chunk", "LOOK-FIRST"),
        ("tool_call", "bash: echo BASH-OUT", "execute"),
        ("tool_call_update", "completed", "BASH-OUT\n"),
        ("tool_call", "bash: exit 3", "execute"),
        ("tool_call_update", "completed", "(no output)\n[exit code: 3]"),  # a non-zero exit is a result, as the original's
        ("tool_call", "todo_write", "other"),
        ("tool_call_update", "completed", replayed[7][2]),
        ("plan", [("write the notes", "completed"), ("check them", "in_progress")]),
        ("agent_message_chunk", "all done"),
    ]
    assert replayed[1:] == live  # the thread looks as it did live (live has no user chunk of its own)


FULL = {"default": [
    {"reasoning": "Write the notes, then fix them.",
     "tools": [{"name": "write", "args": {"file_path": "notes.txt", "content": "one\ntwo\n"}},
               {"name": "edit", "args": {"file_path": "notes.txt", "old_string": "two", "new_string": "2"}}],
     "usage": {"inputTokens": 1000, "outputTokens": 20}},
    {"tool": "bash", "args": {"description": "Run the command", "command": "cat notes.txt"},
     "usage": {"inputTokens": 1100, "outputTokens": 10}},
    {"tool": "todo_write", "args": {"todos": [{"content": "write the notes", "status": "completed"},
                                              {"content": "check them", "status": "in_progress"}]},
     "usage": {"inputTokens": 1200, "outputTokens": 30}},
    {"text": "all done", "usage": {"inputTokens": 1300, "outputTokens": 5}},
]}


def _frames(run, sid):
    """What a client renders of the session, frame by frame (as JSON): without the command list
    (sent after each answer to session/new and load) and a card's ``in_progress`` updates, bare or
    with a running command's output so far (moments of the live turn, not part of the thread: the
    final update has the output); a user's chunk is the load's own."""
    out = []
    for s, u in run.client.updates:
        if s != sid or u.session_update == "available_commands_update":
            continue
        if u.session_update == "tool_call_update" and u.status == "in_progress":
            continue
        out.append(u.model_dump(mode="json", by_alias=True, exclude_none=True))
    return out


async def test_session_load_shows_the_thread_as_it_was_live(acp_agent, scripted):
    """Full replay (issue 42): a turn with a thought, a write, an edit, a bash call and a plan,
    reloaded by a second dsh process, gives the client the same frames it got live — the diffs
    from the log (the file on disk is gone by then), rawOutput, each usage_update, the title."""
    script = scripted(FULL)
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("write notes")])
        assert resp.stop_reason == "end_turn"
        await until(lambda: any(f["sessionUpdate"] == "session_info_update" for f in _frames(run, sid)))
        live = _frames(run, sid)
        assert await run.close_stdin() == 0
        (run.cwd / "notes.txt").unlink()  # what load shows comes from the log, not the disk of now
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        await run.conn.load_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
        replayed = _frames(run, sid)
        assert await run.close_stdin() == 0
    assert replayed[0] == {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "write notes"},
                           **({"messageId": replayed[0]["messageId"]} if "messageId" in replayed[0] else {})}
    replayed = replayed[1:]
    diffs = [c for f in replayed if f["sessionUpdate"] == "tool_call_update" for c in f.get("content", ())
             if c["type"] == "diff"]
    assert [(c.get("oldText"), c["newText"]) for c in diffs] == [(None, "one\ntwo\n"), ("one\ntwo\n", "one\n2\n")]
    finals = [f for f in replayed if f["sessionUpdate"] == "tool_call_update"]
    assert [f["rawOutput"]["isError"] for f in finals] == [False] * 4
    assert "one\n2" in finals[2]["rawOutput"]["output"]
    assert [(f["used"], f["size"]) for f in replayed if f["sessionUpdate"] == "usage_update"] == [
        (1020, 128000), (1110, 128000), (1230, 128000), (1305, 128000)]
    assert replayed[-1]["sessionUpdate"] == "session_info_update" and replayed[-1]["title"] == "write notes"
    assert [f["sessionUpdate"] for f in replayed] == [f["sessionUpdate"] for f in live]
    for shown_then, shown_live in zip(replayed, live, strict=True):  # card by card
        assert shown_then == shown_live
