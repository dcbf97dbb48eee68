"""The ``bash`` tool: one shell command, confined by the session's sandbox tier."""

from __future__ import annotations

import math
import os
import shutil
from typing import TYPE_CHECKING, Any

from dsh_core import ToolError
from dsh_core.protocols import JobEnd
from dsh_core.types import ToolOutput

from .base import BOOL, OPT_INT, OPT_STR, STR, SandboxTool, int_arg, out_schema, str_arg
from .mechanisms import PARTIAL_NOTICE
from .policy import Settings
from .run import spill_path_for

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import JobIO, Jobs

    from .sandbox import Sandbox

# The structured result (ToolOutput.structured) that programs see in code mode; the model's
# text result is unchanged.
BASH_OUTPUT = out_schema({
    "exit_code": {**OPT_INT, "description": "The exit status; None when timed out or killed by a signal."},
    "output": {**STR, "description": "stdout and stderr merged, bounded; when spilled it names the file "
               "holding the whole output."},
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
    required = ("command",)
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
            "Run a shell command with bash in the session workspace (cwd). Output (stdout+stderr) is returned, "
            f"bounded to about {s.max_output_bytes} bytes; longer output is saved to a file whose path is given. "
            f'Sandbox mode: "{s.mode}". Each call runs in a fresh process group; '
        )
        if self.jobs is None:
            return text + "background jobs end with the call."
        return text + (
            "processes it leaves behind (`cmd &`) end with the call. For a long-running command (a dev server, a "
            "watcher, a long build) set run_in_background: the call returns a job id at once and the command keeps "
            "running (same sandbox, no timeout); read its output with job_output, stop it with job_kill, and you get "
            "a notice when it ends."
        )

    def arguments(self, settings: Settings) -> dict[str, Any]:
        s = settings
        args: dict[str, Any] = {
            "command": {"type": "string", "description": "The bash command line to run."},
            "timeout_ms": {
                "type": "integer",
                "description": f"Timeout in milliseconds (default {s.default_timeout_ms}, max {s.max_timeout_ms}).",
            },
        }
        if self.jobs is not None:
            args["run_in_background"] = {
                "type": "boolean",
                "description": "Run as a background job: returns `job id <id>` at once; no timeout applies.",
            }
        return args

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        s = self.sb.settings
        command = str_arg(args, "command")
        assert command is not None
        background = args.get("run_in_background", False)
        if not isinstance(background, bool) or (background and self.jobs is None):
            raise ToolError("run_in_background must be true or false (and needs the jobs plugin)",
                            code="INVALID_ARGUMENTS")
        timeout_ms = min(int_arg(args, "timeout_ms", s.default_timeout_ms, minimum=1), s.max_timeout_ms)
        mode = await self.sb.effective_mode(args, ctx, "command")
        cwd = os.path.realpath(ctx.cwd)
        if not os.path.isdir(cwd):
            raise ToolError(f"the session directory {cwd} does not exist", code="NO_CWD")
        bash = shutil.which("bash") or "/bin/sh"
        if background:
            return await self._background(command, [bash, "-c", command], mode, cwd, ctx)
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
        if self.jobs is not None:
            out.structured["job_id"] = None
        return out

    async def _background(self, command: str, argv: list[str], mode: str, cwd: str, ctx: ToolContext) -> ToolOutput:
        """Start ``argv`` as a job: the same sandbox, environment and limits as a foreground call,
        no timeout, always through a command server (its reaper is the job's lifeline)."""
        assert self.jobs is not None
        await self.sb.runner_for(mode)  # no usable sandbox: the call fails now, no job is left to chase
        sb = self.sb
        spill = spill_path_for(sb.settings.spill_root(), ctx.session_id, ctx.call_id)

        async def work(io: JobIO) -> JobEnd:
            result, _ = await sb.run_argv(
                argv, mode=mode, cwd=cwd, owner=ctx.agent, timeout_s=math.inf, spill=spill,
                sink=_JobSink(io), stop=io.stopping, lifeline=True,
            )
            if result.signal is not None and not result.stopped:
                return JobEnd(status="failed", exit_code=None, detail=f"killed by signal {result.signal}")
            return JobEnd(status="completed", exit_code=result.exit_code)

        job = self.jobs.start(ctx.agent, kind="bash", title=command, work=work, call_id=ctx.call_id)
        out = ToolOutput.text(
            f"job id {job.id}: started in the background ({mode} sandbox). Read its output with job_output "
            f'{{"job_id": "{job.id}"}}, stop it with job_kill; you get a notice when it ends.'
        )
        out.structured = {"exit_code": None, "output": "", "timed_out": False, "signal": None, "spill_path": None,
                          "job_id": job.id}
        return out
