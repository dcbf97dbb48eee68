"""The lsp tool behind the real door: ``dsh run --example acp-extended`` over real stdio, driven by the
official ACP SDK client, with the real Python default (basedpyright) under the real sandbox. The
server starts on the first query, stays warm across turns, and is gone after ``session/close``,
after the client closes stdin, and after ``kill -9`` of dsh."""

from __future__ import annotations

import os
import signal

import anyio
import pytest
from acp import text_block
from dsh_sandbox_tools.testing import require_mechanism

from conftest import MAIN, SHAPES
from dsh_testing import REPO, session_log
from dsh_testing.harness import live_processes

pytestmark = pytest.mark.anyio

EXAMPLES = str(REPO / "examples")

SCRIPT = {"rules": [
    {"when": "^hover", "steps": [
        {"tool": "lsp", "args": {"operation": "hover", "file_path": "main.py", "line": 3, "character": 15}},
        {"text": "{tool_result}"}]},
    {"when": "^break", "steps": [
        {"tool": "write", "args": {"file_path": "main.py", "content": "from shapes import Square\n\nprint(totl([Square(2)]))\n"}},
        {"text": "{tool_result}"}]},
    {"when": "^where", "steps": [
        {"tool": "lsp", "args": {"operation": "goToDefinition", "file_path": "subject.ts", "line": 1, "character": 7}},
        {"text": "{tool_result}"}]},
]}


def servers_in(work) -> list[int]:
    """basedpyright processes serving ``work`` (their cwd), seen from outside any sandbox."""
    return live_processes(lambda argv, cwd: any(b"basedpyright" in a for a in argv[:3]) and cwd == str(work))


def seed(work) -> None:
    (work / "shapes.py").write_text(SHAPES)
    (work / "main.py").write_text(MAIN)
    (work / "subject.ts").write_text("export const answer = 42\n")


async def ask(run, sid: str, prompt: str) -> str:
    before = len("".join(run.client.text(sid)))
    resp = await run.conn.prompt(session_id=sid, prompt=[text_block(prompt)])
    assert resp.stop_reason == "end_turn"
    return "".join(run.client.text(sid))[before:]


async def test_hover_then_the_diagnostics_of_a_write_then_close(acp_agent, scripted):
    seed(acp_agent.work)
    async with acp_agent(scripted(SCRIPT), example="acp-extended", env={"DSH_EXAMPLES_PATH": EXAMPLES}) as run:
        sid = await run.start()
        assert "class Square(side: float)" in await ask(run, sid, "hover")
        (pid,) = servers_in(acp_agent.work)
        broke = await ask(run, sid, "break")  # the scripted model answers with what it read: the result
        assert "main.py</path>\n<type>file</type>\n<content>\nUpdated file\n</content><system-reminder>\n" in broke, broke
        assert 'main.py:3:7: error: "totl" is not defined (reportUndefinedVariable)' in broke
        assert servers_in(acp_agent.work) == [pid]  # the same server, warm across turns
        unavailable = await ask(run, sid, "where")
        assert unavailable == 'Error: no LSP provider handles "subject.ts"'
        await run.conn.close_session(session_id=sid)
        with anyio.fail_after(10):
            while servers_in(acp_agent.work):
                await anyio.sleep(0.05)
    results = [r for r in session_log(acp_agent.home, sid) if r.get("type") == "tool/result"]
    write = results[1]["result"]["content"]
    texts = [b["text"] for b in write]
    assert texts[0].endswith("main.py</path>\n<type>file</type>\n<content>\nUpdated file\n</content>")
    assert any('main.py:3:7: error: "totl" is not defined' in t and "<system-reminder>" in t for t in texts), texts
    assert results[2]["code"] == "LSP_UNAVAILABLE"


TIERS = {"bwrap": {"DSH_SANDBOX_MECHANISM": "bwrap"}, "landlock": {"DSH_SANDBOX_MECHANISM": "landlock"},
         "unconfined": {"DSH_PERMISSION_MODE": "danger-full-access"}}


@pytest.mark.parametrize("tier", list(TIERS))
@pytest.mark.parametrize("how", ["close-stdin", "kill-9"])
async def test_no_server_outlives_dsh(acp_agent, scripted, how, tier):
    if tier != "unconfined":
        require_mechanism(tier)
    seed(acp_agent.work)
    async with acp_agent(scripted(SCRIPT), example="acp-extended", env={"DSH_EXAMPLES_PATH": EXAMPLES, **TIERS[tier]},
                         check=False) as run:
        sid = await run.start()
        assert "class Square" in await ask(run, sid, "hover")
        assert len(servers_in(acp_agent.work)) == 1
        if how == "kill-9":
            os.kill(run.proc.pid, signal.SIGKILL)
            await run.proc.wait()
        else:
            await run.close_stdin()
        with anyio.fail_after(15):
            while servers_in(acp_agent.work):
                await anyio.sleep(0.05)


def test_the_acp_extended_demo_hovers_keylessly(tmp_path):
    """``dsh ask --example acp-extended … "lsp"``: the example's own demo script, the real server."""
    import subprocess
    import sys

    from dsh_testing import minimal_env

    work = tmp_path / "work"
    work.mkdir()
    (work / "main.py").write_text("import os\n")
    proc = subprocess.run([sys.executable, "-m", "dsh_core.cli", "ask", "--example", "acp-extended", "--provider",
                           "scripted", "--model", "demo.json", "lsp"], capture_output=True, timeout=120, cwd=work,
                          env=minimal_env(DSH_HOME=str(tmp_path / "home")))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().startswith("The language server says: ```python\n(module) os"), proc.stdout
