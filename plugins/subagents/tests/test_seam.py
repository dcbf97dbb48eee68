"""The subagent seam and the in-process providers, in one host (the scripted model plays the
parent and the children by rule; rules match the prompt, never the notices dsh adds)."""

from __future__ import annotations

import anyio
import pytest

from dsh_core.contracts import AgentSpec
from dsh_core.types import (
    HistoryForked,
    SubagentSettled,
    SubagentStarted,
    TextBlock,
    ToolResultEvent,
    TurnEnd,
    UserMessage,
    UserMessageEvent,
)
from dsh_testing import memory_host, streaming

pytestmark = pytest.mark.anyio

PLUGINS = ("scripted-model", "subagents")


def _events(agent):
    seen = []
    agent.subscribe(lambda a, e: seen.append(e))
    return seen


async def _turn(agent, text, events):
    agent.submit(UserMessage(id=f"u{len(events)}", content=[TextBlock(text=text)]))
    with anyio.fail_after(10):
        await agent.wait_idle()
    return [e for e in events if isinstance(e, ToolResultEvent)]


async def test_a_foreground_spawn_answers_with_the_childs_final_text(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^delegate", "steps": [
            {"tool": "subagent", "args": {"description": "say ok", "prompt": "child: say CHILD_OK",
                                          "run_in_background": False}},
            {"text": "parent got: {tool_result}"}]},
        {"when": "^child:", "steps": [{"text": "CHILD_OK"}]},
    ]})
    async with memory_host(script, plugins=PLUGINS) as host:
        parent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        events = _events(parent)
        (result,) = await _turn(parent, "delegate", events)
        assert result.result.content[0].text == "CHILD_OK" and not result.result.is_error
        (started,) = [e for e in events if isinstance(e, SubagentStarted)]
        assert started.provider == "spawn" and not started.background and started.session
        assert [e.stop for e in events if isinstance(e, SubagentSettled)] == ["completed"]
        (child,) = parent.children  # continuable: it stays, idle, linked to its parent
        assert child.header.parent_session == parent.session_id and child.header.parent_call == "call_1"
        assert child.spec.depth == 1


async def test_a_background_child_settles_as_one_notice_in_the_next_request(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^start", "steps": [
            {"tool": "subagent", "args": {"description": "bg", "prompt": "child: work"}},
            {"text": "started: {tool_result}"}]},
        {"when": "^child:", "steps": [{"text": "CHILD_DONE"}]},
        {"when": "^next", "steps": [{"text": "next turn"}]},
    ]})
    async with memory_host(script, plugins=PLUGINS) as host:
        parent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        events = _events(parent)
        (result,) = await _turn(parent, "start", events)
        text = result.result.content[0].text
        assert text.startswith("started subagent agent_")
        (child,) = parent.children
        with anyio.fail_after(10):
            while not any(isinstance(e, SubagentSettled) for e in events):
                await anyio.sleep(0.01)
        await _turn(parent, "next", events)
        notices = [e.message for e in events if isinstance(e, UserMessageEvent) and e.message.source == "notice"]
        assert len(notices) == 1 and "CHILD_DONE" in notices[0].content[0].text and "completed" in notices[0].content[0].text
        assert parent.history[-1].content[0].text == "next turn"  # the rule matched the prompt, not the notice


async def test_a_fork_starts_from_the_parents_completed_history(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^remember", "steps": [{"text": "remembered"}]},
        {"when": "^fork", "steps": [
            {"tool": "subagent_fork", "args": {"description": "recall", "prompt": "what was the codeword?"}},
            {"text": "fork said: {tool_result}"}]},
        {"when": "codeword\\?$", "steps": [{"text": "history had {tool_result}"}]},
    ]})
    async with memory_host(script, plugins=PLUGINS) as host:
        parent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        events = _events(parent)
        await _turn(parent, "remember the codeword BLUE", events)
        seen: list = []
        host.models["scripted"].stream, original = None, host.models["scripted"].stream

        def spy(request):
            seen.append(request)
            return original(request)

        host.models["scripted"].stream = spy
        (result,) = await _turn(parent, "fork it", events)
        assert not result.result.is_error
        child_requests = [r for r in seen if r.session_id != parent.session_id]
        first = child_requests[0]
        texts = ["".join(getattr(b, "text", "") for b in m.content) for m in first.messages]
        assert texts[:2] == ["remember the codeword BLUE", "remembered"] and texts[2] == "what was the codeword?"
        assert first.system == parent.system and [t.name for t in first.tools] == [t.name for t in seen[0].tools]
        assert not parent.children  # one-shot: disposed with its answer


async def test_depth_and_live_caps_refuse_before_anything_starts(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^nest", "steps": [
            {"tool": "subagent", "args": {"description": "d", "prompt": "nest deeper", "run_in_background": False}},
            {"text": "got: {tool_result}"}]},
    ]})
    async with memory_host(script, plugins=PLUGINS) as host:
        parent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        events = _events(parent)
        (result,) = await _turn(parent, "nest", events)
        assert "depth limit" in result.result.content[0].text  # the child's own call was refused
        (child,) = parent.children
        assert not child.children
    async with memory_host(script, plugins=PLUGINS, config={"subagents": {"max-live": 1, "max-depth": 3}}) as host:
        parent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        events = _events(parent)
        (result,) = await _turn(parent, "nest", events)
        assert "got: Error: 1 subagents are live in this process (the cap is 1)" in result.result.content[0].text
        (child,) = parent.children
        assert not child.children  # nothing started over the cap
