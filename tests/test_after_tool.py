"""The spine's seams of issue 14: one spill for every tool result, ``dsh_after_tool`` (context
appended after a result, or a block replacing it; several answers folded) and ``dsh_check_step``."""

from __future__ import annotations

import pytest

from dsh_core import FunctionTool, hookimpl
from dsh_core.contracts import AgentSpec
from dsh_core.spill import bound, spill_path_for
from dsh_core.types import (
    AfterTool,
    AssistantMessageEvent,
    TextBlock,
    ToolOutput,
    ToolResultEvent,
    TurnEnd,
    UserMessage,
)
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio


class BigTool:
    """A tool that is not bash and knows nothing of spilling: ``big`` returns ``n`` bytes."""

    @hookimpl
    def dsh_register_tools(self, register):
        async def big(args, ctx):
            return "".join(f"{i:09d}\n" for i in range(args["n"] // 10))

        async def pre(args, ctx):  # already bounded by the tool itself (as bash does)
            out = ToolOutput.text("y" * 500)
            out.spill_path = "/somewhere/else.log"
            return out

        register(FunctionTool("big", "Big output.", {"type": "object"}, big, parallel_safe=True))
        register(FunctionTool("pre", "Pre-bounded.", {"type": "object"}, pre, parallel_safe=True))


class Folding:
    def __init__(self, tag: str, block: bool = False) -> None:
        self.tag, self.block, self.seen = tag, block, []

    @hookimpl
    def dsh_after_tool(self, session, call, output):
        self.seen.append((call.name, output.content[0].text[:20]))
        return AfterTool(context=[f"note from {self.tag}"], block=f"blocked by {self.tag}" if self.block else None)


class Budget:
    def __init__(self, limit: int) -> None:
        self.limit, self.asked = limit, []

    @hookimpl
    def dsh_check_step(self, session, turn, step):
        self.asked.append(step)
        return "stop" if step > self.limit else None


async def _run(script, tmp_path, *plugins, config=None):
    async with memory_host(script, *plugins, config=config) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        return agent, list(host.session_store.logs[agent.session_id].events)


def test_bound_keeps_small_text_and_spills_big_text_with_head_tail_and_path(tmp_path):
    path = spill_path_for(tmp_path, "s/1", "call:1")
    assert path == tmp_path / "s_1" / "call_1.log"
    assert bound("small", 100, path) == ("small", False)
    assert not path.exists()
    text = "".join(f"{i:04d}\n" for i in range(1000))
    shown, spilled = bound(text, 1000, path)
    assert spilled and path.read_text() == text  # the whole text, byte for byte
    assert shown.startswith("0000\n") and shown.endswith("0999\n") and str(path) in shown
    assert "bytes omitted; the full output (5000 bytes)" in shown and len(shown) < 1300


def test_a_spill_file_is_private_and_never_written_through_a_link(tmp_path):
    path = spill_path_for(tmp_path, "s", "c1")
    bound("x" * 2000, 100, path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    planted = spill_path_for(tmp_path, "s", "c2")
    planted.symlink_to(victim)  # placed by someone who can write in the spill root
    with pytest.raises(OSError):
        bound("y" * 2000, 100, planted)
    assert victim.read_text() == "keep me\n"


async def test_every_tool_result_over_the_limit_spills_once_through_the_spine(scripted, tmp_path, monkeypatch):
    monkeypatch.setenv("DSH_HOME", str(tmp_path / "home"))
    script = scripted({"default": [{"tools": [{"name": "big", "args": {"n": 5000}}, {"name": "big", "args": {"n": 500}},
                                              {"name": "pre", "args": {}}]}, {"text": "done"}]})
    agent, events = await _run(script, tmp_path, BigTool(), config={"spill": {"max-bytes": 1000}})
    big, small, pre = [e for e in events if isinstance(e, ToolResultEvent)]
    files = list((tmp_path / "home" / "spill").rglob("*.log"))
    assert files == [tmp_path / "home" / "spill" / agent.session_id / f"{big.result.call_id}.log"]
    assert files[0].read_text().count("\n") == 500
    assert str(files[0]) in big.result.content[0].text and len(big.result.content[0].text) < 1300
    assert small.result.content[0].text.count("\n") == 50  # under the limit: untouched
    assert pre.result.content[0].text == "y" * 500  # bounded by its tool already: not spilled again


async def test_after_tool_answers_are_folded_appended_in_order_and_a_block_replaces(scripted, tmp_path):
    script = scripted({"default": [{"tool": "big", "args": {"n": 100}}, {"text": "saw {tool_result}"}]})
    a, b = Folding("A"), Folding("B", block=True)
    _, events = await _run(script, tmp_path, BigTool(), a, b)
    (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
    texts = [c.text for c in result.result.content]
    # pluggy calls later registrations first; the loop folds in that order
    assert texts[0] == "blocked by B"
    assert sorted(texts[1:]) == ["<system-reminder>\nnote from A\n</system-reminder>",
                                 "<system-reminder>\nnote from B\n</system-reminder>"]
    assert result.result.is_error and result.code == "BLOCKED"
    assert a.seen == b.seen == [("big", "000000000\n000000001\n")]  # hooks saw the tool's own result


async def test_after_tool_context_alone_keeps_the_result_and_its_status(scripted, tmp_path):
    script = scripted({"default": [{"tool": "big", "args": {"n": 20}}, {"text": "ok"}]})
    _, events = await _run(script, tmp_path, BigTool(), Folding("A"))
    (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert [c.text for c in result.result.content] == ["000000000\n000000001\n",
                                                       "<system-reminder>\nnote from A\n</system-reminder>"]
    assert not result.result.is_error and result.code is None


async def test_check_step_stop_ends_the_turn_max_steps_with_every_call_answered(scripted, tmp_path):
    script = scripted({"default": [{"text": f"step {n}", "tool": "big", "args": {"n": 10}} for n in range(1, 9)],
                       })
    budget = Budget(2)
    _, events = await _run(script, tmp_path, BigTool(), budget)
    assert budget.asked == [1, 2, 3]
    said = [e for e in events if isinstance(e, AssistantMessageEvent)]
    assert [m.message.content[0].text for m in said] == ["step 1", "step 2"]  # committed answer so far
    assert len([e for e in events if isinstance(e, ToolResultEvent)]) == 2
    end = events[-1]
    assert isinstance(end, TurnEnd) and end.reason == "max-steps" and end.error is None


async def test_spill_config_is_checked(scripted, tmp_path):
    from dsh_core import ConfigError

    script = scripted({"default": [{"text": "hi"}]})
    with pytest.raises(ConfigError, match="max-bytes"):
        async with memory_host(script, config={"spill": {"max-bytes": "lots"}}):
            pass
