"""When to use ``workflow`` and ``ralph`` at all: their system-prompt sections
(``dsh_register_guidance``). Both are for explicit requests only: each starts many agents."""

from __future__ import annotations

from dsh_core.types import Guidance

WORKFLOW = Guidance(
    name="tool:workflow",
    order=115,
    tools=("workflow",),
    text="Use the workflow tool ONLY when the user explicitly asks for a workflow or for orchestrating many "
    "subagents: it runs a script you write (its description gives the exact format) that fans work out to "
    "subagents in phases and combines their answers. For one or two delegations, call subagent directly.",
)

RALPH = Guidance(
    name="tool:ralph",
    order=116,
    tools=("ralph",),
    text="Use the ralph tool ONLY when the user explicitly asks for a Ralph loop, or for work done in rounds "
    "by fresh agents. Each round is a new subagent that knows nothing of this conversation: what earlier "
    "rounds left in the workspace and reported is all it has. A round that says the objective is met is "
    "making a claim, not passing an independent check. For other long work keep going yourself, and for "
    "bounded delegation use subagent or workflow.",
)

SECTIONS = (WORKFLOW, RALPH)
