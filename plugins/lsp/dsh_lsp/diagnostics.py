"""The diagnostics a ``write`` or ``edit`` introduced, as a bounded reminder after its result.

Before the call (``dsh_before_tool``), for a file a warm server of the session handles, the
server's view of the file as it is on disk is the baseline (its last publication when it already
has that text, else it is told the text and its publication awaited; a file that does not exist
yet has none). After the call (``dsh_after_tool``) the server is told the new text and its next
publication awaited. Introduced = the new diagnostics minus the baseline's, matched by severity,
message, code and source (not by position: an edit moves the lines below it), at or above the
configured severity, at most ``max_items`` of them and ``max_chars`` characters.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lsprotocol import types as t

from .render import bound

if TYPE_CHECKING:  # pragma: no cover
    from .client import Connection

SEVERITIES = {"error": 1, "warning": 2, "information": 3, "hint": 4}
_NAMES = {1: "error", 2: "warning", 3: "information", 4: "hint"}


@dataclass
class Baseline:
    conn: Connection
    path: str
    items: list[t.Diagnostic]


def read_text(path: str) -> str | None:
    """The file's text (None when it does not exist or is not UTF-8 text)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _key(d: t.Diagnostic) -> tuple[Any, ...]:
    code = d.code if isinstance(d.code, str | int) else None
    return (d.severity or 1, d.message, code, d.source)


def introduced(before: list[t.Diagnostic], after: list[t.Diagnostic], threshold: str) -> list[t.Diagnostic]:
    """``after`` less what ``before`` already had (as a multiset), at ``threshold`` or worse, in order."""
    worst = SEVERITIES[threshold]
    seen = Counter(_key(d) for d in before)
    out = []
    for d in sorted(after, key=lambda d: (d.range.start.line, d.range.start.character)):
        k = _key(d)
        if seen[k] > 0:
            seen[k] -= 1
            continue
        if (d.severity or 1) <= worst:
            out.append(d)
    return out


def describe(new: list[t.Diagnostic], shown_path: str, *, max_items: int, max_chars: int) -> str:
    """The reminder the model reads (one-based line:character, as the lsp tool's positions)."""
    n = len(new)
    head = f"The language server reports {n} new problem{'' if n == 1 else 's'} in {shown_path} after this change:"
    lines = [head]
    for d in new[:max_items]:
        code = f" ({d.code})" if isinstance(d.code, str | int) and d.code != "" else ""
        message = " ".join(d.message.split())
        lines.append(f"{shown_path}:{d.range.start.line + 1}:{d.range.start.character + 1}: "
                     f"{_NAMES.get(d.severity or 1, 'error')}: {message}{code}")
    if n > max_items:
        lines.append(f"… {n - max_items} more omitted (limit {max_items}).")
    return bound("\n".join(lines), max_chars, "diagnostics")


def shown(path: str, root: str) -> str:
    rel = os.path.relpath(path, root)
    return path if rel == ".." or rel.startswith("../") else rel
