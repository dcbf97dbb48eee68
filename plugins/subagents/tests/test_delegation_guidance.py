"""The delegation guidance in real agents of one host: ``report``'s section is in the prompt of the
continuable child that has the tool, and in nobody else's; ``subagent``'s follows the configured
background default."""

from __future__ import annotations

import anyio
import pytest
from dsh_subagents.guidance import REPORT_SECTION

from dsh_core.contracts import AgentSpec
from dsh_core.types import RequestHeader, TextBlock, UserMessage
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio

PLUGINS = ("scripted-model", "subagents")


def _headers(host) -> dict[str, RequestHeader]:
    """Each session's first request header, by its origin (None: the parent)."""
    return {log.header.origin: next(e for e in log.events if isinstance(e, RequestHeader))
            for log in host.session_store.logs.values()}


async def test_only_the_continuable_child_is_told_to_report(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^delegate", "steps": [
            {"tool": "subagent", "args": {"description": "d", "prompt": "child: say OK"}},  # continuable, in the background
            {"tool": "subagent_fork", "args": {"description": "f", "prompt": "fork: say OK"}},
            {"text": "done"}]},
        {"when": "^child:", "steps": [{"text": "OK"}]},
        {"when": "^fork:", "steps": [{"text": "OK"}]},
    ]})
    async with memory_host(script, plugins=PLUGINS) as host:
        parent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        parent.submit(UserMessage(id="u1", content=[TextBlock(text="delegate")]))
        with anyio.fail_after(10):
            await parent.wait_idle()
            for child in list(parent.children):
                await child.wait_idle()
            await parent.wait_idle()  # the child's settlement may have woken it
        headers = _headers(host)
        assert set(headers) == {None, "subagent:spawn", "subagent:fork"}
        for origin, header in headers.items():
            has_tool = "report" in [t["name"] for t in header.tools]
            assert (REPORT_SECTION.text in header.system) == has_tool == (origin == "subagent:spawn"), origin
        assert headers["subagent:spawn"].system.endswith(REPORT_SECTION.text)  # the last section


@pytest.mark.parametrize("background", [True, False])
async def test_the_subagent_section_says_what_the_tool_does_by_default(scripted, tmp_path, background):
    script = scripted({"default": []})
    async with memory_host(script, plugins=PLUGINS, config={"subagents": {"background": background}}) as host:
        prompt = host.system_prompt(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        assert ("as they are by default" in prompt) is background
        assert ("unless you set run_in_background to true" in prompt) is not background
        assert "send_message" in prompt and "interrupt_agent" in prompt and "list_agents" in prompt
