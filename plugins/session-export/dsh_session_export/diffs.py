"""What a file tool call changed, as a unified diff (``difflib``), from the session log alone.

The log holds each call's arguments and result, not the file before the call. So the texts a
session has seen are followed per path: a whole-file ``read`` (it starts at line 1 and reaches
the end of the file), a ``write`` (its ``content``), an ``edit`` applied to a known text. A
``write`` over a file whose earlier text the log never showed is shown whole, as added lines, and
says so; an ``edit`` of an unknown text shows the replaced string against its replacement. A
write whose result says it created the file starts from nothing. Any other tool that may change
files (``bash``, a subagent, a program) makes the session forget what it knew.
"""

from __future__ import annotations

import difflib
import json
import os.path as osp
import re
from typing import Any

_READ_LINE = re.compile(r"^(\d+): ?(.*)$")


class FileTexts:
    """The last known whole text of each file a session touched (absolute path → text)."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd
        self.known: dict[str, str] = {}

    def path(self, raw: Any) -> str | None:
        if not isinstance(raw, str) or not raw:
            return None
        return osp.normpath(raw if osp.isabs(raw) or not self.cwd else osp.join(self.cwd, raw))

    def saw_read(self, args: dict[str, Any], result: str) -> None:
        """A ``read`` that shows a whole file teaches its text (numbered ``N: line`` lines)."""
        path = self.path(args.get("file_path"))
        if path is None or "(End of file" not in result or "<content>" not in result:
            return
        body = result.split("<content>\n", 1)[-1].rsplit("</content>", 1)[0]
        lines: list[str] = []
        for ln in body.split("\n"):
            m = _READ_LINE.match(ln)
            if m is None:
                break
            if int(m.group(1)) != len(lines) + 1:
                return  # a window, not the whole file
            lines.append(m.group(2))
        if lines:
            self.known[path] = "\n".join(lines) + "\n"
        elif "total 0 lines" in result:
            self.known[path] = ""


def _unified(before: str, after: str, name: str) -> str:
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), f"a/{name}", f"b/{name}", lineterm="", n=3)
    return "\n".join(lines)


def change_of(texts: FileTexts, name: str, arguments: str, ok: bool, result: str) -> tuple[str, str] | None:
    """(diff, note) for a file tool's call, or None when the call changes no file. Updates what is
    known only when the call succeeded."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return None
    if not isinstance(args, dict):
        return None
    if name == "read":
        if ok:
            texts.saw_read(args, result)
        else:
            texts.known.pop(texts.path(args.get("file_path")) or "", None)
        return None
    if name == "write":
        return _write(texts, args.get("file_path"), args.get("content"), ok, created="Created file" in result)
    if name == "edit":
        return _edit(texts, args.get("file_path"), args.get("old_string"), args.get("new_string"),
                     bool(args.get("replace_all")), ok)
    if name == "str_replace_editor":
        command = args.get("command")
        if command == "create":
            return _write(texts, args.get("path"), args.get("file_text"), ok, created=False)
        if command == "str_replace":
            return _edit(texts, args.get("path"), args.get("old_str"), args.get("new_str") or "", False, ok)
    if name not in _KEEPS_FILES:
        texts.known.clear()  # a command, a subagent…: any file may have changed in ways the log does not show
    return None


# tools that change no file (or only the ones followed above)
_KEEPS_FILES = frozenset({"glob", "grep", "read_image", "todo_write", "web_fetch", "web_search", "session_search",
                          "session_event_search", "session_event_read", "session_event_trace", "session_trace",
                          "job_list", "job_output", "list_agents", "skill", "get_goal"})


def _write(texts: FileTexts, raw_path: Any, content: Any, ok: bool, *, created: bool) -> tuple[str, str] | None:
    path = texts.path(raw_path)
    if path is None or not isinstance(content, str):
        return None
    before = "" if created else texts.known.get(path)
    note = ""
    if before is None:
        before = ""
        note = "" if created else "the file's earlier text is not in the log: its new text is shown whole"
    if ok:
        texts.known[path] = content
    return _unified(before, content, str(raw_path)), note


def _edit(texts: FileTexts, raw_path: Any, old: Any, new: Any, every: bool, ok: bool) -> tuple[str, str] | None:
    path = texts.path(raw_path)
    if path is None or not isinstance(old, str) or not isinstance(new, str):
        return None
    before = texts.known.get(path)
    if before is not None and old and old in before:
        after = before.replace(old, new) if every else before.replace(old, new, 1)
        if ok:
            texts.known[path] = after
        return _unified(before, after, str(raw_path)), ""
    if ok:
        texts.known.pop(path, None)  # changed in a way this log cannot follow
    return _unified(old, new, str(raw_path)), "the file's whole text is not in the log: the replaced text is shown"
