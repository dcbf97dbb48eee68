"""A tool that asks the approval seam, standing in for sandbox escalation in ACP tests.

``guarded_write {path, content}`` asks for approval; allowed → writes the file (relative
to the session cwd) and says so; anything else → writes nothing and says why.
``slow {ms}`` sleeps (cancellable) and then answers, for cancel-during-tool tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from dsh_core import FunctionTool, hookimpl

WRITE_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}


async def guarded_write(args: dict[str, Any], ctx: Any) -> str:
    outcome = await ctx.approve(f"write {args['path']}", kind="edit", subject=args["path"], args=args)
    if outcome != "allowed-once":
        return f"not written: approval {outcome}"
    target = Path(ctx.cwd) / args["path"]
    target.write_text(args["content"])
    return f"wrote {args['path']}"


async def slow(args: dict[str, Any], ctx: Any) -> str:
    Path(ctx.cwd, "slow-started").write_text("1")
    await anyio.sleep(int(args.get("ms", 60000)) / 1000)
    return "slow done"


@hookimpl
def dsh_register_tools(register: Any) -> None:
    register(FunctionTool("guarded_write", "Write a file after one-shot approval.", WRITE_SCHEMA, guarded_write))
    register(FunctionTool("slow", "Sleep for ms milliseconds.", {"type": "object"}, slow))
