"""The warm code runtime: one confined Python process per session that forks every run.

Run as a standalone script (standard library and ctypes only), started once per session
through the spine's Confinement seam — the argv and environment a one-off program process
would get — with its control socket (``AF_UNIX``/``SOCK_SEQPACKET``) on stdin::

    python3 -I -S _warm.py REAPING     (REAPING: the path of dsh_core/reaping.py)

It loads the program side (``_child.py``) and asyncio once, then waits; a run costs a fork
instead of an interpreter start and those imports (``bench/code_mode.py`` prints both).

Protocol, one datagram per message:

- control, warm → host: ``ready`` once loaded (on any failure before that it just exits);
- host → warm: ``run`` or ``run confined`` with three or four descriptors: the run's *call
  socket* (``SOCK_SEQPACKET``), its *channel* (a stream socket speaking ``_child.py``'s
  protocol), the write end of its *output* pipe, and when the run has a pids cgroup, that
  cgroup's ``tasks`` opened for writing (``ProcessBound.join_fd``). The warm process forks a reaper and forgets it
  (``reaping.serve``, shared with the bash command server; the host's side is
  ``dsh_core/warmserver.py``); end-of-file on the control socket ends the warm process.
- reaper (a child subreaper; ``dsh_core/reaping.py``, shared with the bash command server):
  forks the *program process*, then waits until it exits, or the host says ``kill`` on the call
  socket, or closes it (end-of-file is ``kill``: a run never outlives the one who asked for
  it). It kills the program's group and every process re-parented to it, reaps them all, and
  only then answers ``exit <code>`` (negative: killed by that signal).
- program process: joins the run's cgroup (before anything else runs), leads a session of its
  own, has stdin on /dev/null, stdout and stderr on the output pipe and no descriptor but the
  channel; in a confined session (``run confined``) it enters a nested Landlock domain, so it
  cannot trace, signal or connect to the warm process or the reapers (outside that domain).
  Then it waits on the channel for the program (``comm`` ``dsh-code-ready``: the host makes
  the session's next run ready once the current one has ended), runs it (``dsh-code-run``), sends
  ``done`` and exits (``_child.main``).

Isolation between runs: each run is a fresh fork of a process that never ran a program, and
the warm process is not dumpable (no ``ptrace``/``/proc/<pid>/mem`` for a process without
CAP_SYS_PTRACE, which confinement drops) — so no Python state, descriptor, thread or process
of one run reaches the warm process or the next run. What a run writes to the filesystem it
may write to (the workspace, the temporary directory) is shared, as it is for ``bash``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import os
import signal
import socket
import sys
from typing import NoReturn

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_MSG = 4096

PR_SET_DUMPABLE = 4
PR_SET_NAME = 15
PR_SET_NO_NEW_PRIVS = 38

# Landlock (linux/landlock.h): the same syscall numbers on every architecture. A nested domain
# needs one handled right; making block devices is one no program needs.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_ACCESS_FS_MAKE_BLOCK = 1 << 11
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1
LANDLOCK_SCOPE_SIGNAL = 2
SCOPE_ABI = 6
EXIT_SETUP_FAILED = 125

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _set_name(name: bytes) -> None:
    """The process's ``comm`` (what ``ps`` and /proc/PID/comm show); cosmetic, never fatal."""
    _libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def landlock_abi() -> int:
    r = _libc.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                      ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    abi = int(r) if r > 0 else 0
    cap = os.environ.get("DSH_LANDLOCK_MAX_ABI", "")  # the sandbox's own test knob: behave as on an older kernel
    return min(abi, int(cap)) if cap.isdigit() else abi


def nest() -> bool:
    """Enter a nested Landlock domain (scoped: no signals or abstract sockets out of it, on ABI 6+).
    False when the kernel has no Landlock; OSError when it has and the domain could not be entered."""
    abi = landlock_abi()
    if abi <= 0:
        return False
    attr = _RulesetAttr(LANDLOCK_ACCESS_FS_MAKE_BLOCK, 0,
                        LANDLOCK_SCOPE_SIGNAL | LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET if abi >= SCOPE_ABI else 0)
    size = ctypes.sizeof(attr) if abi >= SCOPE_ABI else 8  # older kernels know only the first field
    fd = _libc.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                       ctypes.c_uint32(0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        if _libc.syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(fd)
    return True


def _load(name: str, path: str):  # dsh_core/reaping.py by path (-I -S: outside any package); it loads the rest
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


# ------------------------------------------------------------------ the program process


def _fail(out: int, message: str) -> NoReturn:
    with contextlib.suppress(OSError):
        os.write(out, f"code-mode: {message}\n".encode())
    os._exit(EXIT_SETUP_FAILED)


def program(child, channel: int, out: int, cgroup: int | None, call: int, confined: bool) -> None:
    if cgroup is not None:
        try:
            os.write(cgroup, b"0")  # its ``tasks``, "0": this thread, the only one; nothing of the run has forked yet
        except OSError as exc:
            _fail(out, f"cannot join the run's process cgroup ({exc.strerror}); the program was not run")
        os.close(cgroup)
    os.close(call)  # the reaper's lifeline, not the program's
    os.setsid()
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    os.closerange(3, channel)
    open_max = os.sysconf("SC_OPEN_MAX")
    os.closerange(channel + 1, open_max if open_max > 0 else 65536)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if confined:
        try:
            nest()
        except OSError as exc:
            _fail(1, f"cannot isolate the run from the warm runtime ({exc}); the program was not run")
    child.batch()  # (see there: a ready run's wake-ups never take the host's CPU mid-way)
    _set_name(b"dsh-code-ready")  # a run made ready, waiting for its program
    sys.argv = [os.path.join(HERE, "_child.py"), str(channel)]
    try:
        child.main(channel, on_run=_running)  # ends the process once it has answered
    finally:
        os._exit(EXIT_SETUP_FAILED)  # only if it could not (a run message it could not read)


def _running() -> None:
    """The program has come: from now on this process is as inspectable as a fresh one would be.
    While it waited it stayed non-dumpable (inherited from the warm process), so the run before
    it could not reach it even where Landlock cannot nest; that run is gone by now."""
    _set_name(b"dsh-code-run")
    _prctl(PR_SET_DUMPABLE, 1)


# ------------------------------------------------------------------ the reaper


def reaper(reaping, child, fds: list[int], confined: bool) -> None:
    """The run's reaper (``dsh_core/reaping.py``): fork the program process, wait until it exits
    or the host says kill (or goes away), then kill and reap everything of the run and report."""
    call_fd, channel, out, *rest = fds
    cgroup = rest[0] if rest else None
    reaping.become_subreaper()
    _set_name(b"dsh-code-reaper")
    call = socket.socket(fileno=call_fd)
    pid = os.fork()
    if pid == 0:
        try:
            program(child, channel, out, cgroup, call_fd, confined)
        finally:
            os._exit(EXIT_SETUP_FAILED)
    for fd in (channel, out, cgroup):
        if fd is not None:
            os.close(fd)
    reaping.finish(pid, call)  # "kill" (or anything) on the call socket: the run ends now


# ------------------------------------------------------------------ the warm process


def main(reaping_path: str) -> None:
    control = socket.socket(fileno=os.dup(0))  # the control socket came as stdin
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    _prctl(PR_SET_DUMPABLE, 0)  # runs, forked from here, cannot trace or read this process
    _set_name(b"dsh-code-warm")
    reaping = _load("dsh_reaping", reaping_path)  # dsh_core/reaping.py: how a run ends
    child = reaping.load("dsh_code_child", os.path.join(HERE, "_child.py"))
    import asyncio  # loaded once here: a program using it skips its import (60-100 ms)
    import asyncio.unix_events  # noqa: F401
    import traceback  # noqa: F401 - a failing program's report

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # reapers are reaped by the kernel
    # Everything loaded so far is left out of the garbage collector's walks, here and in every
    # fork: a collection in a run would otherwise write to each of these objects' headers, a
    # page fault and a copy per page (the program process's CPU from the run message to done,
    # 100 gathered reads: about 0.15 ms less, schedstat, medians of 9 alternating twice).
    gc.collect()
    gc.freeze()
    control.send(b"ready")
    # a reaper forked for each run (``reaping.serve``; the run itself is made ready in advance)
    reaping.serve(control, (b"run", b"run confined"), (3, 4),
                  lambda word, fds: reaper(reaping, child, fds, word == b"run confined"), prefork=False)


if __name__ == "__main__":
    main(sys.argv[1])
