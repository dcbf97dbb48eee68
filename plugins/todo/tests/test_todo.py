"""todo through the real agent loop: todo_write replaces the list, bad input is an error result,
the current list is appended (never rewritten) every remind-every tool results while items are open."""

from __future__ import annotations

import dsh_todo
import pytest

from dsh_core import ConfigError, FunctionTool, hookimpl
from dsh_core.config import decode
from dsh_core.contracts import AgentSpec
from dsh_core.types import TextBlock, ToolResultEvent, UserMessage
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio


class Echo:
    @hookimpl
    def dsh_register_tools(self, register):
        async def echo(args, ctx):
            return "echo"

        register(FunctionTool("echo", "Echo.", {"type": "object"}, echo, parallel_safe=True))


def _write(*items):
    return {"tool": "todo_write", "args": {"todos": [{"content": c, "status": s} for c, s in items]}}


async def _run(script, tmp_path, config=None):
    async with memory_host(script, Echo(), plugins=("scripted-model", "todo"), config=config) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        assert agent.offered[-1] == "todo_write"  # appended after the other tools
        agent.submit(UserMessage(id="u", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        return [e for e in host.session_store.logs[agent.session_id].events if isinstance(e, ToolResultEvent)]


async def test_todo_write_replaces_the_list_and_renders_it(scripted, tmp_path):
    script = scripted({"default": [_write(("a", "completed"), ("b", "in_progress"), ("c", "pending")),
                                   _write(("only", "pending")), {"text": "ok"}]})
    first, second = await _run(script, tmp_path)
    assert first.result.content[0].text.endswith("Todo list (1/3 completed):\n[x] a\n[>] b\n[ ] c")
    assert second.result.content[0].text.endswith("Todo list (0/1 completed):\n[ ] only")


@pytest.mark.parametrize("todos", [None, [{"content": "", "status": "pending"}], [{"content": "x", "status": "done"}],
                                   ["x"]])
async def test_bad_lists_are_error_results_and_keep_the_old_list(scripted, tmp_path, todos):
    script = scripted({"default": [{"tool": "todo_write", "args": {"todos": todos}}, {"text": "ok"}]})
    (result,) = await _run(script, tmp_path)
    assert result.result.is_error and result.code == "INVALID_ARGUMENTS"


async def test_the_open_list_is_appended_every_n_tool_results(scripted, tmp_path):
    script = scripted({"default": [_write(("plan", "in_progress")), *[{"tool": "echo", "args": {}}] * 5,
                                   _write(("plan", "completed")), *[{"tool": "echo", "args": {}}] * 3,
                                   {"text": "ok"}]})
    results = await _run(script, tmp_path, config={"todo": {"remind-every": 2}})
    shown = [i for i, r in enumerate(results) if len(r.result.content) > 1]
    assert shown == [2, 4]  # echo #2 and #4 after the write; none once everything is completed
    assert "[>] plan" in results[2].result.content[1].text
    assert results[2].result.content[1].text.startswith("<system-reminder>")


def test_config_is_checked():
    with pytest.raises(ConfigError, match=r"example.toml: \[config.todo\] remind-every: expected `int` >= 1, found 0"):
        decode("todo", dsh_todo.TodoConfig, {"remind-every": 0}, where="example.toml")
