"""word_count: the lines, words and bytes of a file in the session's workspace.

The worked example of dsh's plugin-author guide (docs/plugin-authors.md): one tool, one typed
config table, errors the model can act on, and nothing outside the session's cwd.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated, Any

from msgspec import Meta

from dsh_core import FunctionTool, ToolError, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.contracts import ToolContext

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
    root = Path(ctx.cwd).resolve()
    path = (root / args["path"]).resolve()  # resolve(): a symlink pointing out is caught below
    if not path.is_relative_to(root):
        raise ToolError(f"{args['path']!r} is outside the workspace", code="OUTSIDE_WORKSPACE")
    try:  # O_NOFOLLOW, and what was opened is checked, not the path: a link swapped in meanwhile
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        raise ToolError(f"no file {args['path']!r} in the workspace", code="NOT_FOUND") from None
    with os.fdopen(fd, "rb", closefd=True) as f:
        st = os.fstat(f.fileno())
        opened = Path(os.readlink(f"/proc/self/fd/{f.fileno()}"))
        if not stat.S_ISREG(st.st_mode) or not opened.is_relative_to(root):
            raise ToolError(f"no file {args['path']!r} in the workspace", code="NOT_FOUND")
        if st.st_size > limit:
            raise ToolError(f"{args['path']!r} has {st.st_size} bytes, over max-bytes ({limit})", code="TOO_LARGE")
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
