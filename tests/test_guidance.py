"""The tool-guidance seam (``dsh_register_guidance``, ``dsh_session_tool_names``): a section reaches
exactly the agents that have one of its tools, after the ``dsh_system_prompt`` sections, in one
fixed order; and the shipped compositions get the shipped sections that way."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsh_core import CompositionError, FunctionTool, Guidance, hookimpl
from dsh_core.compose import load_composition
from dsh_core.contracts import AgentSpec
from dsh_core.host import Host, load_plugins, make_plugin_manager
from dsh_core.types import RequestHeader, TextBlock, UserMessage
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio


def _tool(name: str) -> FunctionTool:
    async def fn(args, ctx):
        return name

    return FunctionTool(name, f"The {name} tool.", {"type": "object"}, fn)


class Tools:
    def __init__(self, *names: str) -> None:
        self.names = names

    @hookimpl
    def dsh_register_tools(self, register):
        for name in self.names:
            register(_tool(name))


class Sections:
    """Registers its sections in the order given (the spine must not care)."""

    def __init__(self, *sections: Guidance) -> None:
        self.sections = sections

    @hookimpl
    def dsh_register_guidance(self, register, host):
        for section in self.sections:
            register(section)


class Persona:
    @hookimpl
    def dsh_system_prompt(self, spec, host):
        return "PERSONA"


class SessionTool:
    """Declares ``private`` for the agents whose spec asks for it (as subagents does for report)."""

    @hookimpl
    def dsh_session_tool_names(self, spec, host):
        return ["private"] if spec.extra.get("private") else None


def _g(name: str, order: int, *tools: str) -> Guidance:
    return Guidance(name=name, order=order, tools=tools, text=f"<{name}>")


def _spec(tmp_path, script, **extra) -> AgentSpec:
    return AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script), extra=extra)


async def test_a_section_reaches_only_agents_with_one_of_its_tools_in_a_fixed_order(scripted, tmp_path):
    script = scripted({"default": [{"text": "ok"}]})
    sections = Sections(_g("tool:z", 5, "alpha"), _g("tool:absent", 1, "nope"), _g("tool:b", 5, "beta", "nope"),
                        _g("tool:a", 9, "alpha"), _g("tool:private", 0, "private"))
    async with memory_host(script, Tools("alpha", "beta"), sections, Persona(), SessionTool()) as host:
        prompt = host.system_prompt(_spec(tmp_path, script))
        # after the base and persona sections; order, then name; a section with no tool present is left out
        assert prompt.endswith("PERSONA\n\n<tool:b>\n\n<tool:z>\n\n<tool:a>")
        assert "<tool:absent>" not in prompt and "<tool:private>" not in prompt
        assert host.system_prompt(_spec(tmp_path, script)) == prompt  # the same text every time
        # a session tool declared for this spec brings its section (first: order 0)
        child = host.system_prompt(_spec(tmp_path, script, private=True))
        assert child.endswith("PERSONA\n\n<tool:private>\n\n<tool:b>\n\n<tool:z>\n\n<tool:a>")
        # and the agent's first request carries it
        agent = host.create_agent(_spec(tmp_path, script))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        (header,) = [e for e in host.session_store.logs[agent.session_id].events if isinstance(e, RequestHeader)]
        assert header.system == prompt


@pytest.mark.parametrize("sections, message", [
    ((_g("tool:x", 1, "alpha"), _g("tool:x", 2, "beta")), "two plugins register the guidance section 'tool:x'"),
    ((_g("tool:x", 1),), "names no tool"),
])
async def test_a_duplicate_or_toolless_section_stops_start_up(scripted, sections, message):
    with pytest.raises(CompositionError, match=message):
        async with memory_host(scripted({"default": []}), Tools("alpha", "beta"), Sections(*sections)):
            pass  # pragma: no cover - start-up fails


def _host(example: str, *, without: tuple[str, ...] = ()) -> Host:
    comp = load_composition(example)
    comp = replace(comp, plugins=tuple(p for p in comp.plugins if p not in without),
                   config={k: v for k, v in comp.config.items() if k not in without})  # a table nobody reads is refused
    pm = make_plugin_manager(trace=False)
    load_plugins(pm, comp)
    return Host(pm, comp)


def _names(host: Host, **extra) -> list[str]:
    return [g.name for g in host.guidance_for(AgentSpec(cwd="/w", provider="scripted", model="m", extra=extra))]


SHIPPED = ["tool:read", "tool:write", "tool:edit", "tool:glob", "tool:grep", "tool:bash", "tool:jobs",
           "tool:web_fetch", "tool:goal", "tool:workflow", "tool:ralph", "tool:subagent"]


def test_the_acp_agent_gets_the_shipped_sections_in_their_order_and_a_child_adds_report():
    host = _host("acp-agent")
    assert _names(host) == SHIPPED
    assert _names(host, **{"subagents.continuable": True}) == [*SHIPPED, "tool:report"]
    prompt = host.system_prompt(AgentSpec(cwd="/w", provider="scripted", model="m"))
    assert prompt.index("Current DSH file policy") < prompt.index("[exit code: N]")  # after the plugins' sections
    assert "job_output" in prompt and "the report tool" not in prompt


def test_a_composition_without_a_plugin_has_none_of_its_sections():
    host = _host("acp-agent", without=("jobs", "workflow"))
    assert _names(host) == [n for n in SHIPPED if n not in ("tool:jobs", "tool:workflow", "tool:ralph")]
    assert "job_output" not in host.system_prompt(AgentSpec(cwd="/w", provider="scripted", model="m"))
    bare = _host("acp-agent", without=("jobs", "workflow", "sandbox-tools", "subagents", "web", "goals"))
    assert _names(bare, **{"subagents.continuable": True}) == []
