"""The driver: hand tasks to an executor (the local pool or Ray actors), retry what is
retryable, write every final result to --out, and stop cleanly on Ctrl-C.

The driver alone writes the results file, whichever engine runs the tasks. ``concurrency``
workers each take the next task, wait for its outcome and append it (one ``write`` per
line), so at any moment at most ``concurrency`` tasks are unrecorded — that is all kill -9
of the batch can lose.

Signals: the first SIGINT (or SIGTERM) stops taking new tasks and interrupts the ones in
flight (``session/cancel``; they are recorded ``interrupted``); a second SIGINT kills the
agent processes at once. Either way the run ends with exit status 130.
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from .records import ErrorInfo, Result, ResultsFile, Task


class Executor(Protocol):
    async def execute(self, task: Task, attempt: int, retried: list[ErrorInfo]) -> Any:
        """-> an object with ``result: Result``, ``retryable: bool`` and ``fatal: bool`` (no task of
        this run can start: the engine stops dispatching)."""

    def interrupt(self) -> None: ...

    async def kill(self) -> None: ...


@dataclass
class Stats:
    total: int = 0  # tasks this run set out to do
    skipped: int = 0  # already done in --out
    ok: int = 0
    failed: int = 0
    interrupted: int = 0
    retries: int = 0
    running: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    interrupted_by: str | None = None
    cannot_start: str | None = None  # why no agent can start: the run stopped dispatching
    failures: dict[str, int] = field(default_factory=dict)  # error class → count

    @property
    def finished(self) -> int:
        return self.ok + self.failed + self.interrupted

    @property
    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def record(self, result: Result) -> None:
        if result.status == "ok":
            self.ok += 1
        elif result.status == "failed":
            self.failed += 1
            cls = result.error.cls if result.error is not None else "failed"
            self.failures[cls] = self.failures.get(cls, 0) + 1
        else:
            self.interrupted += 1
        if result.usage:
            self.tokens += result.usage.get("inputTokens", 0) + result.usage.get("outputTokens", 0)


class Listener(Protocol):
    def update(self, stats: Stats) -> None: ...

    def note(self, message: str) -> None: ...


async def drive(
    tasks: list[Task],
    executor: Executor,
    results: ResultsFile,
    stats: Stats,
    listener: Listener,
    *,
    concurrency: int,
    retries: int,
) -> None:
    stats.started = time.monotonic()  # the rate counts task time, not engine start-up (Ray: seconds)
    send, receive = anyio.create_memory_object_stream[tuple[Task, int, list[ErrorInfo]]](math.inf)
    for task in tasks:
        send.send_nowait((task, 1, []))
    remaining = len(tasks)
    stopping = False
    if remaining == 0:
        send.close()

    async def worker() -> None:
        nonlocal remaining, stopping
        async for task, attempt, retried in receive:
            if stopping:
                break
            stats.running += 1
            listener.update(stats)
            try:
                outcome = await executor.execute(task, attempt, retried)
            finally:
                stats.running -= 1
            result: Result = outcome.result
            if outcome.fatal and not stopping and result.error is not None:
                stopping = True  # every other task would fail the same way: say it once and stop
                stats.cannot_start = result.error.message
                listener.note(f"no agent can start, so the batch stops (a re-run does the tasks not started): "
                              f"{result.error.message}")
                send.close()
            if outcome.retryable and attempt <= retries and not stopping and result.error is not None:
                stats.retries += 1
                listener.note(f"task {task.id!r}: {result.error.cls}: {result.error.message}; retrying on a fresh agent")
                send.send_nowait((task, attempt + 1, [*retried, result.error]))
                continue
            results.append(result)
            stats.record(result)
            remaining -= 1
            listener.update(stats)
            if remaining == 0:
                send.close()

    async def watch_signals(scope: anyio.CancelScope) -> None:
        nonlocal stopping
        seen = 0
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                seen += 1
                if seen == 1:
                    stopping = True
                    stats.interrupted_by = signal.Signals(signum).name
                    listener.note(
                        f"{signal.Signals(signum).name}: cancelling {stats.running} task(s) in flight"
                        " (Ctrl-C again to kill the agents)"
                    )
                    executor.interrupt()
                    send.close()
                else:
                    listener.note("killing the agents")
                    await executor.kill()

    async with anyio.create_task_group() as outer:
        outer.start_soon(watch_signals, outer.cancel_scope)
        await anyio.sleep(0)  # the signal receiver is installed before any agent is spawned
        async with anyio.create_task_group() as tg:
            for _ in range(max(1, min(concurrency, len(tasks)))):
                tg.start_soon(worker)
        outer.cancel_scope.cancel()
    stats.ended = time.monotonic()
