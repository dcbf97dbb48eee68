"""A terminal's keeper: the process on the PTY that starts the (confined) shell and ends
everything it leaves behind. Standard library only; run as ``python -I -S _keeper.py``.

    _keeper.py --reaping <dsh_core/reaping.py> --lifeline <fd> -- <argv...>

It is the PTY's session leader and a child subreaper, so every process the shell starts,
setsid'd or double-forked, is re-parented to it. It forks ``argv`` and then waits until the
shell exits, the lifeline (a pipe whose other end only dsh holds) reaches end of file, or it is
sent SIGHUP/SIGTERM (the terminal's master closed, or dsh closing it): then it sends SIGTERM to
what is left, waits a little, kills and reaps every process, and exits with the shell's status
(by the same signal when the shell died of one). End of file on the lifeline is how the tree
ends when dsh is killed with SIGKILL.
"""

from __future__ import annotations

import importlib.util
import os
import select
import signal
import socket
import sys
import time

GRACE_S = 1.0  # after SIGTERM, how long the tree may take to end before SIGKILL


def _load(path: str):
    spec = importlib.util.spec_from_file_location("dsh_reaping", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ENDED_BY_US = (signal.SIGHUP, signal.SIGTERM)
IGNORED = (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def _spawn(command: list[str], keep_out: list[int]) -> int:
    """Fork ``command`` with the default signal dispositions and none of the keeper's own descriptors."""
    pid = os.fork()
    if pid:
        return pid
    try:
        for sig in (*ENDED_BY_US, *IGNORED):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        for fd in keep_out:
            os.close(fd)
        os.execvp(command[0], command)
    except OSError as exc:
        os.write(2, f"terminal: cannot start {command[0]}: {exc}\r\n".encode())
    os._exit(127)


def _end_tree(reaping, pid: int) -> int | None:  # reaping: dsh_core/reaping.py, loaded by path
    """SIGHUP (an interactive shell ignores SIGTERM; SIGHUP ends it and its jobs) and SIGTERM to
    the tree, then a grace period; the shell's wait status if it was reaped meanwhile."""
    status = None
    reaping.kill(pid, signal.SIGHUP)
    reaping.terminate(pid)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and reaping.children():
        try:
            done, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if done == pid:
            status = st
        if done == 0:
            time.sleep(0.01)
    return status


def _exit_as(status: int | None) -> int:
    """Exit the way the shell did: its code, or by the same signal."""
    if status is None:
        return 0
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.WEXITSTATUS(status)


def main(argv: list[str]) -> int:
    reaping = _load(argv[argv.index("--reaping") + 1])
    lifeline = int(argv[argv.index("--lifeline") + 1])
    command = argv[argv.index("--") + 1:]
    reaping.become_subreaper()
    wake_r, wake_w = socket.socketpair()
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    for sig in ENDED_BY_US:
        signal.signal(sig, lambda *_: None)
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    pid = _spawn(command, [lifeline, wake_r.fileno(), wake_w.fileno()])
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    for fd in (pidfd, lifeline, wake_r.fileno()):
        poller.register(fd, select.POLLIN)
    ready = {fd for fd, _ in poller.poll()}
    # the shell ended, or the lifeline closed (or spoke), or SIGHUP/SIGTERM arrived: end the tree
    status = None if pidfd in ready else _end_tree(reaping, pid)
    reaped = reaping.reap_all(pid)
    return _exit_as(reaped if reaped is not None else status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
