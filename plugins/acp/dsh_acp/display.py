"""Text an ACP client shows a person (titles, tool input, tool output), made safe to show: the
spine's ``dsh_core.display`` functions, and ``bound_input`` for a tool call's ``rawInput``.

A client shows a title on one line and may render ``rawInput`` in full: neither may carry
terminal control sequences or bidirectional overrides that could disguise what is shown,
and neither may be unbounded. Used by the door's permission requests and by presentation
plugins' tool-call cards alike.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dsh_core.display import UNSAFE, cut, one_line, strip_unsafe, visible

__all__ = ["UNSAFE", "bound_input", "cut", "one_line", "strip_unsafe", "visible"]

RAW_STRING_MAX = 1024  # characters per string in rawInput (then shrunk until the whole fits)
RAW_MAX_BYTES = 8 * 1024  # the encoded rawInput
RAW_ITEMS_MAX = 32  # entries per object or array
RAW_DEPTH_MAX = 4
KEY_MAX = 64

def bound_input(raw: dict[str, Any], keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """A tool call's arguments as ``rawInput``: strings shortened (1024 characters, then less)
    until the encoded whole fits 8 KiB, at most 32 entries and 4 levels. When nothing fits,
    ``{"arguments": "too large to show"}`` plus the ``keep`` keys, shortened."""
    limit = RAW_STRING_MAX
    while limit >= 16:
        bounded: dict[str, Any] = _bound(raw, limit, RAW_DEPTH_MAX)  # a dict stays a dict
        if len(msgspec.json.encode(bounded)) <= RAW_MAX_BYTES:
            return bounded
        limit //= 4
    fallback: dict[str, Any] = {"arguments": "too large to show"}
    for key in keep:
        if key in raw:
            fallback[key] = _bound(raw[key], 512, 1)
    return fallback


def _bound(value: Any, limit: int, depth: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= limit else f"{value[:limit]}… [{len(value) - limit} more characters]"
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth <= 0:
        return "…"
    if isinstance(value, dict):
        items = list(value.items())
        out = {cut(str(k), KEY_MAX): _bound(v, limit, depth - 1) for k, v in items[:RAW_ITEMS_MAX]}
        if len(items) > RAW_ITEMS_MAX:
            out["…"] = f"{len(items) - RAW_ITEMS_MAX} more entries"
        return out
    if isinstance(value, (list, tuple)):
        out_list = [_bound(v, limit, depth - 1) for v in value[:RAW_ITEMS_MAX]]
        if len(value) > RAW_ITEMS_MAX:
            out_list.append(f"… {len(value) - RAW_ITEMS_MAX} more items")
        return out_list
    try:  # anything else a tool may have put in its arguments: shown as JSON text
        return _bound(msgspec.json.encode(value).decode(), limit, depth)
    except Exception:
        return _bound(repr(value), limit, depth)
