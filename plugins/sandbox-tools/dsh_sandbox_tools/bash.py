"""The ``bash`` tool: one shell command, confined by the session's sandbox tier."""

from __future__ import annotations

import math
import os
import signal
from functools import partial
from typing import TYPE_CHECKING, Any

from dsh_core import ToolError
from dsh_core.paths import find_program, real_dir
from dsh_core.progress import output_progress
from dsh_core.protocols import JobEnd
from dsh_core.types import ToolOutput

from .base import BOOL, OPT_INT, OPT_STR, STR, SandboxTool, out_schema, positive_ms, str_arg
from .mechanisms import PARTIAL_NOTICE
from .policy import Settings
from .run import spill_file_for, spill_path_for

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import JobIO, Jobs

    from .sandbox import Sandbox

# The structured result (ToolOutput.structured) that programs see in code mode; the model's
# text result is unchanged.
BASH_OUTPUT = out_schema({
    "exit_code": {**OPT_INT, "description": "The exit status; None when timed out or killed by a signal."},
    "output": {**STR, "description": "stdout, bounded; when spilled it names the file holding the whole output."},
    "stderr": {**STR, "description": "stderr, bounded the same way."},
    "timed_out": BOOL,
    "signal": {**OPT_INT, "description": "The signal that killed the command, if any."},
    "spill_path": {**OPT_STR, "description": "The file with the full output when it was too long, else None."},
})


class _JobSink:
    """The command's output as a background job keeps it: every chunk to the job's log
    (``JobIO.write``), nothing held here."""

    def __init__(self, io: JobIO) -> None:
        self.io = io
        self.total = 0
        self.file = None

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.io.write(chunk)

    def close(self) -> None:
        pass

    def text(self) -> str:
        return ""


class BashTool(SandboxTool):
    name = "bash"
    kind = "execute"
    required = ("command", "description")
    output_schema = BASH_OUTPUT
    escalates = True

    def __init__(self, sb: Sandbox, jobs: Jobs | None = None) -> None:
        self.jobs = jobs  # the host's job registry: with one, ``run_in_background`` is offered
        super().__init__(sb)
        if jobs is not None:
            self.spec.output_schema = out_schema({
                **BASH_OUTPUT["properties"],
                "job_id": {**OPT_STR, "description": "The background job's id (run_in_background), else None."},
            })

    def describe(self, settings: Settings) -> str:
        s = settings
        text = (
            "Run a command with `bash -c` in the session workspace and get back its stdout, with its stderr after "
            "a `[stderr]` line. Every call starts a new shell, so nothing (cwd, variables, functions) carries over "
            "from one call to the next: give `workdir` rather than `cd`. A non-zero exit is reported as "
            "`[exit code: N]` at the end of the result; a timeout as `[timed out after Nms]`. "
            f'The command runs in the "{s.mode}" sandbox: an operation it blocks is reported as '
            "`[sandbox: file access denied under <mode> mode]`, which is the policy speaking, not a bug in the "
            f"command. Output past about {s.max_output_bytes} bytes is cut to its head and tail and saved whole to "
            "a file whose path the result names. "
        )
        if self.jobs is None:
            return text + "Background execution is not available here: a command must finish within its timeout."
        return text + (
            "For a long-running command (a dev server, a watcher, a long build) set `run_in_background: true`: the "
            "call returns a job id at once and the command keeps running (same sandbox, no timeout); read its output "
            "with `job_output` and stop it with `job_kill`."
        )

    def arguments(self, settings: Settings) -> dict[str, Any]:
        s = settings
        args: dict[str, Any] = {
            "command": {"type": "string", "description": "The bash command to run."},
            "description": {
                "type": "string",
                "description": "What this command does, in 5-10 words of active voice (shown to the person), "
                               'e.g. "git status" -> "Show working tree status".',
            },
            "timeoutMs": {
                "type": "number",
                "description": f"Timeout in milliseconds (default {s.default_timeout_ms}, at most "
                               f"{s.max_timeout_ms}); the command is killed when it runs out.",
            },
            "workdir": {
                "type": "string",
                "description": "Directory to run the command in, inside the session workspace (the default); "
                               "a relative path is taken from the workspace.",
            },
        }
        if self.jobs is not None:
            args["run_in_background"] = {
                "type": "boolean",
                "description": "Run as a background job and return its id at once (read it with job_output, stop "
                               "it with job_kill). No timeout applies.",
            }
        return args

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        s = self.sb.settings
        command = str_arg(args, "command")
        if not command.strip():
            raise ToolError("invalid command: expected a non-empty string", code="INVALID_ARGUMENTS")
        description = str_arg(args, "description")
        if not description.strip():
            raise ToolError("invalid description: expected a non-empty string", code="INVALID_ARGUMENTS")
        background = args.get("run_in_background", False)
        if not isinstance(background, bool) or (background and self.jobs is None):
            raise ToolError("run_in_background must be true or false (and needs the jobs plugin)",
                            code="INVALID_ARGUMENTS")
        timeout_ms = min(positive_ms(args, "timeoutMs", s.default_timeout_ms), s.max_timeout_ms)
        workspace = real_dir(ctx.cwd)
        if workspace is None:
            raise ToolError(f"the session directory {os.path.realpath(ctx.cwd)} does not exist", code="NO_CWD")
        workdir = str_arg(args, "workdir", required=False)
        cwd = workspace if workdir is None else resolve_workdir(workdir, workspace, self.sb.extra_roots(ctx.agent))
        mode = await self.sb.effective_mode(args, ctx, "command")
        bash = _bash()
        if background:
            return await self._background(command, [bash, "-c", command], mode, cwd, workspace, ctx)
        run = partial(
            self.sb.run_argv,
            [bash, "-c", command],
            mode=mode,
            cwd=cwd,
            workspace=workspace,
            resolved=True,  # realpath'd above, in this call
            owner=ctx.agent,
            timeout_s=timeout_ms / 1000,
            spill=spill_file_for(s.spill_root(), ctx.session_id, ctx.call_id),  # a Path only if it spills
            split=True,
        )
        if ctx.shows_progress:
            async with output_progress(ctx) as tap:  # the tail so far, for a person watching
                result, runner = await run(tap=tap)
        else:  # nobody watches: not even the context manager (~8 calls a command)
            result, runner = await run()
        stdout, stderr = result.text, result.stderr or ""
        if runner is not None and runner.name == "landlock":
            stdout, stderr = stdout.replace(_PARTIAL_LINE, ""), stderr.replace(_PARTIAL_LINE, "")
            if result.exit_code == 125 and "landlock-run: " in stdout + stderr:
                raise ToolError(
                    f'sandbox mode "{mode}" could not be applied (Landlock runner failed); refusing to run the '
                    f"command unconfined. Runner output: {(stdout + stderr).strip()[-500:]}",
                    code="SANDBOX_UNAVAILABLE",
                )
        failed = result.timed_out or result.signal is not None or bool(result.exit_code)
        denied = runner is not None and failed and runner.denial in stdout + stderr
        text = render_result(stdout, stderr, timed_out=result.timed_out, timeout_ms=timeout_ms,
                             signal_number=result.signal, exit_code=result.exit_code,
                             denied=mode if denied else None, hint=self.sb.hint(mode) if denied else None)
        # A non-zero exit, a timeout or a signal is the command's outcome, reported for the model to
        # judge (the markers), not a failure of the tool: only a call that could not run is an error.
        out = ToolOutput.text(text)
        if result.spill_path is not None:  # already bounded by the spine's Sink: the loop spills nothing more
            out.spill_path = str(result.spill_path)
        elif result.stderr_spill_path is not None:
            out.spill_path = str(result.stderr_spill_path)
        out.structured = {
            "exit_code": result.exit_code if result.signal is None else None,
            "output": stdout,
            "stderr": stderr,
            "timed_out": result.timed_out,
            "signal": result.signal,
            "spill_path": str(result.spill_path) if result.spill_path is not None else None,
        }
        if self.jobs is not None:
            out.structured["job_id"] = None
        return out

    async def _background(self, command: str, argv: list[str], mode: str, cwd: str, workspace: str,
                          ctx: ToolContext) -> ToolOutput:
        """Start ``argv`` as a job: the same sandbox, environment and limits as a foreground call,
        no timeout, always through a command server (its reaper is the job's lifeline)."""
        assert self.jobs is not None
        await self.sb.runner_for(mode)  # no usable sandbox: the call fails now, no job is left to chase
        sb = self.sb
        spill = spill_path_for(sb.settings.spill_root(), ctx.session_id, ctx.call_id)

        async def work(io: JobIO) -> JobEnd:
            result, _ = await sb.run_argv(
                argv, mode=mode, cwd=cwd, workspace=workspace, owner=ctx.agent, timeout_s=math.inf, spill=spill,
                sink=_JobSink(io), stop=io.stopping, lifeline=True,
            )
            if result.signal is not None and not result.stopped:
                return JobEnd(status="failed", exit_code=None, detail=f"killed by signal {result.signal}")
            return JobEnd(status="completed", exit_code=result.exit_code)

        job = self.jobs.start(ctx.agent, kind="bash", title=command, work=work, call_id=ctx.call_id)
        out = ToolOutput.text(f"started background job {job.id}")
        out.structured = {"exit_code": None, "output": "", "stderr": "", "timed_out": False, "signal": None, "spill_path": None,
                          "job_id": job.id}
        return out


_PARTIAL_LINE = PARTIAL_NOTICE + "\n"  # the Landlock runner's notice line, taken out of a command's output


def _bash() -> str:
    """The shell a command runs in: bash through PATH's absolute directories (cached per PATH;
    never a ``bash`` in the directory of the moment: ``dsh_core.paths.find_program``), else sh."""
    return find_program("bash") or "/bin/sh"


def resolve_workdir(workdir: str | None, workspace: str, extra: tuple[str, ...] = ()) -> str:
    """The directory a call runs in: ``workdir`` taken from the session workspace (canonical),
    which it must not leave — or one of the session's additional directories (``extra``, an
    editor's ``additionalDirectories``), confined the same. The sandbox's writable roots stay the
    session's whatever the workdir, and a workdir outside them is refused rather than run from: a
    command's directory is never a way out of the session's confinement."""
    if workdir is None:
        return workspace
    if not workdir.strip():
        raise ToolError("invalid workdir: expected a non-empty string", code="INVALID_ARGUMENTS")
    real = os.path.realpath(os.path.join(workspace, os.path.expanduser(workdir)))
    roots = [workspace, *(os.path.realpath(r) for r in extra)]
    if not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
        if extra:
            raise ToolError(
                f"workdir {workdir!r} is outside the session workspace {workspace} and its additional directories "
                f"({', '.join(roots[1:])}); commands run inside them (give a directory in one, or no workdir)",
                code="WORKDIR_OUTSIDE",
            )
        raise ToolError(
            f"workdir {workdir!r} is outside the session workspace {workspace}; commands run inside it "
            "(give a directory in the workspace, or no workdir)",
            code="WORKDIR_OUTSIDE",
        )
    if not os.path.isdir(real):
        raise ToolError(f"workdir {workdir!r} is not a directory in {workspace}", code="NO_CWD")
    return real


def render_result(stdout: str, stderr: str, *, timed_out: bool, timeout_ms: int, signal_number: int | None,
                  exit_code: int | None, denied: str | None = None, hint: str | None = None) -> str:
    """The text the model reads of a finished command: stdout, then ``[stderr]`` and stderr, then
    one line per marker (sandbox denial, timeout, signal or non-zero exit; the exit marker last)."""
    body = stdout
    if stderr:
        if body and not body.endswith("\n"):
            body += "\n"
        body += "[stderr]\n" + stderr
    if not body:
        body = "(no output)"
    markers: list[str] = []
    if denied is not None:
        markers.append(f"[sandbox: file access denied under {denied} mode]")
        if hint:
            markers.append(hint)
    if timed_out:
        markers.append(f"[timed out after {timeout_ms}ms]")
    if signal_number is not None:
        markers.append(f"[killed by signal: {signal_name(signal_number)}]")
    elif exit_code:
        markers.append(f"[exit code: {exit_code}]")
    if not markers:
        return body
    return body + ("" if body.endswith("\n") else "\n") + "\n".join(markers)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
