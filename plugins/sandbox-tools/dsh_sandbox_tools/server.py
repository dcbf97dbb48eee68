"""The harness side of the confined command server (``_cmdserver.py``): start it once per
session and confinement, run commands through it, keep a bounded pool of them.

A command run here costs a fork and an exec inside an already-confined process. Its lifetime
is tied to a call socket this side holds: the reaper kills and reaps the whole call (setsid'd
and double-forked stragglers included) when asked, when the command ends, or when the socket
closes — a cancel at any instant, even mid-spawn, or this process dying. ``run`` returns only
after the reaper reported that every process of the call is gone.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec

from dsh_core import reaping
from dsh_core.warmserver import CallSocket, Readiness, WarmServer, WarmServerError

from .run import DRAIN_GRACE_S, TERM_GRACE_S, CommandResult, HeadSink, _Sink, stderr_spill

SERVER = str(Path(__file__).with_name("_cmdserver.py").resolve())
EXIT_WAIT_S = 10.0  # after "kill", how long to wait for the reaper's "exit" before giving up on it
MAX_SERVERS = 32  # idle servers beyond this many are closed, least recently used first …
IDLE_KEEP_S = 30.0  # … but a live session's server used in the last this many seconds is kept beyond it
SPARE_READINESS = 4  # a server keeps at most this many readiness sets of ended calls


class ServerError(WarmServerError):
    """The command server could not be started or lost the call (never run unconfined instead)."""


def server_argv(runner: Any, roots: list[str], cwd: str, fd: int) -> list[str]:
    """The argv that starts a command server confined like ``runner.wrap`` would confine a command
    (``runner`` None: unconfined, for danger-full-access jobs that still need the reaper)."""
    from .mechanisms import bwrap_argv, landlock_rules

    base = [sys.executable, "-I", "-S", SERVER, "--reaping", reaping.PATH]
    if runner is None:
        return [*base, str(fd)]
    if runner.name == "bwrap":
        return bwrap_argv([*base, str(fd)], roots, cwd)
    return [*base, "--landlock", *landlock_rules(roots), str(fd)]


class CommandServer(WarmServer):
    """One running ``_cmdserver`` process and its control socket (``dsh_core/warmserver.py``)."""

    error = ServerError
    name = "the command server"

    def __init__(self, argv_for_fd: Callable[[int], list[str]], *, env: dict[str, str], cwd: str) -> None:
        super().__init__(argv_for_fd, env=env, cwd=cwd)
        self.active = 0
        self.last_used = time.monotonic()  # when a call last ended (or the server started)
        # The readiness sets of ended calls, kept for the next: each stays registered with the event
        # loop (an empty set is never readable), where a set of its own registered and taken off
        # again was ~25 Python calls a command (bench/profile_prompt.py --bash).
        self._spare: list[Readiness] = []

    def _readiness(self) -> Readiness:
        return self._spare.pop() if self._spare else Readiness()

    def _done_with(self, ready: Readiness) -> None:
        ready.clear()
        if self.closed or len(self._spare) >= SPARE_READINESS:
            ready.close()
        else:
            self._spare.append(ready)

    async def aclose(self) -> None:
        spare, self._spare = self._spare, []
        for ready in spare:
            ready.close()
        await super().aclose()

    def _send(self, fds: list[int]) -> None:
        self.send(b"run", fds)

    async def run(
        self, argv: list[str], *, cwd: str, env: dict[str, str], timeout_s: float, limit: int, spill: Path | str,
        stdin: bytes | None = None, capture: bool = False, sink: Any = None, stop: anyio.Event | None = None,
        split: bool = False, tap: Callable[[bytes], None] | None = None,
    ) -> CommandResult:
        """Run one command through the server. ``capture``: stdout and stderr apart, each its first
        ``limit`` bytes (a hook's answer), instead of one spilling stream; ``stdin``: bytes the
        command reads (else /dev/null); ``sink``: where the output goes instead (``feed``,
        ``close``, ``text``: a background job's log); ``stop``: when set, the command is ended as
        on a timeout (SIGTERM, then SIGKILL), and the result says ``stopped``; ``split``: stdout
        and stderr apart, each bounded with its own spill file (the bash tool's result); ``tap``:
        also sees every chunk of output as it arrives (a live view of the running command)."""
        request: dict[str, Any] = {"argv": argv, "cwd": cwd, "stderr": capture or split, "stdin": stdin is not None}
        if env != self._env:  # else the server's own environment, the one it was started with (a bash call's)
            request["env"] = env
        payload = _encode(request)
        call = _Call(limit, spill, self._readiness(), stdin=stdin, capture=capture, sink=sink, split=split, tap=tap)
        try:
            try:
                call.send(self._send, payload)
            except BaseException:
                call.close()
                raise
            # From here the call socket is the call's lifeline: closing it kills the whole call.
            self.active += 1
            try:
                return await call.run(timeout_s, stop)
            finally:
                self.active -= 1
                self.last_used = time.monotonic()
        finally:
            self._done_with(call.ready)  # the call closed: it watches nothing now


def _encode(request: dict[str, Any]) -> bytes:
    """The request as JSON for the server's ``json.loads``: msgspec's encoder (a tenth of the
    stdlib's time on a whole environment), or the stdlib's for what UTF-8 cannot hold (a lone
    surrogate from an undecodable variable: escaped, and decoded back the same)."""
    try:
        return msgspec.json.encode(request)
    except UnicodeEncodeError:
        return json.dumps(request).encode()


class _Call:
    """One command through a server: its descriptors, its sinks, and the wait for the reaper's ``exit``."""

    def __init__(self, limit: int, spill: Path | str, ready: Readiness, *, stdin: bytes | None, capture: bool,
                 sink: Any = None, split: bool = False, tap: Callable[[bytes], None] | None = None) -> None:
        self.spill = spill
        self.tap = tap
        self.stdin = stdin
        self.sink: Any = sink if sink is not None else HeadSink(limit) if capture else _Sink(limit, spill)
        self.err_sink: Any = HeadSink(limit) if capture else _Sink(limit, stderr_spill(spill)) if split else None
        self.out_r, self.out_w = os.pipe2(os.O_CLOEXEC)
        self.err_r, self.err_w = os.pipe2(os.O_CLOEXEC) if capture or split else (-1, -1)
        self.in_r, self.in_w = os.pipe2(os.O_CLOEXEC) if stdin is not None else (-1, -1)
        self.line = CallSocket()
        self.ready = ready  # empty; its owner (the server) closes it or keeps it for another call
        self.open: dict[int, Any] = {}  # the output pipes not at their end yet, and their sinks
        self.ended: list[int] = []  # descriptors at their end, still watched (until the call waits again)
        self.reported = False  # the reaper reported (or its socket closed)
        self.finished = False
        self.code: int | None = None
        self.timed_out = False
        self.stopped = False

    def send(self, send_fds: Callable[[list[int]], None], payload: bytes) -> None:
        """Hand the server the request and the command's ends of the pipes; ours stay here."""
        theirs = [fd for fd in (self.err_w, self.in_r) if fd >= 0]
        memfd = os.memfd_create("dsh-command", os.MFD_CLOEXEC)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(memfd, view):]
            send_fds([memfd, self.out_w, self.line.theirs(), *theirs])
        finally:
            os.close(memfd)
            for fd in (self.out_w, *theirs):
                os.close(fd)
            self.out_w = self.err_w = self.in_r = -1
            self.line.sent()

    def close(self) -> None:
        self.ready.clear()
        self.line.close()
        for fd in (self.out_r, self.err_r, self.in_w, self.out_w, self.err_w, self.in_r):
            if fd >= 0:
                os.close(fd)
        self.out_r = self.err_r = self.in_w = self.out_w = self.err_w = self.in_r = -1
        self.sink.close()
        if self.err_sink is not None:
            self.err_sink.close()

    def _read_ready(self) -> None:
        """Everything the pipes and the call socket hold now, without waiting: output into its
        sink (and the tap). A pipe at its end, and the call socket once it reported (or closed),
        go to ``ended``: no longer watched once the call waits again."""
        for fd, into in list(self.open.items()):
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    del self.open[fd]
                    self.ended.append(fd)
                    break
                into.feed(chunk)
                if self.tap is not None:
                    self.tap(chunk)
        if not self.reported:
            report = self.line.report_now()
            if report is not None:
                self.reported = True
                self.ended.append(self.line.sock.fileno())
                self.finished, self.code = report

    async def _until(self, done: Callable[[], bool], deadline: float = math.inf, *, read_first: bool = True) -> None:
        """Drain the output and read the call socket until ``done()`` or ``deadline``
        (``time.monotonic()``), in this task: one wait on all of them, no task per pipe, and no
        cancel scope for the deadline (entered and left on every call, ~30 calls a command). What
        ended is unwatched only before another wait: a call's end is usually read in one go, and
        its descriptors are then unwatched all at once as it closes (``Readiness.clear``).
        ``read_first=False``: wait before the first read (a call just sent has nothing to read
        yet, and reading nothing is three syscalls and three BlockingIOErrors raised)."""
        if not read_first and not await self.ready.wait(deadline):
            return
        while True:
            self._read_ready()
            if done():
                return
            if self.ended:
                self.ready.unwatch(*self.ended)
                self.ended.clear()
            if not self.ready.fds or not await self.ready.wait(deadline):
                return

    async def _report(self, within_s: float) -> tuple[bool, int | None]:
        """The reaper's report ("exit <code>") if it comes within ``within_s``, draining the output
        meanwhile; (False, None) if it does not."""
        await self._until(lambda: self.reported, time.monotonic() + within_s)
        return (self.finished, self.code) if self.reported else (False, None)

    def _write_now(self) -> memoryview | None:
        """As much of the command's stdin as the pipe takes now (all of a hook's payload, usually:
        then it is closed at once and no writer task is needed); what is left, else None."""
        if self.stdin is None:
            return None
        view = memoryview(self.stdin)
        try:
            view = view[os.write(self.in_w, view):]
        except BlockingIOError:
            pass
        except OSError:
            view = view[:0]  # EPIPE: it exited or closed its stdin
        if view:
            return view
        os.close(self.in_w)
        self.in_w = -1
        return None

    async def _writer(self, view: memoryview) -> None:
        """The rest of the command's stdin: written, then closed (EOF); one that does not read it is fine."""
        try:
            while view:
                try:
                    view = view[os.write(self.in_w, view):]
                except BlockingIOError:
                    await anyio.wait_writable(self.in_w)
        except OSError:
            pass  # EPIPE: it exited or closed its stdin
        finally:
            os.close(self.in_w)
            self.in_w = -1

    async def _stop(self, first: bytes) -> tuple[bool, int | None]:
        if self.reported or not self.line.stop(first):
            return False, None  # the reaper is gone without reporting
        if first == b"term":
            await self._report(TERM_GRACE_S)
            if self.reported:
                return self.finished, self.code
            if not self.line.stop(b"kill"):
                return False, None
        return await self._report(EXIT_WAIT_S)

    async def _wait(self, timeout_s: float, stop: anyio.Event | None = None, tg: Any = None) -> None:
        """The reaper's report, within ``timeout_s`` (or until ``stop``; then SIGTERM, and SIGKILL
        after a grace), then the rest of the output (at most ``DRAIN_GRACE_S`` more)."""
        if stop is not None:
            tg.start_soon(self._watch_stop, stop)
        await self._until(lambda: self.reported or self.stopped, time.monotonic() + timeout_s, read_first=False)
        if not self.reported:
            self.timed_out = not self.stopped
            with anyio.CancelScope(shield=True):
                self.finished, self.code = await self._stop(b"term")
        if self.open:
            await self._until(lambda: not self.open, time.monotonic() + DRAIN_GRACE_S)

    async def _watch_stop(self, stop: anyio.Event) -> None:
        await stop.wait()
        self.stopped = True
        self.ready.wake()

    async def run(self, timeout_s: float, stop: anyio.Event | None = None) -> CommandResult:
        self.open = {self.out_r: self.sink, **({self.err_r: self.err_sink} if self.err_sink is not None else {})}
        for fd in (self.out_r, self.err_r, self.in_w):
            if fd >= 0:
                os.set_blocking(fd, False)
        self.ready.watch(*self.open, self.line.sock.fileno())
        try:
            rest = self._write_now()
            if stop is None and rest is None:  # a plain call (a bash command, a hook): no task at all
                await self._wait(timeout_s)
            else:
                async with anyio.create_task_group() as tg:
                    if rest is not None:
                        tg.start_soon(self._writer, rest)
                    await self._wait(timeout_s, stop, tg)
                    tg.cancel_scope.cancel()
        finally:
            if not self.finished:  # cancelled (or the wait failed): kill now, and wait until all is gone
                with anyio.CancelScope(shield=True):  # only then: a scope entered and left was ~25 calls a command
                    self.finished, self.code = await self._stop(b"kill")
            self.close()  # no await in it: nothing to shield
        if not self.finished:
            raise ServerError("the command server lost the call (it died or did not answer)")
        code = self.code
        return CommandResult(
            exit_code=None if self.timed_out else code,
            signal=-code if code is not None and code < 0 else None,
            timed_out=self.timed_out,
            text=self.sink.text(),
            total_bytes=self.sink.total,
            spill_path=Path(self.spill) if getattr(self.sink, "file", None) is not None else None,
            stderr=self.err_sink.text() if self.err_sink is not None else None,
            stderr_spill_path=(Path(stderr_spill(self.spill)) if getattr(self.err_sink, "file", None) is not None
                               else None),
            stopped=self.stopped,
        )


@dataclass
class SessionServers:
    """The command servers a session started (``agent.state(SessionServers)``, filled by
    ``ServerPool.get``): they end when the session is disposed, not whenever the pool next needs room."""

    keys: dict[Hashable, ServerPool] = field(default_factory=dict)

    async def aclose(self) -> None:
        keys, self.keys = self.keys, {}
        for key, pool in keys.items():
            await pool.discard(key)


class ServerPool:
    """Command servers by key (session, mechanism, roots), at most ``limit`` kept when idle.

    The limit bounds what idle sessions hold, not the working set: a server of a live session
    that ran a call in the last ``IDLE_KEEP_S`` is kept beyond it. (Evicting those made a busy
    process thrash: with more sessions making bash calls at once than the limit, each session's
    server sat idle between its calls, was closed as least recently used, and the next call
    started a fresh confined server — about every call, under a 64-session load.)"""

    def __init__(self, limit: int = MAX_SERVERS) -> None:
        self.limit = limit
        self._servers: OrderedDict[Hashable, tuple[CommandServer, Any]] = OrderedDict()
        self._locks: weakref.WeakValueDictionary[Hashable, anyio.Lock] = weakref.WeakValueDictionary()

    def __len__(self) -> int:
        return len(self._servers)

    async def get(self, key: Hashable, owner: Any, make: Callable[[], CommandServer]) -> CommandServer:
        entry = self._servers.get(key)
        if entry is not None and not entry[0].closed:
            self._servers.move_to_end(key)
            return entry[0]
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = anyio.Lock()
        async with lock:
            entry = self._servers.get(key)
            if entry is not None and not entry[0].closed:
                return entry[0]
            if entry is not None:
                self._servers.pop(key, None)
                await entry[0].aclose()
            server = make()
            await server.start()
            self._servers[key] = (server, weakref.ref(owner) if owner is not None else (lambda: None))
            if callable(getattr(owner, "state", None)):  # a session: the server ends with it
                owner.state(SessionServers).keys[key] = self
            await self._shrink()
            return server

    async def discard(self, key: Hashable) -> None:
        entry = self._servers.pop(key, None)
        if entry is not None:
            await entry[0].aclose()

    async def _shrink(self) -> None:
        if len(self._servers) <= self.limit:
            return

        def gone(owner_ref: Any) -> bool:
            owner = owner_ref()
            return owner is None or getattr(owner, "disposed", False)

        recent = time.monotonic() - IDLE_KEEP_S
        idle = [k for k, (srv, owner) in self._servers.items()
                if srv.active == 0 and (gone(owner) or srv.last_used < recent)]
        # servers of finished sessions first, then least recently used
        idle.sort(key=lambda k: 0 if gone(self._servers[k][1]) else 1)
        for key in idle[: len(self._servers) - self.limit]:
            await self.discard(key)

    async def aclose(self) -> None:
        entries = list(self._servers.values())
        self._servers.clear()
        async with anyio.create_task_group() as tg:
            for server, _ in entries:
                tg.start_soon(server.aclose)
