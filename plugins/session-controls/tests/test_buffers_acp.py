"""acp-editor's file tools and the editor's open files (ACP fs/read_text_file and
fs/write_text_file), with the official SDK client over a real ``dsh run`` on stdio: reads see
unsaved edits, an edit applies to what the model read, completed writes and edits reach the
editor, nothing outside the workspace goes through it, and acp-agent never asks."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from acp import text_block
from acp.schema import ClientCapabilities, FileSystemCapabilities, ReadTextFileResponse, WriteTextFileResponse

from dsh_testing import REPO, Recorder

pytestmark = pytest.mark.anyio

EXAMPLES = {"DSH_EXAMPLES_PATH": str(REPO / "examples")}
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
    async with acp_agent(scripted(SCRIPT), example="acp-editor", env=EXAMPLES, client=editor, client_fs=True) as run:
        await run.conn.initialize(protocol_version=1, client_capabilities=FS)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("tidy the notes")])
        assert resp.stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    notes, new = str(work / "notes.txt"), str(work / "new.txt")
    assert editor.reads == [notes, notes]  # the read, then the edit's base; never /etc/hostname
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
