"""Client MCP servers over ACP, through the official SDK client and a real ``dsh run`` on stdio:
``acp-editor`` takes a stdio server from ``session/new`` and the model calls its tool;
``acp-agent`` still refuses any with -32602 (ACP-3) and advertises no MCP capability."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import pytest
from acp import RequestError, text_block
from acp.schema import EnvVariable, HttpMcpServer, McpServerStdio
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from dsh_testing import SHIPPED_EXAMPLES, session_log, until

pytestmark = pytest.mark.anyio

FIXTURE = str(Path(__file__).resolve().parent / "fixture_server.py")


def _running_with(value: str) -> list[int]:
    """Live (not zombie) processes whose environment holds ``value``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and value.encode() in (entry / "environ").read_bytes() \
                    and "Z" not in (entry / "stat").read_text().rsplit(")", 1)[1][:3]:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _server(marks: Path) -> McpServerStdio:
    return McpServerStdio(name="fx", command=sys.executable, args=[FIXTURE, "stdio"],
                          env=[EnvVariable(name="FIXTURE_MARKS", value=str(marks))])


async def test_acp_editor_takes_a_stdio_server_and_the_model_calls_its_tool(acp_agent, scripted, tmp_path):
    script = scripted({"default": [{"tool": "mcp__fx__echo", "args": {"text": "from the editor"}},
                                   {"text": "the server said: {tool_result}"}]})
    marks = tmp_path / "marks"
    marks.mkdir()
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        init = await run.conn.initialize(protocol_version=1)
        caps = init.agent_capabilities.mcp_capabilities
        assert caps is not None and caps.http is True and caps.sse is False
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[_server(marks)])).session_id
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("call it")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid) == ["the server said: echo: from the editor"]
        assert (marks / "started").exists()  # its pid is the sandbox's own under bubblewrap (a pid namespace)
        assert await run.close_stdin() == 0
    assert not _running_with(str(marks))  # the server ended with the session, wherever it ran
    log = session_log(acp_agent.home, sid)
    connected = [e for e in log if e["type"] == "mcp/connected"]
    assert connected and connected[0]["server"] == "fx" and connected[0]["source"] == "client"
    assert str(marks) not in json.dumps(log)  # the server's env never reaches the log…
    assert str(marks) not in json.dumps(run.frames)  # …nor a frame


async def test_acp_editor_refuses_a_transport_it_does_not_take_and_a_duplicate_name(acp_agent, scripted, tmp_path):
    async with acp_agent(scripted({}), example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        sse = {"type": "sse", "name": "old", "url": "http://127.0.0.1:1/sse", "headers": []}
        with pytest.raises(RequestError) as err:
            await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[sse])
        assert err.value.code == -32602 and "sse MCP servers are not supported" in str(err.value)
        twice = [_server(tmp_path), _server(tmp_path)]
        with pytest.raises(RequestError) as err:
            await run.conn.new_session(cwd=str(run.cwd), mcp_servers=twice)
        assert err.value.code == -32602 and "two servers are named 'fx'" in str(err.value)
        assert await run.close_stdin() == 0


async def test_acp_agent_still_refuses_mcp_servers(acp_agent, scripted, tmp_path):
    async with acp_agent(scripted({})) as run:
        init = await run.conn.initialize(protocol_version=1)
        assert init.agent_capabilities.mcp_capabilities is None or (
            not init.agent_capabilities.mcp_capabilities.http and not init.agent_capabilities.mcp_capabilities.sse)
        assert "mcpCapabilities" not in json.dumps([f for f in run.frames if "result" in f])
        for servers in ([_server(tmp_path)], [HttpMcpServer(type="http", name="web", url="http://127.0.0.1:1/mcp", headers=[])]):
            with pytest.raises(RequestError) as err:
                await run.conn.new_session(cwd=str(run.cwd), mcp_servers=servers)
            assert err.value.code == -32602
            assert err.value.data == {"details": "mcpServers is not supported"}  # byte for byte as before
        assert await run.close_stdin() == 0


async def test_acp_editor_shows_a_server_that_fails_to_start_and_names_it_to_the_model(acp_agent, scripted):
    """Issue 42 bug 3: the person sees which server failed and why within a second of session/new
    (an agent message, and /status), and the model's call of its tool names the server."""
    script = scripted({"rules": [{"when": "^use it", "steps": [
        {"tool": "mcp__broken__lookup", "args": {"q": "x"}}, {"text": "the tool said: {tool_result}"}]}]})
    broken = McpServerStdio(name="broken", command=sys.executable, env=[], args=[
        "-c", "import sys; sys.stderr.write('config file missing: /etc/broken.toml\\n'); sys.exit(3)"])
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[broken])).session_id

        def said() -> list[str]:
            return [u.content.text for s, u in run.client.updates
                    if s == sid and u.session_update == "agent_message_chunk"]

        await until(said, timeout=1.0)  # within a second of the answer to session/new
        (message,) = said()
        assert message.startswith("MCP server **broken** failed to start: ")
        assert "config file missing: /etc/broken.toml" in message  # the server's own words: why
        frames = [json.loads(line) for line in bytes(run.stdout).splitlines() if line.strip()]
        answer = next(i for i, f in enumerate(frames) if (f.get("result") or {}).get("sessionId") == sid)
        shown = next(i for i, f in enumerate(frames) if f.get("method") == "session/update"
                     and f["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        assert answer < shown  # after the session/new answer, never before it

        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("/status")])
        assert resp.stop_reason == "end_turn"
        status = run.client.text(sid)[-1]
        assert "\n- **MCP server `broken`:** **failed** (stdio): " in status and "config file missing" in status

        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("use it")])
        assert resp.stop_reason == "end_turn"
        (card,) = [u for s, u in run.client.updates if s == sid and u.session_update == "tool_call_update"
                   and u.status == "failed"]
        shown = card.content[0].content.text
        assert "MCP server 'broken', which is not connected" in shown and "unknown tool" not in shown
        assert "config file missing" in shown
        assert await run.close_stdin() == 0
    results = [e["result"] for e in session_log(acp_agent.home, sid) if e["type"] == "tool/result"]
    assert "MCP server 'broken'" in results[0]["content"][0]["text"]  # what the model read


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("tier", ["workspace-write", "danger-full-access"])
async def test_acp_editor_runs_a_stdio_server_confined_like_bash_and_says_so(acp_agent, scripted, tmp_path,
                                                                            mechanism, tier):
    """Issue 42 bug 4: a stdio server from session/new starts in the session's sandbox tier (it
    cannot write outside the workspace and the temp dirs under workspace-write), unconfined only in
    danger-full-access, and /status says which."""
    require_mechanism(mechanism)
    outside = Path("/var/tmp") / f"dsh-mcp-confine-{secrets.token_hex(4)}"  # no writable root of the tier
    marks = tmp_path / "marks"
    marks.mkdir()
    server = McpServerStdio(name="fx", command="/bin/sh", env=[EnvVariable(name="FIXTURE_MARKS", value=str(marks))],
                            args=["-c", f'touch "{outside}" 2>/dev/null; exec "{sys.executable}" "{FIXTURE}" stdio'])
    script = scripted({"default": [{"tool": "mcp__fx__echo", "args": {"text": "hi"}}, {"text": "said: {tool_result}"}]})
    env = {**SHIPPED_EXAMPLES, "DSH_SANDBOX_MECHANISM": mechanism, "DSH_PERMISSION_MODE": tier}
    try:
        async with acp_agent(script, example="acp-editor", env=env) as run:
            await run.conn.initialize(protocol_version=1)
            sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[server])).session_id
            resp = await run.conn.prompt(session_id=sid, prompt=[text_block("call it")])
            assert resp.stop_reason == "end_turn" and run.client.text(sid) == ["said: echo: hi"]
            await run.conn.prompt(session_id=sid, prompt=[text_block("/status")])
            status = run.client.text(sid)[-1]
            assert await run.close_stdin() == 0
        if tier == "workspace-write":
            assert not outside.exists()  # the write outside the roots was refused
            assert "- **MCP server `fx`:** connected (stdio, " in status
            assert "; confined: workspace-write)" in status and f"sandbox workspace-write ({mechanism})" in status
        else:
            assert outside.exists()  # the person's own rights: said plainly
            assert "; unconfined: the session runs in danger-full-access)" in status
        connected = [e for e in session_log(acp_agent.home, sid) if e["type"] == "mcp/connected"]
        assert connected[0]["confinement"] == tier
    finally:
        outside.unlink(missing_ok=True)
