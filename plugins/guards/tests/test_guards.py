"""guards through the real agent loop: reminders at the thresholds only, canonical argument
comparison, per session; the step budget ends the turn ``max-steps`` with the answer committed."""

from __future__ import annotations

import dsh_guards
import pytest

from dsh_core import ConfigError, FunctionTool, hookimpl
from dsh_core.config import decode
from dsh_core.contracts import AgentSpec
from dsh_core.types import AssistantMessageEvent, TextBlock, ToolResultEvent, TurnEnd, UserMessage
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio


class Echo:
    @hookimpl
    def dsh_register_tools(self, register):
        async def echo(args, ctx):
            return f"echo {args.get('x')}"

        register(FunctionTool("echo", "Echo.", {"type": "object"}, echo, parallel_safe=True))


def _reminders(events):
    out = []
    for e in events:
        if isinstance(e, ToolResultEvent):
            out.append([c.text for c in e.result.content[1:]])
    return out


async def _session(script, tmp_path, prompts, config=None):
    async with memory_host(script, Echo(), plugins=("scripted-model", "guards"), config=config) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        for p in prompts:
            agent.submit(UserMessage(id=p, content=[TextBlock(text=p)]))
            await agent.wait_idle()
        return list(host.session_store.logs[agent.session_id].events)


async def test_identical_calls_get_reminders_at_3_5_8_never_a_block(scripted, tmp_path):
    calls = [{"tool": "echo", "args": {"x": 1, "y": 2}} if i % 2 else {"tool": "echo", "args": {"y": 2, "x": 1}}
             for i in range(9)]
    script = scripted({"default": [*calls, {"text": "done"}]})
    events = await _session(script, tmp_path, ["go"])
    extra = _reminders(events)
    assert [i + 1 for i, r in enumerate(extra) if r] == [3, 5, 8]  # key order does not make calls differ
    assert "echo with exactly these arguments 5 times" in extra[4][0]
    assert all(not e.result.is_error for e in events if isinstance(e, ToolResultEvent))
    assert events[-1].reason == "completed"


async def test_counts_span_the_session_and_differ_by_arguments_and_config(scripted, tmp_path):
    script = scripted({"default": [{"tool": "echo", "args": {"x": 1}}, {"tool": "echo", "args": {"x": 2}},
                                   {"text": "ok"}]})
    events = await _session(script, tmp_path, ["a", "b"], config={"guards": {"repeat-thresholds": [2]}})
    assert [bool(r) for r in _reminders(events)] == [False, False, True, True]  # 2nd of each, in turn 2


async def test_max_steps_ends_the_turn_with_what_was_said(scripted, tmp_path):
    script = scripted({"default": [{"text": f"s{n}", "tool": "echo", "args": {"x": n}} for n in range(10)]})
    events = await _session(script, tmp_path, ["go"], config={"guards": {"max-steps": 4}})
    said = [e.message.content[0].text for e in events if isinstance(e, AssistantMessageEvent)]
    assert said == ["s0", "s1", "s2", "s3"]
    assert len([e for e in events if isinstance(e, ToolResultEvent)]) == 4
    assert isinstance(events[-1], TurnEnd) and events[-1].reason == "max-steps"


async def test_env_overrides_max_steps(scripted, tmp_path, monkeypatch):
    monkeypatch.setenv("DSH_MAX_STEPS", "1")
    script = scripted({"default": [{"text": "s", "tool": "echo", "args": {}}, {"text": "never"}]})
    events = await _session(script, tmp_path, ["go"])
    assert events[-1].reason == "max-steps"


def test_config_is_checked():
    expected = {"max-steps": r"max-steps: expected `int` >= 1, found 0",
                "repeat-thresholds": r"repeat-thresholds\[0\]: expected `int` >= 2, found 1",
                "nope": r"unknown key 'nope'"}
    for bad, match in (({"max-steps": 0}, expected["max-steps"]), ({"repeat-thresholds": [1]}, expected["repeat-thresholds"]),
                       ({"repeat-thresholds": "3"}, r"repeat-thresholds: expected `array`, found '3'"),
                       ({"nope": 1}, expected["nope"])):
        with pytest.raises(ConfigError, match=r"example.toml: \[config.guards\] " + match):
            decode("guards", dsh_guards.GuardsConfig, bad, where="example.toml")
