"""Ending every process of one call: the reaper's side (standard library and ctypes only).

A call's *reaper* is a child subreaper (``PR_SET_CHILD_SUBREAPER``): every process the call
leaves behind, setsid'd or double-forked, is re-parented to it. It watches the call's leader
and the call socket, then kills and reaps everything before it reports ``exit <code>``; end of
file on the call socket means kill, so a call never outlives whoever asked for it.

It is also the confined side of a warm server (``dsh_core/warmserver.py`` is the host's):
``serve`` keeps one reaper forked in advance, waiting for the next piece of work, and ``finish``
ends a call. Two confined scripts use it: sandbox-tools' command server (``_cmdserver.py``: a
forked command per ``bash`` call) and code mode's warm runtime (``_warm.py``: a forked program
per run). They run with ``python -I -S`` inside the sandbox and cannot import dsh_core, so they
load this file by path (``PATH``, handed to them on their command line). ``recv_datagram`` is
the host's side of the call socket.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import time
import types
from collections.abc import Callable

PATH = os.path.abspath(__file__)
MAX_MSG = 4096
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def become_subreaper() -> None:
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def children() -> list[int]:
    """This process's children (a subreaper's include every orphan of its calls)."""
    me = os.getpid()
    try:
        fd = os.open(f"/proc/self/task/{me}/children", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = b""
            while chunk := os.read(fd, 65536):
                raw += chunk
        finally:
            os.close(fd)
        return [int(p) for p in raw.split()]
    except OSError:
        pass
    out = []  # no CONFIG_PROC_CHILDREN: scan every process's parent
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return out


def kill(pid: int, sig: int, group: bool = False) -> None:
    with contextlib.suppress(OSError):
        (os.killpg if group else os.kill)(pid, sig)


def watch(leader: int, call: socket.socket, on_message: Callable[[bytes], bool]) -> None:
    """Until the leader exits or ``on_message(msg)`` says stop (True); end of file or an error on
    ``call`` stops too. The leader is left a zombie: its pid keeps the group id for ``killpg``."""
    pidfd = os.pidfd_open(leader)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(call.fileno(), select.POLLIN)
    stop = False
    while not stop:
        for fd, _ in poller.poll():  # every ready fd is handled, even after one said stop
            if fd == pidfd:
                if os.waitid(os.P_PID, leader, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    stop = True
            else:
                try:
                    msg = call.recv(MAX_MSG)
                except OSError:
                    msg = b""
                if not msg or on_message(msg):
                    stop = True
    os.close(pidfd)


def terminate(leader: int) -> None:
    """SIGTERM to the leader's group and to every process re-parented to this subreaper."""
    kill(leader, signal.SIGTERM, group=True)
    for child in children():
        kill(child, signal.SIGTERM)


def reap_all(leader: int) -> int | None:
    """SIGKILL the leader's group, then kill and reap every child until none is left; the
    leader's wait status when it was reaped here."""
    if leader:
        kill(leader, signal.SIGKILL, group=True)
    status: int | None = None
    while True:
        # Dead children first, without a listing: most calls leave only their leader, a zombie by
        # now, and then two waits end it (reading /proc for the listing costs more than the rest).
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status  # no child at all: every process of the call is gone
        if pid == 0:  # one still runs: kill every child (orphans re-parented here included), wait for one
            kids = children()
            for kid in kids:
                kill(kid, signal.SIGKILL)
            if not kids:
                time.sleep(0.001)  # a child exists but was re-parented after the listing
                continue
            try:
                pid, st = os.waitpid(-1, 0)
            except ChildProcessError:
                return status
        if pid == leader:
            status = st


def exit_code(status: int) -> int:
    """A wait status as the call reports it: the exit code, or minus the killing signal."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def report(call: socket.socket, code: int) -> None:
    with contextlib.suppress(OSError):
        call.send(b"exit %d" % code)


def finish(leader: int, call: socket.socket, on_message: Callable[[bytes], bool] = lambda msg: True,
           status: int | None = None) -> None:
    """A reaper's whole job once its leader runs (``leader`` 0 with ``status``: it could not
    start): watch it, then kill and reap everything of the call and report ``exit <code>``."""
    if _taken is not None:
        _taken()
    if status is None:
        watch(leader, call, on_message)
    reaped = reap_all(leader)
    if reaped is not None:
        status = reaped
    if _again is not None:
        _again()
    report(call, exit_code(status) if status is not None else 0)


# A reused reaper's "ready again" (set by ``_reaper_loop``): said to the server *before* the call's
# exit is reported, so that by the time the host sends its next call the server counts this reaper
# as waiting. Said after, a next call taken by the other waiting reaper found none waiting: the
# server forked a third, and the first, back too late, was one too many and exited — a fork and
# an exit per call under load.
_again: Callable[[], None] | None = None
# A reused reaper's "taken" (``_reaper_loop``): said once the command runs, so the wake-up of the
# server is not on the way to the command's start (the spawn); said before "ready again" always.
_taken: Callable[[], None] | None = None


def load(name: str, path: str) -> types.ModuleType:
    """A module by path (the confined scripts run with -I -S, outside any package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPARE_REAPERS = 2  # idle reapers a server keeps at most
CALLS_PER_REAPER = 1000  # then it exits and a fresh fork of the server takes its place


def serve(control: socket.socket, words: tuple[bytes, ...], nfds: tuple[int, int],
          handle: Callable[[bytes, list[int]], None], *, prefork: bool = True,
          prepare: Callable[[], None] | None = None) -> None:
    """A warm server's loop: each message on ``control`` (one of ``words`` with ``nfds[0]`` to
    ``nfds[1]`` descriptors; anything else is dropped) is run as ``handle(word, fds)`` in a
    reaper, a fork of the server. ``handle`` owns ``fds`` and closes them all.

    ``prefork`` (the command server): reapers are forked in advance and serve call after call;
    one waits on ``control`` whenever none is busy, so neither a fork nor a process's first
    copy-on-write faults are on a call's path. Each has a line to the server: it says when it
    took a call, once its command runs (the server forks another when none is left waiting),
    and asks to wait again after it (at most ``SPARE_REAPERS`` wait; one more exits); a reaper that dies, even killed
    while waiting, is seen by its line's end-of-file. ``prepare()`` runs once in each
    reaper before its first wait (e.g. becoming a subreaper). Without ``prefork`` (the warm
    runtime, whose runs are made ready in advance anyway) the server forks one reaper per
    message, which ends with it. End-of-file on ``control`` ends the server; calls still
    running keep their reapers. The server's SIGCHLD should be ignored (reapers are reaped by
    the kernel); a reaper gets the default back."""
    if prefork:
        _serve_reused(control, words, nfds, handle, prepare)
    else:
        _serve_forking(control, words, nfds, handle)


def _serve_forking(control: socket.socket, words: tuple[bytes, ...], nfds: tuple[int, int],
                   handle: Callable[[bytes, list[int]], None]) -> None:
    while taken := _next(control, words, nfds):
        word, fds = taken
        if os.fork() == 0:
            code = 0
            try:
                control.close()
                _adopt(fds)
                handle(word, fds)
            except BaseException:
                code = 1
            os._exit(code)
        for fd in fds:
            os.close(fd)


def _serve_reused(control: socket.socket, words: tuple[bytes, ...], nfds: tuple[int, int],
                  handle: Callable[[bytes, list[int]], None], prepare: Callable[[], None] | None) -> None:
    reapers: dict[socket.socket, bool] = {}  # the server's end of each reaper's line -> it waits
    poller = select.poll()
    while True:
        if not any(reapers.values()):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            if os.fork() == 0:
                code = 0
                try:
                    for line in (ours, *reapers):
                        line.close()
                    _reaper_loop(control, theirs, words, nfds, handle, prepare)
                except BaseException:
                    code = 1
                os._exit(code)
            theirs.close()
            reapers[ours] = True
            poller.register(ours, select.POLLIN)
        for fd, _ in poller.poll():
            line = next(r for r in reapers if r.fileno() == fd)
            try:
                said = line.recv(16)
            except OSError:
                said = b""
            if said == b"E":
                return
            if said == b"T":
                reapers[line] = False
            elif said == b"F" and sum(reapers.values()) < SPARE_REAPERS:
                reapers[line] = True
                line.send(b"w")
            else:  # gone (killed even: another is forked if none is left waiting), or one too many
                with contextlib.suppress(OSError):
                    line.send(b"x")
                poller.unregister(fd)
                del reapers[line]
                line.close()


def _reaper_loop(control: socket.socket, line: socket.socket, words: tuple[bytes, ...], nfds: tuple[int, int],
                 handle: Callable[[bytes, list[int]], None], prepare: Callable[[], None] | None) -> None:
    """A reaper made in advance: wait for a call, run it, telling the server (``T``) once its
    command started; then ask to wait again (``F``: the server answers ``w``, or ``x`` when enough
    already wait)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if prepare is not None:
        prepare()
    global _again, _taken
    said: list[bool] = []
    took: list[bool] = []

    def taken() -> None:
        if not took:
            line.send(b"T")
            took.append(True)

    def again() -> None:
        taken()
        line.send(b"F")
        said.append(True)

    for calls in range(CALLS_PER_REAPER):
        if calls:
            if not said:
                line.send(b"F")
            said.clear()
            if line.recv(16) != b"w":
                return
        got = _next(control, words, nfds)
        if got is None:
            line.send(b"E")  # the host closed the session (or died): the server ends too
            return
        took.clear()
        _adopt(got[1])
        _again, _taken = again, taken
        try:
            handle(*got)
        finally:
            _again = _taken = None
            taken()  # a call that ended before its command ran (a bad request) was taken too


def _adopt(fds: list[int]) -> None:
    for fd in fds:
        os.set_inheritable(fd, False)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _next(control: socket.socket, words: tuple[bytes, ...], nfds: tuple[int, int]) -> tuple[bytes, list[int]] | None:
    """The next well-formed message on ``control``; None at end-of-file."""
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(control, MAX_MSG, nfds[1])
        except InterruptedError:
            continue
        except OSError:
            return None
        if not msg:
            return None
        if msg in words and nfds[0] <= len(fds) <= nfds[1]:
            return msg, fds
        for fd in fds:
            os.close(fd)


async def recv_datagram(sock: socket.socket) -> bytes:
    """The host's side: one datagram from a non-blocking socket; b"" at end of file or on error."""
    import anyio  # here, not at the top: the confined scripts load this file without anyio

    while True:
        try:
            return sock.recv(MAX_MSG)
        except BlockingIOError:
            await anyio.wait_readable(sock)
        except OSError:
            return b""
