"""A session's terminals (its state slot): ids, names, the retention budget they share, and
starting one confined like the session's ``bash`` calls. They all end with the session."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from dsh_core import ToolError
from dsh_core.paths import find_program

from .terminal import PROMPT, PROMPT_COMMAND, Terminal, Timing

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent


@dataclass(frozen=True)
class Limits:
    rows: int = 40
    cols: int = 160
    scrollback_lines: int = 10_000
    scrollback_max_bytes: int = 4 << 20
    session_max_bytes: int = 16 << 20
    max_terminals: int = 8
    max_read_bytes: int = 256 << 10
    timing: Timing = field(default_factory=Timing)


def shell_argv(start_in: str | None = None) -> list[str]:
    """An interactive bash without profiles; ``start_in``: a directory to change to first (the
    confinement's roots stay those of the session's workspace, whatever the terminal's cwd)."""
    bash = find_program("bash") or "/bin/bash"
    argv = [bash, "--noprofile", "--norc", "-i"]
    if start_in is None:
        return argv
    return [bash, "--noprofile", "--norc", "-c", 'cd -- "$0" || exit 1; exec "$@"', start_in, *argv]


def shell_env(base: dict[str, str]) -> dict[str, str]:
    """The confined environment, with the terminal's own: a known prompt and its marker."""
    env = dict(base)
    env.update({"TERM": "xterm", "PS1": PROMPT, "PROMPT_COMMAND": PROMPT_COMMAND, "HISTFILE": "/dev/null",
                "LANG": env.get("LANG") or "C.UTF-8"})
    env.pop("PS2", None)
    return env


async def start_terminal(agent: Agent, term: Terminal, cwd: str) -> str:
    """Spawn ``term``'s shell confined as ``agent``'s ``bash`` calls are, wait for its first
    prompt and return what it printed (the motd). On failure nothing is left running."""
    confinement = agent.host.confinement
    if confinement is None:
        raise ToolError("terminals need a plugin that provides confinement (mount sandbox-tools); a terminal never "
                        "runs unconfined", code="SANDBOX_UNAVAILABLE")
    home = os.path.realpath(agent.cwd)
    confined = await confinement.confine(shell_argv(None if cwd == home else cwd), cwd=home, session=agent)
    term.mode = confined.mode
    try:
        term.spawn(confined.argv, shell_env(confined.env), home)
    except OSError as exc:
        raise ToolError(f"could not start a terminal: {exc}", code="SPAWN_FAILED") from None
    await agent.host.task_group.start(term.reader, name=f"terminal {term.id}")
    try:
        result = await term.send("", submit=False, startup=True)
    except BaseException:
        await term.close()
        raise
    if result.wait_reason in ("session_exit", "timeout"):
        text = result.viewport.strip()
        await term.close()
        what = "exited during startup" if result.wait_reason == "session_exit" else \
            "did not reach readiness before startup timeout"
        raise ToolError(f"PTY shell {what}" + (f": {text[-500:]}" if text else ""), code="SPAWN_FAILED")
    return result.viewport


async def check_mode(agent: Agent, term: Terminal) -> None:
    """Refuse to type into a terminal whose confinement is no longer the session's (the session
    changed its mode, e.g. to plan): it keeps the one it started with, and must never be less
    confined than a ``bash`` call of the session now."""
    confinement = agent.host.confinement
    if confinement is None or term.mode is None:
        return
    now = (await confinement.confine(["true"], cwd=os.path.realpath(agent.cwd), session=agent)).mode
    if now != term.mode:
        raise ToolError(f'the session\'s sandbox mode is now "{now}", and PTY session {term.id} was opened in '
                        f'"{term.mode}"; a terminal keeps the confinement it started with: close it (terminal_close) '
                        "and open a new one", code="MODE_CHANGED")


class TerminalSet:
    """One session's terminals (``agent.state(TerminalSet)``): closed with the session."""

    def __init__(self) -> None:
        self.terminals: dict[str, Terminal] = {}
        self.next_id = 0
        self.limits = Limits()
        self.opening = 0

    def configure(self, limits: Limits) -> TerminalSet:
        self.limits = limits
        return self

    def get(self, term_id: Any) -> Terminal:
        if not isinstance(term_id, str) or not term_id:
            raise ToolError("sessionId must be a non-empty string", code="INVALID_ARGUMENTS")
        term = self.terminals.get(term_id)
        if term is None:
            raise ToolError(f"unknown PTY session {term_id}", code="NO_SESSION")
        return term

    def new(self, name: str | None, kind: str) -> Terminal:
        lim = self.limits
        if name is not None and any(t.name == name for t in self.terminals.values()):
            raise ToolError(f'PTY session name "{name}" already exists for this owner', code="DUPLICATE_NAME")
        if len(self.terminals) + self.opening >= lim.max_terminals:
            raise ToolError(f"at most {lim.max_terminals} terminal sessions are open at once; close one first "
                            "(terminal_close)", code="TERMINAL_LIMIT")
        self.next_id += 1
        return Terminal(f"pty-{self.next_id}", name=name, kind=kind, rows=lim.rows, cols=lim.cols,
                        max_lines=lim.scrollback_lines, max_bytes=lim.scrollback_max_bytes,
                        max_read_bytes=lim.max_read_bytes, timing=lim.timing, on_grow=self._grew)

    def _grew(self, _n: int) -> None:
        """Retention per session: past the budget, the terminal holding the most gives up its oldest lines."""
        live = list(self.terminals.values())
        total = sum(t.screen.scrollback.bytes for t in live)
        while total > self.limits.session_max_bytes and live:
            biggest = max(live, key=lambda t: t.screen.scrollback.bytes)
            gone = biggest.screen.scrollback.drop_oldest()
            if not gone:
                break
            total -= gone

    async def close(self, term_id: str) -> bool:
        term = self.get(term_id)
        if term.closing:
            return False
        await term.close()
        self.terminals.pop(term_id, None)
        return True

    async def aclose(self) -> None:
        """The session ended: every terminal's process tree ends, concurrently."""
        terms = list(self.terminals.values())
        self.terminals.clear()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for term in terms:
                    tg.start_soon(term.close)


def cwd_for(agent: Agent, cwd: Any) -> str:
    if cwd is None:
        return os.path.realpath(agent.cwd)
    if not isinstance(cwd, str) or not cwd:
        raise ToolError("cwd must be a non-empty string", code="INVALID_ARGUMENTS")
    path = os.path.realpath(os.path.join(agent.cwd, os.path.expanduser(cwd)))
    if not os.path.isdir(path):
        raise ToolError(f"cwd {cwd} is not a directory", code="NO_CWD")
    return path
