"""What a ``session/request_permission`` shows a person: ``toolCall.kind``, ``title``, ``rawInput``.

Built from the approval request a tool sent through the spine's approval seam, and bounded:
a client shows the title in one line and may render ``rawInput`` in full, and neither may
carry terminal control sequences that could disguise what is being asked.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from dsh_acp import wire

from dsh_core.types import ApprovalRequest

TITLE_MAX = 200  # characters
RAW_STRING_MAX = 1024  # characters per string in rawInput (then shrunk until the whole fits)
RAW_MAX_BYTES = 8 * 1024  # the encoded rawInput
RAW_ITEMS_MAX = 32  # entries per object or array
RAW_DEPTH_MAX = 4
_KEY_MAX = 64

# C0/C1 controls, DEL, and the bidirectional overrides/isolates that can reorder what is shown.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(text: str) -> str:
    """One line, no control characters: newlines become ``↵``, tabs spaces, controls ``\\xNN``."""
    text = text.replace("\r\n", "\n").replace("\n", " ↵ ").replace("\t", " ")
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}" if ord(m.group()) > 0xFF else f"\\x{ord(m.group()):02x}", text)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def kind_of(request: ApprovalRequest) -> str:
    """The ACP ToolKind the tool declared; ``other`` when it declared none we know (never absent:
    some clients treat a missing kind as a harmless read)."""
    return request.kind if request.kind in wire.TOOL_KINDS else "other"


def title_of(request: ApprovalRequest) -> str:
    """``bash: rm -rf build → danger-full-access``: tool, what it acts on, the tier asked for.
    The tier is never cut off; a long subject is."""
    head = _cut(_visible(request.tool_name), 40)
    tail = f" → {_cut(_visible(request.tier), 40)}" if request.tier else ""
    subject = request.subject if request.subject else request.reason
    room = TITLE_MAX - len(head) - len(tail) - 2
    return f"{head}: {_cut(_visible(subject), room)}{tail}"


def raw_input_of(request: ApprovalRequest) -> dict[str, Any]:
    """The call's arguments, the tier asked for and the model's justification, bounded."""
    raw: dict[str, Any] = dict(request.args) if isinstance(request.args, dict) else {"reason": request.reason}
    if request.tier:
        raw["tier"] = request.tier
    if request.justification:
        raw["justification"] = request.justification
    limit = RAW_STRING_MAX
    while limit >= 16:
        bounded: dict[str, Any] = _bound(raw, limit, RAW_DEPTH_MAX)  # a dict stays a dict
        if len(wire.encoder.encode(bounded)) <= RAW_MAX_BYTES:
            return bounded
        limit //= 4
    fallback: dict[str, Any] = {"arguments": "too large to show"}
    for key in ("tier", "justification"):
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
        out = {_cut(str(k), _KEY_MAX): _bound(v, limit, depth - 1) for k, v in items[:RAW_ITEMS_MAX]}
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


def tool_call_of(request: ApprovalRequest) -> wire.PermissionToolCall:
    assert request.call_id is not None
    return wire.PermissionToolCall(
        tool_call_id=request.call_id,
        kind=kind_of(request),
        title=title_of(request),
        raw_input=raw_input_of(request),
    )
