"""What a ``session/request_permission`` shows a person: ``toolCall.kind``, ``title``, ``content``
(why it is asked; for a file change, a diff a client opens in its review view), ``rawInput``.

Built from the approval request a tool sent through the spine's approval seam, and bounded:
a client shows the title in one line and may render ``rawInput`` in full, and neither may
carry terminal control sequences that could disguise what is being asked.
"""

from __future__ import annotations

import os
from typing import Any

from dsh_acp import wire
from dsh_acp.display import bound_input, cut, strip_unsafe, visible

from dsh_core.paths import read_small_text
from dsh_core.types import ApprovalRequest

TITLE_MAX = 200  # characters


def kind_of(request: ApprovalRequest) -> str:
    """The ACP ToolKind the tool declared; ``other`` when it declared none we know (never absent:
    some clients treat a missing kind as a harmless read)."""
    return request.kind if request.kind in wire.TOOL_KINDS else "other"


def title_of(request: ApprovalRequest) -> str:
    """``bash: rm -rf build → danger-full-access``: tool, what it acts on, the tier asked for
    (``[fix the tests] bash: …`` when a subagent asks). The tier is never cut off; a long subject is."""
    head = cut(visible(request.tool_name), 40)
    if request.delegate:
        head = f"[{cut(visible(request.delegate), 60)}] {head}"
    tail = f" → {cut(visible(request.tier), 40)}" if request.tier else ""
    subject = request.subject if request.subject else request.reason
    room = TITLE_MAX - len(head) - len(tail) - 2
    return f"{head}: {cut(visible(subject), room)}{tail}"


def raw_input_of(request: ApprovalRequest) -> dict[str, Any]:
    """The call's arguments, the tier asked for and the model's justification, bounded."""
    raw: dict[str, Any] = dict(request.args) if isinstance(request.args, dict) else {"reason": request.reason}
    if request.tier:
        raw["tier"] = request.tier
    if request.justification:
        raw["justification"] = request.justification
    return bound_input(raw, keep=("tier", "justification"))


REASON_MAX = 2000  # characters of the justification shown as content
DIFF_MAX = 64 * 1024  # characters of a diff's old or new text; a larger change is shown without a diff


def content_of(request: ApprovalRequest, buffered: str | None = None) -> list[wire.ContentOut | wire.DiffOut]:
    """What the client shows in the request: the model's justification (else the tool's reason),
    and for a file change (write, edit) the diff, so a client such as Toad opens its review view."""
    out: list[wire.ContentOut | wire.DiffOut] = []
    why = request.justification or request.reason
    if why:
        out.append(wire.ContentOut(content=wire.TextOut(text=strip_unsafe(cut(why, REASON_MAX)))))
    diff = diff_of(request, buffered)
    if diff is not None:
        out.append(diff)
    return out


def _target(request: ApprovalRequest) -> str | None:
    """The absolute path a ``write`` or ``edit`` request changes (None: not a file change)."""
    path = (request.args or {}).get("file_path")
    if request.tool_name not in ("write", "edit") or not isinstance(path, str) or not path:
        return None
    cwd = getattr(request.agent, "cwd", None) or "/"
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))


async def buffered_text(request: ApprovalRequest) -> str | None:
    """For a file change asked about before its tool ran (a hook's ``ask``: the request carries
    no ``change``), the editor's text of the file when the session reads through the editor
    (``buffers``): the text the tool will then change, so the diff is computed from it too."""
    full = _target(request)
    spec = getattr(request.agent, "spec", None)
    buffers = getattr(spec, "buffers", None)
    if request.change is not None or full is None or buffers is None:
        return None
    text: str | None = await buffers.read(os.path.realpath(full))
    return text


def diff_of(request: ApprovalRequest, buffered: str | None = None) -> wire.DiffOut | None:
    """The change a ``write`` or ``edit`` request would make, as a whole-file diff (None when it
    cannot be shown honestly: not a regular UTF-8 file, larger than ``DIFF_MAX``, or an edit
    whose ``old_string`` is not in it; the tool refuses that call anyway).

    The tool's own ``change`` when the request carries one: the very texts it will write over
    and write (the editor's unsaved buffer, when the session reads through the editor). Else,
    from the arguments (file_path, content | old_string, new_string[, replace_all]) applied to
    ``buffered`` (the editor's text, see ``buffered_text``) or the file as it is now."""
    if request.change is not None:
        change = request.change
        if (change.before is not None and len(change.before) > DIFF_MAX) or len(change.after) > DIFF_MAX:
            return None
        return wire.DiffOut(path=change.path, old_text=change.before, new_text=change.after)
    full = _target(request)
    if full is None:
        return None
    args = request.args or {}
    showable, old = (True, buffered) if buffered is not None else read_small_text(full, DIFF_MAX * 4)
    if not showable or (old is not None and len(old) > DIFF_MAX):
        return None
    if request.tool_name == "write":
        new = args.get("content")
    else:
        before, after = args.get("old_string"), args.get("new_string")
        if not (isinstance(old, str) and isinstance(before, str) and isinstance(after, str) and before in old):
            return None
        new = old.replace(before, after) if args.get("replace_all") is True else old.replace(before, after, 1)
    if not isinstance(new, str) or len(new) > DIFF_MAX:
        return None
    return wire.DiffOut(path=full, old_text=old, new_text=new)


def tool_call_of(request: ApprovalRequest, buffered: str | None = None) -> wire.PermissionToolCall:
    assert request.call_id is not None
    content = content_of(request, buffered)
    return wire.PermissionToolCall(
        tool_call_id=request.call_id,
        kind=kind_of(request),
        title=title_of(request),
        **({"content": content} if content else {}),
        raw_input=raw_input_of(request),
    )
