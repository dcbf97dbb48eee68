"""Max tokens in the middle of a streamed tool call: the call is dropped, the next turn goes on."""

from __future__ import annotations

import pytest

from dsh_core import FunctionTool, hookimpl
from dsh_core.contracts import AgentSpec
from dsh_core.types import (
    AssistantMessage,
    AssistantMessageEvent,
    TextBlock,
    ToolCallBlock,
    ToolResultEvent,
    TurnEnd,
    UserMessage,
)
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio


class Echo:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    @hookimpl
    def dsh_register_tools(self, register):
        async def echo(args, ctx):
            self.calls.append(args)
            return f"ECHO {args['x']}"

        register(FunctionTool("echo", "Echo x.", {"type": "object"}, echo, parallel_safe=True))


CUT = {"finish": "length", "tools": [{"name": "echo", "args": {"x": "whole"}}, {"name": "echo", "args": {"x": "half"}}]}


@pytest.mark.parametrize("before", ["", "Let me echo both. "], ids=["nothing-before", "text-before"])
async def test_a_tool_call_cut_by_max_tokens_is_neither_run_nor_committed(scripted, tmp_path, before):
    script = scripted({"rules": [
        {"when": "^go", "steps": [{**CUT, "text": before} if before else CUT]},
        {"when": "^continue", "steps": [{"text": "carried on"}]},
    ]})
    tools = Echo()
    async with memory_host(script, tools) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        agent.submit(UserMessage(id="u2", content=[TextBlock(text="continue")]))
        await agent.wait_idle()
        events = host.session_store.logs[agent.session_id].events
        history = list(agent.history)

    assert tools.calls == []  # neither the whole call nor the half-streamed one ran
    assert not [e for e in events if isinstance(e, ToolResultEvent)]
    cut, after = [e for e in events if isinstance(e, AssistantMessageEvent)]
    # The cut message is logged with how it ended, and holds no tool call.
    assert cut.finish == "max-tokens" and not any(isinstance(b, ToolCallBlock) for b in cut.message.content)
    assert [b.text for b in cut.message.content] == ([before] if before else [])
    assert [e.reason for e in events if isinstance(e, TurnEnd)] == ["max-tokens", "completed"]
    assert after.message.content == [TextBlock(text="carried on")]
    # The model's history is a valid conversation: no dangling call, no empty assistant message.
    assert all(not isinstance(b, ToolCallBlock) for m in history for b in getattr(m, "content", []))
    assistants = [m for m in history if isinstance(m, AssistantMessage)]
    assert [m.content for m in assistants] == ([[TextBlock(text=before)]] if before else []) + [[TextBlock(text="carried on")]]

    # A restored agent rebuilds exactly that history from the log.
    async with memory_host(script, Echo()) as host2:
        restored = host2.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        restored.restore(events)
        assert list(restored.history) == history
