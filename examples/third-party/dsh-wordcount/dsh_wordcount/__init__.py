"""word_count: the lines, words and bytes of a file in the session's workspace.

The worked example of dsh's plugin-author guide (docs/plugin-authors.md): one tool, one typed
config table, errors the model can act on, and nothing outside the session's cwd.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from msgspec import Meta

from dsh_core import FunctionTool, ToolError, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.contracts import ToolContext
from dsh_core.paths import open_inside

PLUGIN = "wordcount"


class WordCountConfig(PluginConfig):
    """``[config.wordcount]`` in an example.toml (keys are kebab-case: ``max-bytes``)."""

    max_bytes: Annotated[int, Meta(ge=1, description="larger files are refused, not read")] = 1_000_000


SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "description": "a file, relative to the workspace"}},
    "required": ["path"],  # enforced by dsh before the tool runs: `args["path"]` is always there
    "additionalProperties": False,
}


async def word_count(args: dict[str, Any], ctx: ToolContext) -> str:
    limit = ctx.host.config_for(WordCountConfig).max_bytes
    try:  # inside the workspace, symlinks too, checked on what was opened (a hostile repository)
        fd = open_inside(ctx.cwd, args["path"])
    except PermissionError:
        raise ToolError(f"{args['path']!r} is outside the workspace", code="OUTSIDE_WORKSPACE") from None
    except OSError:
        raise ToolError(f"no file {args['path']!r} in the workspace", code="NOT_FOUND") from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ToolError(f"{args['path']!r} has {size} bytes, over max-bytes ({limit})", code="TOO_LARGE")
        data = f.read(limit + 1)
    lines = data.count(b"\n")
    return f"{lines} lines, {len(data.split())} words, {len(data)} bytes"


@hookimpl
def dsh_config_type() -> tuple[str, type[PluginConfig]]:
    return PLUGIN, WordCountConfig


@hookimpl
def dsh_register_tools(register: Any, host: Any) -> None:
    register(FunctionTool("word_count", "Count the lines, words and bytes of a file in the workspace.",
                          SCHEMA, word_count, parallel_safe=True))
