"""workflow: the ``workflow`` tool (a model-written script that fans out subagents, run read-only
in the code runtime) and the ``ralph`` tool (a fixed loop of fresh subagents until one reports the
objective met). Both start their members on the spine's subagent seam (``spawn`` by default) and
need a code runtime (code-mode; ``mode = "runtime"`` mounts it without run_code). See README.md."""

from __future__ import annotations

import os
from typing import Annotated, Any

from msgspec import Meta

from dsh_core import FunctionTool, config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.protocols import Host, ToolContext
from dsh_core.types import ToolOutput

from .members import Caps
from .ralph import run_ralph
from .script import run_workflow

NAME = "workflow"


class WorkflowConfig(PluginConfig):
    """[config.workflow]"""

    max_agents: Annotated[int, Meta(ge=1, description="agents one workflow run may start in all")] = 1000
    concurrency: Annotated[int, Meta(ge=0, description=(
        "agents of one workflow run working at once (0: min(16, max(1, cores - 2)))"))] = 0
    max_items: Annotated[int, Meta(ge=1, description="items one parallel() or pipeline() call may take")] = 4096
    max_depth: Annotated[int, Meta(ge=0, description="deepest level a member may be at (1: the caller's children)")] = 1
    max_result_chars: Annotated[int, Meta(ge=1, description="characters of a workflow's return value shown")] = 50_000
    max_rounds: Annotated[int, Meta(ge=1, description="ralph's default and ceiling for maxRounds")] = 256
    max_handoff_chars: Annotated[int, Meta(ge=1, description="characters of one ralph round report (as JSON)")] = 16_384
    max_ralph_result_chars: Annotated[int, Meta(ge=1, description="characters of ralph's result text")] = 16_384
    provider: Annotated[str, Meta(min_length=1, description="the subagent provider members start on")] = "spawn"


def concurrency(configured: int) -> int:
    """The configured limit, or the original's automatic one: a core or two left to the rest."""
    return configured or min(16, max(1, (os.cpu_count() or 1) - 2))


dsh_config_type = config_type_hook(NAME, WorkflowConfig)


WORKFLOW_DESCRIPTION = """Run a Python workflow script that orchestrates subagents at scale. Use it for work that fans out across many independent pieces (an audit over many files, a migration, research from several angles, adversarial checking of findings), where you write the orchestration as a script instead of delegating turn by turn.

The workflow's identity goes in the `meta` parameter as JSON: `name` (short kebab-case) and `description` strings are required; `whenToUse` (string) and `phases` (an array of `{title, detail?, provider?, model?}`) are optional. The `script` parameter is only the body of an async Python function (top-level `await`); end it with `return <value>`, a JSON value, which is this tool's result.

Hooks in the script body:
- `await agent(prompt, *, schema=None, label=None, phase=None, provider=None, model=None)`: run one fresh subagent to the end. Without `schema` it gives the child's final text; with `schema` (an object JSON Schema) the JSON value it answered, checked against the schema. It gives `None` when the child fails (drop those with `[r for r in results if r]`). `label` names it, `phase` groups it, `provider`/`model` pick another LLM (a model the session's provider lists).
- `await pipeline(items, *stages)`: each item through the async stages (each takes the previous stage's value) on its own, with no barrier between stages; prefer it for multi-stage work.
- `await parallel(thunks)`: run zero-argument callables (`lambda: agent(...)`) side by side and wait for all of them (a barrier).
- `phase(title)` starts a progress phase; `log(message)` narrates progress; `args` is the call's `args`, as given.

A misused hook (a bad argument, a schema that is not an object) or a tripped cap ends the whole script with an error. Caps on agents in all and at once apply; the script itself cannot write files or reach the network: the agents do the work, the script only coordinates them. The call returns when the script finishes."""

WORKFLOW_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "script": {
            "type": "string",
            "description": "The Python workflow script body (top-level await allowed; end with `return <json-value>`).",
        },
        "meta": {
            "type": "object",
            "description": "The workflow identity block (plain JSON, never code).",
            "properties": {
                "name": {"type": "string", "description": "Short kebab-case workflow name."},
                "description": {"type": "string", "description": "One-line description of what the workflow does."},
                "whenToUse": {"type": "string", "description": "Optional guidance on when this workflow applies."},
                "phases": {
                    "type": "array",
                    "description": "Optional phase declarations matched by phase() calls.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "title": {"type": "string", "description": "The phase title phase() calls match exactly."},
                            "detail": {"type": "string", "description": "Optional one-line description of the phase."},
                            "provider": {"type": "string", "description": "Optional provider this phase is expected to use."},
                            "model": {"type": "string", "description": "Optional model this phase is expected to use."},
                        },
                        "required": ["title"],
                    },
                },
            },
            "required": ["name", "description"],
        },
        "args": {
            "type": "object",
            "description": ("Optional JSON input given to the script as `args` (wrap a bare list as a field, e.g. "
                            "{\"files\": [...]})."),
        },
    },
    "required": ["script", "meta"],
    "additionalProperties": False,
}

RALPH_DESCRIPTION = (
    "Run a foreground Ralph loop of fresh agents toward one objective that does not change. Use it only when the "
    "user explicitly asks for Ralph or for fresh-agent iteration. Each round starts a new child with no parent "
    "conversation and no earlier round's session; the shared workspace is the long-term memory, and only a short "
    "structured report passes from one round to the next. The call returns when a worker reports completion or a "
    "concrete blocker, or at the round limit. Ordinary long-running work in this session belongs to the goal tools.")

RALPH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "objective": {"type": "string", "description": "The objective every fresh Ralph round works toward; it does not change."},
        "maxRounds": {"type": "number", "description": "Optional round cap: a positive whole number, at most the deployment's ceiling."},
    },
    "required": ["objective"],
    "additionalProperties": False,
}


@hookimpl
def dsh_register_tools(register: Any, host: Host) -> None:
    config = host.config_for(WorkflowConfig)
    caps = Caps(max_agents=config.max_agents, concurrency=concurrency(config.concurrency),
                max_depth=config.max_depth, provider=config.provider, max_items=config.max_items)

    async def workflow(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return await run_workflow(args, ctx, caps, max_result_chars=config.max_result_chars)

    async def ralph(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return await run_ralph(args, ctx, caps, config.max_rounds, max_handoff_chars=config.max_handoff_chars,
                               max_result_chars=config.max_ralph_result_chars)

    register(FunctionTool("workflow", WORKFLOW_DESCRIPTION, WORKFLOW_PARAMETERS, workflow, kind="think"))
    register(FunctionTool("ralph", RALPH_DESCRIPTION, RALPH_PARAMETERS, ralph, kind="think"))


@hookimpl
def dsh_register_guidance(register: Any, host: Host) -> None:
    from .guidance import SECTIONS  # the texts live in their own module (guidance.py)

    for section in SECTIONS:
        register(section)
