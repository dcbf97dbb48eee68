"""The tools: bash, read, write, edit, glob, grep, read_image."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from dsh_core import ToolError
from dsh_core.media import sniff_image
from dsh_core.types import ImageBlock, TextBlock, ToolOutput, ToolSpec

from .fspath import PathDenied, absolute, open_for_write
from .mechanisms import PARTIAL_NOTICE, Runner, get_runner
from .policy import MODES, Settings, scrubbed_env, wider, writable_roots
from .run import CommandResult, run_command, spill_path_for
from .server import CommandServer, ServerError, ServerPool, server_argv

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext

READ_DEFAULT_LIMIT = 2000
READ_MAX_LINE = 2000
GLOB_MAX = 1000
GLOB_SCAN_MAX = 20 * GLOB_MAX  # matches looked at before sampling
GREP_MAX = 500
GREP_MAX_FILE = 5_000_000
IMAGE_MAX_BYTES = 10_000_000


class Sandbox:
    """One host's sandbox state: settings, and per-agent read records (for ``edit``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.servers = ServerPool()
        self._reads: "weakref.WeakKeyDictionary[Any, dict[str, int]]" = weakref.WeakKeyDictionary()

    def reads(self, agent: Any) -> dict[str, int]:
        d = self._reads.get(agent)
        if d is None:
            d = self._reads[agent] = {}
        return d

    def escalation_targets(self) -> list[str]:
        return [m for m in MODES if wider(m, self.settings.mode)]

    # -------------------------------------------------------------- escalation

    def escalation_params(self) -> dict[str, Any]:
        targets = self.escalation_targets()
        if not targets:
            return {}
        return {
            "sandbox_permissions": {
                "type": "string",
                "enum": targets,
                "description": "Only when this one call needs a wider sandbox tier than the current "
                f'"{self.settings.mode}"; a person approves or rejects it once. Requires justification.',
            },
            "justification": {
                "type": "string",
                "description": "Why this call needs the wider tier (shown to the approver). Required with sandbox_permissions.",
            },
        }

    async def effective_mode(self, args: dict[str, Any], ctx: "ToolContext", what: str) -> str:
        """The tier this call runs with; asks the approval seam (one-shot) for a wider one."""
        target = args.get("sandbox_permissions")
        justification = args.get("justification")
        mode = self.settings.mode
        if target is None and justification is None:
            return mode
        if target is None or not isinstance(justification, str) or not justification.strip():
            raise ToolError(
                "sandbox_permissions and justification go together: give both (justification must not be blank), "
                "or neither to run in the current tier",
                code="INVALID_ARGUMENTS",
            )
        if target not in MODES:
            raise ToolError(f"sandbox_permissions must be one of {', '.join(MODES)}", code="INVALID_ARGUMENTS")
        if not wider(target, mode):
            if mode == "danger-full-access":
                raise ToolError(
                    "this deployment already runs without confinement (danger-full-access); "
                    "call again without sandbox_permissions",
                    code="INVALID_ARGUMENTS",
                )
            raise ToolError(
                f'sandbox_permissions "{target}" is not wider than the current mode "{mode}"; '
                "call again without it",
                code="INVALID_ARGUMENTS",
            )
        call = {k: v for k, v in args.items() if k not in ("sandbox_permissions", "justification")}
        outcome = await ctx.approve(
            f"escalate sandbox to {target}: {justification.strip()}",
            kind="execute" if what == "command" else "edit",  # bash runs; write/edit modify files
            subject=args.get("command") if what == "command" else args.get("path"),
            args=call,
            tier=target,
            justification=justification.strip(),
        )
        if outcome == "allowed-once":
            return target
        if outcome == "rejected":
            raise ToolError(
                f'the user rejected escalating this {what} to "{target}"; nothing was run. '
                f'Work within "{mode}" mode or ask the user how to proceed.',
                code="ESCALATION_REJECTED",
            )
        if outcome == "cancelled":
            raise ToolError(f'approval for escalating to "{target}" was cancelled; nothing was run.',
                            code="ESCALATION_CANCELLED")
        raise ToolError(
            f'escalating this {what} to "{target}" requires approval, but no approval channel is available; '
            f'nothing was run. Work within "{mode}" mode.',
            code="APPROVAL_UNAVAILABLE",
        )

    def hint(self, mode: str) -> str:
        """The escalation note appended to a denied write (empty when escalation is not offered)."""
        nxt = [m for m in self.escalation_targets() if wider(m, mode)]
        if not nxt:
            return ""
        opts = " or ".join(f'"{m}"' for m in nxt)
        return (
            f"[sandbox: escalation available — retry this exact call once with sandbox_permissions={opts} "
            "(danger-full-access for paths outside the workspace) and a justification, only if the write is "
            "really needed]"
        )

    def write_roots(self, mode: str, cwd: str) -> list[str] | None:
        return None if mode == "danger-full-access" else writable_roots(mode, cwd)

    # -------------------------------------------------------------- running commands

    async def runner_for(self, mode: str) -> Runner | None:
        """The confinement for ``mode`` (None: danger-full-access); refuses when none works."""
        if mode == "danger-full-access":
            return None
        probe = await get_runner(self.settings.mechanism)
        if probe.runner is None:
            raise ToolError(
                f'sandbox mode "{mode}" is requested but no sandbox backend is usable on this host; '
                f"refusing to run the command unconfined. Tried: {probe.summary()}. "
                "Fix: install bubblewrap (apt-get install bubblewrap) or use a kernel with Landlock; "
                "only on a disposable machine set DSH_PERMISSION_MODE=danger-full-access.",
                code="SANDBOX_UNAVAILABLE",
            )
        return probe.runner

    async def run_argv(
        self,
        argv: list[str],
        *,
        mode: str,
        cwd: str,
        spill: Path,
        owner: Any = None,
        timeout_s: float | None = None,
        limit: int | None = None,
        env: dict[str, str] | None = None,
    ) -> tuple[CommandResult, Runner | None]:
        """Run any ``argv`` in ``cwd`` confined by ``mode``; returns the result and the runner used.

        Calls in the configured mode of a session (``owner``: its agent) go through that
        session's confined command server (a fork per call); escalated one-shot calls, and
        calls without an owner, start a fresh confined process (``Runner.wrap``). Either way,
        when this returns (or is cancelled) no process of the call is alive.
        """
        s = self.settings
        runner = await self.runner_for(mode)
        env = scrubbed_env(mode=mode) if env is None else env
        timeout_s = s.default_timeout_ms / 1000 if timeout_s is None else timeout_s
        limit = s.max_output_bytes if limit is None else limit
        if runner is None:
            return await run_command(argv, cwd=cwd, env=env, timeout_s=timeout_s, limit=limit, spill=spill), None
        roots = writable_roots(mode, cwd)
        if owner is None or mode != s.mode:
            argv = runner.wrap(argv, roots, cwd)
            return await run_command(argv, cwd=cwd, env=env, timeout_s=timeout_s, limit=limit, spill=spill), runner
        key = (getattr(owner, "session_id", id(owner)), runner.name, tuple(roots))
        server_env = scrubbed_env(mode=mode)
        for attempt in (1, 2):
            try:
                server = await self.servers.get(
                    key, owner,
                    lambda: CommandServer(lambda fd: server_argv(runner, roots, cwd, fd), env=server_env, cwd=cwd),
                )
            except ServerError as exc:
                raise ToolError(
                    f'sandbox mode "{mode}" could not be applied ({runner.detail or runner.name} command server: '
                    f"{exc}); refusing to run the command unconfined.",
                    code="SANDBOX_UNAVAILABLE",
                ) from None
            try:
                return await server.run(argv, cwd=cwd, env=env, timeout_s=timeout_s, limit=limit, spill=spill), runner
            except ServerError as exc:
                await self.servers.discard(key)
                if attempt == 2 or not exc.before_start:  # lost mid-call: never run the command twice
                    raise ToolError(f"the sandbox command server failed: {exc}", code="SANDBOX_FAILED") from None
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self.servers.aclose()


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def _out(props: dict[str, Any]) -> dict[str, Any]:
    """An output schema: every listed property is always present."""
    return {"type": "object", "properties": props, "required": list(props)}


_INT = {"type": "integer"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_OPT_INT = {"type": ["integer", "null"]}
_OPT_STR = {"type": ["string", "null"]}

# The structured results (ToolOutput.structured) that programs see in code mode; the model's
# text results are unchanged.
BASH_OUTPUT = _out({
    "exit_code": {**_OPT_INT, "description": "The exit status; None when timed out or killed by a signal."},
    "output": {**_STR, "description": "stdout and stderr merged, bounded; when spilled it names the file "
               "holding the whole output."},
    "timed_out": _BOOL,
    "signal": {**_OPT_INT, "description": "The signal that killed the command, if any."},
    "spill_path": {**_OPT_STR, "description": "The file with the full output when it was too long, else None."},
})
READ_OUTPUT = _out({
    "path": _STR,
    "text": {**_STR, "description": "The lines of the window, exactly as in the file (no line numbers)."},
    "first_line": {**_INT, "description": "1-based number of the first line shown (0 when none)."},
    "last_line": {**_INT, "description": "Number of the last line shown (0 when none)."},
    "total_lines": _INT,
})
WRITE_OUTPUT = _out({"path": _STR, "created": {**_BOOL, "description": "false when it overwrote a file"},
                     "bytes": _INT})
EDIT_OUTPUT = _out({"path": _STR, "replacements": _INT})
GLOB_OUTPUT = _out({"paths": {"type": "array", "items": _STR, "description": "Relative to the workspace when "
                              "inside it."}, "truncated": _BOOL})
GREP_OUTPUT = _out({
    "matches": {"type": "array", "items": _out({"path": _STR, "line": _INT, "text": _STR})},
    "truncated": _BOOL,
})
READ_IMAGE_OUTPUT = _out({"path": _STR, "mime": _STR, "bytes": _INT,
                          "width": _OPT_INT, "height": _OPT_INT})


def _str_arg(args: dict[str, Any], key: str, *, required: bool = True, allow_empty: bool = False) -> str | None:
    v = args.get(key)
    if v is None:
        if required:
            raise ToolError(f"missing required argument {key!r}", code="INVALID_ARGUMENTS")
        return None
    if not isinstance(v, str) or (not allow_empty and not v):
        raise ToolError(f"argument {key!r} must be a non-empty string", code="INVALID_ARGUMENTS")
    return v


def _int_arg(args: dict[str, Any], key: str, default: int, *, minimum: int = 0) -> int:
    v = args.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ToolError(f"argument {key!r} must be an integer ≥ {minimum}", code="INVALID_ARGUMENTS")
    return v


def _display(path: str, cwd: str) -> str:
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


# ------------------------------------------------------------------------------ bash


class BashTool:
    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        s = sb.settings
        self.spec = ToolSpec(
            name="bash",
            description=(
                "Run a shell command with bash in the session workspace (cwd). Output (stdout+stderr) is returned, "
                f"bounded to about {s.max_output_bytes} bytes; longer output is saved to a file whose path is given. "
                f'Sandbox mode: "{s.mode}". Each call runs in a fresh process group; background jobs end with the call.'
            ),
            parameters=_schema(
                {
                    "command": {"type": "string", "description": "The bash command line to run."},
                    "timeout_ms": {
                        "type": "integer",
                        "description": f"Timeout in milliseconds (default {s.default_timeout_ms}, max {s.max_timeout_ms}).",
                    },
                    **sb.escalation_params(),
                },
                ["command"],
            ),
            output_schema=BASH_OUTPUT,
        )

    async def run(self, args: dict[str, Any], ctx: "ToolContext") -> ToolOutput:
        s = self.sb.settings
        command = _str_arg(args, "command")
        assert command is not None
        timeout_ms = min(_int_arg(args, "timeout_ms", s.default_timeout_ms, minimum=1), s.max_timeout_ms)
        mode = await self.sb.effective_mode(args, ctx, "command")
        cwd = os.path.realpath(ctx.cwd)
        if not os.path.isdir(cwd):
            raise ToolError(f"the session directory {cwd} does not exist", code="NO_CWD")
        bash = shutil.which("bash") or "/bin/sh"
        result, runner = await self.sb.run_argv(
            [bash, "-c", command],
            mode=mode,
            cwd=cwd,
            owner=ctx.agent,
            timeout_s=timeout_ms / 1000,
            spill=spill_path_for(s.spill_root(), ctx.session_id, ctx.call_id),
        )
        text = result.text
        if runner is not None and runner.name == "landlock":
            text = text.replace(PARTIAL_NOTICE + "\n", "")
            if result.exit_code == 125 and "landlock-run: " in text:
                raise ToolError(
                    f'sandbox mode "{mode}" could not be applied (Landlock runner failed); refusing to run the '
                    f"command unconfined. Runner output: {text.strip()[-500:]}",
                    code="SANDBOX_UNAVAILABLE",
                )
        lines = [text.rstrip("\n")] if text.strip() else ["(no output)"]
        is_error = False
        if result.timed_out:
            is_error = True
            lines.append(f"[timed out after {timeout_ms} ms; the command and its process group were killed]")
        elif result.signal is not None:
            is_error = True
            lines.append(f"[killed by signal {result.signal}]")
        elif result.exit_code:
            is_error = True
            lines.append(f"[exit code {result.exit_code}]")
        if runner is not None and is_error and runner.denial in text:
            lines.append(f"[sandbox: file access denied under {mode} mode]")
            hint = self.sb.hint(mode)
            if hint:
                lines.append(hint)
        out = ToolOutput.text("\n".join(lines), is_error=is_error, code="TIMEOUT" if result.timed_out else None)
        if result.spill_path is not None:  # already bounded by the spine's Sink: the loop spills nothing more
            out.spill_path = str(result.spill_path)
        out.structured = {
            "exit_code": result.exit_code if result.signal is None else None,
            "output": text,
            "timed_out": result.timed_out,
            "signal": result.signal,
            "spill_path": str(result.spill_path) if result.spill_path is not None else None,
        }
        return out


# ------------------------------------------------------------------------------ read / write / edit


def _read_window(path: str, offset: int, limit: int, exact: list[str] | None = None) -> tuple[str, int, int, int, int]:
    """(numbered text, first line, last line, total lines, mtime_ns) of a text file; the window's
    exact lines are appended to ``exact`` when given."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        head = f.read(8192)
        if b"\0" in head:
            raise ToolError(
                f"{path} looks binary; use read_image for an image, or bash (e.g. `xxd | head`) to inspect it",
                code="BINARY_FILE",
            )
        f.seek(0)
        out: list[str] = []
        n = 0
        for n, raw in enumerate(f, start=1):
            if offset <= n < offset + limit:
                if exact is not None:
                    exact.append(raw.decode("utf-8", errors="replace"))
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if len(line) > READ_MAX_LINE:
                    line = line[:READ_MAX_LINE] + f"… [line truncated, {len(line)} chars]"
                out.append(f"{n:>6}\t{line}")
    first = offset if out else 0
    return "\n".join(out), first, first + len(out) - 1 if out else 0, n, st.st_mtime_ns


class ReadTool:
    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        self.spec = ToolSpec(
            name="read",
            description=(
                "Read a text file as numbered lines (`<line>\\t<text>`). Paths are absolute or relative to the "
                f"workspace. offset is the first line (1-based), limit the number of lines (default {READ_DEFAULT_LIMIT})."
            ),
            parameters=_schema(
                {
                    "path": {"type": "string", "description": "File to read."},
                    "offset": {"type": "integer", "description": "First line to show, 1-based (default 1)."},
                    "limit": {"type": "integer", "description": f"Lines to show (default {READ_DEFAULT_LIMIT})."},
                },
                ["path"],
            ),
            output_schema=READ_OUTPUT,
            parallel_safe=True,
        )

    async def run(self, args: dict[str, Any], ctx: "ToolContext") -> ToolOutput:
        raw = _str_arg(args, "path")
        assert raw is not None
        offset = _int_arg(args, "offset", 1, minimum=1)
        limit = _int_arg(args, "limit", READ_DEFAULT_LIMIT, minimum=1)
        path = absolute(raw, ctx.cwd)
        if os.path.isdir(path):
            raise ToolError(f"{raw} is a directory; use glob to list it", code="IS_DIRECTORY")
        try:
            exact: list[str] = []
            text, first, last, total, mtime = await anyio.to_thread.run_sync(_read_window, path, offset, limit, exact)
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


class WriteTool:
    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        self.spec = ToolSpec(
            name="write",
            description=(
                "Create or overwrite a file with the given content (parent directories are created). "
                f'Writes are allowed only where the sandbox mode "{sb.settings.mode}" allows.'
            ),
            parameters=_schema(
                {
                    "path": {"type": "string", "description": "File to write (absolute or relative to the workspace)."},
                    "content": {"type": "string", "description": "The complete new content."},
                    **sb.escalation_params(),
                },
                ["path", "content"],
            ),
            output_schema=WRITE_OUTPUT,
        )

    async def run(self, args: dict[str, Any], ctx: "ToolContext") -> ToolOutput:
        raw = _str_arg(args, "path")
        content = _str_arg(args, "content", allow_empty=True)
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
        verb = "overwrote" if existed else "created"
        out = ToolOutput.text(f"{verb} {raw} ({len(data)} bytes)")
        out.structured = {"path": raw, "created": not existed, "bytes": len(data)}
        return out


class EditTool:
    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        self.spec = ToolSpec(
            name="edit",
            description=(
                "Replace an exact string in a file you have read in this session. old_string must match exactly "
                "(whitespace included) and be unique unless replace_all is true."
            ),
            parameters=_schema(
                {
                    "path": {"type": "string", "description": "File to edit."},
                    "old_string": {"type": "string", "description": "Exact text to replace."},
                    "new_string": {"type": "string", "description": "Replacement text."},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."},
                    **sb.escalation_params(),
                },
                ["path", "old_string", "new_string"],
            ),
            output_schema=EDIT_OUTPUT,
        )

    async def run(self, args: dict[str, Any], ctx: "ToolContext") -> ToolOutput:
        raw = _str_arg(args, "path")
        old = _str_arg(args, "old_string")
        new = _str_arg(args, "new_string", allow_empty=True)
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
        n = count if replace_all else 1
        out = ToolOutput.text(f"edited {raw}: replaced {n} occurrence{'s' if n != 1 else ''}")
        out.structured = {"path": raw, "replacements": n}
        return out


# ------------------------------------------------------------------------------ glob / grep


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


class GlobTool:
    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        self.spec = ToolSpec(
            name="glob",
            description="List files matching a glob pattern (e.g. `**/*.py`), relative to path (default: the workspace). "
            "`.git` is skipped.",
            parameters=_schema(
                {
                    "pattern": {"type": "string", "description": "Glob pattern; `**` matches any depth."},
                    "path": {"type": "string", "description": "Directory to search from (default: workspace)."},
                },
                ["pattern"],
            ),
            output_schema=GLOB_OUTPUT,
            parallel_safe=True,
        )

    async def run(self, args: dict[str, Any], ctx: "ToolContext") -> ToolOutput:
        pattern = _str_arg(args, "pattern")
        assert pattern is not None
        base = absolute(_str_arg(args, "path", required=False) or ".", ctx.cwd)
        if os.path.isabs(pattern):
            raise ToolError("pattern must be relative; put the directory in path", code="INVALID_ARGUMENTS")
        if not os.path.isdir(base):
            raise ToolError(f"{base} is not a directory", code="NOT_FOUND")
        try:
            found, more = await anyio.to_thread.run_sync(_glob, base, pattern)
        except ValueError as exc:
            raise ToolError(f"bad glob pattern: {exc}", code="INVALID_ARGUMENTS") from None
        shown = [_display(p, ctx.cwd) for p in found]
        data = {"paths": shown, "truncated": more}
        if not found:
            return ToolOutput(content=[TextBlock(text=f"no files match {pattern!r} under {_display(base, ctx.cwd)}")],
                              structured=data)
        lines = list(shown)
        if more:
            lines.append(f"[more than {GLOB_MAX} matches: a sample across the top-level entries; narrow the pattern or path]")
        return ToolOutput(content=[TextBlock(text="\n".join(lines))], structured=data)


def _grep(base: str, rx: "re.Pattern[str]", name_glob: str | None, cwd: str,
          found: list[dict[str, Any]] | None = None) -> tuple[list[str], bool]:
    out: list[str] = []

    def scan(path: str) -> bool:
        try:
            if os.path.getsize(path) > GREP_MAX_FILE:
                return False
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return False
        if b"\0" in data[:8192]:
            return False
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            if rx.search(line):
                if len(line) > 500:
                    line = line[:500] + "…"
                out.append(f"{_display(path, cwd)}:{n}: {line}")
                if found is not None:
                    found.append({"path": _display(path, cwd), "line": n, "text": line})
                if len(out) >= GREP_MAX:
                    return True
        return False

    if os.path.isfile(base):
        return out, scan(base)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if name_glob and not (fnmatch.fnmatch(name, name_glob) or fnmatch.fnmatch(os.path.relpath(path, base), name_glob)):
                continue
            if scan(path):
                return out, True
    return out, False


class GrepTool:
    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        self.spec = ToolSpec(
            name="grep",
            description="Search file contents with a regular expression (Python syntax). Returns `path:line: text`. "
            "path is a file or directory (default: the workspace); glob filters file names (e.g. `*.py`).",
            parameters=_schema(
                {
                    "pattern": {"type": "string", "description": "Regular expression."},
                    "path": {"type": "string", "description": "File or directory to search (default: workspace)."},
                    "glob": {"type": "string", "description": "Only files whose name or relative path matches."},
                },
                ["pattern"],
            ),
            output_schema=GREP_OUTPUT,
            parallel_safe=True,
        )

    async def run(self, args: dict[str, Any], ctx: "ToolContext") -> ToolOutput:
        pattern = _str_arg(args, "pattern")
        assert pattern is not None
        base = absolute(_str_arg(args, "path", required=False) or ".", ctx.cwd)
        name_glob = _str_arg(args, "glob", required=False)
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise ToolError(f"bad regular expression: {exc}", code="INVALID_ARGUMENTS") from None
        if not os.path.exists(base):
            raise ToolError(f"{base} does not exist", code="NOT_FOUND")
        found: list[dict[str, Any]] = []
        hits, more = await anyio.to_thread.run_sync(_grep, base, rx, name_glob, os.path.realpath(ctx.cwd), found,
                                                    abandon_on_cancel=True)
        data = {"matches": found, "truncated": more}
        if not hits:
            return ToolOutput(content=[TextBlock(text=f"no matches for {pattern!r}")], structured=data)
        if more:
            hits.append(f"[stopped after {GREP_MAX} matches; narrow the pattern or path]")
        return ToolOutput(content=[TextBlock(text="\n".join(hits))], structured=data)


# ------------------------------------------------------------------------------ read_image


class ReadImageTool:
    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        self.spec = ToolSpec(
            name="read_image",
            description="Look at an image file in the workspace (png, jpeg, gif, webp): it is attached to the "
            "conversation so you can see it. Only for models with image input.",
            parameters=_schema({"path": {"type": "string", "description": "Image file to view."}}, ["path"]),
            output_schema=READ_IMAGE_OUTPUT,
            parallel_safe=True,
        )

    async def run(self, args: dict[str, Any], ctx: "ToolContext") -> ToolOutput:
        raw = _str_arg(args, "path")
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


def make_tools(sb: Sandbox) -> list[Any]:
    return [BashTool(sb), ReadTool(sb), WriteTool(sb), EditTool(sb), GlobTool(sb), GrepTool(sb), ReadImageTool(sb)]
