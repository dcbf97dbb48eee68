"""``session/load`` in acp-editor shows the session again as it was shown live (issue 42 bug 7,
its tool-call part), over a real ``dsh run`` in a second process with the official SDK client:
each tool call's card with its final status and output, the thoughts, the plan, in log order
around the replayed text. acp-agent's load replays only the text (tests/test_session_lifecycle.py)."""

from __future__ import annotations

import pytest
from acp import text_block

from dsh_testing import REPO

pytestmark = pytest.mark.anyio

EXAMPLES = {"DSH_EXAMPLES_PATH": str(REPO / "examples")}
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
    async with acp_agent(script, example="acp-editor", env=EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("do it")])
        assert resp.stop_reason == "end_turn"
        live = _shown(run, sid)
        assert await run.close_stdin() == 0
    async with acp_agent(script, example="acp-editor", env=EXAMPLES) as run:
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
