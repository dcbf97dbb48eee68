"""Tool-call scheduling: calls start in submission order; parallel-safe ones overlap, exclusive ones run alone.

A tool declares ``ToolSpec.parallel_safe`` (reads, searches) or not (commands, writes: the
default). ``ToolScheduler.ticket(safe)`` reserves a place in line synchronously, so the order
is the caller's order whatever the task scheduler does; ``async with ticket:`` waits to be
admitted and releases on exit. A parallel-safe call is admitted when no exclusive call runs
and fewer than ``limit`` safe calls run; an exclusive call when nothing runs. Nobody overtakes
the head of the line, so an exclusive call is never starved and never overlaps anything.
Used by the agent loop for the calls of one assistant message and by code mode for a
program's calls.
"""

from __future__ import annotations

from collections import deque
from types import TracebackType

import anyio
import anyio.lowlevel


class Ticket:
    """One call's place in line. Enter once; cancellation while waiting gives the place up."""

    def __init__(self, scheduler: ToolScheduler, parallel_safe: bool) -> None:
        self._scheduler = scheduler
        self.parallel_safe = parallel_safe
        self._admitted = anyio.Event()
        self._released = False

    async def __aenter__(self) -> Ticket:
        try:
            if self._admitted.is_set():
                # Admitted at once (a burst of reads): no loop turn before the call runs, only the
                # check for a cancel. The wait's own yield cost every call a turn of the loop: 100
                # gathered reads in a program, 11.6 -> 10.7 ms of the host's CPU; 100 native reads
                # of one message, 10.00 -> 9.63 ms (bench/floor_code_mode.py turns, alternating).
                await anyio.lowlevel.checkpoint_if_cancelled()
            else:
                await self._admitted.wait()
        except BaseException:
            self._scheduler._leave(self)
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._scheduler._leave(self)


class ToolScheduler:
    """Admits calls in submission order; ``limit`` bounds overlapping parallel-safe calls (None: no bound)."""

    def __init__(self, limit: int | None = None) -> None:
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._line: deque[Ticket] = deque()
        self._safe_running = 0
        self._exclusive_running = False

    @property
    def running(self) -> int:
        return self._safe_running + int(self._exclusive_running)

    def ticket(self, parallel_safe: bool) -> Ticket:
        t = Ticket(self, parallel_safe)
        self._line.append(t)
        self._pump()
        return t

    def _pump(self) -> None:
        while self._line:
            head = self._line[0]
            if self._exclusive_running:
                return
            if head.parallel_safe:
                if self.limit is not None and self._safe_running >= self.limit:
                    return
                self._safe_running += 1
            else:
                if self._safe_running:
                    return
                self._exclusive_running = True
            self._line.popleft()
            head._admitted.set()

    def _leave(self, t: Ticket) -> None:
        if t._released:
            return
        t._released = True
        if t._admitted.is_set():
            if t.parallel_safe:
                self._safe_running -= 1
            else:
                self._exclusive_running = False
        else:
            self._line.remove(t)
        self._pump()
