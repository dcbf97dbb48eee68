"""One persistent terminal: a real PTY (ptyprocess) running the session's shell, confined like
its ``bash`` calls, behind a keeper (``_keeper.py``) that ends the whole tree with the terminal,
with dsh, or when dsh is killed outright; a screen (screen.py) fed by a reader task; sends that
wait for a prompt, a read on stdin, silence, a timeout or the shell's exit, and say which.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import ptyprocess  # type: ignore[import-untyped]  # (no type information shipped)

from dsh_core import ToolError, reaping

from .screen import Page, TermScreen, utf8_tail

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

KEEPER = str(Path(__file__).with_name("_keeper.py").resolve())
PROMPT = "dsh> "
# Printed by the controlled shell before each prompt (PROMPT_COMMAND): an OSC that a terminal
# ignores, carrying the last status. PS1 is set again each time, so a command that changes it
# does not break readiness.
PROMPT_COMMAND = r'printf "\033]133;D;%s\007" "$?"; PS1=' + f"'{PROMPT}'"
MARKER = re.compile(rb"\x1b\]133;D;(\d*)\x07")
CSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL,
           "SIGTSTP": signal.SIGTSTP, "SIGHUP": signal.SIGHUP}
WaitReason = Literal["stdin_read", "inferred_idle", "timeout", "session_exit"]

# Syscalls that mean "blocked reading the terminal" (/proc/<pid>/syscall): read/readv on it, or
# select/pselect6 watching only descriptor 0 (bash's readline, Python's REPL).
_SYSCALLS = {
    "x86_64": {"read": {0, 19}, "select": {23, 270}},
    "aarch64": {"read": {63, 65}, "select": {72}},
}.get(platform.machine(), {"read": set(), "select": set()})

# How a stopped send (job_kill) ends what runs in the foreground, in seconds from the stop: Ctrl-C
# twice, as a person would press it, then SIGTERM and SIGKILL to the foreground group, all within
# the jobs plugin's default kill grace (3 s). Ctrl-C alone is not enough: bash loses a SIGINT that
# lands while it forks (the child takes it before exec, exits 0, and bash carries on), and the
# presses follow the output that wakes the send, so a loop that prints and then forks is hit in
# that window press after press (three lost presses in a row, seen under load). A signal step
# finds the shell itself in the foreground (a loop of builtins) and presses Ctrl-C instead: the
# shell is never signalled.
STOP_STEPS: tuple[tuple[float, signal.Signals | None], ...] = (
    (0.0, None), (0.5, None), (1.0, signal.SIGTERM), (2.0, signal.SIGKILL))
STOP_GRACE_S = 10.0  # how long a stopped send waits for the shell's prompt before it settles anyway


@dataclass
class Timing:
    poll_s: float = 0.05
    exact_probe_after_s: float = 0.15  # before this, a read on stdin may be the one before the write
    idle_silence_s: float = 3.0
    handoff_grace_s: float = 0.5
    timeout_s: float = 30.0
    close_grace_s: float = 3.0


@dataclass
class Status:
    kind: Literal["running", "exited"] = "running"
    exit_code: int | None = None
    signal: str | None = None

    def render(self) -> str:
        if self.kind == "running":
            return "running"
        return f"exited code={'null' if self.exit_code is None else self.exit_code} " \
               f"signal={'null' if self.signal is None else self.signal}"

    def as_dict(self) -> dict[str, Any]:
        if self.kind == "running":
            return {"kind": "running"}
        return {"kind": "exited", "exitCode": self.exit_code, "signal": self.signal}


@dataclass
class SendResult:
    viewport: str
    wait_reason: WaitReason
    status: Status
    truncated: bool


@dataclass
class _Wait:
    """One send's bookkeeping: where it began, what the foreground was, what it handed out."""

    line: int
    column: int
    emitted: int  # progress: the lines before this one were handed out
    fg0: int | None
    markers0: int
    startup: bool
    left_wait: bool
    on_progress: Callable[[str], None] | None
    stopped: float = math.inf  # when ``stop`` was first seen
    stop_steps: int = 0  # how many of ``STOP_STEPS`` were taken
    started: float = field(default_factory=time.monotonic)

    def progress(self, screen: TermScreen, *, final: bool = False) -> None:
        """Hand the finished lines (all of them when ``final``) to ``on_progress``."""
        if self.on_progress is None:
            return
        column = self.column if self.emitted == self.line else 0
        if final:
            rest, _ = screen.lines_from(self.emitted, column)
            if rest:
                self.on_progress(rest)
            return
        cursor_line = screen.cursor()[0]
        if cursor_line > self.emitted and not screen.alternate:
            done, _ = screen.lines_from(self.emitted, column)
            finished = done.split("\n")[: cursor_line - max(self.emitted, screen.scrollback.first)]
            if finished:
                self.on_progress("\n".join(finished) + "\n")
            self.emitted = cursor_line


def _stat_rdev(path: str) -> int | None:
    try:
        return os.stat(path).st_rdev
    except OSError:
        return None


class Terminal:
    """A live terminal. ``start`` spawns it; a reader task of the host's group feeds its screen
    until the PTY closes; ``close`` ends its whole process tree and returns when it is gone."""

    def __init__(self, term_id: str, *, name: str | None, kind: str, rows: int, cols: int,
                 max_lines: int, max_bytes: int, max_read_bytes: int, timing: Timing,
                 on_grow: Callable[[int], None] = lambda _n: None) -> None:
        self.id = term_id
        self.name = name
        self.type = kind
        self.rows, self.cols = rows, cols
        self.max_read_bytes = max_read_bytes
        self.timing = timing
        self.screen = TermScreen(cols, rows, max_lines=max_lines, max_bytes=max_bytes, reply=self._reply,
                                 on_grow=on_grow)
        self.status = Status()
        self.mode: str | None = None  # the sandbox tier it was started in
        self.proc: ptyprocess.PtyProcess | None = None
        self.pid: int | None = None
        self.fd = -1
        self._lifeline = -1
        self.shell_pgid: int | None = None
        self.markers = 0  # prompt markers seen so far
        self.last_output = time.monotonic()
        self.active = False  # one send at a time
        self.closing = False
        self.ended = anyio.Event()  # the PTY closed and the keeper was reaped
        self._scan = b""
        self._after_marker = b""  # what followed the last prompt marker (its first bytes)
        self.prompt_shown = False  # the last output was a marker and then exactly the prompt
        self._wake = anyio.Event()  # set when output arrives or the terminal ends
        self._replies = bytearray()
        self._tty_rdev: int | None = None
        self._reader_scope: anyio.CancelScope | None = None
        self._interrupted_at: float | None = None  # a cancelled send pressed Ctrl-C then

    # ------------------------------------------------------------------ life

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        """Start the keeper on a new PTY with ``argv`` (already confined) as its shell."""
        r, w = os.pipe()
        os.set_inheritable(r, True)
        keeper = [sys.executable, "-I", "-S", KEEPER, "--reaping", reaping.PATH, "--lifeline", str(r), "--", *argv]
        try:
            self.proc = ptyprocess.PtyProcess.spawn(keeper, cwd=cwd, env=env, dimensions=(self.rows, self.cols),
                                                    pass_fds=(r,))
        except Exception:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._lifeline = w
        self.pid = self.proc.pid
        self.fd = self.proc.fd
        os.set_blocking(self.fd, False)

    async def reader(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Feed the screen until the PTY closes, then reap the keeper and record the status."""
        with anyio.CancelScope() as scope:
            self._reader_scope = scope
            task_status.started()
            try:
                while True:
                    await anyio.wait_readable(self.fd)
                    try:
                        data = os.read(self.fd, 65536)
                    except BlockingIOError:
                        continue
                    except OSError:  # EIO: every holder of the slave side is gone
                        break
                    if not data:
                        break
                    self._feed(data)
                with anyio.CancelScope(shield=True):
                    await self._reap()
            finally:
                self._finish()

    async def _reap(self) -> None:
        proc = self.proc
        assert proc is not None
        deadline = time.monotonic() + self.timing.close_grace_s * 2 + 5
        while proc.isalive():
            if time.monotonic() > deadline:
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGKILL)
            await anyio.sleep(0.01)
        sig = proc.signalstatus
        self.status = Status("exited", exit_code=proc.exitstatus if sig is None else None,
                             signal=signal.Signals(sig).name if sig is not None else None)

    def _finish(self) -> None:
        self._wake.set()
        if self.status.kind == "running":
            self.status = Status("exited")
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1
        if self.proc is not None and not self.proc.closed:
            with contextlib.suppress(OSError):
                self.proc.fileobj.close()  # the master side (its child is already reaped, or being ended)
            self.proc.closed = True
        self.ended.set()

    async def close(self) -> None:
        """End the terminal's whole process tree (SIGHUP, SIGTERM, then SIGKILL) and wait for it."""
        self.closing = True
        if self._lifeline >= 0:
            os.close(self._lifeline)  # the keeper ends the tree
            self._lifeline = -1
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self.timing.close_grace_s + 5):
                await self.ended.wait()
            if not self.ended.is_set():  # the keeper did not end: kill it, and stop reading
                if self.pid is not None:
                    with contextlib.suppress(OSError):
                        os.kill(self.pid, signal.SIGKILL)
                if self._reader_scope is not None:
                    self._reader_scope.cancel()
                with anyio.move_on_after(5):
                    await self.ended.wait()

    # ------------------------------------------------------------------ output

    def _feed(self, data: bytes) -> None:
        self.last_output = time.monotonic()
        buf = self._scan + data
        end = -1
        for m in MARKER.finditer(buf):
            self.markers += 1
            end = m.end()
        tail = buf[max(end, 0):]
        cut = tail.rfind(b"\x1b")
        self._scan = tail[cut:][-64:] if cut >= 0 else b""
        self._after_marker = (tail if end >= 0 else self._after_marker + data)[:64]
        self.prompt_shown = self.markers > 0 and CSI.sub(b"", self._after_marker) == PROMPT.encode()
        self.screen.feed(data)
        self._wake.set()
        if self._replies:
            self._write_nowait(bytes(self._replies))
            self._replies.clear()

    def _reply(self, data: str) -> None:
        self._replies += data.encode()

    def _write_nowait(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            os.write(self.fd, data)

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except BlockingIOError:
                await anyio.wait_writable(self.fd)
                continue
            except OSError as exc:
                raise ToolError(f"PTY session {self.id} cannot take input: {exc}", code="SESSION_EXITED") from None
            view = view[n:]

    # ------------------------------------------------------------------ the foreground

    def foreground(self) -> int | None:
        try:
            return os.tcgetpgrp(self.fd)
        except OSError:
            return None

    def reading_stdin(self, pgid: int | None) -> bool:
        """Whether the foreground group's leader is blocked reading this terminal."""
        if pgid is None or pgid <= 0:
            return False
        try:
            with open(f"/proc/{pgid}/syscall") as f:
                fields = f.read().split()
        except OSError:
            return False
        if len(fields) < 3 or not fields[0].isdigit():
            return False
        nr = int(fields[0])
        if self._tty_rdev is None and self.pid is not None:
            self._tty_rdev = _stat_rdev(f"/proc/{self.pid}/fd/0")
        if nr in _SYSCALLS["read"]:
            fd = int(fields[1], 16)
        elif nr in _SYSCALLS["select"] and int(fields[1], 16) == 1:
            fd = 0
        else:
            return False
        rdev = _stat_rdev(f"/proc/{pgid}/fd/{fd}")
        return rdev is not None and rdev == self._tty_rdev

    def signal(self, name: str) -> int:
        """Send ``name`` to the foreground process group; returns that group."""
        if self.closing or self.status.kind != "running":
            raise ToolError(f"PTY session {self.id} is closing" if self.closing else
                            f"PTY session {self.id} has exited", code="SESSION_EXITED")
        sig = SIGNALS[name]
        pgid = self.foreground()
        if pgid is None or pgid <= 0:
            raise ToolError(f"PTY session {self.id} has no foreground process group", code="NO_FOREGROUND")
        if sig == signal.SIGKILL and pgid == self.shell_pgid:
            raise ToolError(f"refusing to SIGKILL the shell of PTY session {self.id}; use terminal_close",
                            code="SHELL_SIGKILL")
        try:
            os.killpg(pgid, sig)
        except OSError as exc:
            raise ToolError(f"could not signal PTY session {self.id}: {exc}", code="SIGNAL_FAILED") from None
        return pgid

    async def settle(self, since: float, within: float = 0.5) -> None:
        """After a signal: wait (up to ``within``) until what it caused has been drawn — the
        shell's prompt back with the foreground, or output that went quiet — so that the next
        send does not take a prompt the signal brought back for its own answer."""
        with anyio.move_on_after(within):
            while self.status.kind == "running":
                at_prompt = self.prompt_shown and self.foreground() == self.shell_pgid
                if at_prompt or (self.last_output > since and time.monotonic() - self.last_output >= self.timing.poll_s):
                    return
                self._wake = anyio.Event()
                with anyio.move_on_after(self.timing.poll_s):
                    await self._wake.wait()

    # ------------------------------------------------------------------ sends

    async def send(self, text: str, *, submit: bool, startup: bool = False,
                   stop: anyio.Event | None = None,
                   on_progress: Callable[[str], None] | None = None) -> SendResult:
        """Write ``text`` (and Enter when ``submit``), then wait until the shell shows its prompt,
        the foreground program reads the terminal, output stays silent, the time is up or the
        shell exits. ``stop`` (a cancelled or killed send) interrupts the foreground with SIGINT
        and keeps waiting for it to settle. ``on_progress`` gets finished lines as they come."""
        if self.closing:
            raise ToolError(f"PTY session {self.id} is closing", code="SESSION_CLOSING")
        if self.status.kind != "running":
            raise ToolError(f"PTY session {self.id} has exited", code="SESSION_EXITED")
        if self.active:
            raise ToolError(f"PTY session {self.id} already has an active send", code="SEND_ACTIVE")
        self.active = True
        try:
            return await self._send(text, submit, startup, stop, on_progress)
        except anyio.get_cancelled_exc_class():
            # The call was cancelled (the person pressed stop): interrupt what runs in the foreground.
            if self.status.kind == "running" and self.foreground() not in (None, self.shell_pgid):
                self._write_nowait(b"\x03")  # Ctrl-C: SIGINT to the foreground group
                self._interrupted_at = time.monotonic()  # the next send waits for what it brings back
            raise
        finally:
            self.active = False

    async def _send(self, text: str, submit: bool, startup: bool, stop: anyio.Event | None,
                    on_progress: Callable[[str], None] | None) -> SendResult:
        data = (text + ("\r" if submit else "")).encode()
        if self._interrupted_at is not None:
            # A cancelled send pressed Ctrl-C and could not wait: do not type ahead of the prompt
            # that Ctrl-C brings back (the line would come back redrawn after it).
            since, self._interrupted_at = self._interrupted_at, None
            await self.settle(since, within=1.0)
        line, column = self.screen.cursor()
        fg0 = self.foreground()
        # A wait that was there before the write may be the one the write answers: only a wait seen
        # after the program left it counts. With nothing written, the wait there is the answer.
        wait = _Wait(line=line, column=column, emitted=line, fg0=fg0, markers0=self.markers, startup=startup,
                     left_wait=not data or not self.reading_stdin(fg0), on_progress=on_progress)
        self.last_output = wait.started
        if data:
            await self.write(data)
        while True:
            if not self._wake.is_set():
                with anyio.move_on_after(self.timing.poll_s):
                    await self._wake.wait()
            self._wake = anyio.Event()
            wait.progress(self.screen)
            if self.ended.is_set() or self.status.kind != "running":
                reason: WaitReason = "session_exit"
                break
            if stop is not None and stop.is_set() and self._stop_step(wait):
                continue
            found = self._ready(wait)
            if found in ("timeout", "inferred_idle") and self._stopping(wait):
                continue
            if found is not None:
                reason = found
                break
        if self.screen.alternate:
            viewport, lost = self.screen.display(), False
        else:
            viewport, lost = self.screen.lines_from(line, column)
        wait.progress(self.screen, final=True)
        viewport, cut = utf8_tail(viewport, self.max_read_bytes)
        return SendResult(viewport, reason, self.status, lost or cut or self.screen.scrollback.dropped)

    def _stop_step(self, wait: _Wait) -> bool:
        """Take the next of ``STOP_STEPS`` if it is due; whether one was taken. Ctrl-C goes
        through the line discipline, which signals whatever group holds the foreground at that
        instant (no race with a group that just ended)."""
        now = time.monotonic()
        wait.stopped = min(wait.stopped, now)
        if wait.stop_steps >= len(STOP_STEPS) or now - wait.stopped < STOP_STEPS[wait.stop_steps][0]:
            return False
        sig = STOP_STEPS[wait.stop_steps][1]
        wait.stop_steps += 1
        self.last_output = now
        fg = self.foreground()
        if sig is None or fg is None or fg <= 0 or fg == self.shell_pgid:
            self._write_nowait(b"\x03")
        else:
            with contextlib.suppress(OSError):
                os.killpg(fg, sig)
        return True

    def _stopping(self, wait: _Wait) -> bool:
        """Whether a stopped send keeps waiting rather than settle on time or silence: until the
        shell's prompt is back, for up to ``STOP_GRACE_S``. A shell that holds the foreground
        again has not always drawn its prompt yet (it runs PROMPT_COMMAND first): settling then
        would let the next send be typed ahead of it. Only the prompt settles a stopped send
        (``_ready`` says ``stdin_read`` for it; this is asked only when it did not)."""
        if math.isinf(wait.stopped) or time.monotonic() - wait.stopped >= STOP_GRACE_S:
            return False
        return self.foreground() is not None and self.shell_pgid is not None

    def _ready(self, wait: _Wait) -> WaitReason | None:
        """Why the send returns now, if it does: the shell's prompt with the foreground back, a
        read on the terminal, silence, or the time."""
        t = self.timing
        now = time.monotonic()
        idle = now - self.last_output
        fg = self.foreground()
        prompted = self.markers > wait.markers0
        if prompted and self.shell_pgid is None and fg is not None:
            self.shell_pgid = fg
        if prompted and (self.prompt_shown or idle >= t.poll_s) and fg is not None and fg == self.shell_pgid:
            return "stdin_read"
        waiting = self.reading_stdin(fg)
        if fg == wait.fg0 and not waiting:
            wait.left_wait = True
        accepts = waiting and (fg != wait.fg0 or wait.left_wait)
        has_output = not wait.startup or self.screen.display() != ""
        if now - wait.started >= t.exact_probe_after_s and accepts and has_output and idle >= t.poll_s:
            return "stdin_read"
        if has_output and idle >= t.idle_silence_s + (t.handoff_grace_s if prompted else 0):
            return "inferred_idle"
        if now - wait.started >= t.timeout_s:
            return "timeout"
        return None

    def read(self, offset: int, count: int) -> Page:
        return self.screen.page(offset, count, self.max_read_bytes)
