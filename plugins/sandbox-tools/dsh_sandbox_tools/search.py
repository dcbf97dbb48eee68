"""The search tools: ``glob`` (file names) and ``grep`` (file contents); ``.git`` is skipped."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import anyio

from dsh_core import ToolError
from dsh_core.types import TextBlock, ToolOutput

from .base import BOOL, INT, STR, SandboxTool, display, out_schema, str_arg
from .fspath import absolute

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext

GLOB_MAX = 1000
GLOB_SCAN_MAX = 20 * GLOB_MAX  # matches looked at before sampling
GREP_MAX = 500
GREP_MAX_FILE = 5_000_000

# The structured results (ToolOutput.structured) that programs see in code mode; the model's
# text results are unchanged.
GLOB_OUTPUT = out_schema({"paths": {"type": "array", "items": STR, "description": "Relative to the workspace when "
                                    "inside it."}, "truncated": BOOL})
GREP_OUTPUT = out_schema({
    "matches": {"type": "array", "items": out_schema({"path": STR, "line": INT, "text": STR})},
    "truncated": BOOL,
})


def _skip(rel_parts: tuple[str, ...]) -> bool:
    return ".git" in rel_parts


def _glob(base: str, pattern: str) -> tuple[list[str], bool]:
    out: list[str] = []
    for p in Path(base).glob(pattern):
        rel = p.relative_to(base).parts if p.is_relative_to(base) else p.parts
        if _skip(rel):
            continue
        out.append(str(p))
        if len(out) >= GLOB_SCAN_MAX:
            break
    if len(out) <= GLOB_MAX:
        return sorted(out), False
    # Over the cap: a sample taken round-robin across the top-level entries, so one big subtree
    # cannot hide the others and the answer does not depend on directory order.
    groups: dict[str, list[str]] = {}
    for path in sorted(out):
        groups.setdefault(os.path.relpath(path, base).split(os.sep)[0], []).append(path)
    queues = list(groups.values())
    picked = [q[i] for i in range(GLOB_MAX) for q in queues if i < len(q)][:GLOB_MAX]
    return sorted(picked), True


class GlobTool(SandboxTool):
    name = "glob"
    kind = "search"
    description = (
        "List files matching a glob pattern (e.g. `**/*.py`), relative to path (default: the workspace). "
        "`.git` is skipped."
    )
    properties: ClassVar[dict[str, Any]] = {
        "pattern": {"type": "string", "description": "Glob pattern; `**` matches any depth."},
        "path": {"type": "string", "description": "Directory to search from (default: workspace)."},
    }
    required = ("pattern",)
    output_schema = GLOB_OUTPUT
    parallel_safe = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        pattern = str_arg(args, "pattern")
        assert pattern is not None
        base = absolute(str_arg(args, "path", required=False) or ".", ctx.cwd)
        if os.path.isabs(pattern):
            raise ToolError("pattern must be relative; put the directory in path", code="INVALID_ARGUMENTS")
        if not os.path.isdir(base):
            raise ToolError(f"{base} is not a directory", code="NOT_FOUND")
        try:
            found, more = await anyio.to_thread.run_sync(_glob, base, pattern)
        except ValueError as exc:
            raise ToolError(f"bad glob pattern: {exc}", code="INVALID_ARGUMENTS") from None
        shown = [display(p, ctx.cwd) for p in found]
        data = {"paths": shown, "truncated": more}
        if not found:
            return ToolOutput(content=[TextBlock(text=f"no files match {pattern!r} under {display(base, ctx.cwd)}")],
                              structured=data)
        lines = list(shown)
        if more:
            lines.append(f"[more than {GLOB_MAX} matches: a sample across the top-level entries; narrow the pattern or path]")
        return ToolOutput(content=[TextBlock(text="\n".join(lines))], structured=data)


def _grep(base: str, rx: re.Pattern[str], name_glob: str | None, cwd: str,
          found: list[dict[str, Any]] | None = None) -> tuple[list[str], bool]:
    out: list[str] = []

    def scan(path: str) -> bool:
        try:
            if os.path.getsize(path) > GREP_MAX_FILE:
                return False
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return False
        if b"\0" in data[:8192]:
            return False
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            if rx.search(line):
                if len(line) > 500:
                    line = line[:500] + "…"
                out.append(f"{display(path, cwd)}:{n}: {line}")
                if found is not None:
                    found.append({"path": display(path, cwd), "line": n, "text": line})
                if len(out) >= GREP_MAX:
                    return True
        return False

    if os.path.isfile(base):
        return out, scan(base)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if name_glob and not (fnmatch.fnmatch(name, name_glob) or fnmatch.fnmatch(os.path.relpath(path, base), name_glob)):
                continue
            if scan(path):
                return out, True
    return out, False


class GrepTool(SandboxTool):
    name = "grep"
    kind = "search"
    description = (
        "Search file contents with a regular expression (Python syntax). Returns `path:line: text`. "
        "path is a file or directory (default: the workspace); glob filters file names (e.g. `*.py`)."
    )
    properties: ClassVar[dict[str, Any]] = {
        "pattern": {"type": "string", "description": "Regular expression."},
        "path": {"type": "string", "description": "File or directory to search (default: workspace)."},
        "glob": {"type": "string", "description": "Only files whose name or relative path matches."},
    }
    required = ("pattern",)
    output_schema = GREP_OUTPUT
    parallel_safe = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        pattern = str_arg(args, "pattern")
        assert pattern is not None
        base = absolute(str_arg(args, "path", required=False) or ".", ctx.cwd)
        name_glob = str_arg(args, "glob", required=False)
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise ToolError(f"bad regular expression: {exc}", code="INVALID_ARGUMENTS") from None
        if not os.path.exists(base):
            raise ToolError(f"{base} does not exist", code="NOT_FOUND")
        found: list[dict[str, Any]] = []
        hits, more = await anyio.to_thread.run_sync(_grep, base, rx, name_glob, os.path.realpath(ctx.cwd), found,
                                                    abandon_on_cancel=True)
        data = {"matches": found, "truncated": more}
        if not hits:
            return ToolOutput(content=[TextBlock(text=f"no matches for {pattern!r}")], structured=data)
        if more:
            hits.append(f"[stopped after {GREP_MAX} matches; narrow the pattern or path]")
        return ToolOutput(content=[TextBlock(text="\n".join(hits))], structured=data)
