"""The file tools: ``read``, ``write``, ``edit`` and ``read_image``.

Writes enforce the tier's writable roots in-process (``fspath.open_for_write``: ``openat2``
with ``RESOLVE_BENEATH``); reads are allowed everywhere. ``edit`` works only on a file this
session has read (or written), unchanged since (the Sandbox keeps the per-agent read records).
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any, ClassVar

import anyio

from dsh_core import ToolError
from dsh_core.media import sniff_image
from dsh_core.types import ImageBlock, TextBlock, ToolOutput

from .base import BOOL, INT, OPT_INT, STR, SandboxTool, int_arg, out_schema, str_arg
from .fspath import PathDenied, absolute, open_for_write
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


def _read_window(path: str, offset: int, limit: int, exact: list[str] | None = None,
                 buffered: str | None = None) -> tuple[str, int, int, int, int]:
    """(numbered text, first line, last line, total lines, mtime_ns) of a text file — of
    ``buffered`` instead of its bytes when given (the editor's text of it), the file still deciding
    that it exists, is readable and is text; the window's exact lines are appended to ``exact``."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        head = f.read(8192)
        if b"\0" in head:
            raise ToolError(
                f"{path} looks binary; use read_image for an image, or bash (e.g. `xxd | head`) to inspect it",
                code="BINARY_FILE",
            )
        f.seek(0)
        source = f if buffered is None else io.BytesIO(buffered.encode("utf-8"))
        out: list[str] = []
        n = 0
        for n, raw in enumerate(source, start=1):
            if offset <= n < offset + limit:
                if exact is not None:
                    exact.append(raw.decode("utf-8", errors="replace"))
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if len(line) > READ_MAX_LINE:
                    line = line[:READ_MAX_LINE] + f"… [line truncated, {len(line)} chars]"
                out.append(f"{n:>6}\t{line}")
    first = offset if out else 0
    return "\n".join(out), first, first + len(out) - 1 if out else 0, n, st.st_mtime_ns


class ReadTool(SandboxTool):
    name = "read"
    kind = "read"
    description = (
        "Read a text file as numbered lines (`<line>\\t<text>`). Paths are absolute or relative to the "
        f"workspace. offset is the first line (1-based), limit the number of lines (default {READ_DEFAULT_LIMIT})."
    )
    properties: ClassVar[dict[str, Any]] = {
        "path": {"type": "string", "description": "File to read."},
        "offset": {"type": "integer", "description": "First line to show, 1-based (default 1)."},
        "limit": {"type": "integer", "description": f"Lines to show (default {READ_DEFAULT_LIMIT})."},
    }
    required = ("path",)
    output_schema = READ_OUTPUT
    parallel_safe = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raw = str_arg(args, "path")
        assert raw is not None
        offset = int_arg(args, "offset", 1, minimum=1)
        limit = int_arg(args, "limit", READ_DEFAULT_LIMIT, minimum=1)
        path = absolute(raw, ctx.cwd)
        if os.path.isdir(path):
            raise ToolError(f"{raw} is a directory; use glob to list it", code="IS_DIRECTORY")
        buffers = ctx.agent.spec.buffers
        buffered = await buffers.read(os.path.realpath(path)) if buffers is not None else None
        try:
            exact: list[str] = []
            text, first, last, total, mtime = await anyio.to_thread.run_sync(
                _read_window, path, offset, limit, exact, buffered)
        except FileNotFoundError:
            raise ToolError(f"{raw} does not exist (paths are relative to {ctx.cwd})", code="NOT_FOUND") from None
        except PermissionError:
            raise ToolError(f"{raw}: permission denied", code="PERMISSION_DENIED") from None
        self.sb.reads(ctx.agent)[os.path.realpath(path)] = mtime
        data = {"path": raw, "text": "".join(exact), "first_line": first, "last_line": last, "total_lines": total}
        if total == 0:
            text = f"{raw} is empty (0 lines)"
        elif not text:
            text = f"{raw} has {total} lines; offset {offset} is past the end"
        elif first != 1 or last != total:
            more = f"; continue with offset={last + 1}" if last < total else ""
            text += f"\n[lines {first}–{last} of {total}{more}]"
        return ToolOutput(content=[TextBlock(text=text)], structured=data)


def _denied(sb: Sandbox, exc: PathDenied, mode: str, raw: str) -> ToolError:
    msg = f'cannot write "{raw}" under {mode} mode: {exc.reason}.'
    if mode == "read-only":
        msg = f'cannot write "{raw}": the sandbox is read-only (no writes allowed).'
    hint = sb.hint(mode)
    return ToolError(msg + (" " + hint if hint else ""), code="SANDBOX_DENIED")


def _write_bytes(abspath: str, data: bytes, roots: list[str] | None, *, create: bool, label: str) -> tuple[bool, int]:
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
        "path": {"type": "string", "description": "File to write (absolute or relative to the workspace)."},
        "content": {"type": "string", "description": "The complete new content."},
    }
    required = ("path", "content")
    output_schema = WRITE_OUTPUT
    escalates = True

    def describe(self, settings: Settings) -> str:
        return (
            "Create or overwrite a file with the given content (parent directories are created). "
            f'Writes are allowed only where the sandbox mode "{settings.mode}" allows.'
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raw = str_arg(args, "path")
        content = str_arg(args, "content", allow_empty=True)
        assert raw is not None and content is not None
        mode = await self.sb.effective_mode(args, ctx, "file operation")
        path = absolute(raw, ctx.cwd)
        data = content.encode("utf-8")
        try:
            existed, mtime = await anyio.to_thread.run_sync(
                lambda: _write_bytes(path, data, self.sb.write_roots(mode, ctx.cwd), create=True, label=mode)
            )
        except PathDenied as exc:
            raise _denied(self.sb, exc, mode, raw) from None
        except IsADirectoryError:
            raise ToolError(f"{raw} is a directory", code="IS_DIRECTORY") from None
        except OSError as exc:
            raise ToolError(f"cannot write {raw}: {exc.strerror}", code="WRITE_FAILED") from None
        self.sb.reads(ctx.agent)[os.path.realpath(path)] = mtime
        if ctx.agent.spec.buffers is not None:  # after the sandbox let the write happen: the editor shows it
            await ctx.agent.spec.buffers.wrote(os.path.realpath(path), content)
        verb = "overwrote" if existed else "created"
        out = ToolOutput.text(f"{verb} {raw} ({len(data)} bytes)")
        out.structured = {"path": raw, "created": not existed, "bytes": len(data)}
        return out


class EditTool(SandboxTool):
    name = "edit"
    kind = "edit"
    description = (
        "Replace an exact string in a file you have read in this session. old_string must match exactly "
        "(whitespace included) and be unique unless replace_all is true."
    )
    properties: ClassVar[dict[str, Any]] = {
        "path": {"type": "string", "description": "File to edit."},
        "old_string": {"type": "string", "description": "Exact text to replace."},
        "new_string": {"type": "string", "description": "Replacement text."},
        "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."},
    }
    required = ("path", "old_string", "new_string")
    output_schema = EDIT_OUTPUT
    escalates = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raw = str_arg(args, "path")
        old = str_arg(args, "old_string")
        new = str_arg(args, "new_string", allow_empty=True)
        assert raw is not None and old is not None and new is not None
        replace_all = bool(args.get("replace_all", False))
        if old == new:
            raise ToolError("old_string and new_string are the same; nothing to change", code="INVALID_ARGUMENTS")
        path = absolute(raw, ctx.cwd)
        real = os.path.realpath(path)
        reads = self.sb.reads(ctx.agent)
        if real not in reads:
            raise ToolError(f"read {raw} with the read tool before editing it", code="NOT_READ")
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
        mode = await self.sb.effective_mode(args, ctx, "file operation")
        updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        try:
            _, mtime = await anyio.to_thread.run_sync(
                lambda: _write_bytes(path, updated.encode("utf-8"), self.sb.write_roots(mode, ctx.cwd),
                                     create=False, label=mode)
            )
        except PathDenied as exc:
            raise _denied(self.sb, exc, mode, raw) from None
        except OSError as exc:
            raise ToolError(f"cannot write {raw}: {exc.strerror}", code="WRITE_FAILED") from None
        reads[real] = mtime
        if buffers is not None:
            await buffers.wrote(real, updated)
        n = count if replace_all else 1
        out = ToolOutput.text(f"edited {raw}: replaced {n} occurrence{'s' if n != 1 else ''}")
        out.structured = {"path": raw, "replacements": n}
        return out


class ReadImageTool(SandboxTool):
    name = "read_image"
    kind = "read"
    description = (
        "Look at an image file in the workspace (png, jpeg, gif, webp): it is attached to the "
        "conversation so you can see it. Only for models with image input."
    )
    properties: ClassVar[dict[str, Any]] = {"path": {"type": "string", "description": "Image file to view."}}
    required = ("path",)
    output_schema = READ_IMAGE_OUTPUT
    parallel_safe = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raw = str_arg(args, "path")
        assert raw is not None
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
        path = absolute(raw, ctx.cwd)
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
        return ToolOutput(
            content=[TextBlock(text=f"image {raw} ({mime}, {len(data)} bytes)"), block],
            structured={"path": raw, "mime": mime, "bytes": len(data), "width": block.width, "height": block.height},
        )
