"""The ``bash`` tool: one shell command, confined by the session's sandbox tier."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, Any

from dsh_core import ToolError
from dsh_core.types import ToolOutput

from .base import BOOL, OPT_INT, OPT_STR, STR, SandboxTool, int_arg, out_schema, str_arg
from .mechanisms import PARTIAL_NOTICE
from .policy import Settings
from .run import spill_path_for

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext

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


class BashTool(SandboxTool):
    name = "bash"
    kind = "execute"
    required = ("command",)
    output_schema = BASH_OUTPUT
    escalates = True

    def describe(self, settings: Settings) -> str:
        s = settings
        return (
            "Run a shell command with bash in the session workspace (cwd). Output (stdout+stderr) is returned, "
            f"bounded to about {s.max_output_bytes} bytes; longer output is saved to a file whose path is given. "
            f'Sandbox mode: "{s.mode}". Each call runs in a fresh process group; background jobs end with the call.'
        )

    def arguments(self, settings: Settings) -> dict[str, Any]:
        s = settings
        return {
            "command": {"type": "string", "description": "The bash command line to run."},
            "timeout_ms": {
                "type": "integer",
                "description": f"Timeout in milliseconds (default {s.default_timeout_ms}, max {s.max_timeout_ms}).",
            },
        }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        s = self.sb.settings
        command = str_arg(args, "command")
        assert command is not None
        timeout_ms = min(int_arg(args, "timeout_ms", s.default_timeout_ms, minimum=1), s.max_timeout_ms)
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
