"""The lsp tool against a real language server (basedpyright, the shipped Python default) in a real
confined process: the four operations, one-based UTF-16 positions, LSP_UNAVAILABLE, a server that
stays warm, restarts after it died and stops with its session; and the diagnostics a write or an
edit introduced, through the real agent loop."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import pytest
from dsh_lsp import LspServers

from conftest import MAIN, text
from dsh_core.types import ToolResultEvent

pytestmark = pytest.mark.anyio

FIXTURE = str(Path(__file__).with_name("fixture_server.py"))


def servers(session) -> LspServers:
    return session.agent.state(LspServers)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purposes
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


async def test_the_four_operations_answer_from_basedpyright(lsp_host, workspace):
    async with lsp_host() as s:
        hover = await s.call("lsp", operation="hover", file_path="main.py", line=3, character=15)
        definition = await s.call("lsp", operation="goToDefinition", file_path="main.py", line=3, character=15)
        references = await s.call("lsp", operation="findReferences", file_path="shapes.py", line=10, character=8)
        implementation = await s.call("lsp", operation="goToImplementation", file_path="shapes.py", line=6,
                                      character=10)
    assert "class Square(side: float)" in text(hover), text(hover)
    assert hover.structured["kind"] == "hover"
    assert text(definition) == "shapes.py:10:7"
    assert definition.structured["resolvedWorkspaceUri"] == workspace.as_uri()
    # the declaration is included; grouped by file in the order the server gave them
    assert sorted(text(references).splitlines()) == ["main.py:1:20", "main.py:3:14", "main.py:3:25", "shapes.py:10:7"]
    assert text(implementation).splitlines() == ["shapes.py:6:9", "shapes.py:14:9"]


async def test_positions_are_one_based_utf16(lsp_host, workspace):
    # "😀" is two UTF-16 code units: `v` is at UTF-16 column 11 (one-based), code point 10
    (workspace / "emoji.py").write_text('s = "😀"; v = 1\nprint(v)\n')
    async with lsp_host() as s:
        definition = await s.call("lsp", operation="goToDefinition", file_path="emoji.py", line=2, character=7)
        on = await s.call("lsp", operation="hover", file_path="emoji.py", line=1, character=11)
        before = await s.call("lsp", operation="hover", file_path="emoji.py", line=1, character=10)
    assert text(definition) == "emoji.py:1:11"
    assert "(variable) v" in text(on), text(on)
    assert "(variable) v" not in text(before), text(before)


async def test_arguments_are_checked(lsp_host):
    async with lsp_host() as s:
        zero = await s.call("lsp", operation="hover", file_path="main.py", line=0, character=1)
        frac = await s.call("lsp", operation="hover", file_path="main.py", line=1, character=1.5)
        op = await s.call("lsp", operation="rename", file_path="main.py", line=1, character=1)
        missing = await s.call("lsp", operation="hover", file_path="nope.py", line=1, character=1)
    assert (zero.code, text(zero)) == ("INVALID_ARGUMENTS", "Error: line must be a positive integer (one-based)")
    assert text(frac) == "Error: character must be a positive integer (one-based)"
    assert op.code == "INVALID_ARGUMENTS"
    assert missing.code == "NOT_FOUND"
    assert servers(s).running == {}  # nothing started for a call that could not be asked


async def test_no_server_for_the_file_is_the_originals_LSP_UNAVAILABLE(lsp_host, workspace):
    (workspace / "subject.ts").write_text("export const answer = 42\n")
    async with lsp_host() as s:
        ts = await s.call("lsp", operation="goToDefinition", file_path="subject.ts", line=1, character=7)
    async with lsp_host(lsp={"servers": {}}) as s:
        py = await s.call("lsp", operation="hover", file_path="main.py", line=1, character=1)
    assert (ts.is_error, ts.code, text(ts)) == (True, "LSP_UNAVAILABLE", 'Error: no LSP provider handles "subject.ts"')
    assert (py.code, text(py)) == ("LSP_UNAVAILABLE", 'Error: no LSP provider handles "main.py"')


async def test_an_answer_that_does_not_match_the_specification_fails_at_once(lsp_host, workspace):
    (workspace / "subject.ts").write_text("export const answer = 42\n")
    fixture = {"servers": {"fixture": {"command": [sys.executable, FIXTURE], "extensions": {".ts": "typescript"}}},
               "timeout-ms": 30_000}
    async with lsp_host(lsp=fixture) as s:
        with anyio.fail_after(10):  # not the 30 s timeout
            out = await s.call("lsp", operation="goToImplementation", file_path="subject.ts", line=1, character=14)
        again = await s.call("lsp", operation="goToDefinition", file_path="subject.ts", line=1, character=14)
    assert (out.code, text(out)) == ("LSP_SERVER_FAILED", "Error: the language server answered with a result that "
                                                         "does not match the LSP specification")
    assert text(again) == "subject.ts:1:7\nsubject.ts:2:7"  # the server is fine: only that answer was


async def test_a_server_that_publishes_no_diagnostics_costs_one_open_wait(lsp_host, workspace):
    (workspace / "a.ts").write_text("export const a = 1\n")
    (workspace / "b.ts").write_text("export const b = 2\n")
    quiet = {"servers": {"fixture": {"command": [sys.executable, FIXTURE], "extensions": {".ts": "typescript"},
                                     "initialization-options": {"quiet": True}, "open-wait-ms": 1500}}}
    async with lsp_host(lsp=quiet) as s:
        await s.call("lsp", operation="goToDefinition", file_path="a.ts", line=1, character=14)  # starts it
        t0 = anyio.current_time()
        out = await s.call("lsp", operation="goToDefinition", file_path="b.ts", line=1, character=14)
        took = anyio.current_time() - t0
    assert text(out) == "b.ts:1:7\nb.ts:2:7"
    assert took < 1.0, took  # the second new file did not wait the 1.5 s again


async def test_a_server_without_the_operation_says_so(lsp_host, workspace):
    (workspace / "subject.ts").write_text("export const answer = 42\nconsole.log(answer)\n")
    fixture = {"servers": {"fixture": {"command": [sys.executable, FIXTURE], "extensions": {".ts": "typescript"}}},
               "max-locations": 1}
    async with lsp_host(lsp=fixture) as s:
        refs = await s.call("lsp", operation="findReferences", file_path="subject.ts", line=1, character=14)
        definition = await s.call("lsp", operation="goToDefinition", file_path="subject.ts", line=1, character=7)
    assert refs.code == "LSP_UNSUPPORTED_OPERATION", text(refs)
    assert text(definition) == "subject.ts:1:7\n… 1 more location omitted (limit 1)."


async def test_the_server_stays_warm_restarts_after_it_died_and_stops_with_the_session(lsp_host):
    async with lsp_host() as s:
        await s.call("lsp", operation="hover", file_path="main.py", line=3, character=15)
        (first,) = servers(s).pids()
        await s.call("lsp", operation="hover", file_path="shapes.py", line=10, character=8)
        assert servers(s).pids() == [first]  # warm: the same process answered
        os.killpg(first, signal.SIGKILL)
        with anyio.fail_after(10):
            while alive(first):
                await anyio.sleep(0.05)
        again = await s.call("lsp", operation="hover", file_path="main.py", line=3, character=15)
        assert "class Square" in text(again), text(again)
        (second,) = servers(s).pids()
        assert second != first
        await s.agent.dispose()
        assert not alive(second)
        assert servers(s).running == {}


@pytest.mark.parametrize("mode", ["read-only", "session"])
async def test_subagents_share_their_roots_read_only_server(lsp_host, workspace, mode):
    from dsh_core.contracts import AgentSpec, ToolContext

    async with lsp_host(lsp={"mode": mode}) as s:
        child = s.host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=s.agent.spec.model,
                                              parent=s.agent))
        await s.call("lsp", operation="hover", file_path="main.py", line=3, character=15)
        ctx = ToolContext(agent=child, call_id="k1", tool_name="lsp", turn=1, step=1)
        out = await s.host.tools["lsp"].run(
            {"operation": "hover", "file_path": "main.py", "line": 3, "character": 15}, ctx)
        assert "class Square" in text(out)
        mine, childs = servers(s).pids(), child.state(LspServers).pids()
        if mode == "read-only":  # one server, the root's
            assert len(mine) == 1 and childs == []
        else:  # each session confines its own in its own tier
            assert len(mine) == 1 and len(childs) == 1 and childs != mine
        await child.dispose()


async def test_closing_the_host_stops_the_servers_of_every_session(lsp_host):
    async with lsp_host() as s:
        await s.call("lsp", operation="hover", file_path="main.py", line=3, character=15)
        (pid,) = servers(s).pids()
    assert not alive(pid)


# ---------------------------------------------------------------------- diagnostics after an edit


def reminders(s) -> list[str]:
    out = []
    for event in s.events:
        if isinstance(event, ToolResultEvent):
            out.append("\n".join(getattr(b, "text", "") for b in event.result.content))
    return out


def lsp_step(path: str = "main.py", line: int = 3, character: int = 15) -> dict:
    return {"tool": "lsp", "args": {"operation": "hover", "file_path": path, "line": line, "character": character}}


async def test_an_edit_that_breaks_the_code_brings_its_new_diagnostics(lsp_host, workspace):
    steps = [
        lsp_step(),
        {"tool": "read", "args": {"file_path": "main.py"}},
        {"tool": "edit", "args": {"file_path": "main.py", "old_string": "total([", "new_string": "totl(["}},
        {"tool": "write", "args": {"file_path": "fine.py", "content": "x: int = 1\n"}},
        {"text": "done"},
    ]
    async with lsp_host(steps) as s:
        await s.prompt()
    results = reminders(s)
    edit, write = results[2], results[3]
    assert edit.startswith("The file ") and "main.py has been updated successfully." in edit
    assert "The language server reports 1 new problem in main.py after this change:" in edit
    assert 'main.py:3:7: error: "totl" is not defined (reportUndefinedVariable)' in edit
    assert "<system-reminder>" in edit
    assert write.endswith("fine.py</path>\n<type>file</type>\n<content>\nCreated file\n</content>")  # no new problem, nothing added
    assert "totl" in (workspace / "main.py").read_text()


async def test_only_what_the_change_introduced_is_reported_and_bounded(lsp_host, workspace):
    (workspace / "main.py").write_text(MAIN + "broken: int = 'old'\n")  # a problem that was there before
    new = "".join(f"v{i}: int = 'x{i}'\n" for i in range(5))
    steps = [
        lsp_step(),
        {"tool": "write", "args": {"file_path": "main.py", "content": MAIN + "broken: int = 'old'\n" + new}},
        {"text": "done"},
    ]
    async with lsp_host(steps, lsp={"diagnostics-max": 2}) as s:
        await s.prompt()
    write = reminders(s)[1]
    assert "reports 5 new problems in main.py" in write, write
    assert "main.py:5:" in write and "main.py:6:" in write and "main.py:7:" not in write
    assert "'old'" not in write  # it was there before the change
    assert "… 3 more omitted (limit 2)." in write


async def test_no_diagnostics_when_turned_off_or_no_server_is_warm(lsp_host):
    edit = {"tool": "write", "args": {"file_path": "main.py", "content": "print(nope)\n"}}
    async with lsp_host([lsp_step(), edit, {"text": "done"}], lsp={"diagnostics": False}) as s:
        await s.prompt()
    assert reminders(s)[1].endswith("main.py</path>\n<type>file</type>\n<content>\nUpdated file\n</content>")
    async with lsp_host([edit, {"text": "done"}]) as s:  # no lsp call: no server runs, none is started
        await s.prompt()
        assert servers(s).running == {}
    assert reminders(s)[0].endswith("main.py</path>\n<type>file</type>\n<content>\nUpdated file\n</content>")


async def test_doctor_says_whether_each_servers_program_is_there():
    from dsh_lsp import ServerCheck, ServerConfig

    there = await ServerCheck("python", ServerConfig(command=["basedpyright-langserver", "--stdio"],
                                                     extensions={".py": "python"})).run()
    missing = await ServerCheck("rust", ServerConfig(command=["no-such-language-server"],
                                                     extensions={".rs": "rust"})).run()
    assert there.status == "ok" and there.detail.endswith("basedpyright-langserver serves .py")
    assert (missing.status, missing.detail) == (
        "warn", "'no-such-language-server' is not installed: lsp answers LSP_SERVER_FAILED for .rs")


async def test_a_server_that_is_not_installed_fails_the_call_not_the_session(lsp_host):
    missing = {"servers": {"python": {"command": ["no-such-language-server"], "extensions": {".py": "python"}}}}
    async with lsp_host(lsp=missing) as s:
        with anyio.fail_after(20):
            out = await s.call("lsp", operation="hover", file_path="main.py", line=1, character=1)
    assert out.code == "LSP_SERVER_FAILED", text(out)
    assert text(out).startswith("Error: could not start 'no-such-language-server': "), text(out)
    assert "No such file or directory" in text(out)  # the server's (or the sandbox's) own words
