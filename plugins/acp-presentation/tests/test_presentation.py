"""acp-presentation's projection on a real in-process session, event by event: diffs stay exact
when one step changes a file twice, nothing outside the workspace is read, titles are one
clean line, a plugin bug never costs the door its answer."""

from __future__ import annotations

import json

import pytest
from dsh_acp import wire
from dsh_acp_presentation import DIFF_MAX, dsh_after_tool, dsh_present_event, dsh_present_replay, title_of

from dsh_core.contracts import AgentSpec
from dsh_core.types import (
    FileChange,
    FileChanges,
    Note,
    TextBlock,
    ToolCallEvent,
    ToolResultEvent,
    ToolResultMessage,
)
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio


def _call(turn, step, call_id, name, **args):
    return ToolCallEvent(turn=turn, step=step, call_id=call_id, name=name, arguments=json.dumps(args))


def _result(turn, step, call_id, name, error=False):
    return ToolResultEvent(turn=turn, step=step, result=ToolResultMessage(
        call_id=call_id, name=name, content=[TextBlock(text="Error: no" if error else "ok")], is_error=error))


async def _agent(host, tmp_path, script):
    return host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))


async def test_two_edits_of_one_file_in_one_step_each_show_exactly_their_change(scripted, tmp_path):
    script = scripted({})
    (tmp_path / "f.txt").write_text("a\nb\nc\n")
    async with memory_host(script, plugins=("scripted-model", "sandbox-tools", "acp-presentation")) as host:
        agent = await _agent(host, tmp_path, script)
        # the step's calls are recorded before any runs, their results after all ran
        for e in (_call(1, 1, "c1", "edit", file_path="f.txt", old_string="a", new_string="A"),
                  _call(1, 1, "c2", "edit", file_path="f.txt", old_string="b", new_string="B"),
                  _call(1, 1, "c3", "write", file_path="new.txt", content="fresh\n")):
            dsh_present_event(agent, e)
        (tmp_path / "f.txt").write_text("A\nB\nc\n")  # what the two edits did
        first = dsh_present_event(agent, _result(1, 1, "c1", "edit"))[0].content[0]
        second = dsh_present_event(agent, _result(1, 1, "c2", "edit"))[0].content[0]
        third = dsh_present_event(agent, _result(1, 1, "c3", "write"))[0].content[0]
        assert (first.old_text, first.new_text) == ("a\nb\nc\n", "A\nb\nc\n")
        assert (second.old_text, second.new_text) == ("A\nb\nc\n", "A\nB\nc\n")
        assert (third.old_text, third.new_text) == (None, "fresh\n")  # a new file
        await agent.dispose()


async def test_a_failed_edit_shows_no_diff_and_a_file_outside_the_workspace_is_never_read(scripted, tmp_path):
    script = scripted({})
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "secret.txt").write_text("outside\n")
    (work / "link.txt").symlink_to(tmp_path / "secret.txt")
    async with memory_host(script, plugins=("scripted-model", "sandbox-tools", "acp-presentation")) as host:
        agent = await _agent(host, work, script)
        for name, path in (("edit", "../secret.txt"), ("edit", "link.txt"), ("write", str(tmp_path / "secret.txt"))):
            dsh_present_event(agent, _call(1, 1, f"c-{path}", name, path=path, old_string="outside", new_string="x",
                                           content="x"))
            (end,) = dsh_present_event(agent, _result(1, 1, f"c-{path}", name))
            assert [type(c) for c in end.content] == [wire.ContentOut], path  # the output, no diff
        dsh_present_event(agent, _call(1, 2, "bad", "edit", file_path="f.txt", old_string="zzz", new_string="y"))
        (end,) = dsh_present_event(agent, _result(1, 2, "bad", "edit", error=True))
        assert end.status == "failed" and [type(c) for c in end.content] == [wire.ContentOut]
        await agent.dispose()


async def test_the_diff_a_card_shows_is_recorded_for_load_bounded_and_only_for_a_card(scripted, tmp_path):
    """``dsh_after_tool`` writes the pair of texts a write's or edit's card shows into the log
    (``acp/file-change``) before the result commits: a text over 256 KiB is named, not kept; a
    call with no card (a program's nested call), a failed one, one outside the workspace: nothing."""
    from dsh_core.types import ToolCallBlock, ToolOutput  # dsh_after_tool's arguments, called directly

    script = scripted({})
    async with memory_host(script, plugins=("scripted-model", "sandbox-tools", "acp-presentation")) as host:
        agent = await _agent(host, tmp_path, script)
        notes = []
        agent.subscribe(lambda _agent, e: notes.append(e.data) if isinstance(e, Note) and e.kind == "acp/file-change" else None)
        big = "x" * (DIFF_MAX + 1)
        changes = {"small": FileChange(path=str(tmp_path / "a.txt"), before="a\n", after="b\n"),
                   "big": FileChange(path=str(tmp_path / "b.txt"), before=None, after=big),
                   "outside": FileChange(path="/etc/hostname", before="h", after="x"),
                   "failed": FileChange(path=str(tmp_path / "c.txt"), before=None, after="c"),
                   "p:code:1": FileChange(path=str(tmp_path / "d.txt"), before=None, after="d")}
        for call_id, change in changes.items():
            if ":code:" not in call_id:
                dsh_present_event(agent, _call(1, 1, call_id, "write", file_path=change.path, content=change.after))
            agent.state(FileChanges).record(call_id, change)
            out = ToolOutput.text("Error: no" if call_id == "failed" else "ok", is_error=call_id == "failed")
            assert dsh_after_tool(agent, ToolCallBlock(id=call_id, name="write", arguments="{}"), out) is None
        assert notes == [
            {"callId": "small", "path": str(tmp_path / "a.txt"), "oldText": "a\n", "newText": "b\n"},
            {"callId": "big", "path": str(tmp_path / "b.txt"), "skipped": "a text of the change is over 256 KiB"}]
        # the change stays for the live card
        assert agent.state(FileChanges).take("small") == changes["small"]
        await agent.dispose()


async def test_load_shows_a_recorded_diff_only_inside_the_workspace_and_bounded(scripted, tmp_path):
    """The note is read from a log, a file: a path outside the workspace, or a text over the
    bound, is not shown; a well-formed one is, on its call's final update."""
    script = scripted({})
    async with memory_host(script, plugins=("scripted-model", "sandbox-tools", "acp-presentation")) as host:
        agent = await _agent(host, tmp_path, script)
        notes = {"in": {"path": str(tmp_path / "a.txt"), "oldText": None, "newText": "a\n"},
                 "out": {"path": "/etc/hostname", "oldText": "h", "newText": "x"},
                 "big": {"path": str(tmp_path / "b.txt"), "oldText": None, "newText": "x" * (DIFF_MAX + 1)}}
        shown = {}
        for call_id, data in notes.items():
            dsh_present_replay(agent, _call(1, 1, call_id, "write", file_path=data["path"], content=data["newText"]))
            dsh_present_replay(agent, Note(kind="acp/file-change", data={"callId": call_id, **data}))
            (end,) = dsh_present_replay(agent, _result(1, 1, call_id, "write"))
            shown[call_id] = [(c.path, c.new_text) for c in end.content if isinstance(c, wire.DiffOut)]
        assert shown == {"in": [(str(tmp_path / "a.txt"), "a\n")], "out": [], "big": []}
        await agent.dispose()


def test_titles_are_one_clean_bounded_line():
    title = title_of("bash", {"command": "echo hi\nrm -rf /\x1b[2J\u202e"})
    assert title == "bash: echo hi ↵ rm -rf /\\x1b[2J\\u202e"  # controls shown as escapes, never acted on
    assert len(title_of("read", {"file_path": "x" * 500})) == 200
    assert title_of("mcp__notes__search", {"query": "release"}) == "mcp__notes__search release"
    assert title_of("bash", {"command": "npm run dev", "run_in_background": True}) == "bash (background): npm run dev"
    assert title_of("job_output", {"job_id": "job_2", "wait": True}) == "job_output job_2"
    assert title_of("skill", {"name": "release-notes"}) == "skill release-notes"
    assert title_of("web_search", {"queries": ["anyio", "trio"]}) == "web_search anyio; trio"


async def test_a_presentation_bug_costs_its_updates_never_the_answer(acp_agent, scripted, tmp_path):
    """A plugin whose dsh_present_event raises: the door still answers with the text."""
    from acp import text_block

    examples = tmp_path / "examples" / "broken-presenter"
    examples.mkdir(parents=True)
    (examples / "example.toml").write_text(
        '[example]\nfront-door = "acp-stdio"\nplugins = ["acp-transport", "scripted-model", "testkit-broken-presenter"]\n')
    script = scripted({"default": [{"text": "still here"}]})
    async with acp_agent(script, example="broken-presenter", env={"DSH_EXAMPLES_PATH": str(tmp_path / "examples")}) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("hi")])
        assert resp.stop_reason == "end_turn" and run.client.text(sid) == ["still here"]
        assert await run.close_stdin() == 0
    assert b"presenting AssistantMessageEvent failed" in bytes(run.stderr)


def test_every_update_it_sends_validates_against_the_acp_schema():
    from dsh_testing import check_frames

    updates = [
        wire.ToolCallStart(tool_call_id="c1", title="edit a.py", kind="edit", status="pending",
                           locations=[wire.ToolCallLocation(path="/w/a.py", line=3)], raw_input={"file_path": "a.py"}),
        wire.ToolCallProgress(tool_call_id="c1", status="completed", content=[
            wire.DiffOut(path="/w/a.py", old_text=None, new_text="x\n"),
            wire.ContentOut(content=wire.TextOut(text="ok"))]),
        wire.ThoughtChunk(content=wire.TextOut(text="hm"), message_id="msg_1"),
        wire.PlanUpdate(entries=[wire.PlanEntry(content="a", priority="medium", status="in_progress")]),
        wire.UsageUpdate(used=10, size=128000),
        wire.SessionInfoUpdate(title="t", updated_at="2026-12-02T12:00:00Z"),
    ]
    raw = b"".join(wire.encoder.encode(wire.Notification(method="session/update", params=wire.SessionNotification(
        session_id="s" * 32, update=u))) + b"\n" for u in updates)
    assert len(check_frames(raw)) == len(updates)
    bad = (b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"' + b"s" * 32
           + b'","update":{"sessionUpdate":"tool_call","title":"no id"}}}\n')
    with pytest.raises(AssertionError, match="violates ACP schema"):  # the check can fail
        check_frames(bad)


async def test_an_mcp_server_is_shown_failing_once_then_gone_or_back(scripted, tmp_path):
    """A server's failures reach the person once per outage (not once per retry), named as what
    happened: failed to start, went away, back, gone for good."""
    from dsh_core.types import McpConnected, McpFailed

    script = scripted({})
    async with memory_host(script, plugins=("scripted-model", "acp-presentation")) as host:
        agent = await _agent(host, tmp_path, script)

        def said(event):
            out = dsh_present_event(agent, event)
            return [u.content.text for u in out or ()]

        fail = dict(server="fx", transport="stdio", error="boom")
        assert said(McpFailed(**fail, retry_in=0.5)) == [
            "MCP server **fx** failed to start: boom. Its tools are unavailable until it connects (next try in 0.5 s)."]
        assert said(McpFailed(**fail, attempt=2, retry_in=1.0)) == []  # the same outage
        assert said(McpConnected(server="fx", transport="stdio", tools=2)) == [
            "MCP server **fx** is connected again (2 tools)."]
        assert said(McpConnected(server="fx", transport="stdio", tools=3)) == []  # a relisting: nothing to say
        assert said(McpFailed(**fail, retry_in=0.5))[0].startswith("MCP server **fx** went away: boom.")
        assert said(McpFailed(**fail, attempt=6)) == [
            "MCP server **fx** is not available: boom. Its tools are gone for the rest of this session."]
