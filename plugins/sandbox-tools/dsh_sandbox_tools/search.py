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
GREP_MAX = 250  # matches shown
GREP_COUNT_MAX = 20 * GREP_MAX  # matches counted for the total
GREP_MAX_LINE = 2000
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


def _pattern_and_base(args: dict[str, Any], ctx: ToolContext) -> tuple[str, str]:
    """A search's ``pattern`` and where it looks: ``path`` made absolute (default: the workspace)."""
    return str_arg(args, "pattern"), absolute(str_arg(args, "path", required=False) or ".", ctx.cwd)


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
        pattern, base = _pattern_and_base(args, ctx)
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


def _grep(base: str, rx: re.Pattern[str], name_glob: str | list[str] | None, cwd: str,
          found: list[dict[str, Any]] | None = None) -> tuple[list[tuple[str, int, str]], int]:
    """(the first ``GREP_MAX`` matches as (path, line, text), how many there are — counted up to
    ``GREP_COUNT_MAX``, past which the count is that cap plus one)."""
    out: list[tuple[str, int, str]] = []
    seen = 0

    def scan(path: str) -> bool:
        nonlocal seen
        text = _text_of(path)
        if text is None:
            return False
        for n, line in enumerate(text.splitlines(), start=1):
            if rx.search(line):
                seen += 1
                if seen > GREP_COUNT_MAX:
                    return True
                if len(out) >= GREP_MAX:
                    continue
                if len(line) > GREP_MAX_LINE:
                    line = line[:GREP_MAX_LINE] + "…"
                out.append((display(path, cwd), n, line))
                if found is not None:
                    found.append({"path": display(path, cwd), "line": n, "text": line})
        return False

    if os.path.isfile(base):
        scan(base)
        return out, seen
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if name_glob and not _included(name, os.path.relpath(path, base), name_glob):
                continue
            if scan(path):
                return out, seen
    return out, seen


def _text_of(path: str) -> str | None:
    """A searchable file's text: None for one too large, unreadable or binary."""
    try:
        if os.path.getsize(path) > GREP_MAX_FILE:
            return None
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return None if b"\0" in data[:8192] else data.decode("utf-8", errors="replace")


def _included(name: str, rel: str, globs: str | list[str]) -> bool:
    return any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(rel, g) for g in ([globs] if isinstance(globs, str) else globs))


def format_grep(hits: list[tuple[str, int, str]], seen: int) -> str:
    """The model's view of a search: a count, then each file's path over its ``Line N: text`` rows."""
    if not hits:
        return "No matches found"
    groups: dict[str, list[str]] = {}
    for path, n, line in hits:
        groups.setdefault(path, []).append(f"Line {n}: {line}")
    body = "\n\n".join(f"{path}\n" + "\n".join(rows) for path, rows in groups.items())
    if seen <= len(hits):
        return f"Found {seen} {'match' if seen == 1 else 'matches'}\n\n{body}"
    total = f"more than {GREP_COUNT_MAX}" if seen > GREP_COUNT_MAX else str(seen)
    return (f"Found {len(hits)} of {total} matches\n\n{body}\n\n"
            f"(Only the first {len(hits)} are shown; narrow pattern, path or include to see the others.)")


class GrepTool(SandboxTool):
    name = "grep"
    kind = "search"
    description = (
        "Search file contents with a regular expression (Python `re` syntax); matching lines come back with "
        f"their line numbers, grouped by file. The first {GREP_MAX} matches are shown, with the total count. "
        "Read a matched file for the lines around a match. `.git` is skipped."
    )
    properties: ClassVar[dict[str, Any]] = {
        "pattern": {"type": "string", "description": "The regular expression to search for."},
        "path": {"type": "string", "description": "File or directory to search (default: the workspace; a relative "
                 "path is taken from it)."},
        "include": {"type": "string", "description": 'One glob naming the files to search (e.g. "*.py", '
                    '"*.{js,jsx}"); matched against the name or the path under `path`.'},
    }
    required = ("pattern",)
    output_schema = GREP_OUTPUT
    parallel_safe = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        pattern, base = _pattern_and_base(args, ctx)
        include = str_arg(args, "include", required=False)
        if include is not None and include.startswith("!"):
            raise ToolError("include must be a positive glob filter; negated patterns (\"!…\") are not supported",
                            code="INVALID_ARGUMENTS")
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise ToolError(f"bad regular expression: {exc}", code="INVALID_ARGUMENTS") from None
        if not os.path.exists(base):
            raise ToolError(f"{base} does not exist", code="NOT_FOUND")
        found: list[dict[str, Any]] = []
        hits, seen = await anyio.to_thread.run_sync(
            _grep, base, rx, _braces(include), os.path.realpath(ctx.cwd), found, abandon_on_cancel=True)
        data = {"matches": found, "truncated": seen > len(hits)}
        return ToolOutput(content=[TextBlock(text=format_grep(hits, seen))], structured=data)


def _braces(glob: str | None) -> Any:
    """``include`` as a name filter: ``{a,b}`` alternation expanded into several fnmatch globs."""
    if glob is None:
        return None
    m = re.search(r"\{([^{}]*)\}", glob)
    if m is None:
        return glob
    return [alt for part in m.group(1).split(",") for alt in _alts(glob[:m.start()] + part + glob[m.end():])]


def _alts(glob: str) -> list[str]:
    more = _braces(glob)
    return more if isinstance(more, list) else [more]
