"""A warm confined server, the host's side: a process started once (per session), a control
socket to hand it work, and one *call socket* per piece of work that is that work's lifeline.

Two plugins run one: sandbox-tools' command server (``_cmdserver.py``: a fork and an exec per
``bash`` call or hook) and code mode's warm runtime (``_warm.py``: a forked program per run).
Both confined scripts share the other side of this protocol in ``dsh_core/reaping.py`` (the
pre-forked reapers, ``serve``; how a call ends, ``finish``), loaded by path since they run with
``python -I -S`` and the standard library only.

The protocol (``AF_UNIX``/``SOCK_SEQPACKET``, one message per datagram):

- control, server → host: ``ready`` once it accepts work (or ``error <text>``, or an exit, with
  the reason on its stderr);
- host → server: a word (``run``…) with the work's descriptors, the call socket among them;
  end-of-file on the control socket ends the server (calls still running keep their reapers);
- call socket, reaper → host: ``exit <code>`` (negative: killed by that signal), only once every
  process of the call is gone; host → reaper: ``term`` or ``kill``; end-of-file means ``kill``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import select
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import anyio

from .reaping import MAX_MSG, recv_datagram

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0  # after end-of-file on its control socket, how long the server may take to exit


class WarmServerError(Exception):
    """The server could not be started, or is gone. ``before_start``: nothing of the work it was
    handed ran, so handing it to another server is safe."""

    def __init__(self, message: str, *, before_start: bool = False) -> None:
        super().__init__(message)
        self.before_start = before_start


def parse_exit(msg: bytes) -> tuple[bool, int | None]:
    """(finished, exit code) from a reaper's message; anything else (end-of-file) means the call was lost."""
    if msg.startswith(b"exit "):
        try:
            return True, int(msg[5:])
        except ValueError:
            pass
    return False, None


class WarmServer:
    """One running server process and its control socket.

    ``argv``: the command line, or a function of the control socket's descriptor number (passed
    to the child under that number); ``control_on_stdin``: the control socket is the child's stdin
    instead. Subclasses set ``error`` (the exception they raise) and ``name`` (for messages);
    ``kill_group``: a server that does not exit in time is killed with its whole process group
    (its idle pre-forked reapers included) rather than alone.
    """

    error: type[WarmServerError] = WarmServerError
    name = "the warm server"
    kill_group = False

    def __init__(self, argv: list[str] | Callable[[int], list[str]], *, env: dict[str, str], cwd: str,
                 control_on_stdin: bool = False) -> None:
        self._argv = argv
        self._env = env
        self._cwd = cwd
        self._on_stdin = control_on_stdin
        self.control: socket.socket | None = None
        self.proc: Any = None
        self.closed = False

    @property
    def alive(self) -> bool:
        return not self.closed and self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        """Start the process and wait for its ``ready``; raise ``error`` with its reason otherwise."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.fileno()
        argv = self._argv(fd) if callable(self._argv) else list(self._argv)
        try:
            with anyio.CancelScope(shield=True):
                self.proc = await anyio.open_process(
                    argv, stdin=fd if self._on_stdin else subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE, pass_fds=() if self._on_stdin else (fd,), env=self._env,
                    cwd=self._cwd, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.control = ours
        ours.setblocking(False)
        try:
            with anyio.fail_after(START_TIMEOUT_S):
                first = await recv_datagram(ours)
            if first != b"ready":
                err = b""
                if self.proc.stderr is not None:
                    with anyio.move_on_after(2):
                        async for chunk in self.proc.stderr:
                            err += chunk
                detail = (first[6:] if first.startswith(b"error ") else err).decode(errors="replace").strip()
                raise self.error(detail.splitlines()[-1] if detail else f"{self.name} exited at start")
            if self.proc.stderr is not None:
                await self.proc.stderr.aclose()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise

    def send(self, word: bytes, fds: list[int]) -> None:
        """Hand the server one piece of work (it keeps its own copies of ``fds``)."""
        if self.control is None or self.closed or self.proc.returncode is not None:
            self.closed = True
            raise self.error(f"{self.name} is gone", before_start=True)
        try:
            socket.send_fds(self.control, [word], fds)
        except OSError as exc:  # BlockingIOError included: a healthy server never lags by a whole buffer
            self.closed = True
            raise self.error(f"{self.name} is gone ({exc})", before_start=True) from None

    async def aclose(self) -> None:
        """End the server (end-of-file on its control socket) and reap it; calls still running
        keep their reapers, which their own call sockets end."""
        self.closed = True
        if self.control is not None:
            self.control.close()
        if self.proc is not None:
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(STOP_TIMEOUT_S) as slow:
                    await self.proc.wait()
                if slow.cancelled_caught:
                    if self.kill_group:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(self.proc.pid, 9)
                    else:
                        self.proc.kill()
                    await self.proc.wait()
                await self.proc.aclose()


class CallSocket:
    """One call's lifeline, the host's end: ``theirs`` goes to the server with the work, ``sent``
    drops our copy of it; ``stop`` asks the reaper to end the call, ``wait`` takes its report."""

    def __init__(self) -> None:
        self.sock, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def theirs(self) -> int:
        return self._theirs.fileno()

    def sent(self) -> None:
        self._theirs.close()
        self.sock.setblocking(False)

    def stop(self, word: bytes = b"kill") -> bool:
        """``term`` or ``kill``; False when the reaper is already gone."""
        try:
            self.sock.send(word)
        except OSError:
            return False
        return True

    async def wait(self) -> tuple[bool, int | None]:
        """The reaper's report: (finished, exit code); (False, None) when it vanished without one."""
        return parse_exit(await recv_datagram(self.sock))

    def report_now(self) -> tuple[bool, int | None] | None:
        """The reaper's report as ``wait`` gives it, if it is there now; None: not yet."""
        try:
            msg = self.sock.recv(MAX_MSG)
        except BlockingIOError:
            return None
        except OSError:
            msg = b""
        return parse_exit(msg)

    def close(self) -> None:
        self.sock.close()
        self._theirs.close()


class Readiness:
    """Waits, in the calling task, until any of several descriptors is readable (or at its end),
    or a deadline passes: a call's output pipes and its call socket, without a task (and a wait)
    per descriptor, nor a cancel scope for the call's timeout.

    The descriptors are watched by an epoll set of this object's own (``watch``/``unwatch``:
    one C call each), and only that set's descriptor is registered with the event loop, once,
    at the first wait (``close`` takes it off): asyncio's add_reader/remove_reader are ~15 Python
    calls each, and a call watched three descriptors, each added and removed (~45 calls a bash
    command, bench/profile_prompt.py --bash). The set is level-triggered, like the loop: a
    descriptor that is readable while nobody waits costs one callback per loop turn, so a caller
    reads everything ready before it waits again. On another anyio backend, ``wait`` waits on the
    set's descriptor with anyio."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self._set: select.epoll | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._woken: anyio.Event | None = None  # another anyio backend's wait, for ``wake``

    def _ready(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def wake(self) -> None:
        """End a wait now (a spurious wake-up, for the caller to look at its own state)."""
        self._ready()
        if self._woken is not None:
            self._woken.set()

    def _readable(self) -> None:
        """The loop's callback for the set: a wake-up only if a watched descriptor is readable now
        (a callback queued in the loop turn that also ran the waiter, and the waiter unwatched
        the descriptor meanwhile, is stale)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self._set is not None and self._set.poll(0):
            waiter.set_result(None)

    def watch(self, *fds: int) -> None:
        for fd in fds:
            if fd not in self.fds:
                if self._set is None:
                    self._set = select.epoll()  # close-on-exec
                self._set.register(fd, select.EPOLLIN)
                self.fds.append(fd)

    def unwatch(self, *fds: int) -> None:
        """Stop watching ``fds`` (before they are closed)."""
        for fd in fds:
            if fd in self.fds:
                self.fds.remove(fd)
                assert self._set is not None
                self._set.unregister(fd)

    def clear(self) -> None:
        """Stop watching everything (before the descriptors are closed); the set stays registered
        with the loop, for another user (a command server keeps its ended calls' for its next)."""
        if self._set is not None:
            for fd in self.fds:
                self._set.unregister(fd)
        self.fds.clear()

    def close(self) -> None:
        """Stop watching everything, and let go of the loop's registration and the set."""
        self.clear()
        if self._set is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._set.fileno())
            self._loop = None
            self._set.close()
            self._set = None

    async def wait(self, deadline: float = math.inf) -> bool:
        """Until one of the watched descriptors is readable (spurious wake-ups are possible), or
        ``deadline`` (``time.monotonic()``) passes; False without waiting when it already has."""
        if not self.fds:
            raise RuntimeError("Readiness.wait with nothing to watch")
        assert self._set is not None
        delay = deadline - time.monotonic()
        if delay <= 0:
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another anyio backend (trio): the set's descriptor, or a wake
            woken = self._woken = anyio.Event()
            with anyio.move_on_after(delay):
                async with anyio.create_task_group() as tg:

                    async def readable(fd: int) -> None:
                        await anyio.wait_readable(fd)
                        woken.set()

                    tg.start_soon(readable, self._set.fileno())
                    await woken.wait()
                    tg.cancel_scope.cancel()
            self._woken = None
            return True
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._set.fileno())
            self._loop = loop
            loop.add_reader(self._set.fileno(), self._readable)
        self._waiter = loop.create_future()
        timer = loop.call_later(delay, self._ready) if delay != math.inf else None
        try:
            await self._waiter  # a cancel scope cancels the task here, as at any checkpoint
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        return True
