"""The persistent ``bash`` (a composition choice): one terminal per session, hidden from the
terminal tools, whose shell keeps its cwd and environment between calls. Each command is
wrapped between two unique markers on one line; its output is what the screen shows between
them, its exit status follows the end marker."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from dsh_core import FunctionTool, ToolError

from .sessions import Limits, check_mode, start_terminal
from .terminal import Terminal

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import Agent

DESCRIPTION = ("Execute commands in a bash shell that lives on between calls: this agent's current directory, "
               "exported environment variables and other shell state carry over from one call to the next.")
TRUNCATED_MESSAGE = ("<response clipped><NOTE>To save on context only part of this output has been shown to you. "
                     "Narrow the command (head, tail, grep -n) to see the part you need.</NOTE>")
LOST_PREFIX_MESSAGE = ("<response clipped><NOTE>The beginning of this command output was dropped by the terminal "
                       "scrollback limit. The following text is the earliest retained output.</NOTE>\n")
SHELL_RESET_MESSAGE = ("The persistent bash shell was reset; the next bash call starts from the workspace with a fresh "
                       "current directory and environment.")


@dataclass(frozen=True)
class BashSettings:
    limits: Limits
    timeout_s: float = 300.0
    max_output_chars: int = 16_000


def _quote(value: str) -> str:
    return "$'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\r", "\\r").replace("\n", "\\n") + "'"


class PersistentShell:
    """The session's shell (``agent.state(PersistentShell)``); calls run one at a time."""

    def __init__(self) -> None:
        self.term: Terminal | None = None
        self.lock = anyio.Lock()

    async def get(self, agent: Agent, limits: Limits) -> Terminal:
        if self.term is not None and self.term.status.kind == "running" and not self.term.closing:
            try:
                await check_mode(agent, self.term)
                return self.term
            except ToolError:  # the session's mode changed: a fresh shell in the tier it has now
                pass
        await self.reset()
        term = Terminal("bash", name=None, kind="shell", rows=limits.rows, cols=limits.cols,
                        max_lines=limits.scrollback_lines, max_bytes=limits.scrollback_max_bytes,
                        max_read_bytes=limits.max_read_bytes, timing=limits.timing)
        await start_terminal(agent, term, agent.cwd)
        self.term = term
        result = await term.send("stty -echo", submit=True)  # only the command's own output shows
        if result.wait_reason in ("timeout", "session_exit"):
            await self.reset()
            raise ToolError("persistent bash shell did not accept initialization", code="SPAWN_FAILED")
        return term

    async def reset(self) -> None:
        term, self.term = self.term, None
        if term is not None:
            await term.close()

    async def aclose(self) -> None:
        await self.reset()


def _between(text: str, start: str, end: str) -> tuple[str, int | None, bool]:
    """The output between the markers, the status after the end one (None: not there yet), and
    whether the start marker was lost (scrolled out of what is kept)."""
    ends = list(re.finditer(re.escape(end) + r"(\d+)\n", text + "\n"))
    m = ends[-1] if ends else None
    s = text.rfind(start, 0, m.start() if m else len(text))
    body_start = s + len(start) if s >= 0 else 0
    body = text[body_start: m.start() if m else len(text)]
    body = body.removeprefix("\n").removesuffix("\n")
    return body, int(m.group(1)) if m else None, s < 0


def _render(body: str, max_chars: int, lost: bool, exit_code: int | None) -> str:
    out = body if len(body) <= max_chars else body[:max_chars] + TRUNCATED_MESSAGE
    if lost and body:
        out = LOST_PREFIX_MESSAGE + out
    if exit_code:
        out = f"{out}\n[exit code: {exit_code}]" if out else f"[exit code: {exit_code}]"
    return out


def make_bash(settings: BashSettings) -> FunctionTool:
    async def bash(args: dict[str, Any], ctx: ToolContext) -> str:
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("command must be a non-empty string", code="INVALID_ARGUMENTS")
        shell: PersistentShell = ctx.agent.state(PersistentShell)
        async with shell.lock:
            return await _run(shell, command, ctx.agent)

    async def _run(shell: PersistentShell, command: str, agent: Agent) -> str:
        nonce = secrets.token_hex(8)
        start, end = f"__DSH_PERSISTENT_BASH_START_{nonce}__", f"__DSH_PERSISTENT_BASH_END_{nonce}:"
        wrapped = (f"printf '%s\\n' {_quote(start)}; eval -- {_quote(command)}; __dsh_status=$?; "
                   f"printf '%s%s\\n' {_quote(end)} \"$__dsh_status\"")
        term = await shell.get(agent, settings.limits)
        text, first = wrapped, True
        with anyio.move_on_after(settings.timeout_s) as deadline:
            while True:
                result = await term.send(text if first else "", submit=first)
                first = False
                transcript = "\n".join(term.screen.transcript_lines())
                body, code, lost = _between(transcript, start, end)
                if code is not None:
                    return _render(body, settings.max_output_chars, lost, code)
                if result.status.kind == "exited":
                    st = result.status
                    await shell.reset()
                    mark = (f"[shell killed by signal: {st.signal}]" if st.signal else
                            f"[shell exited: code {st.exit_code}]" if st.exit_code is not None else "[shell exited]")
                    out = _render(body, settings.max_output_chars, lost, None)
                    return "\n".join(p for p in (out, mark, SHELL_RESET_MESSAGE) if p)
                if result.wait_reason == "stdin_read":
                    # the shell or a program it started reads input without the end marker having come (an
                    # interactive child, an interrupt): show what came rather than wait for the deadline
                    return _render(body, settings.max_output_chars, lost, None)
                await anyio.sleep(0.025)
        assert deadline.cancelled_caught
        transcript = "\n".join(term.screen.transcript_lines())
        body, _, lost = _between(transcript, start, end)
        await shell.reset()
        return "\n".join([f"Your command timed out after {round(settings.timeout_s)} seconds. Below is partial output:",
                          _render(body, settings.max_output_chars, lost, None), SHELL_RESET_MESSAGE])

    return FunctionTool(
        "bash", DESCRIPTION,
        {"type": "object", "properties": {"command": {
            "type": "string", "description": "The command for bash to execute; prefer relative paths in it."}},
         "required": ["command"], "additionalProperties": False},
        bash, kind="execute",
    )
