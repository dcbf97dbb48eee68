"""The ``str_replace_editor`` tool: ``view``, ``create``, ``str_replace`` and ``insert``.

Reads are allowed everywhere (as for ``read``). Writes go through the spine's ``Confinement`` seam
(``host.confinement.write_file``), which sandbox-tools provides with the very write its ``write``
and ``edit`` use: the session's tier, its writable roots, ``openat2`` with ``RESOLVE_BENEATH`` (no
symlink, ``..`` or hard link leaves the root), regular files only. Without a confinement provider
nothing is written. ``str_replace`` and ``insert`` need a file the session has read (``view`` here,
or ``read``), or written, and not changed since: the spine's ``ReadRecords`` slot, the one
sandbox-tools' ``edit`` checks, so the two families agree.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, Any

import anyio

from dsh_core import ToolError
from dsh_core.contracts import ReadRecords
from dsh_core.errors import WriteDenied
from dsh_core.types import ToolOutput, ToolSpec

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext

NAME = "str_replace_editor"
COMMANDS = ("view", "create", "str_replace", "insert")
DEFAULT_MAX_OUTPUT_CHARS = 16_000
MAX_FILE_BYTES = 32 * 1024 * 1024  # a file larger than this is not loaded whole; bash (grep, sed) handles it
SKIPPED_DIRS = ("node_modules", "__pycache__")

# The original's clipping note, verbatim: models trained on this tool know what it asks of them.
CLIPPED = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. You should retry "
    "this tool after you have searched inside the file with `grep -n` in order to find the line numbers of what "
    "you are looking for.</NOTE>"
)

DESCRIPTION = """\
View, create and edit text files by absolute path.
* `view` on a file shows it with line numbers (`cat -n` style); `view_range` picks lines. On a directory it lists the \
files and directories inside, two levels deep, leaving out hidden entries, node_modules and __pycache__
* `create` makes a new file with `file_text`; it refuses a path that already exists
* `str_replace` replaces `old_str` with `new_str` (or with nothing). `old_str` must occur exactly once in the file, \
whitespace and indentation included: add surrounding lines until it is unique
* `insert` puts `new_str` after line `insert_line` (0 puts it at the top)
* `str_replace` and `insert` work on a file you have viewed (or read) in this session and that has not changed since
* Long output is cut and ends with `<response clipped>`"""

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "enum": list(COMMANDS),
                    "description": "What to do: `view`, `create`, `str_replace` or `insert`."},
        "path": {"type": "string", "description": "The absolute path of the file or directory, e.g. `/repo/main.py`."},
        "file_text": {"type": "string", "description": "`create` only (required there): the whole text of the new file."},
        "insert_line": {"type": "integer", "description": "`insert` only (required there): the line `new_str` goes "
                        "after; 0 inserts before the first line."},
        "new_str": {"type": "string", "description": "`str_replace`: the text that replaces `old_str` (left out: "
                    "`old_str` is deleted). `insert` (required there): the text to insert."},
        "old_str": {"type": "string", "description": "`str_replace` only (required there): the exact text to replace; "
                    "it must occur once in the file."},
        "view_range": {"type": "array", "items": {"type": "integer"}, "description": "`view` of a file only: "
                       "`[first, last]` line numbers, counting from 1; `[first, -1]` shows through the end."},
    },
    "required": ["command", "path"],
    "additionalProperties": False,
}


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + CLIPPED


def _lines_at(text: str, offsets: list[int]) -> list[int]:
    return [text.count("\n", 0, offset) + 1 for offset in offsets]


def _offsets(text: str, needle: str) -> list[int]:
    found: list[int] = []
    at = text.find(needle)
    while at >= 0:
        found.append(at)
        at = text.find(needle, at + len(needle))
    return found


def _required(args: dict[str, Any], key: str, command: str, *, allow_empty: bool = True) -> str:
    value = args.get(key)
    if value is None:
        raise ToolError(f"Parameter `{key}` is required for command: {command}", code="INVALID_ARGUMENTS")
    if not allow_empty and value == "":
        raise ToolError(f"Parameter `{key}` is empty for command: {command}", code="INVALID_ARGUMENTS")
    assert isinstance(value, str)  # the spine checked the declared type
    return value


def _integral(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if float(value).is_integer() else None


def _load(path: str) -> tuple[str, int]:
    """The UTF-8 text of a regular file and its mtime (ns), from one open that never waits (a FIFO
    put in the file's place since ``_existing`` looked at it would block an open for reading, and
    this thread with it, until a writer came)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        f = open(fd, "rb")  # noqa: SIM115 - closed by the with below
    except BaseException:
        os.close(fd)
        raise
    with f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f'cannot read "{path}": not a regular file', code="NOT_REGULAR_FILE")
        if st.st_size > MAX_FILE_BYTES:
            raise ToolError(f'"{path}" is {st.st_size} bytes, more than this tool loads ({MAX_FILE_BYTES}); '
                            "look inside it with bash (grep -n, sed -n)", code="FILE_TOO_LARGE")
        data = f.read(MAX_FILE_BYTES + 1)
    if b"\0" in data[:8192]:
        raise ToolError(f'"{path}" looks binary; this tool edits UTF-8 text only', code="BINARY_FILE")
    try:
        return data.decode("utf-8"), st.st_mtime_ns
    except UnicodeDecodeError:
        raise ToolError(f'"{path}" is not UTF-8 text; this tool edits UTF-8 text only', code="BINARY_FILE") from None


def _listing(root: str) -> list[str]:
    """``d``/``f``/``?`` rows, tab, path, for ``root`` and two levels below it (no hidden entries,
    node_modules or __pycache__; symlinks are shown, not followed)."""
    rows = [f"d\t{root}"]

    def visit(directory: str, depth: int) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            if directory == root:
                raise
            return  # an unreadable subdirectory is listed, its contents not
        for entry in entries:
            if entry.name.startswith(".") or entry.name in SKIPPED_DIRS:
                continue
            full = os.path.join(directory, entry.name)
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                kind = "d" if is_dir else "f" if entry.is_file(follow_symlinks=False) else "?"
            except OSError:
                is_dir, kind = False, "?"
            rows.append(f"{kind}\t{full}")
            if is_dir and depth < 2:
                visit(full, depth + 1)

    visit(root, 1)
    rows.sort(key=lambda row: row.split("\t", 1)[1])
    return rows


def _reads(ctx: ToolContext) -> ReadRecords:
    records: ReadRecords = ctx.agent.state(ReadRecords)
    return records


class StrReplaceEditor:
    """The tool; its writes go through the host's ``Confinement`` seam."""

    def __init__(self, *, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS, description: str | None = None) -> None:
        self.max_output_chars = max_output_chars
        self.spec = ToolSpec(name=NAME, description=description or DESCRIPTION, parameters=PARAMETERS, kind="edit")

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        command = args.get("command")
        if command not in COMMANDS:
            raise ToolError(f"Unrecognized command {command!r}. The allowed commands for the {NAME} tool are: "
                            f"{', '.join(COMMANDS)}", code="INVALID_ARGUMENTS")
        path = self._path(args.get("path"), ctx)
        if command == "view":
            return ToolOutput.text(await self._view(path, args.get("view_range"), ctx))
        if command == "create":
            return ToolOutput.text(await self._create(path, _required(args, "file_text", "create"), ctx))
        if command == "str_replace":
            old = _required(args, "old_str", "str_replace", allow_empty=False)
            new = args.get("new_str")
            return ToolOutput.text(await self._replace(path, old, "" if new is None else new, ctx))
        insert_line = args.get("insert_line")
        if insert_line is None:
            raise ToolError("Parameter `insert_line` is required for command: insert", code="INVALID_ARGUMENTS")
        return ToolOutput.text(await self._insert(path, insert_line, _required(args, "new_str", "insert"), ctx))

    # ------------------------------------------------------------------ paths

    @staticmethod
    def _path(raw: Any, ctx: ToolContext) -> str:
        if not isinstance(raw, str) or not raw.strip():
            raise ToolError("path must be a non-empty string", code="INVALID_ARGUMENTS")
        if not os.path.isabs(raw):
            # the original suggests "/<path>"; the path under the session's workspace is the likelier meaning
            suggestion = os.path.normpath(os.path.join(ctx.cwd, raw))
            raise ToolError(f"The path {raw} is not an absolute path, it should start with `/`. "
                            f"Maybe you meant {suggestion}?", code="INVALID_ARGUMENTS")
        return os.path.normpath(raw)

    @staticmethod
    def _existing(path: str, command: str) -> os.stat_result:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise ToolError(f"The path {path} does not exist. Please provide a valid path.", code="NOT_FOUND") from None
        except NotADirectoryError:
            raise ToolError(f"The path {path} does not exist. Please provide a valid path.", code="NOT_FOUND") from None
        except PermissionError:
            raise ToolError(f'cannot {command} "{path}": permission denied', code="PERMISSION_DENIED") from None
        if stat.S_ISDIR(st.st_mode) and command != "view":
            raise ToolError(f"The path {path} is a directory and only the `view` command can be used on directories",
                            code="IS_DIRECTORY")
        if not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
            what = "view" if command == "view" else "edit" if command == "str_replace" else "insert into"
            extra = " or directory" if command == "view" else ""
            raise ToolError(f'cannot {what} "{path}": not a regular file{extra}', code="NOT_REGULAR_FILE")
        return st

    async def _text(self, path: str, ctx: ToolContext) -> tuple[str, int]:
        """The file's text (the editor's, unsaved edits included, when the client has it open) and
        the mtime the read records keep."""
        try:
            text, mtime = await anyio.to_thread.run_sync(_load, path)
        except FileNotFoundError:
            raise ToolError(f"The path {path} does not exist. Please provide a valid path.", code="NOT_FOUND") from None
        except PermissionError:
            raise ToolError(f'cannot read "{path}": permission denied', code="PERMISSION_DENIED") from None
        buffers = ctx.agent.spec.buffers
        buffered = await buffers.read(os.path.realpath(path)) if buffers is not None else None
        return (text if buffered is None else buffered), mtime

    # ------------------------------------------------------------------ view

    async def _view(self, path: str, view_range: Any, ctx: ToolContext) -> str:
        st = self._existing(path, "view")
        if stat.S_ISDIR(st.st_mode):
            if view_range is not None:
                raise ToolError("The `view_range` parameter is not allowed when `path` points to a directory.",
                                code="INVALID_ARGUMENTS")
            try:
                rows = await anyio.to_thread.run_sync(_listing, path)
            except PermissionError:
                raise ToolError(f'cannot view "{path}": permission denied', code="PERMISSION_DENIED") from None
            listing = clip("\n".join(rows) + "\n", self.max_output_chars)
            return (f"Here're the files and directories up to 2 levels deep in {path}, excluding hidden items, "
                    f"node_modules, and Python cache directories:\n{listing}\n")
        text, mtime = await self._text(path, ctx)
        _reads(ctx)[os.path.realpath(path)] = mtime
        lines = text.split("\n")
        first, shown = 1, lines
        header = f"Here's the content of {path} with line numbers (which has a total of {len(lines)} lines)"
        if view_range is not None:
            pair = [_integral(v) for v in view_range] if isinstance(view_range, list) else []
            if len(pair) != 2 or None in pair:
                raise ToolError("Invalid `view_range`. It should be a list of two integers.", code="INVALID_ARGUMENTS")
            start, end = pair[0], pair[1]
            assert start is not None and end is not None
            given = f"[{start}, {end}]"
            if start < 1 or start > len(lines):
                raise ToolError(f"Invalid `view_range`: {given}. Its first element `{start}` should be within the "
                                f"range of lines of the file: [1, {len(lines)}]", code="INVALID_ARGUMENTS")
            if end > len(lines):
                raise ToolError(f"Invalid `view_range`: {given}. Its second element `{end}` should be smaller than "
                                f"the number of lines in the file: `{len(lines)}`", code="INVALID_ARGUMENTS")
            if end != -1 and end < start:
                raise ToolError(f"Invalid `view_range`: {given}. Its second element `{end}` should be larger or "
                                f"equal than its first `{start}`", code="INVALID_ARGUMENTS")
            first, shown = start, lines[start - 1:] if end == -1 else lines[start - 1:end]
            header += f" with view_range={given}"
        numbered = "\n".join(f"{first + i:6}  {line}" for i, line in enumerate(shown))
        return clip(f"{header}:\n{numbered}\n", self.max_output_chars)

    # ------------------------------------------------------------------ writes

    async def _store(self, path: str, text: str, ctx: ToolContext, *, create: bool) -> None:
        confinement = ctx.host.confinement
        if confinement is None:
            raise ToolError(f'cannot write "{path}": no plugin provides confinement in this composition (mount '
                            "sandbox-tools), and nothing is written unconfined", code="SANDBOX_UNAVAILABLE")
        try:
            mtime = await confinement.write_file(path, text.encode("utf-8"), session=ctx.agent, cwd=ctx.cwd,
                                                 create=create)
        except WriteDenied as exc:
            # the original's marker first (what a model trained on the tool recognises), then why
            raise ToolError(f'[sandbox: file access denied under {exc.mode} mode] cannot write "{path}": '
                            f"{exc.reason}.", code="SANDBOX_DENIED") from None
        except IsADirectoryError:
            raise ToolError(f"The path {path} is a directory and only the `view` command can be used on directories",
                            code="IS_DIRECTORY") from None
        except OSError as exc:
            raise ToolError(f'cannot write "{path}": {exc.strerror}', code="WRITE_FAILED") from None
        real = os.path.realpath(path)
        _reads(ctx)[real] = mtime
        if ctx.agent.spec.buffers is not None:  # after the sandbox let the write happen: the editor shows it
            await ctx.agent.spec.buffers.wrote(real, text)

    async def _create(self, path: str, file_text: str, ctx: ToolContext) -> str:
        if os.path.lexists(path):
            raise ToolError(f"File already exists at: {path}. Cannot overwrite files using command `create`.",
                            code="ALREADY_EXISTS")
        await self._store(path, file_text, ctx, create=True)
        return f"New file created successfully at: {path}"

    async def _current(self, path: str, command: str, ctx: ToolContext) -> str:
        """The text to edit: the file must exist, be one this session read or wrote, and be unchanged since."""
        self._existing(path, command)
        reads = _reads(ctx)
        real = os.path.realpath(path)
        if real not in reads:
            raise ToolError(f'edit requires reading "{path}" first — view the file, then retry', code="NOT_READ")
        text, mtime = await self._text(path, ctx)
        if mtime != reads[real]:
            raise ToolError(f'cannot write "{path}": file changed since it was read — view the file again, then retry',
                            code="STALE_READ")
        return text

    async def _replace(self, path: str, old: str, new: str, ctx: ToolContext) -> str:
        text = await self._current(path, "str_replace", ctx)
        found = _offsets(text, old)
        if not found:
            raise ToolError(f"No replacement was performed, old_str `{old}` did not appear verbatim in {path}.",
                            code="NO_MATCH")
        if len(found) > 1:
            lines = ", ".join(str(n) for n in _lines_at(text, found))
            raise ToolError(f"No replacement was performed. Multiple occurrences of old_str `{old}` in lines "
                            f"[{lines}]. Please ensure it is unique", code="AMBIGUOUS_MATCH")
        at = found[0]
        await self._store(path, text[:at] + new + text[at + len(old):], ctx, create=False)
        return f"The file {path} has been edited successfully."

    async def _insert(self, path: str, insert_line: Any, new: str, ctx: ToolContext) -> str:
        text = await self._current(path, "insert", ctx)
        lines = text.split("\n")
        at = _integral(insert_line)
        if at is None or at < 0 or at > len(lines):
            raise ToolError(f"Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines "
                            f"of the file: [0, {len(lines)}]", code="INVALID_ARGUMENTS")
        await self._store(path, "\n".join([*lines[:at], *new.split("\n"), *lines[at:]]), ctx, create=False)
        return f"The file {path} has been edited successfully."
