"""mcp-client against real MCP servers (the SDK's, ``fixture_server.py``) over real stdio and
streamable HTTP on 127.0.0.1, through the real agent loop with a scripted model."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import pytest
from dsh_mcp_client.names import tool_name

from dsh_core import ConfigError
from dsh_core.contracts import AgentSpec
from dsh_core.types import McpConnected, McpFailed, TextBlock, ToolResultEvent, TurnEnd, UserMessage
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio

FIXTURE = str(Path(__file__).resolve().parent / "fixture_server.py")


def stdio(name: str = "fx", **extra):
    return {"name": name, "command": sys.executable, "args": [FIXTURE, "stdio"], **extra}


class Session:
    def __init__(self, host, agent) -> None:
        self.host, self.agent = host, agent

    @property
    def events(self):
        return list(self.host.session_store.logs[self.agent.session_id].events)

    def of(self, cls):
        return [e for e in self.events if isinstance(e, cls)]

    async def turn(self, text: str = "go", timeout: float = 30) -> None:
        with anyio.fail_after(timeout):
            self.agent.submit(UserMessage(id=f"u{len(self.of(TurnEnd))}", content=[TextBlock(text=text)]))
            await self.agent.wait_idle()

    def results(self) -> list[ToolResultEvent]:
        return self.of(ToolResultEvent)

    async def until(self, pred, timeout: float = 20) -> None:
        with anyio.fail_after(timeout):
            while not pred():
                await anyio.sleep(0.02)


@asynccontextmanager
async def session(scripted, tmp_path, steps, servers, **cfg):
    """``steps``: the steps of every prompt, or ``{prompt regex: steps}``."""
    script = scripted({"rules": [{"when": k, "steps": v} for k, v in steps.items()]} if isinstance(steps, dict)
                      else {"default": steps})
    config = {"mcp-client": {"servers": servers, **cfg}}
    async with memory_host(script, plugins=("scripted-model", "mcp-client"), config=config) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        try:
            yield Session(host, agent)
        finally:
            with anyio.fail_after(30):
                await agent.dispose()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, FIXTURE, "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the fixture's HTTP server did not start"
            time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# ---------------------------------------------------------------------------------------- names


def test_names_fit_deepseek_and_distinct_tools_never_collide():
    assert tool_name("files", "read_file") == "mcp__files__read_file"
    odd = tool_name("my.server", "read file")
    assert odd.startswith("mcp__my_server__read_file_") and len(odd) <= 64
    assert tool_name("my.server", "read file") == odd  # deterministic
    assert tool_name("my_server", "read file") != odd and tool_name("my.server", "read_file") != odd
    long = tool_name("s" * 40, "t" * 40)
    assert len(long) == 64 and long != tool_name("s" * 40, "t" * 41)
    import re

    for n in (odd, long, tool_name("ü", "∑"), tool_name("a", "")):
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", n), n


async def test_a_duplicate_server_name_is_refused_clearly(scripted, tmp_path):
    with pytest.raises(ConfigError, match=r"servers\[1\] \('fx'\): a server named 'fx' is already configured"):
        async with session(scripted, tmp_path, [{"text": "x"}], [stdio(), stdio()]):
            pass


async def test_an_http_server_without_a_url_is_refused(scripted, tmp_path):
    with pytest.raises(ConfigError, match="an http server needs a url"):
        async with session(scripted, tmp_path, [{"text": "x"}], [{"name": "web", "transport": "http"}]):
            pass


# ---------------------------------------------------------------------------------------- calls


async def test_stdio_tools_are_listed_before_the_first_turn_and_called(scripted, tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-must-not-leak-1234")
    steps = [
        {"tools": [{"name": "mcp__fx__echo", "args": {"text": "hi"}}, {"name": "mcp__fx__add", "args": {"a": 2, "b": 3}},
                   {"name": "mcp__fx__fail", "args": {"reason": "test"}}]},
        {"tools": [{"name": "mcp__fx__env", "args": {"name": "DEEPSEEK_API_KEY"}},
                   {"name": "mcp__fx__env", "args": {"name": "FIXTURE_OWN"}}, {"name": "mcp__fx__whereami", "args": {}}]},
        {"text": "done"},
    ]
    async with session(scripted, tmp_path, steps, [stdio(env={"FIXTURE_OWN": "own-value"})]) as s:
        await s.turn()
        (connected,) = s.of(McpConnected)
        assert (connected.server, connected.transport, connected.source) == ("fx", "stdio", "config")
        assert connected.tools == 10 and connected.protocol_version
        assert {"mcp__fx__echo", "mcp__fx__slow", "mcp__fx__grow"} <= set(s.agent.tools)
        assert s.agent.tools["mcp__fx__echo"].spec.kind == "read" and s.agent.parallel_safe("mcp__fx__echo")
        assert s.agent.tools["mcp__fx__add"].spec.kind is None and not s.agent.parallel_safe("mcp__fx__add")
        echo, add, fail, key, own, cwd = s.results()
        assert echo.result.content[0].text == "echo: hi" and not echo.result.is_error
        assert '"sum": 5' in add.result.content[0].text.replace(" ", "").replace('"sum":5', '"sum": 5')
        assert fail.result.is_error and fail.code == "MCP_TOOL_ERROR" and fail.result.content[0].text == "Error executing tool fail"
        assert key.result.content[0].text == "<unset>"  # the scrubbed environment
        assert own.result.content[0].text == "own-value"  # plus the server's own
        assert cwd.result.content[0].text == os.path.realpath(tmp_path)  # the session's directory
        log = b"".join(msgspec.json.encode(e) for e in s.events)
        assert b"sk-must-not-leak" not in log and b"own-value" in log  # the value a tool answered, not the config


async def test_a_structured_result_reaches_programs_and_an_image_only_a_model_that_sees(scripted, tmp_path):
    steps = [{"tools": [{"name": "mcp__fx__picture", "args": {}}]}, {"text": "done"}]
    async with session(scripted, tmp_path, steps, [stdio()]) as s:
        await s.turn()
        out = await s.agent.call_tool("mcp__fx__add", {"a": 1, "b": 2}, call_id="c1", turn=1, step=1)
        assert out.structured == {"sum": 3} and not out.is_error
        (picture,) = s.results()
        assert picture.result.content[0].text.startswith("a tiny picture\n[1 image(s) left out")


async def test_streamable_http_tools_are_called_with_the_configured_headers(scripted, tmp_path, http_server):
    steps = [{"tools": [{"name": "mcp__web__echo", "args": {"text": "over http"}}]}, {"text": "done"}]
    servers = [{"name": "web", "transport": "http", "url": http_server, "headers": {"Authorization": "Bearer secret-token-42"}}]
    async with session(scripted, tmp_path, steps, servers) as s:
        await s.turn()
        (connected,) = s.of(McpConnected)
        assert connected.transport == "http" and connected.tools == 10
        (echo,) = s.results()
        assert echo.result.content[0].text == "echo: over http"
        assert b"secret-token-42" not in b"".join(msgspec.json.encode(e) for e in s.events)
        assert "secret-token-42" not in repr(s.agent.describe_state())


async def test_two_servers_with_the_same_tool_name_both_answer(scripted, tmp_path):
    steps = [{"tools": [{"name": "mcp__one__echo", "args": {"text": "1"}}, {"name": "mcp__two__echo", "args": {"text": "2"}}]},
             {"text": "done"}]
    async with session(scripted, tmp_path, steps, [stdio("one"), stdio("two")]) as s:
        await s.turn()
        assert [r.result.content[0].text for r in s.results()] == ["echo: 1", "echo: 2"]
        names = list(s.agent.tools)
        assert names.index("mcp__one__echo") < names.index("mcp__two__echo")  # server order, not connection order


async def test_a_changed_tool_list_is_listed_again(scripted, tmp_path):
    steps = {"grow": [{"tools": [{"name": "mcp__fx__grow", "args": {"name": "fresh"}}]}, {"text": "grown"}],
             "call": [{"tools": [{"name": "mcp__fx__fresh", "args": {}}]}, {"text": "done"}]}
    async with session(scripted, tmp_path, steps, [stdio()]) as s:
        await s.turn("grow")
        await s.until(lambda: "mcp__fx__fresh" in s.agent.tools)
        await s.turn("call")
        assert s.results()[-1].result.content[0].text == "extra"
        assert [e.tools for e in s.of(McpConnected)] == [10, 11]


async def test_a_change_made_by_a_call_the_moment_the_tools_are_ready_is_heard(scripted, tmp_path):
    """A session may call a server's tool as soon as its tools are offered (a fast model): the
    change stream is acknowledged by then, so a change that call makes is heard."""
    async with session(scripted, tmp_path, {"go": [{"text": "ok"}]}, [stdio()]) as s:
        await s.agent._sources_ready.wait()
        grow = s.agent.tools["mcp__fx__grow"]
        await grow.link.client.call_tool(grow.remote, {"name": "fresh"})
        await s.until(lambda: "mcp__fx__fresh" in s.agent.tools, timeout=10)


# ---------------------------------------------------------------------------------------- failure


async def test_a_crashed_server_reconnects_and_answers_again(scripted, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    steps = {"crash": [{"tools": [{"name": "mcp__fx__crash", "args": {}}]}, {"text": "crashed"}],
             "again": [{"tools": [{"name": "mcp__fx__echo", "args": {"text": "back"}}]}, {"text": "done"}]}
    async with session(scripted, tmp_path, steps, [stdio(env={"FIXTURE_MARKS": str(marks)})]) as s:
        await s.turn("crash")
        first = int((marks / "started").read_text())
        crash = s.results()[0]
        assert crash.result.is_error and crash.code == "MCP_UNAVAILABLE"
        await s.until(lambda: len(s.of(McpConnected)) == 2)
        failed = s.of(McpFailed)
        assert failed[0].retry_in == 0.5 and failed[0].error == "the server closed the connection"
        await s.turn("again")
        assert s.results()[-1].result.content[0].text == "echo: back"
        assert int((marks / "started").read_text()) != first and not _alive(first)
        from dsh_core.types import RequestHeader

        assert len(s.of(RequestHeader)) == 1  # the same tools again: the request's prefix never changed


async def test_a_server_that_keeps_failing_goes_away_with_a_note_to_the_model(scripted, tmp_path):
    steps = [{"text": "first"}]
    servers = [{"name": "bad", "command": sys.executable, "args": ["-c", "import sys; sys.stderr.write('boom: no config\\n'); sys.exit(2)"],
                "reconnect-attempts": 1}]
    async with session(scripted, tmp_path, steps, servers) as s:
        await s.turn()  # not held up by the failures
        await s.until(lambda: any(e.retry_in is None for e in s.of(McpFailed)))
        first, last = s.of(McpFailed)
        assert first.retry_in == 0.5 and last.retry_in is None and last.attempt == 2
        assert "boom: no config" in first.error
        assert not [n for n in s.agent.tools if n.startswith("mcp__bad")]


async def test_a_server_that_never_answers_initialize_costs_its_connect_timeout(scripted, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    servers = [stdio("mute", env={"FIXTURE_HANG": "1", "FIXTURE_MARKS": str(marks)}, **{"connect-timeout": 1.0, "reconnect-attempts": 0})]
    async with session(scripted, tmp_path, [{"text": "went on"}], servers) as s:
        started = time.monotonic()
        await s.turn(timeout=15)
        assert time.monotonic() - started < 8
        (failed,) = s.of(McpFailed)
        assert failed.error.startswith("no answer within 1 s") and failed.retry_in is None
        await s.until(lambda: (marks / "started").exists())
        pid = int((marks / "started").read_text())
        await s.until(lambda: not _alive(pid))  # the mute server was killed, not left behind


async def test_a_call_past_its_timeout_is_cancelled_at_the_server(scripted, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    steps = [{"tools": [{"name": "mcp__fx__slow", "args": {"seconds": 30}}]}, {"text": "done"}]
    async with session(scripted, tmp_path, steps, [stdio(env={"FIXTURE_MARKS": str(marks)}, **{"call-timeout": 1.0})]) as s:
        await s.turn()
        (slow,) = s.results()
        assert slow.code == "TIMEOUT" and "did not answer within 1 s" in slow.result.content[0].text
        await s.until(lambda: (marks / "cancelled").exists())


async def test_a_cancelled_turn_cancels_the_mcp_call(scripted, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    steps = [{"tools": [{"name": "mcp__fx__slow", "args": {"seconds": 30}}]}, {"text": "never"}]
    async with session(scripted, tmp_path, steps, [stdio(env={"FIXTURE_MARKS": str(marks)})]) as s:
        s.agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await s.until(lambda: (marks / "slow-started").exists())
        s.agent.cancel()
        with anyio.fail_after(10):
            await s.agent.wait_idle()
        assert s.of(TurnEnd)[-1].reason == "aborted"
        await s.until(lambda: (marks / "cancelled").exists())


async def test_disposing_the_session_leaves_no_server_process(scripted, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    steps = [{"tools": [{"name": "mcp__fx__spawn", "args": {}}]}, {"text": "spawned"}]
    async with session(scripted, tmp_path, steps, [stdio(env={"FIXTURE_MARKS": str(marks)})]) as s:
        await s.turn()
        pid = int((marks / "started").read_text())
        child = int((marks / "child").read_text())
        assert _alive(pid) and _alive(child)
        assert os.getpgid(pid) == pid != os.getpgid(os.getpid())  # its own process group, the child in it
        assert os.getpgid(child) == pid
        with anyio.fail_after(15):
            await s.agent.dispose()
        deadline = time.monotonic() + 5
        while (_alive(pid) or _alive(child)) and time.monotonic() < deadline:
            await anyio.sleep(0.02)
        assert not _alive(pid) and not _alive(child)  # the server and the child it started


# ---------------------------------------------------------------------------------------- doctor


def test_doctor_shows_each_configured_server_reachable_with_its_tool_count(tmp_path):
    import json

    from dsh_testing import minimal_env

    example = tmp_path / "examples" / "with-mcp"
    example.mkdir(parents=True)
    example.joinpath("example.toml").write_text(f"""
[example]
front-door = "acp-stdio"
plugins = ["acp-transport", "scripted-model", "mcp-client"]

[route]
provider = "scripted"
model = "x.json"

[[config.mcp-client.servers]]
name = "fx"
command = {json.dumps(sys.executable)}
args = [{json.dumps(FIXTURE)}, "stdio"]
env = {{ SECRET_TOKEN = "tok-must-not-show-77" }}

[[config.mcp-client.servers]]
name = "missing"
command = "/nonexistent/mcp-server"
connect-timeout = 5.0
""")
    env = minimal_env(DSH_HOME=str(tmp_path / "home"), DSH_EXAMPLES_PATH=str(tmp_path / "examples"))
    proc = subprocess.run([sys.executable, "-m", "dsh_core.cli", "doctor", "--json", "--example", "with-mcp"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)
    report = {c["subject"]: c for c in json.loads(proc.stdout)["checks"]}
    assert report["mcp server fx"]["status"] == "ok" and "answered: 10 tool(s)" in report["mcp server fx"]["detail"]
    missing = report["mcp server missing"]
    assert missing["status"] == "warn" and "no such program" in missing["detail"]
    assert "tok-must-not-show-77" not in proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------- code mode


async def test_code_mode_programs_call_mcp_tools_and_are_shown_their_api(scripted, tmp_path):
    from dsh_sandbox_tools.testing import require_mechanism

    from dsh_core.types import UserMessageEvent

    require_mechanism("landlock")
    program = 'r = await tools.mcp__fx__add(a=2, b=3)\nreturn r["sum"] * 10'
    script = scripted({"default": [{"tool": "run_code", "args": {"code": program, "description": "add"}},
                                   {"text": "got {tool_result}"}]})
    config = {"mcp-client": {"servers": [stdio()]}, "code-mode": {"mode": "code"}}
    async with memory_host(script, plugins=("scripted-model", "sandbox-tools", "code-mode", "mcp-client"),
                           config=config) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        s = Session(host, agent)
        await s.turn()
        (result,) = s.results()
        assert result.result.content[0].text.strip() == "50", result.result.content[0].text
        shown = "\n".join(b.text for e in s.of(UserMessageEvent) for b in e.message.content if hasattr(b, "text"))
        assert "def mcp__fx__add(self, *, a: int, b: int)" in shown and "from its MCP servers" in shown
        assert "mcp__fx__add" not in agent.system  # the system prompt (the cached prefix) is untouched
        await s.turn()  # nothing new: no second API block
        shown_again = [e for e in s.of(UserMessageEvent) if "from its MCP servers" in str(e.message.content)]
        assert len(shown_again) == 1
        await agent.dispose()


async def test_an_image_is_kept_through_the_attachment_store_when_the_model_sees_images(scripted, tmp_path):
    from dsh_core.types import ImageBlock

    script = scripted({"capabilities": {"image_input": True},
                       "default": [{"tools": [{"name": "mcp__fx__picture", "args": {}}]}, {"text": "seen"}]})
    config = {"mcp-client": {"servers": [stdio()]}}
    async with memory_host(script, plugins=("scripted-model", "attachment-store", "mcp-client"), config=config) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        s = Session(host, agent)
        await s.turn()
        (picture,) = s.results()
        text, image = picture.result.content
        assert text.text == "a tiny picture" and isinstance(image, ImageBlock) and image.mime == "image/png"
        from fixture_server import PNG

        assert await host.attachment_store.read_image(image) == PNG
        await agent.dispose()


async def test_interception_hooks_see_mcp_names_and_can_deny_a_call(scripted, tmp_path):
    from dsh_core import hookimpl
    from dsh_core.interception import BeforeTool

    seen = []

    class NoFail:
        @hookimpl
        def dsh_before_tool(self, session, name, args, call_id, turn, step):
            seen.append(name)
            return BeforeTool(decision="deny", reason="not this one") if name == "mcp__fx__fail" else None

    script = scripted({"default": [{"tools": [{"name": "mcp__fx__fail", "args": {"reason": "x"}},
                                              {"name": "mcp__fx__echo", "args": {"text": "ok"}}]}, {"text": "done"}]})
    async with memory_host(script, NoFail(), plugins=("scripted-model", "mcp-client"),
                           config={"mcp-client": {"servers": [stdio()]}}) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        s = Session(host, agent)
        await s.turn()
        denied, echo = s.results()
        assert denied.code == "BLOCKED" and "not this one" in denied.result.content[0].text
        assert echo.result.content[0].text == "echo: ok"
        assert sorted(seen) == ["mcp__fx__echo", "mcp__fx__fail"]
        await agent.dispose()


# ---------------------------------------------------------------------------------------- a published server


async def test_the_published_reference_time_server_answers(scripted, tmp_path):
    """``mcp-server-time`` from the package registry (modelcontextprotocol/servers), a test dependency."""
    steps = [{"tools": [{"name": "mcp__time__get_current_time", "args": {"timezone": "UTC"}}]}, {"text": "done"}]
    servers = [{"name": "time", "command": sys.executable, "args": ["-m", "mcp_server_time"]}]
    async with session(scripted, tmp_path, steps, servers) as s:
        await s.turn()
        (connected,) = s.of(McpConnected)
        assert connected.tools == 2
        assert s.agent.tools["mcp__time__get_current_time"].spec.kind == "read"  # its readOnlyHint
        (now,) = s.results()
        assert not now.result.is_error and '"timezone": "UTC"' in now.result.content[0].text
        out = await s.agent.call_tool("mcp__time__convert_time", {"source_timezone": "UTC", "time": "12:00",
                                                                   "target_timezone": "Asia/Tokyo"},
                                      call_id="c", turn=1, step=1)
        assert out.structured["target"]["datetime"].endswith("21:00:00+09:00"), out.structured


async def test_a_server_gone_for_good_takes_its_tools_and_the_model_is_told(scripted, tmp_path):
    from dsh_core.types import UserMessageEvent

    marks = tmp_path / "marks"
    marks.mkdir()
    steps = {"crash": [{"tools": [{"name": "mcp__fx__crash", "args": {}}]}, {"text": "crashed"}],
             "again": [{"tools": [{"name": "mcp__fx__echo", "args": {"text": "still there?"}}]}, {"text": "done"}]}
    servers = [stdio(env={"FIXTURE_MARKS": str(marks), "FIXTURE_ONCE": "1"}, **{"reconnect-attempts": 1})]
    async with session(scripted, tmp_path, steps, servers) as s:
        await s.turn("crash")
        await s.until(lambda: any(e.retry_in is None for e in s.of(McpFailed)))
        crashed, refused = s.of(McpFailed)
        assert crashed.retry_in == 0.5 and "already started once" in refused.error
        assert not [n for n in s.agent.tools if n.startswith("mcp__fx")]
        await s.turn("again")
        echo = s.results()[-1]
        # not "unknown tool": the model is told whose tool it was, and why it is gone
        assert echo.code == "BLOCKED" and echo.result.is_error
        assert "mcp__fx__echo is a tool of MCP server 'fx', which is not connected (gone: " in echo.result.content[0].text
        notes = [b.text for e in s.of(UserMessageEvent) for b in e.message.content
                 if "did not come back" in getattr(b, "text", "")]
        assert len(notes) == 1 and "MCP server 'fx' stopped" in notes[0] and "mcp__fx__echo" in notes[0]


async def test_a_failed_relisting_keeps_the_last_good_set(caplog):
    import mcp_types
    from dsh_mcp_client.config import ServerSpec
    from dsh_mcp_client.link import ServerLink

    class Agentish:
        cwd = "/"

        def emit(self, event):
            pass

    class Flaky:
        protocol_version = "2025-11-25"

        async def list_tools(self, cursor=None, cache_mode="use"):
            raise RuntimeError("the listing broke")

    changed = []
    link = ServerLink(ServerSpec(name="fx", transport="stdio", connect_timeout=1), Agentish(), lambda: changed.append(1))
    link._set([mcp_types.Tool(name="keep", input_schema={"type": "object"})])
    async with anyio.create_task_group() as tg:
        tg.start_soon(link._resync, Flaky())
        link._relist.set()
        await anyio.sleep(0.1)
        tg.cancel_scope.cancel()
    assert [t.spec.name for t in link.tools] == ["mcp__fx__keep"] and changed == [1]
    assert "listing its changed tools failed; keeping the last list" in caplog.text


async def test_client_servers_count_only_when_accepted_and_never_over_a_configured_name(scripted, tmp_path, capfd):
    from dsh_core.types import McpServer

    script = scripted({"default": [{"text": "hi"}]})
    theirs = (McpServer(name="fx", command=sys.executable, args=(FIXTURE, "stdio"), env=(("FIXTURE_PREFIX", "client_"),)),
              McpServer(name="extra", command=sys.executable, args=(FIXTURE, "stdio")))
    for accept, expected in ((False, {"config"}), (True, {"config", "client"})):
        config = {"mcp-client": {"servers": [stdio()], "accept-client-servers": accept}}
        async with memory_host(script, plugins=("scripted-model", "mcp-client"), config=config) as host:
            agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script), mcp_servers=theirs))
            s = Session(host, agent)
            await s.turn()
            assert {e.source for e in s.of(McpConnected)} == expected
            assert "mcp__fx__echo" in agent.tools and "mcp__fx__client_echo" not in agent.tools  # the configured fx
            assert ("mcp__extra__echo" in agent.tools) is accept
            await agent.dispose()
    assert "the client's MCP server 'fx' is left out: a configured server has that name" in capfd.readouterr().err
