"""The client's child process and everything it starts: spawn, signal, wait, prove gone.

``spawn`` starts an agent in its own process session (so its own process group) with three
fresh pipes. ``ProcessTree.stop`` shuts it down in tiers: close its stdin and wait
``eof_grace`` for the whole tree to exit, then SIGTERM the tree, wait ``term_grace``, then
SIGKILL, and finally *proves* the tree is gone (no live process of its group or its
descendants in ``/proc``). Pids are tracked with their start time, so a reused pid is never
signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import anyio
import anyio.abc
import anyio.lowlevel

ExitStatus = Literal["eof", "sigterm", "sigkill"]


class SpawnError(OSError):
    """The command could not be started."""


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, starttime) from /proc/<pid>/stat, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return rest[0], int(rest[1]), int(rest[2]), int(rest[19])
    except (IndexError, ValueError):
        return None


def _all_pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def tree_pids(root: int, pgid: int | None = None) -> dict[int, int]:
    """Live (non-zombie) processes that are ``root``, in process group ``pgid`` (default
    ``root``), or descend from any of those: pid → start time (to survive pid reuse)."""
    pgid = root if pgid is None else pgid
    stats = {pid: s for pid in _all_pids() if (s := _stat(pid)) is not None}
    members = {pid for pid, s in stats.items() if pid == root or s[2] == pgid}
    changed = True
    while changed:
        changed = False
        for pid, s in stats.items():
            if pid not in members and s[1] in members:
                members.add(pid)
                changed = True
    return {pid: stats[pid][3] for pid in members if stats[pid][0] != "Z"}


def still_alive(tracked: Mapping[int, int]) -> dict[int, int]:
    """The tracked processes (pid → start time) that still run, not counting zombies."""
    out = {}
    for pid, start in tracked.items():
        s = _stat(pid)
        if s is not None and s[3] == start and s[0] != "Z":
            out[pid] = start
    return out


@dataclass
class Spawned:
    """A started child and our ends of its pipes (stdin write end, stdout and stderr read ends)."""

    process: anyio.abc.Process
    stdin: int
    stdout: int
    stderr: int


async def spawn(argv: Sequence[str], *, cwd: str, env: Mapping[str, str] | None) -> Spawned:
    """Start ``argv`` in ``cwd``, in its own session and process group. Raises ``SpawnError``."""
    await anyio.lowlevel.checkpoint_if_cancelled()  # already cancelled: spawn nothing
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        with anyio.CancelScope(shield=True):  # once spawned, the process is always ours to reap
            process = await anyio.open_process(
                list(argv),
                stdin=in_r,
                stdout=out_w,
                stderr=err_w,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
    except OSError as exc:
        for fd in (in_r, in_w, out_r, out_w, err_r, err_w):
            os.close(fd)
        raise SpawnError(exc.errno, exc.strerror or str(exc)) from None
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    return Spawned(process, in_w, out_r, err_r)


class SurvivorsError(Exception):
    """Processes of the tree are still alive after SIGKILL (``status``: how the shutdown ended)."""

    def __init__(self, message: str, status: ExitStatus) -> None:
        super().__init__(message)
        self.status = status


class ProcessTree:
    """A spawned leader (its own process group) and the processes it starts."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, tracked: Mapping[int, int], sig: int) -> None:
        """``sig`` to the leader's group and to every tracked process still alive."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)
        for pid in still_alive(tracked):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def kill_now(self) -> None:
        """SIGKILL the whole tree at once (escalates a shutdown in progress)."""
        if self.process.returncode is None:
            self.signal(tree_pids(self.pid), signal.SIGKILL)

    async def wait(self, tracked: dict[int, int], seconds: float) -> bool:
        """Poll until the leader and every tracked process exit, or ``seconds`` pass."""
        deadline = time.monotonic() + seconds
        while True:
            if self.process.returncode is None:
                tracked.update(tree_pids(self.pid))  # the tree may still grow
            if self.process.returncode is not None and not still_alive(tracked) and not tree_pids(self.pid):
                return True
            if time.monotonic() >= deadline:
                return False
            with anyio.move_on_after(0.05):
                await self.process.wait()
            if self.process.returncode is not None:
                await anyio.sleep(0.01)

    async def stop(
        self, close_stdin: Callable[[], None], *, eof_grace: float, term_grace: float, kill_now: bool = False
    ) -> ExitStatus:
        """Close stdin; wait ``eof_grace``; SIGTERM the tree; wait ``term_grace``; SIGKILL (at once
        with ``kill_now``). Shielded. Raises ``SurvivorsError`` if a process survives SIGKILL."""
        with anyio.CancelScope(shield=True):
            tracked = tree_pids(self.pid) if self.process.returncode is None else {}
            close_stdin()  # stdin EOF
            status: ExitStatus = "eof"
            if kill_now or not await self.wait(tracked, eof_grace):
                status = "sigterm"
                if not kill_now:
                    self.signal(tracked, signal.SIGTERM)
                if kill_now or not await self.wait(tracked, term_grace):
                    status = "sigkill"
                    self.signal(tracked, signal.SIGKILL)
                    await self.wait(tracked, 5.0)
            await self.process.wait()
            survivors = still_alive(tracked) or tree_pids(self.pid)
        if survivors:
            raise SurvivorsError(f"ACP child {self.pid}: processes survived SIGKILL: {sorted(survivors)}", status)
        return status
