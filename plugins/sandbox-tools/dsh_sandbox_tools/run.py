"""Run one command in its own process group: bounded output with a spill file, timeout, kill on cancel."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc

from dsh_core.spill import Sink as _Sink  # the spine's one spill mechanism (streaming form)
from dsh_core.spill import spill_file_for, spill_path_for  # noqa: F401  (re-exported for the tools)

TERM_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this long
DRAIN_GRACE_S = 0.5  # after the command exits, how long output from stragglers may still arrive


@dataclass
class CommandResult:
    exit_code: int | None  # None when killed by us (timeout)
    signal: int | None
    timed_out: bool
    text: str  # bounded: the whole output, or head + marker + tail (stdout only when captured apart)
    total_bytes: int
    spill_path: Path | None
    stderr: str | None = None  # captured apart: its first ``limit`` bytes (``capture``), or bounded as ``text`` (``split``)
    stderr_spill_path: Path | None = None  # ``split``: the file with the whole stderr when it was too long
    stopped: bool = False  # ended because its ``stop`` event was set (a background job's kill)


class HeadSink:
    """Keeps the first ``limit`` bytes and counts the rest (a hook's stdout or stderr: parsed, not shown)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.total = 0
        self.file = None

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]

    def close(self) -> None:
        pass

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace")


async def feed_stdin(stream: anyio.abc.ByteSendStream | None, data: bytes) -> None:
    """Write ``data`` to a command's stdin and close it; a command that does not read it is fine."""
    if stream is None:
        return
    try:
        await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
    finally:
        with anyio.CancelScope(shield=True):
            await stream.aclose()


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
    argv: list[str], *, cwd: str, env: dict[str, str], timeout_s: float, limit: int, spill: Path | str,
    stdin: bytes | None = None, capture: bool = False, split: bool = False, tap: Callable[[bytes], None] | None = None,
) -> CommandResult:
    """``capture``: stdout and stderr apart, each its first ``limit`` bytes (no spill); ``split``:
    stdout and stderr apart, each bounded head+tail with its own spill file (``stderr_spill``);
    ``stdin``: bytes written to the command's stdin (else /dev/null); ``tap``: also sees every
    chunk of output (stdout and stderr as they arrive), for a live view of the running command."""
    sink: _Sink | HeadSink = HeadSink(limit) if capture else _Sink(limit, spill)
    err_sink: _Sink | HeadSink | None = HeadSink(limit) if capture else _Sink(limit, stderr_spill(spill)) if split else None
    # Shielded: a cancel that lands while the process is being spawned must not lose the handle
    # (asyncio would SIGKILL only the leader, leaving what it already forked running). The
    # cancel is seen at the first checkpoint inside the try below, whose finally kills the group.
    with anyio.CancelScope(shield=True):
        proc = await anyio.open_process(
            argv, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if capture or split else subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True,
        )
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    timed_out = False
    drained = anyio.Event()

    async def drain(stream: anyio.abc.ByteReceiveStream | None, into: _Sink | HeadSink) -> None:
        if stream is None:
            return
        try:
            async for chunk in stream:
                into.feed(chunk)
                if tap is not None:
                    tap(chunk)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    async def reader() -> None:
        try:
            async with anyio.create_task_group() as both:
                both.start_soon(drain, proc.stdout, sink)
                if err_sink is not None:
                    both.start_soon(drain, proc.stderr, err_sink)
        finally:
            drained.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            if stdin is not None:
                tg.start_soon(feed_stdin, proc.stdin, stdin)
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
            if err_sink is not None:
                err_sink.close()
    rc = proc.returncode
    sig = -rc if rc is not None and rc < 0 else None
    return CommandResult(
        exit_code=None if timed_out else rc,
        signal=sig,
        timed_out=timed_out,
        text=sink.text(),
        total_bytes=sink.total,
        spill_path=Path(spill) if sink.file is not None else None,
        stderr=err_sink.text() if err_sink is not None else None,
        stderr_spill_path=Path(stderr_spill(spill)) if getattr(err_sink, "file", None) is not None else None,
    )


def stderr_spill(spill: Path | str) -> str:
    """Where a ``split`` call's too-long stderr goes: beside its stdout's spill file
    (``<name>.stderr``; a string: the sink makes it a Path only if it spills, and a Path is ~30
    Python calls on every bash call's path)."""
    return f"{spill}.stderr"
