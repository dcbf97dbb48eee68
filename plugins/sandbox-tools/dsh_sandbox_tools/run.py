"""Run one command in its own process group: bounded output with a spill file, timeout, kill on cancel."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import anyio

from dsh_core.spill import Sink as _Sink  # the spine's one spill mechanism (streaming form)
from dsh_core.spill import spill_path_for  # noqa: F401  (re-exported for the tools)

TERM_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this long
DRAIN_GRACE_S = 0.5  # after the command exits, how long output from stragglers may still arrive


@dataclass
class CommandResult:
    exit_code: int | None  # None when killed by us (timeout)
    signal: int | None
    timed_out: bool
    text: str  # bounded: the whole output, or head + marker + tail
    total_bytes: int
    spill_path: Path | None


def killpg(pgid: int, sig: int) -> None:
    """Signal a process group; one that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def kill_group(proc: anyio.abc.Process, pgid: int) -> None:
    """SIGTERM the whole group, wait a little, then SIGKILL it (grandchildren included)."""
    killpg(pgid, signal.SIGTERM)
    with anyio.move_on_after(TERM_GRACE_S):
        await proc.wait()
    killpg(pgid, signal.SIGKILL)
    with anyio.move_on_after(TERM_GRACE_S):
        await proc.wait()


async def run_command(
    argv: list[str], *, cwd: str, env: dict[str, str], timeout_s: float, limit: int, spill: Path
) -> CommandResult:
    sink = _Sink(limit, spill)
    # Shielded: a cancel that lands while the process is being spawned must not lose the handle
    # (asyncio would SIGKILL only the leader, leaving what it already forked running). The
    # cancel is seen at the first checkpoint inside the try below, whose finally kills the group.
    with anyio.CancelScope(shield=True):
        proc = await anyio.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=cwd, env=env, start_new_session=True,
        )
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    timed_out = False
    drained = anyio.Event()

    async def reader() -> None:
        assert proc.stdout is not None
        try:
            async for chunk in proc.stdout:
                sink.feed(chunk)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            drained.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            with anyio.move_on_after(timeout_s) as deadline:
                await proc.wait()
            if deadline.cancelled_caught:
                timed_out = True
                with anyio.CancelScope(shield=True):
                    await kill_group(proc, pgid)
            # Nothing outlives the call: background jobs of the command die with it.
            killpg(pgid, signal.SIGKILL)
            with anyio.move_on_after(DRAIN_GRACE_S):
                await drained.wait()
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                await kill_group(proc, pgid)
            killpg(pgid, signal.SIGKILL)
            await proc.aclose()
            sink.close()
    rc = proc.returncode
    sig = -rc if rc is not None and rc < 0 else None
    return CommandResult(
        exit_code=None if timed_out else rc,
        signal=sig,
        timed_out=timed_out,
        text=sink.text(),
        total_bytes=sink.total,
        spill_path=spill if sink.file is not None else None,
    )
