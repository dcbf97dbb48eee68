"""workflow: the ``workflow`` tool (a model-written script that fans out subagents, run read-only
in the code runtime) and the ``ralph`` tool (a fixed loop of fresh subagents until one reports the
objective met). Both start their members on the spine's subagent seam (``spawn`` by default) and
need a code runtime (code-mode; ``mode = "runtime"`` mounts it without run_code). See README.md."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from dsh_core import FunctionTool, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.protocols import Host, ToolContext
from dsh_core.types import ToolOutput

from .members import Caps
from .ralph import run_ralph
from .script import run_workflow

NAME = "workflow"


class WorkflowConfig(PluginConfig):
    """[config.workflow]"""

    max_agents: Annotated[int, Meta(ge=1, description="agents one workflow run may start in all")] = 32
    concurrency: Annotated[int, Meta(ge=1, description="agents of one workflow run working at once")] = 4
    max_depth: Annotated[int, Meta(ge=0, description="deepest level a member may be at (1: the caller's children)")] = 1
    max_rounds: Annotated[int, Meta(ge=1, description="the most rounds ralph may be asked for")] = 10
    provider: Annotated[str, Meta(min_length=1, description="the subagent provider members start on")] = "spawn"


@hookimpl
def dsh_config_type() -> tuple[str, type[PluginConfig]]:
    return NAME, WorkflowConfig


WORKFLOW_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "meta": {
            "type": "object",
            "description": "What the workflow is: {\"name\": short name, \"description\": one line}.",
            "properties": {"name": {"type": "string"}, "description": {"type": "string"}},
        },
        "script": {
            "type": "string",
            "description": (
                "The body of an async Python function (top-level await; end with `return <JSON value>`). Hooks: "
                "`await agent(prompt, *, schema=None, label=None, phase=None, provider=None, model=None)` runs a "
                "fresh subagent and gives its final text (or the JSON value it answered, checked against "
                "`schema`), or None if it failed; `await parallel([lambda: agent(...), ...])`; "
                "`await pipeline(items, *stages)` (each stage an async function of one item); `phase(title)`; "
                "`log(message)`; `args`. The script itself cannot write files or reach the network: the agents "
                "do the work."
            ),
        },
        "args": {"description": "Any JSON value, available to the script as `args`."},
    },
    "required": ["script"],
    "additionalProperties": False,
}

RALPH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "objective": {"type": "string", "description": "What the rounds work toward, checkable when met."},
        "max_rounds": {"type": "integer", "minimum": 1, "description": "The most rounds to run (default 5)."},
    },
    "required": ["objective"],
    "additionalProperties": False,
}


@hookimpl
def dsh_register_tools(register: Any, host: Host) -> None:
    config = host.config_for(WorkflowConfig)
    caps = Caps(max_agents=config.max_agents, concurrency=config.concurrency, max_depth=config.max_depth,
                provider=config.provider)

    async def workflow(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return await run_workflow(args, ctx, caps)

    async def ralph(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return await run_ralph(args, ctx, caps, config.max_rounds)

    register(FunctionTool(
        "workflow",
        "Run an orchestration script that fans work out to subagents (fresh agents with your tools and workspace) "
        "and combines their answers: parallel reviews, map-reduce over files, multi-stage pipelines. Returns what "
        "the script returns.",
        WORKFLOW_PARAMETERS, workflow, kind="think"))
    register(FunctionTool(
        "ralph",
        "Work on an objective in rounds: each round a fresh subagent continues the work in the workspace from "
        "what the earlier rounds reported, until one reports the objective met or the rounds run out.",
        RALPH_PARAMETERS, ralph, kind="think"))


@hookimpl
def dsh_register_guidance(register: Any, host: Host) -> None:
    from .guidance import SECTIONS  # the texts live in their own module (guidance.py)

    for section in SECTIONS:
        register(section)
