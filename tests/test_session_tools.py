"""The per-session tool seam (``dsh_session_tools`` / ``ToolSource`` / ``Agent.publish_tools``):
a session's own tools (an MCP server's) come and go beside the host's, the first turn waits
until each source is ready, and disposing the session ends its sources."""

from __future__ import annotations

import anyio
import pytest

from dsh_core import FunctionTool, hookimpl
from dsh_core.contracts import AgentSpec
from dsh_core.types import RequestHeader, TextBlock, ToolResultEvent, UserMessage
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio


def _tool(name: str, answer: str) -> FunctionTool:
    async def fn(args, ctx):
        return answer

    return FunctionTool(name, f"The {name} tool.", {"type": "object"}, fn)


class Source:
    """A tool source that publishes after ``delay`` and then waits for ``more`` to publish again."""

    def __init__(self, name: str, tools: list, delay: float = 0.0, fail: bool = False) -> None:
        self.name, self.tools, self.delay, self.fail = name, tools, delay, fail
        self.more = anyio.Event()
        self.later: list = []
        self.ended = anyio.Event()
        self.cancelled = False

    async def serve(self, session, ready):
        try:
            await anyio.sleep(self.delay)
            if self.fail:
                raise RuntimeError("the server is gone")
            session.publish_tools(self.name, self.tools)
            ready()
            await self.more.wait()
            session.publish_tools(self.name, self.later)
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        finally:
            self.ended.set()


class Sources:
    def __init__(self, *sources: Source) -> None:
        self.sources = sources

    @hookimpl
    def dsh_session_tools(self, session, host):
        return self.sources[0] if len(self.sources) == 1 else None


class Native:
    @hookimpl
    def dsh_register_tools(self, register):
        register(_tool("native", "from the host"))


async def test_the_first_turn_waits_for_the_source_and_the_model_calls_its_tool(scripted, tmp_path):
    script = scripted({"default": [{"tool": "mcp__demo__echo", "args": {}}, {"text": "saw {tool_result}"}]})
    source = Source("demo", [_tool("mcp__demo__echo", "echoed")], delay=0.2)
    async with memory_host(script, Sources(source), Native()) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        with anyio.fail_after(10):
            agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
            await agent.wait_idle()
        events = list(host.session_store.logs[agent.session_id].events)
        (header,) = [e for e in events if isinstance(e, RequestHeader)]
        assert [t["name"] for t in header.tools] == ["native", "mcp__demo__echo"]
        (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
        assert result.result.content[0].text == "echoed" and not result.result.is_error
        await agent.dispose()
        assert source.cancelled and source.ended.is_set()


async def test_a_new_set_replaces_the_old_one_and_a_taken_name_is_skipped(scripted, tmp_path, capfd):
    script = scripted({"default": [{"text": "one"}, {"text": "two"}]})
    source = Source("demo", [_tool("native", "shadow"), _tool("mcp__demo__a", "a")])
    source.later = [_tool("mcp__demo__b", "b")]
    async with memory_host(script, Sources(source), Native()) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        with anyio.fail_after(10):
            agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
            await agent.wait_idle()
            assert list(agent.tools) == ["native", "mcp__demo__a"]
            assert agent.tools["native"] is host.tools["native"]  # the host's own tool stays
            assert "tool 'native' of demo is not added" in capfd.readouterr().err
            source.more.set()
            while "mcp__demo__b" not in agent.tools:
                await anyio.sleep(0.01)
            assert list(agent.tools) == ["native", "mcp__demo__b"]
            agent.submit(UserMessage(id="u2", content=[TextBlock(text="again")]))
            await agent.wait_idle()
        headers = [e for e in host.session_store.logs[agent.session_id].events if isinstance(e, RequestHeader)]
        assert [[t["name"] for t in h.tools] for h in headers] == [["native", "mcp__demo__a"], ["native", "mcp__demo__b"]]
        await agent.dispose()


async def test_the_same_set_again_leaves_the_request_prefix_alone(scripted, tmp_path):
    script = scripted({"default": [{"text": "one"}, {"text": "two"}]})
    tools = [_tool("mcp__demo__a", "a")]
    source = Source("demo", tools)
    source.later = tools
    async with memory_host(script, Sources(source)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        with anyio.fail_after(10):
            agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
            await agent.wait_idle()
            source.more.set()
            await anyio.sleep(0.05)
            agent.submit(UserMessage(id="u2", content=[TextBlock(text="again")]))
            await agent.wait_idle()
        headers = [e for e in host.session_store.logs[agent.session_id].events if isinstance(e, RequestHeader)]
        assert len(headers) == 1  # no second header: the request's prefix did not change
        await agent.dispose()


async def test_a_failing_source_is_reported_and_the_session_goes_on_without_it(scripted, tmp_path, capfd):
    script = scripted({"default": [{"text": "fine"}]})
    source = Source("demo", [], delay=0.05, fail=True)
    async with memory_host(script, Sources(source)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        with anyio.fail_after(10):
            agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
            await agent.wait_idle()
        assert "tool source 'demo' of session" in capfd.readouterr().err
        assert agent.tools == {}
        await agent.dispose()


async def test_disposing_a_session_whose_source_never_got_ready_ends_it(scripted, tmp_path):
    script = scripted({"default": [{"text": "never"}]})
    source = Source("demo", [], delay=3600)
    async with memory_host(script, Sources(source)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await anyio.sleep(0.05)
        assert agent.busy
        with anyio.fail_after(10):
            await agent.dispose()  # the waiting turn is cancelled, the source with it
        assert source.cancelled
