"""What the model reads from an ``lsp`` call: location lines and hover text, bounded.

Pure functions (no I/O). The model counts lines and UTF-16 columns from one; the protocol
counts from zero: ``to_protocol`` and ``location_line`` convert. Locations are grouped by file
(first-seen order) as ``path:line:character``, a ``file:`` URI inside the workspace as a
workspace-relative path, outside it as an absolute path, any other URI as it is. The count cap
comes first (an omission line says how many were left out), then the character cap, whose
notice counts against the cap itself.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse

OPERATIONS = ("goToDefinition", "findReferences", "goToImplementation", "hover")
NO_LOCATIONS = "No results."
NO_HOVER = "No hover information."


def one_based(value: Any, name: str) -> int:
    """A positive integer coordinate (``1.0`` is accepted as JSON numbers may come), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer (one-based)")
    return int(value)


def uri_path(uri: str) -> str | None:
    """The filesystem path of a ``file:`` URI, or None for any other (or a malformed) URI."""
    try:
        parsed = urlparse(uri)
    except ValueError:
        return None
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        return None
    path = unquote(parsed.path)
    return path if path.startswith("/") and "\0" not in path else None


def render_uri(uri: str, workspace: str) -> str:
    """``uri`` as the model reads it: relative to ``workspace`` inside it, absolute outside, else verbatim."""
    path = uri_path(uri)
    if path is None:
        return uri
    rel = os.path.relpath(path, workspace)
    if rel == ".":
        return "."
    if rel == ".." or rel.startswith("../"):
        return path
    return rel


def bound(text: str, max_chars: int, label: str) -> str:
    """``text`` cut to ``max_chars`` characters including the notice that says it was cut."""
    if len(text) <= max_chars:
        return text
    notice = f"\n… {label} truncated (limit {max_chars} characters)."
    if len(notice) >= max_chars:
        return notice[:max_chars]
    return text[: max_chars - len(notice)] + notice


def format_locations(locations: list[dict[str, Any]], workspace: str, max_locations: int, max_chars: int) -> str:
    """``[{uri, range}]`` (zero-based, as the protocol has them) as grouped ``path:line:character`` lines."""
    if not locations:
        return bound(NO_LOCATIONS, max_chars, "locations")
    shown = locations[:max_locations]
    omitted = len(locations) - len(shown)
    groups: dict[str, list[str]] = {}
    for loc in shown:
        path = render_uri(loc["uri"], workspace)
        start = loc["range"]["start"]
        groups.setdefault(path, []).append(f"{path}:{start['line'] + 1}:{start['character'] + 1}")
    lines = [entry for entries in groups.values() for entry in entries]
    if omitted > 0:
        lines.append(f"… {omitted} more location{'' if omitted == 1 else 's'} omitted (limit {max_locations}).")
    return bound("\n".join(lines), max_chars, "locations")


def format_hover(hover: dict[str, Any] | None, max_chars: int) -> str:
    return bound(NO_HOVER if hover is None else hover["contents"], max_chars, "hover")


def hover_text(contents: Any) -> str:
    """A hover's contents (MarkupContent, a MarkedString, or a list of them) as one text."""
    if isinstance(contents, str):
        return contents
    if isinstance(contents, list | tuple):
        return "\n\n".join(t for t in (hover_text(c) for c in contents) if t)
    value = getattr(contents, "value", None)
    if isinstance(value, str):
        language = getattr(contents, "language", None)
        return f"```{language}\n{value}\n```" if language else value
    return ""
