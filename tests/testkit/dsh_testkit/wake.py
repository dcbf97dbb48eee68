"""A tool that wakes its session later, standing in for a background job or subagent settling.

``wake_later {ms, text}`` answers at once; ``ms`` milliseconds later (a task of the host's group)
it tells the session ``text`` through ``Agent.notify(..., wake=True)``: an idle session starts an
autonomous turn for it, a busy one reads it at its next request. The session's cwd gets the file
``woke`` when the notice was handed over (tests wait for it instead of sleeping).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from dsh_core import FunctionTool, hookimpl

SCHEMA = {
    "type": "object",
    "properties": {"ms": {"type": "number"}, "text": {"type": "string"}},
    "required": ["text"],
}


async def wake_later(args: dict[str, Any], ctx: Any) -> str:
    agent, delay = ctx.agent, float(args.get("ms", 0)) / 1000

    async def later() -> None:
        await anyio.sleep(delay)
        agent.notify(args["text"], source="notice", wake=True)
        Path(agent.cwd, "woke").write_text("1")

    ctx.host.task_group.start_soon(later)
    return f"will wake in {args.get('ms', 0)} ms"


@hookimpl
def dsh_register_tools(register: Any) -> None:
    register(FunctionTool("wake_later", "Tell this session TEXT after MS milliseconds, waking it.", SCHEMA, wake_later))
