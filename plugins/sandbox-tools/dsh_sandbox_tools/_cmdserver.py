"""The confined command server: one per session, started once inside the sandbox, forks each command.

Run as a standalone script (stdlib + ctypes only), already inside bubblewrap or with Landlock
applied by itself before it accepts work::

    python3 -I -S _cmdserver.py --reaping PATH [--landlock --rw DIR … --rw-file FILE … --hide DIR …] CONTROL_FD

Confinement is inherited by everything it forks, so a command costs a fork and an exec instead
of a new bubblewrap or Python launcher (about 1 ms instead of 12–35 ms).

Protocol (``AF_UNIX``/``SOCK_SEQPACKET``, one message per datagram):

- control socket, server → harness: ``ready`` once confined (or ``error <text>``, then exit);
- harness → server: ``run`` with three to five descriptors: a memfd holding the JSON request
  (``argv``, ``cwd``, ``env`` — absent when it is the server's own, the environment it was
  started with —, and the flags ``stderr``/``stdin``), the write end of the output
  pipe, the call socket, then the write end of a separate stderr pipe when ``stderr`` is set
  and the read end of a stdin pipe when ``stdin`` is set (hooks read a payload on stdin and
  answer on stdout, apart from stderr);
- call socket, reaper → harness: ``exit <code>`` (negative: killed by that signal), sent only
  after *every* process of the call is dead and reaped;
- harness → reaper: ``term`` (SIGTERM to the command's group and orphans) or ``kill``
  (SIGKILL everything). End-of-file on the call socket — the harness closed it, was cancelled
  mid-spawn, or died — means ``kill``: a call can never outlive the one who asked for it.

Each call runs in a *reaper*, a fork of the server made in advance that serves call after
call (``reaping.serve``: a fork, and its copy-on-write faults, are on no call's path; another
is forked only while every reaper is busy) and is a child subreaper
(``PR_SET_CHILD_SUBREAPER``, ``dsh_core/reaping.py``, loaded by the path ``--reaping`` gives;
the host's side is ``dsh_core/warmserver.py``): every process the command leaves behind, even
one that called ``setsid`` or double-forked, is re-parented to the reaper, which kills and
reaps them all before it answers ``exit``. End-of-file on the control socket ends the server.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import signal
import socket
import sys
from collections.abc import Mapping

MAX_MSG = 4096


def _resolve(argv0: str, env: Mapping[str, str]) -> str:
    if "/" in argv0:
        return argv0
    for d in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":"):
        p = os.path.join(d or ".", argv0)
        if os.access(p, os.X_OK) and not os.path.isdir(p):
            return p
    return argv0


_DEFAULT_SIGNALS = [s for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM,
                                signal.SIGHUP, signal.SIGQUIT) if s is not None]


def _reaper(reaping, request: dict, owned: list[int], out_fd: int, call: socket.socket, err_fd: int | None = None,
            in_fd: int | None = None) -> None:
    """One call, in a reaper (a subreaper already): spawn the command, relay "term", kill and
    reap everything, report. ``owned``: the call's descriptors still open (closed as they go)."""
    leader, leader_status = _spawn(request, out_fd, err_fd, in_fd)
    if in_fd is not None:
        _close(owned, in_fd)

    def on_message(msg: bytes) -> bool:  # "term": SIGTERM and keep watching; anything else: kill
        if msg == b"term":
            reaping.terminate(leader)
            return False
        return True

    # Nothing of the call outlives it: the group (while the zombie leader holds its id), then every
    # process re-parented to this subreaper, until none is left. The output pipes are closed only
    # after the report: the harness sees their end-of-file with the "exit", in one wake-up.
    reaping.finish(leader, call, on_message, leader_status)


def _close(owned: list[int], fd: int) -> None:
    owned.remove(fd)
    os.close(fd)


def _spawn(request: dict, out_fd: int, err_fd: int | None = None, in_fd: int | None = None) -> tuple[int, int | None]:
    """The command's group leader (0 when it could not start) and, when it could not, the wait
    status the shell would report (127 not found, 126 not runnable)."""
    argv = [str(a) for a in request["argv"]]
    given = request.get("env")  # absent: the server's own environment (what it was started with)
    env = os.environ if given is None else {str(k): str(v) for k, v in given.items()}
    try:
        os.chdir(request["cwd"])
        source = in_fd if in_fd is not None else _null()
        leader = os.posix_spawn(
            _resolve(argv[0], env), argv, env,
            file_actions=[(os.POSIX_SPAWN_DUP2, source, 0), (os.POSIX_SPAWN_DUP2, out_fd, 1),
                          (os.POSIX_SPAWN_DUP2, err_fd if err_fd is not None else out_fd, 2)],
            setsid=True, setsigdef=_DEFAULT_SIGNALS, setsigmask=[],
        )
    except OSError as exc:
        os.write(out_fd, f"dsh-sandbox: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        return 0, (127 if isinstance(exc, FileNotFoundError) else 126) << 8
    return leader, None


_NULL: list[int] = []


def _null() -> int:
    """/dev/null for a command's stdin, opened once per reaper."""
    if not _NULL:
        _NULL.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
    return _NULL[0]


def _prepare(reaping) -> None:
    """A reaper, before its first call: what every call needs."""
    gc.disable()  # collections would copy the pages of every object shared with the server
    reaping.become_subreaper()  # harmless while it has no child
    _null()


def _call(reaping, fds: list[int]) -> None:
    """One taken request: read it, check it, run it; every descriptor of it is closed after, or
    at once when the request is bad (the harness then sees the call as lost: no "exit")."""
    owned = list(fds)
    memfd, out_fd, call_fd, *extra = fds
    call = socket.socket(fileno=call_fd)
    owned.remove(call_fd)
    try:
        raw = b""
        os.lseek(memfd, 0, os.SEEK_SET)
        while chunk := os.read(memfd, 1 << 20):
            raw += chunk
        _close(owned, memfd)
        request = json.loads(raw)
        err_fd = extra.pop(0) if request.get("stderr") and extra else None
        in_fd = extra.pop(0) if request.get("stdin") and extra else None
        if extra or (request.get("stderr") and err_fd is None) or (request.get("stdin") and in_fd is None):
            return  # descriptors and flags disagree: lose the call rather than guess
        _reaper(reaping, request, owned, out_fd, call, err_fd, in_fd)
    except (OSError, ValueError):
        return
    finally:
        call.close()
        for fd in owned:
            os.close(fd)


def _load(name: str, path: str):  # dsh_core/reaping.py by path (-I -S: outside any package); it loads the rest
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def main(argv: list[str]) -> None:
    rw_dirs: list[str] = []
    rw_files: list[str] = []
    hidden: list[str] = []
    landlock = False
    reaping_path = ""
    i = 0
    while i < len(argv) - 1:
        if argv[i] == "--landlock":
            landlock = True
            i += 1
        elif argv[i] in ("--rw", "--rw-file", "--hide", "--reaping") and i + 2 < len(argv):
            if argv[i] == "--reaping":
                reaping_path = argv[i + 1]
            else:
                {"--rw": rw_dirs, "--rw-file": rw_files, "--hide": hidden}[argv[i]].append(argv[i + 1])
            i += 2
        else:
            break
    control = socket.socket(fileno=int(argv[-1]))
    os.set_inheritable(control.fileno(), False)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # reapers are reaped by the kernel
    try:
        reaping = _load("dsh_reaping", reaping_path)  # dsh_core/reaping.py: how a call ends
    except (OSError, ImportError) as exc:
        control.send(f"error cannot load the reaper ({reaping_path!r}): {exc}".encode()[:MAX_MSG])
        return
    if landlock:
        landlock_exec = reaping.load("dsh_landlock_exec",
                              os.path.join(os.path.dirname(os.path.abspath(__file__)), "_landlock_exec.py"))
        try:
            landlock_exec.restrict(rw_dirs, rw_files, fatal=False, hidden=hidden)
        except OSError as exc:
            control.send(f"error {exc}".encode()[:MAX_MSG])
            return
    control.send(b"ready")
    reaping.serve(control, (b"run",), (3, 5), lambda _word, fds: _call(reaping, fds), prepare=lambda: _prepare(reaping))


if __name__ == "__main__":
    main(sys.argv[1:])
