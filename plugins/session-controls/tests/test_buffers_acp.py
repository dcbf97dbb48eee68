"""acp-editor's file tools and the editor's open files (ACP fs/read_text_file and
fs/write_text_file), with the official SDK client over a real ``dsh run`` on stdio: reads see
unsaved edits, an edit applies to what the model read, completed writes and edits reach the
editor, nothing outside the workspace goes through it, and acp-agent never asks."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from acp import text_block
from acp.schema import ClientCapabilities, FileSystemCapabilities, ReadTextFileResponse, WriteTextFileResponse

from dsh_testing import SHIPPED_EXAMPLES, Recorder

pytestmark = pytest.mark.anyio

FS = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True, write_text_file=True))


@dataclass
class Editor(Recorder):
    """A client with open buffers: a path it holds is answered from memory, others from disk."""

    buffers: dict[str, str] = field(default_factory=dict)
    reads: list[str] = field(default_factory=list)
    writes: list[tuple[str, str]] = field(default_factory=list)

    async def read_text_file(self, session_id: str, path: str, line=None, limit=None, **kw):
        self.reads.append(path)
        return ReadTextFileResponse(content=self.buffers.get(path) or Path(path).read_text())

    async def write_text_file(self, session_id: str, path: str, content: str, **kw):
        self.writes.append((path, content))
        self.buffers[path] = content
        return WriteTextFileResponse()


SCRIPT = {"default": [
    {"tool": "read", "args": {"file_path": "notes.txt"}},
    {"tool": "edit", "args": {"file_path": "notes.txt", "old_string": "unsaved", "new_string": "edited"}},
    {"tool": "write", "args": {"file_path": "new.txt", "content": "fresh\n"}},
    {"tool": "read", "args": {"file_path": "/etc/hostname"}},
    {"tool": "bash", "args": {"description": "Run the command", "command": "cat notes.txt"}},
    {"text": "done: {tool_result}"},
]}


async def test_the_editor_buffers_are_read_and_written_inside_the_workspace(acp_agent, scripted):
    work = acp_agent.work
    (work / "notes.txt").write_text("line one\nthe saved text\n")
    editor = Editor(buffers={str(work / "notes.txt"): "line one\nthe unsaved text\n"})
    async with acp_agent(scripted(SCRIPT), example="acp-editor", env=SHIPPED_EXAMPLES, client=editor, client_fs=True) as run:
        await run.conn.initialize(protocol_version=1, client_capabilities=FS)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("tidy the notes")])
        assert resp.stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    notes, new = str(work / "notes.txt"), str(work / "new.txt")
    # the read, the edit's base, then what the write replaces (new.txt is in no buffer); never /etc/hostname
    assert editor.reads == [notes, notes, new]
    assert editor.writes == [(notes, "line one\nthe edited text\n"), (new, "fresh\n")]
    assert (work / "notes.txt").read_text() == "line one\nthe edited text\n"  # the disk has it too
    assert run.client.text(sid) == ["done: line one\nthe edited text\n"]  # bash read the disk
    assert not any(f.get("method", "").startswith("terminal/") for f in run.frames)


async def test_acp_agent_never_asks_the_editor(acp_agent, scripted):
    work = acp_agent.work
    (work / "notes.txt").write_text("line one\nthe unsaved text\n")
    editor = Editor()
    async with acp_agent(scripted(SCRIPT), client=editor) as run:
        await run.conn.initialize(protocol_version=1, client_capabilities=FS)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("tidy")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    assert editor.reads == [] and editor.writes == []
    assert (work / "new.txt").read_text() == "fresh\n"


APPROVED = {"default": [
    {"tool": "read", "args": {"file_path": "notes.txt"}},
    {"tool": "edit", "args": {"file_path": "notes.txt", "old_string": "unsaved", "new_string": "edited",
                              "sandbox_permissions": "workspace-write", "justification": "the person asked"}},
    {"tool": "write", "args": {"file_path": "todo.txt", "content": "written\n",
                               "sandbox_permissions": "workspace-write", "justification": "the person asked"}},
    {"text": "done"},
]}


def _diffs(content) -> list[tuple[str, str | None, str]]:
    return [(c.path, c.old_text, c.new_text) for c in content or [] if getattr(c, "type", "") == "diff"]


async def test_the_approved_change_is_the_written_change_when_the_buffer_differs_from_the_disk(acp_agent, scripted):
    """Issue 42 bug 1: the person approves a diff computed from the editor's unsaved buffer, the
    tool card shows that same diff, and exactly that text is written (to the editor and the disk)."""
    work = acp_agent.work
    (work / "notes.txt").write_text("line one\nthe saved text\n")
    (work / "todo.txt").write_text("on disk\n")
    notes, todo = str(work / "notes.txt"), str(work / "todo.txt")
    editor = Editor(buffers={notes: "line one\nthe unsaved text\nand a new line\n", todo: "in the buffer\n"},
                    permission_answers=["allow-once", "allow-once"])
    async with acp_agent(scripted(APPROVED), example="acp-editor", env=SHIPPED_EXAMPLES, client=editor, client_fs=True) as run:
        await run.conn.initialize(protocol_version=1, client_capabilities=FS)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        await run.conn.set_session_mode(session_id=sid, mode_id="read-only")  # each write is put to the person
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("tidy the notes")])
        assert resp.stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    edited = "line one\nthe edited text\nand a new line\n"
    expected = [(notes, "line one\nthe unsaved text\nand a new line\n", edited), (todo, "in the buffer\n", "written\n")]
    asked = [d for _, call, _ in editor.permission_requests for d in _diffs(call.content)]
    assert asked == expected  # what the person approved: from the buffers, not the disk
    cards = [d for s, u in editor.updates if s == sid and u.session_update == "tool_call_update"
             and u.status == "completed" for d in _diffs(u.content)]
    assert cards == expected  # what the tool cards show afterwards: the same change
    assert editor.writes == [(notes, edited), (todo, "written\n")]  # what was written: the approved text
    assert (work / "notes.txt").read_text() == edited and (work / "todo.txt").read_text() == "written\n"


ASK = {"hooks": {"PreToolUse": [{"matcher": "^edit$", "hooks": [{"type": "command", "command": (
    "printf '%s' '{\"hookSpecificOutput\": {\"hookEventName\": \"PreToolUse\", \"permissionDecision\": \"ask\", "
    "\"permissionDecisionReason\": \"edits are reviewed\"}}'")}]}]}}


async def test_a_hook_asked_edit_shows_the_buffer_it_then_changes(acp_agent, scripted):
    """Bug 1 on the other way a change is put to the person: a project hook asks before the edit
    runs (no tool has read anything yet). The door shows the diff from the editor's text, which
    is the text the edit then changes and writes."""
    work = acp_agent.work
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.json").write_text(json.dumps(ASK))
    (work / "notes.txt").write_text("line one\nthe saved text\n")
    notes = str(work / "notes.txt")
    editor = Editor(buffers={notes: "the unsaved text\nand more\n"}, permission_answers=["allow-once"])
    script = {"default": [SCRIPT["default"][0], SCRIPT["default"][1], {"text": "done"}]}
    async with acp_agent(scripted(script), example="acp-editor", env=SHIPPED_EXAMPLES, client=editor, client_fs=True) as run:
        await run.conn.initialize(protocol_version=1, client_capabilities=FS)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("tidy")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    expected = [(notes, "the unsaved text\nand more\n", "the edited text\nand more\n")]
    assert [d for _, call, _ in editor.permission_requests for d in _diffs(call.content)] == expected
    assert [d for s, u in editor.updates if s == sid and u.session_update == "tool_call_update"
            and u.status == "completed" for d in _diffs(u.content)] == expected
    assert editor.writes == [(notes, "the edited text\nand more\n")]
