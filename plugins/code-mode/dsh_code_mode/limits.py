"""Budgets of one program run, and the bound on how many processes it may have at once."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one ``run_code`` program may use (``[config.code-mode]`` keys in brackets)."""

    compute_seconds: int = 60  # CPU time of the program's process (compute-seconds)
    wall_seconds: float = 600.0  # from start to finish (wall-seconds)
    max_output_bytes: int = 1 * MiB  # captured stdout+stderr (max-output-bytes)
    max_value_bytes: int = 1 * MiB  # the return value, as JSON (max-value-bytes)
    max_message_bytes: int = 16 * MiB  # one channel message: a call's arguments, a reply
    address_space_bytes: int = 1024 * MiB  # RLIMIT_AS of the program's process (address-space-bytes)
    max_processes: int = 64  # processes/threads at once (max-processes)
    max_calls: int = 10_000  # tool calls per run (max-calls)
    max_pending_calls: int = 256  # tool calls waiting or running at once
    # Bytes the host holds for a run at once: arguments of calls not yet answered plus replies not
    # yet written. Past it the host stops reading the program's channel until they drain, so a
    # program cannot make dsh hold 256 x 16 MiB (measured: 100 raw 15 MB calls grew dsh by 678 MiB
    # before this bound; tests/security/test_code_memory.py).
    max_outstanding_bytes: int = 64 * MiB
    network: bool = True  # False: the program's processes cannot open internet sockets (workflow scripts)


PIDS_V1 = Path("/sys/fs/cgroup/pids")


class ProcessBound:
    """Keeps a fork bomb from taking the machine.

    RLIMIT_NPROC does not bind root (the kernel exempts it), so as root a run gets its own
    ``pids`` cgroup (``pids.max``), joined by the run's first process before it runs anything; the cgroup also lets us
    kill every process of the run, daemons that left the process group included. As another
    user, RLIMIT_NPROC is set in the program's process: the user's current process count plus
    the budget. ``kind`` says which bound applies ("pids-cgroup", "rlimit-nproc", or "none").
    """

    def __init__(self, kind: str, *, nproc: int = 0, cgroup: Path | None = None) -> None:
        self.kind = kind
        self.nproc = nproc
        self.cgroup = cgroup

    @classmethod
    def create(cls, max_processes: int) -> ProcessBound:
        if os.geteuid() != 0:
            return cls("rlimit-nproc", nproc=_user_process_count(os.getuid()) + max_processes)
        if os.access(PIDS_V1, os.W_OK) and (PIDS_V1 / "cgroup.procs").exists():
            sweep_stale(PIDS_V1)
            path = PIDS_V1 / f"dsh-code-{os.getpid()}-{secrets.token_hex(4)}"
            try:
                path.mkdir()
                (path / "pids.max").write_text(str(max_processes))
                return cls("pids-cgroup", cgroup=path)
            except OSError:
                _rmdir(path)
        return cls("none")

    def join_fd(self) -> int:
        """The cgroup's ``tasks`` opened for writing (-1 without a cgroup): the run's first
        process writes "0" to it before anything of the run starts, so nothing forks outside.

        ``tasks``, not ``cgroup.procs``: that process is a fresh fork (one thread), so moving
        the thread moves the process, and the kernel moves the calling thread without taking
        the global thread-group lock for writing. Through ``cgroup.procs`` it takes it, and when
        nobody had for a while that waits for an RCU grace period: 5-20 ms here against
        0.02-0.05 ms (a forked child writing "0" after 50 or 200 ms idle, six times each), which
        was most of the 15-25 ms a run took to be made ready."""
        if self.cgroup is None:
            return -1
        return os.open(self.cgroup / "tasks", os.O_WRONLY | os.O_CLOEXEC)

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup until it is empty (bounded effort)."""
        if self.cgroup is None:
            return
        procs = self.cgroup / "cgroup.procs"
        for _ in range(200):
            try:
                pids = [int(p) for p in procs.read_text().split()]
            except (OSError, ValueError):
                return
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def members(self) -> list[int] | None:
        """The pids in the cgroup now (None without one, or when it cannot be read)."""
        if self.cgroup is None:
            return None
        try:
            return [int(p) for p in _read(f"{self.cgroup}/cgroup.procs").split()]
        except (OSError, ValueError):
            return None

    def settled(self) -> bool | None:
        """Whether nothing of the run can run again: every thread in the cgroup (its ``tasks``) is
        gone or exiting (PF_EXITING: inside the kernel's exit, never to return to its own code);
        None without a cgroup, or when it cannot be read. A thread cloned by one that exits is
        listed before its parent can begin to exit: so the list is read again once all were seen
        exiting, and must hold no other thread. (Waiting until they are gone too, the cgroup
        listed a program that ended itself 0.3-0.5 ms longer, while the kernel tore its memory
        down: most of a run's way from ``done`` to its result.) What a process left in flight
        in the kernel (an asynchronous write) may still complete as its exit winds it down."""
        if self.cgroup is None:
            return None
        tasks = f"{self.cgroup}/tasks"
        try:
            seen = set(_read(tasks).split())
            if not all(_exiting(int(tid)) for tid in seen):
                return False
            return set(_read(tasks).split()) <= seen
        except (OSError, ValueError):
            return None

    def kill_members(self, pids: list[int]) -> list[int]:
        """SIGKILL each of ``pids`` that is still in the cgroup, through a pidfd (it pins the
        process: a pid freed and reused meanwhile is never signalled); returns the pidfds, each
        readable once its process has exited (the caller closes them)."""
        assert self.cgroup is not None
        mine = f"/{self.cgroup.name}"
        fds: list[int] = []
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # gone already
                continue
            try:
                ours = any(line.split(":", 2)[1:2] == ["pids"] and line.endswith(mine)
                           for line in _read(f"/proc/{pid}/cgroup").decode().splitlines())
                if ours:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:  # exited meanwhile (its pidfd is readable then)
                ours = True
            if ours:
                fds.append(fd)
            else:
                os.close(fd)
        return fds

    def close(self) -> None:
        if self.cgroup is not None:
            self.kill_all()
            _rmdir(self.cgroup)
            self.cgroup = None


def sweep_stale(root: Path) -> list[Path]:
    """Remove the cgroups of runs whose dsh is gone (killed before it could remove them): their
    leftover processes are killed first. Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(root.glob("dsh-code-*-*"))
    except OSError:
        return removed
    for path in entries:
        try:
            owner = int(path.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if owner == os.getpid() or os.path.exists(f"/proc/{owner}"):
            continue
        stale = ProcessBound("pids-cgroup", cgroup=path)
        stale.close()
        if not path.exists():
            removed.append(path)
    return removed


def _read(path: str) -> bytes:
    """A small kernel file whole, in three system calls: ``settled`` runs on every run's way to
    its result (through pathlib and a text file object, 9 and 7 us; 2.5 and 2.7 us this way). A
    read that did not fill the buffer was the last: these files are made by the kernel's
    seq_file, which fills a read as far as the file goes (a cgroup of many processes takes more
    than one)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = more = os.read(fd, _CHUNK)
        while len(more) == _CHUNK:
            more = os.read(fd, _CHUNK)
            data += more
        return data
    finally:
        os.close(fd)


_CHUNK = 1 << 16


PF_EXITING = 0x4  # include/linux/sched.h: the task is inside do_exit()


def _exiting(tid: int) -> bool:
    """Whether thread ``tid`` is gone or exiting (the flags of /proc/TID/stat)."""
    try:
        stat = _read(f"/proc/{tid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        return True
    fields = stat[stat.rindex(b")") + 2:].split()  # after the name, which may hold anything
    return bool(int(fields[6]) & PF_EXITING)


def _rmdir(path: Path) -> None:
    for _ in range(100):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # the last tasks are still being reaped


def _user_process_count(uid: int) -> int:
    n = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n
