"""The file tools: ``read``, ``write``, ``edit`` and ``read_image``.

Writes enforce the tier's writable roots in-process (``fspath.open_for_write``: ``openat2``
with ``RESOLVE_BENEATH``); reads are allowed everywhere. ``edit`` works only on a file this
session has read (or written), unchanged since (the Sandbox keeps the per-agent read records).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING, Any, ClassVar

import anyio

from dsh_core import ToolError
from dsh_core.media import sniff_image
from dsh_core.paths import fd_name, read_small_text
from dsh_core.types import FileChange, FileChanges, ImageBlock, TextBlock, ToolOutput

from .base import BOOL, INT, OPT_INT, STR, SandboxTool, out_schema, str_arg, whole_number
from .fspath import PathDenied, absolute, open_cached, open_for_write
from .policy import Settings
from .sandbox import Sandbox

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext

READ_DEFAULT_LIMIT = 2000
READ_MAX_LINE = 2000
IMAGE_MAX_BYTES = 10_000_000

# The structured results (ToolOutput.structured) that programs see in code mode; the model's
# text results are unchanged.
READ_OUTPUT = out_schema({
    "path": STR,
    "text": {**STR, "description": "The lines of the window, exactly as in the file (no line numbers)."},
    "first_line": {**INT, "description": "1-based number of the first line shown (0 when none)."},
    "last_line": {**INT, "description": "Number of the last line shown (0 when none)."},
    "total_lines": INT,
})
WRITE_OUTPUT = out_schema({"path": STR, "created": {**BOOL, "description": "false when it overwrote a file"},
                           "bytes": INT})
EDIT_OUTPUT = out_schema({"path": STR, "replacements": INT})
READ_IMAGE_OUTPUT = out_schema({"path": STR, "mime": STR, "bytes": INT,
                                "width": OPT_INT, "height": OPT_INT})


WHOLE_READ_MAX = 8 << 20  # bytes of a file read whole, its lines split in C; a larger one is streamed
CACHED_READ_MAX = 256 << 10  # bytes of a file that may be read in the event loop, from the kernel's caches
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: opening a FIFO never waits


def _read_window(path: str, offset: int, limit: int, exact: list[str] | None = None,
                 buffered: str | None = None, *, cached: bool = False) -> tuple[str, int, int, int, int, str] | None:
    """(numbered lines ``N: text``, first line, last line, total lines, mtime_ns, real path) of a
    text file — of ``buffered`` instead of its bytes when given (the editor's text of it), the file
    still deciding that it exists, is readable and is text; the window's exact lines are appended
    to ``exact``. ``IsADirectoryError`` for a directory, ``_NotRegular`` for any other file that is
    not a regular one (as the original: a FIFO, a socket, a device; the open never waits on one).

    ``cached``: for the event loop's own thread. The file is read only if the kernel can answer
    from its caches without waiting — the path resolved by ``open_cached`` (``RESOLVE_CACHED``),
    the bytes read with ``preadv2(RWF_NOWAIT)`` (which fails rather than wait for a disk), a
    regular file up to ``CACHED_READ_MAX`` — else None, and the caller reads it in a worker
    thread. The worker thread cost more than the read: its hop, and the GIL passed back and forth
    with the loop on every system call (100 reads of 50-line files in one message: 20 -> 11 ms;
    in a worker thread, a read's own 25 us became 200-500 us waiting for the GIL).

    A file up to ``WHOLE_READ_MAX`` is read at once and split at ``\n`` in C, its window decoded
    at once; a larger one is streamed line by line. (Measured, the window of a 50-line file:
    27 -> 20 us alone; 2,000 lines: 850 -> 553 us.)"""
    fd = open_cached(path, _READ_FLAGS) if cached else os.open(path, _READ_FLAGS)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if not stat.S_ISREG(st.st_mode):
            raise _NotRegular(path)
        if cached:
            data = _cached_bytes(fd, st)
            if data is None:
                return None
            head = data[:8192]
        else:
            head = _read_upto(fd, 8192)
        if b"\0" in head:
            raise ToolError(
                f"{path} looks binary; use read_image for an image, or bash (e.g. `xxd | head`) to inspect it",
                code="BINARY_FILE",
            )
        real = fd_name(fd) or os.path.realpath(path)
        if buffered is not None:
            data = buffered.encode("utf-8")
        elif not cached:
            rest = _read_upto(fd, WHOLE_READ_MAX) if len(head) == 8192 else b""
            data = head + rest if len(rest) < WHOLE_READ_MAX else None
        if data is not None:
            text, first, last, total = _window_of(data, offset, limit, exact)
            return text, first, last, total, st.st_mtime_ns, real
        out: list[str] = []
        n = 0
        with open(fd, "rb", closefd=False) as f:
            f.seek(0)
            for n, raw in enumerate(f, start=1):
                if offset <= n < offset + limit:
                    line = raw.decode("utf-8", errors="replace")
                    if exact is not None:
                        exact.append(line)
                    out.append(_numbered(n, line.removesuffix("\n")))
    finally:
        os.close(fd)
    first = offset if out else 0
    return "\n".join(out), first, first + len(out) - 1 if out else 0, n, st.st_mtime_ns, real


class _NotRegular(Exception):
    pass


_READ_ERRORS = (  # what a failed read tells the model: (exception, text, code)
    (FileNotFoundError, "{raw} does not exist (paths are relative to {cwd})", "NOT_FOUND"),
    (IsADirectoryError, "{raw} is a directory; use glob to list it", "IS_DIRECTORY"),
    (_NotRegular, 'cannot read "{raw}": not a regular file', "NOT_REGULAR_FILE"),
    (PermissionError, "{raw}: permission denied", "PERMISSION_DENIED"),
)


def _read_upto(fd: int, size: int) -> bytes:
    """Up to ``size`` bytes from ``fd``'s position: fewer only at the end of the file."""
    chunks: list[bytes] = []
    while size > 0 and (chunk := os.read(fd, size)):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _cached_bytes(fd: int, st: os.stat_result) -> bytes | None:
    """The whole of a regular file, if the page cache holds all of it and it is no larger than
    ``CACHED_READ_MAX``: one ``RWF_NOWAIT`` read of one byte more than its size, which must come
    back exactly its size (a file that grew or shrank since the ``fstat``, a partly cached one,
    and a file system that cannot read this way are all read in the worker thread instead)."""
    if st.st_size > CACHED_READ_MAX:
        return None
    buf = bytearray(st.st_size + 1)
    try:
        n = os.preadv(fd, [buf], 0, os.RWF_NOWAIT)
    except OSError:  # EAGAIN: not all of it cached; EOPNOTSUPP: this file system cannot tell
        return None
    return bytes(buf[:n]) if n == st.st_size else None


def _numbered(n: int, line: str) -> str:
    line = line.removesuffix("\r")
    if len(line) > READ_MAX_LINE:
        line = line[:READ_MAX_LINE] + f"... (line truncated to {READ_MAX_LINE} chars)"
    return f"{n}: {line}"


def _window_of(data: bytes, offset: int, limit: int, exact: list[str] | None) -> tuple[str, int, int, int]:
    """``_read_window`` of a whole file's bytes: lines end at ``\n`` (as a binary file's do when
    iterated); the window is decoded at once (``\n`` is never inside a UTF-8 sequence, so this
    decodes each line as decoding it alone would)."""
    lines = data.split(b"\n")
    if not lines[-1]:  # the file ends with a newline (or is empty): no line after it
        lines.pop()
    total = len(lines)
    window = lines[offset - 1: offset - 1 + limit]
    if not window:
        return "", 0, 0, total
    last = offset - 1 + len(window)
    ends = last < total or data.endswith(b"\n")  # the window's last line has its newline
    text = (b"\n".join(window) + (b"\n" if ends else b"")).decode("utf-8", errors="replace")
    if exact is not None:
        exact.append(text)
    body = text[:-1] if ends else text  # its lines, each without its newline
    rows = body.split("\n")
    if "\r" in body or max(map(len, rows)) > READ_MAX_LINE:
        numbered = "\n".join(_numbered(n, line) for n, line in enumerate(rows, start=offset))
    else:  # most windows: nothing to cut, no call a line (2,000 lines numbered: 335 -> 208 us)
        numbered = "\n".join([f"{n}: {line}" for n, line in enumerate(rows, offset)])
    return numbered, offset, last, total


def file_envelope(path: str, body: str, kind: str = "file") -> str:
    """The frame a file tool's answer comes in: which file (absolute), what it is, then the body."""
    return f"<path>{path}</path>\n<type>{kind}</type>\n<content>\n{body}\n</content>"


class ReadTool(SandboxTool):
    name = "read"
    kind = "read"
    description = "Read a UTF-8 text file; its lines come back numbered (`N: text`)."
    properties: ClassVar[dict[str, Any]] = {
        "file_path": {"type": "string", "description": "The file to read: absolute, or relative to the workspace."},
        "offset": {"type": "number", "description": "The first line to return, counting from 1 (default 1)."},
        "limit": {"type": "number", "description": f"How many lines to return at most (default {READ_DEFAULT_LIMIT})."},
    }
    required = ("file_path",)
    output_schema = READ_OUTPUT
    parallel_safe = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raw = str_arg(args, "file_path")
        offset = whole_number(args, "offset", 1)
        limit = whole_number(args, "limit", READ_DEFAULT_LIMIT)
        path = os.path.normpath(absolute(raw, ctx.cwd))
        buffers = ctx.agent.spec.buffers
        buffered = await buffers.read(os.path.realpath(path)) if buffers is not None else None
        try:
            exact: list[str] = []
            # What the kernel has cached is read right here; anything else in a worker thread.
            window = _read_window(path, offset, limit, exact, buffered, cached=True)
            if window is None:
                window = await anyio.to_thread.run_sync(_read_window, path, offset, limit, exact, buffered)
            assert window is not None
            text, first, last, total, mtime, real = window
        except (FileNotFoundError, IsADirectoryError, _NotRegular, PermissionError) as exc:
            message, code = next((m, c) for kind, m, c in _READ_ERRORS if isinstance(exc, kind))
            raise ToolError(message.format(raw=raw, cwd=ctx.cwd), code=code) from None
        if not text and offset > max(total, 1):  # not a read of the file: edit still needs one
            raise ToolError(f'offset {offset} is out of range for "{path}" ({total} lines)', code="OUT_OF_RANGE")
        self.sb.reads(ctx.agent)[real] = mtime
        data = {"path": raw, "text": "".join(exact), "first_line": first, "last_line": last, "total_lines": total}
        if last < total:
            footer = f"(Showing lines {first}-{last} of {total}. Use offset={last + 1} to continue.)"
        else:
            footer = f"(End of file - total {total} lines)"
        body = f"{text}\n\n{footer}" if text else footer
        return ToolOutput(content=[TextBlock(text=file_envelope(path, body))], structured=data)


def _denied(sb: Sandbox, exc: PathDenied, mode: str, raw: str) -> ToolError:
    msg = f'cannot write "{raw}" under {mode} mode: {exc.reason}.'
    if mode == "read-only":
        msg = f'cannot write "{raw}": the sandbox is read-only (no writes allowed).'
    hint = sb.hint(mode)
    return ToolError(msg + (" " + hint if hint else ""), code="SANDBOX_DENIED")


CHANGE_MAX = 1 << 20  # bytes of a file's text a write reads to show what it replaces (larger: shown without)


def write_bytes(abspath: str, data: bytes, roots: list[str] | None, *, create: bool, label: str) -> tuple[bool, int]:
    existed = os.path.lexists(abspath)
    fd = open_for_write(abspath, roots, create=create, mkdirs=create, mode_label=label)
    try:
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        return existed, os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)


class WriteTool(SandboxTool):
    name = "write"
    kind = "edit"
    properties: ClassVar[dict[str, Any]] = {
        "file_path": {"type": "string", "description": "The file to write: absolute, or relative to the workspace."},
        "content": {"type": "string", "description": "The whole UTF-8 text the file is to hold."},
    }
    required = ("file_path", "content")
    output_schema = WRITE_OUTPUT
    escalates = True

    def describe(self, settings: Settings) -> str:
        return (
            "Create a UTF-8 text file, or replace all of an existing one (missing parent directories are made). "
            f'Writes go only where the sandbox mode "{settings.mode}" allows.'
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raw = str_arg(args, "file_path")
        content = str_arg(args, "content", allow_empty=True)
        path = os.path.normpath(absolute(raw, ctx.cwd))
        # The text this write replaces, as the person sees it: the editor's buffer (unsaved edits
        # included) when the door lends one, else the disk. The approval and the card show this pair.
        buffers = ctx.agent.spec.buffers
        buffered = await buffers.read(os.path.realpath(path)) if buffers is not None else None
        known, before = (True, buffered) if buffered is not None else await anyio.to_thread.run_sync(read_small_text, path, CHANGE_MAX)
        change = FileChange(path=path, before=before, after=content) if known else None
        mode = await self.sb.effective_mode(args, ctx, "file operation", change)
        data = content.encode("utf-8")
        try:
            existed, mtime = await anyio.to_thread.run_sync(
                lambda: write_bytes(path, data, self.sb.write_roots(mode, ctx.cwd, ctx.agent), create=True, label=mode)
            )
        except PathDenied as exc:
            raise _denied(self.sb, exc, mode, raw) from None
        except IsADirectoryError:
            raise ToolError(f"{raw} is a directory", code="IS_DIRECTORY") from None
        except OSError as exc:
            raise ToolError(f"cannot write {raw}: {exc.strerror}", code="WRITE_FAILED") from None
        self.sb.reads(ctx.agent)[os.path.realpath(path)] = mtime
        if change is not None:
            ctx.agent.state(FileChanges).record(ctx.call_id, change)
        if buffers is not None:  # after the sandbox let the write happen: the editor shows it
            await buffers.wrote(os.path.realpath(path), content)
        out = ToolOutput.text(file_envelope(path, "Updated file" if existed else "Created file"))
        out.structured = {"path": raw, "created": not existed, "bytes": len(data)}
        return out


class EditTool(SandboxTool):
    name = "edit"
    kind = "edit"
    description = (
        "Change an existing UTF-8 text file by replacing literal text, in a file you have read in this session "
        "(and not changed since)."
    )
    properties: ClassVar[dict[str, Any]] = {
        "file_path": {"type": "string", "description": "The file to edit: absolute, or relative to the workspace."},
        "old_string": {"type": "string", "description": "The literal text to replace, matched exactly (whitespace too)."},
        "new_string": {"type": "string", "description": "The literal text to put in its place; empty deletes it."},
        "replace_all": {"type": "boolean", "description": "Replace every occurrence. Default false: old_string must "
                        "then occur exactly once."},
    }
    required = ("file_path", "old_string", "new_string")
    output_schema = EDIT_OUTPUT
    escalates = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raw = str_arg(args, "file_path")
        old = str_arg(args, "old_string")
        new = str_arg(args, "new_string", allow_empty=True)
        replace_all = bool(args.get("replace_all", False))
        if old == new:
            raise ToolError("old_string and new_string are the same; nothing to change", code="INVALID_ARGUMENTS")
        path = os.path.normpath(absolute(raw, ctx.cwd))
        real = os.path.realpath(path)
        reads = self.sb.reads(ctx.agent)
        if real not in reads:
            raise ToolError(f'edit requires reading "{raw}" first — read the file, then retry', code="NOT_READ")
        try:
            st = os.stat(real)
            with open(real, "rb") as f:
                text = f.read().decode("utf-8")
        except FileNotFoundError:
            raise ToolError(f"{raw} no longer exists; use write to create it", code="NOT_FOUND") from None
        except UnicodeDecodeError:
            raise ToolError(f"{raw} is not UTF-8 text; edit it with bash", code="BINARY_FILE") from None
        if st.st_mtime_ns != reads[real]:
            raise ToolError(f"{raw} changed since you read it; read it again, then edit", code="STALE_READ")
        buffers = ctx.agent.spec.buffers
        buffered = await buffers.read(real) if buffers is not None else None
        if buffered is not None:  # the text the model read: the editor's, unsaved edits included
            text = buffered
        count = text.count(old)
        if count == 0:
            raise ToolError(f"old_string was not found in {raw}; read the file and copy the text exactly",
                            code="NO_MATCH")
        if count > 1 and not replace_all:
            raise ToolError(
                f"old_string occurs {count} times in {raw}; add surrounding context to make it unique, "
                "or set replace_all to true",
                code="AMBIGUOUS_MATCH",
            )
        updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        change = FileChange(path=path, before=text, after=updated)  # approved, written and shown: one text
        mode = await self.sb.effective_mode(args, ctx, "file operation", change)
        try:
            _, mtime = await anyio.to_thread.run_sync(
                lambda: write_bytes(path, updated.encode("utf-8"), self.sb.write_roots(mode, ctx.cwd, ctx.agent),
                                     create=False, label=mode)
            )
        except PathDenied as exc:
            raise _denied(self.sb, exc, mode, raw) from None
        except OSError as exc:
            raise ToolError(f"cannot write {raw}: {exc.strerror}", code="WRITE_FAILED") from None
        reads[real] = mtime
        ctx.agent.state(FileChanges).record(ctx.call_id, change)
        if buffers is not None:
            await buffers.wrote(real, updated)
        n = count if replace_all else 1
        out = ToolOutput.text(f"The file {path} has been updated. All occurrences were successfully replaced."
                              if replace_all else f"The file {path} has been updated successfully.")
        out.structured = {"path": raw, "replacements": n}
        return out


class ReadImageTool(SandboxTool):
    name = "read_image"
    kind = "read"
    description = (
        "Look at an image file (png, jpeg, gif, webp): it is attached to the conversation so you can see it. "
        "Only for models with image input."
    )
    properties: ClassVar[dict[str, Any]] = {
        "file_path": {"type": "string", "description": "The image file: absolute, or relative to the workspace."}}
    required = ("file_path",)
    output_schema = READ_IMAGE_OUTPUT
    parallel_safe = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raw = str_arg(args, "file_path")
        route = ctx.route
        if not route.image_input:
            raise ToolError(
                f'cannot read "{raw}" as an image: model "{route.model}" does not declare image input; '
                "describe what you need from the file another way (e.g. inspect it with bash)",
                code="NO_IMAGE_INPUT",
            )
        store = ctx.host.attachment_store
        if store is None:
            raise ToolError(
                f'cannot read "{raw}" as an image: no attachment store is mounted in this composition',
                code="NO_ATTACHMENT_STORE",
            )
        path = os.path.normpath(absolute(raw, ctx.cwd))
        try:
            size = os.path.getsize(path)
            if size > IMAGE_MAX_BYTES:
                raise ToolError(f'"{raw}" is {size} bytes; images larger than {IMAGE_MAX_BYTES} bytes are refused',
                                code="IMAGE_TOO_LARGE")
            data = await anyio.Path(path).read_bytes()
        except FileNotFoundError:
            raise ToolError(f'"{raw}" does not exist (paths are relative to {ctx.cwd})', code="NOT_FOUND") from None
        except IsADirectoryError:
            raise ToolError(f'"{raw}" is a directory', code="IS_DIRECTORY") from None
        mime = sniff_image(data)
        if mime is None or mime not in store.mime_types:
            allowed = ", ".join(store.mime_types)
            raise ToolError(f'"{raw}" is not a supported image (supported: {allowed})', code="NOT_AN_IMAGE")
        try:
            (block,) = await store.save_images([(mime, data)])
        except Exception as exc:
            raise ToolError(f'cannot attach "{raw}": {exc}', code="ATTACHMENT_FAILED") from None
        assert isinstance(block, ImageBlock)
        size_text = f"{block.width}x{block.height} px, " if block.width and block.height else ""
        return ToolOutput(
            content=[TextBlock(text=file_envelope(path, f"{mime} image, {size_text}{len(data)} bytes", "image")), block],
            structured={"path": raw, "mime": mime, "bytes": len(data), "width": block.width, "height": block.height},
        )
