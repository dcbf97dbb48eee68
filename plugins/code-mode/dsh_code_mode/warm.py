"""The host side of the warm code runtime (``_warm.py``): one per session, started once.

``WarmProcess`` starts the confined warm process (the Confinement seam's argv and scrubbed
environment; its control socket on stdin) and hands it runs. ``WarmSlot`` is the session's
state slot: it keeps the warm process (replaced when the confinement changed — another
permission mode — or it died) and the session's next run made ready in advance
(``Prepared``: forked, in its cgroup, set up, waiting for its program), and closes both when
the session is disposed. ``Launched`` is one run as the host sees it: the call socket (its
lifeline: ``kill``, or closing it, ends everything of the run; ``exit <code>`` comes only once
all of it is gone) and the read end of its output pipe.

Why a run is made ready in advance: its two forks, its cgroup and the rehearsal of its first
steps (a fork pays a page fault and a copy for each page it first writes) are a few ms against
a 2-3 ms program; made ready while the model thinks, a run pays none of it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec

from dsh_core import reaping
from dsh_core.warmserver import STOP_TIMEOUT_S, CallSocket, WarmServer, WarmServerError

from .limits import ProcessBound

WARM = str(Path(__file__).resolve().parent / "_warm.py")
MAX_MSG = 4096
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid (SCM_CREDENTIALS)


class Ready(msgspec.Struct, tag="ready", tag_field="t", forbid_unknown_fields=True):
    """A run made ready says so on its channel once it waits for its program (``_child.py``):
    its first message, and only then; ``cpus``: the CPUs it may run on."""

    cpus: list[int] = []


_decode_ready = msgspec.json.Decoder(Ready).decode


class WarmError(WarmServerError):
    """The warm process could not start, or is gone (nothing of the run it was asked for ran)."""


@dataclass(frozen=True)
class Where:
    """Where a session's runs happen, as the Confinement seam said: the warm process's argv,
    environment and cwd, plus what each run's setup needs. Equal ``Where``s share a warm
    process and a run made ready; any change (another permission mode) gets new ones."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str
    max_processes: int
    confined: bool  # a sandbox applies: each run also enters its own nested Landlock domain

    @property
    def process(self) -> tuple[Any, ...]:
        """What the warm process itself depends on."""
        return (self.argv, self.env, self.cwd)


def warm_argv() -> list[str]:
    return [sys.executable, "-I", "-S", WARM, reaping.PATH]


class WarmProcess(WarmServer):
    """One running ``_warm.py`` process and its control socket (on its stdin; ``dsh_core/warmserver.py``)."""

    error = WarmError
    name = "the warm runtime"
    kill_group = True

    def __init__(self, where: Where) -> None:
        super().__init__(list(where.argv), env=dict(where.env), cwd=where.cwd, control_on_stdin=True)
        self.where = where

    def launch(self, fds: list[int], *, confined: bool) -> None:
        """Hand the warm process one run's descriptors (a reaper it forked in advance takes them)."""
        self.send(b"run confined" if confined else b"run", fds)


class Prepared:
    """One run made ready ahead of its program: the warm process has forked its reaper and its
    program process, which joins the run's cgroup, sets itself up, and waits on the channel for
    the program. What is left on a run's critical path is the program itself."""

    def __init__(self, launched: Launched, channel: socket.socket, bound: ProcessBound, where: Where) -> None:
        self.launched = launched
        self.channel = channel
        self.bound = bound
        self.where = where
        self.offered = False  # a run sent it its program ahead (it is that run's, or nobody's)
        self.readied = False  # its ready line was read (``keep_off``): one more is the program's, invalid

    def keep_off(self, cpu: int) -> None:
        """Have the program process woken on another CPU than ``cpu`` (the host's event loop's),
        when it has said it is ready (its ``ready`` line, read here; a run reads a later one).
        Woken by the program, it was put on the busy host's CPU (this VM's scheduler packs tasks
        onto few CPUs) and, as SCHED_BATCH, waited there until the host's event loop blocked: a
        run's program came 0.4-0.8 ms after it was sent; kept off, the program process compiles
        it while the host confirms the run's confinement (100 gathered reads: about 0.5 ms less,
        medians of 8, three alternating pairs). Its whole mask comes back on ``go``. The pid is
        the one the kernel attaches to the line (``SO_PASSCRED``): in the host's pid namespace,
        whatever namespace the run is in, and not the program process's to choose. (Three system
        calls on the run's way; the credentials stay on for the run: turning them off is a fourth.)
        The pid is freed only when the reaper has reaped the program process, and then it ends
        the run (``take`` sees that: ``alive``); another process would have the pid only if the
        kernel's pid counter wrapped round in that instant."""
        ready = self._ready()
        if ready is None:
            return
        pid, cpus = ready
        if cpu in cpus and len(cpus) > 1:
            with contextlib.suppress(OSError):  # gone, or not ours to move: it wakes where the scheduler puts it
                os.sched_setaffinity(pid, cpus - {cpu})

    def _ready(self) -> tuple[int, set[int]] | None:
        """(pid, CPU mask) of the program process from its ``ready`` line, once that has come
        (then read off the channel); None before, or when what came is not one."""
        try:
            data, ancillary, _, _ = self.channel.recvmsg(MAX_MSG, socket.CMSG_SPACE(_UCRED.size),
                                                         socket.MSG_PEEK | socket.MSG_DONTWAIT)
            line, newline, _ = data.partition(b"\n")
            ready = _decode_ready(line)
            if not newline:
                return None
            self.channel.recv(len(line) + 1, socket.MSG_DONTWAIT)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):  # (BlockingIOError: not ready yet)
            return None
        self.readied = True
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(value) >= _UCRED.size:
                pid = _UCRED.unpack_from(value)[0]
                return (pid, set(ready.cpus)) if pid > 0 else None
        return None

    def alive(self) -> bool:
        """False once its reaper reported or vanished (its call socket is readable: nothing
        else is ever sent on it before the run)."""
        try:
            self.launched.call.recv(MAX_MSG, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True  # nothing to read: the reaper still waits
        except OSError:
            pass
        return False  # "exit", end-of-file or an error: gone

    async def discard(self) -> None:
        """Unused: end its processes (the reaper kills and reaps them) and remove its cgroup."""
        self.channel.close()
        self.launched.kill()
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(STOP_TIMEOUT_S):
                await self.launched.wait()
            await anyio.to_thread.run_sync(self.bound.close)
        self.launched.close()


@dataclass
class WarmSlot:
    """A session's warm process and its next run made ready (``session.state(WarmSlot)``);
    both are closed when the session is disposed."""

    process: WarmProcess | None = None
    spare: Prepared | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    starts: int = 0

    async def take(self, where: Where, offered: Prepared | None = None) -> Prepared:
        """A run ready for its program at ``where``: the one made ready meanwhile when it matches
        and lives, else one made now (starting or replacing the warm process when needed).
        ``offered``: the run made ready that the caller sent its program ahead; one that another
        run offered its program and never took is never taken (its program would run)."""
        async with self.lock:
            spare, self.spare = self.spare, None
            if (spare is not None and spare.where == where and spare.alive()
                    and (not spare.offered or spare is offered)):
                return spare
            if spare is not None:
                await spare.discard()
            return await self._prepare(where)

    async def refill(self, where: Where) -> None:
        """Make the next run ready now, off its critical path (its processes start while the model
        thinks) — unless a live warm process of another confinement is the session's now: a run
        started since in another mode replaced it, and replacing it back would kill that run's
        reaper under its program (the ask is stale; that run's end asks again, where it ran)."""
        async with self.lock:
            current = self.process
            if (current is not None and not current.closed and current.proc.returncode is None
                    and current.where.process != where.process):
                return
            if self.spare is None:
                self.spare = await self._prepare(where)

    async def _warm(self, where: Where) -> WarmProcess:
        current = self.process
        if (current is not None and not current.closed and current.where.process == where.process
                and current.proc.returncode is None):
            return current
        if current is not None:
            self.process = None
            await current.aclose()
        process = WarmProcess(where)
        await process.start()
        self.starts += 1
        self.process = process
        return process

    async def _prepare(self, where: Where) -> Prepared:
        bound = await anyio.to_thread.run_sync(ProcessBound.create, where.max_processes)
        launched = Launched()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        join = -1
        try:
            parent.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the ready line's pid: ``keep_off``
            join = bound.join_fd()
            call, output = launched.theirs()
            fds = [call, child.fileno(), output, *([join] if join >= 0 else [])]
            for attempt in (1, 2):
                warm = await self._warm(where)
                try:
                    warm.launch(fds, confined=where.confined)
                    break
                except WarmError:  # it died since the last run: nothing of this one ran, start another
                    if attempt == 2:
                        raise
            launched.sent()
        except BaseException:
            parent.close()
            launched.close()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(bound.close)
            raise
        finally:
            child.close()
            if join >= 0:
                os.close(join)
        return Prepared(launched, parent, bound, where)

    async def aclose(self) -> None:
        spare, self.spare = self.spare, None
        current, self.process = self.process, None
        if spare is not None:
            await spare.discard()
        if current is not None:
            await current.aclose()

    def __repr__(self) -> str:
        alive = self.process is not None and not self.process.closed
        pid = self.process.proc.pid if alive and self.process is not None else None
        return f"WarmSlot(pid={pid}, starts={self.starts}, spare={self.spare is not None})"


class Launched:
    """One run handed to the warm process: its call socket and the read end of its output."""

    def __init__(self) -> None:
        self.line = CallSocket()
        self.call = self.line.sock
        self.output, self._output_theirs = os.pipe2(os.O_CLOEXEC)
        self.code: int | None = None
        self.finished = False
        self._exit_lock = anyio.Lock()

    def theirs(self) -> list[int]:
        return [self.line.theirs(), self._output_theirs]

    def sent(self) -> None:
        """The warm process has its copies: drop ours (the run now owns the only write end)."""
        self.line.sent()
        if self._output_theirs >= 0:
            os.close(self._output_theirs)
            self._output_theirs = -1
        os.set_blocking(self.output, False)

    def kill(self) -> None:
        """Ask the reaper to kill everything of the run now (idempotent; a gone reaper is fine)."""
        self.line.stop(b"kill")

    async def wait(self) -> int | None:
        """The program process's exit code (negative: the signal), once the reaper reported that
        every process of the run is gone; None when the reaper vanished without reporting."""
        async with self._exit_lock:
            if not self.finished:
                _, self.code = await self.line.wait()
                self.finished = True
            return self.code

    async def read(self, size: int = 1 << 16) -> bytes:
        """Output bytes; b"" at end-of-file (every writer of the pipe is gone)."""
        while True:
            try:
                return os.read(self.output, size)
            except BlockingIOError:
                await anyio.wait_readable(self.output)

    def available(self, limit: int) -> bytes:
        """The output bytes in the pipe now (b"" when none; at most about ``limit``), read without
        waiting: once no process of the run can write any more, the rest of its output (bounded:
        a process outside the run that was handed the pipe may still be writing to it)."""
        data = bytearray()
        try:
            while len(data) < limit and (chunk := os.read(self.output, 1 << 16)):
                data += chunk
        except (BlockingIOError, OSError):  # (OSError: the run's output was closed already)
            pass
        return bytes(data)

    def close(self) -> None:
        self.line.close()
        for fd in (self.output, self._output_theirs):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.output = self._output_theirs = -1
