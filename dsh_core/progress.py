"""A running command's output shown while it runs (``ToolContext.progress``), bounded in size and
rate: the tail of what it printed so far (its last ``TAIL_LINES`` lines, at most ``TAIL_BYTES``
bytes), sent at most once per ``EVERY_S`` seconds and only when it changed.

A tool wraps the run of its command in ``output_progress(ctx)`` and feeds every chunk of output
it reads to the callable it gets; with nobody watching (``ctx.shows_progress`` false: no front
door shows progress, e.g. acp-agent) it gets None and nothing is gathered or started.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:  # pragma: no cover
    from .protocols import ToolContext

TAIL_LINES = 40
TAIL_BYTES = 4096
EVERY_S = 0.25


class OutputTail:
    """The last lines of a byte stream: keeps at most ``2 * size`` bytes, whatever was fed."""

    def __init__(self, lines: int = TAIL_LINES, size: int = TAIL_BYTES) -> None:
        self.lines, self.size = lines, size
        self._kept = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._kept += chunk[-2 * self.size:]
        if len(self._kept) > 2 * self.size:
            del self._kept[:-2 * self.size]

    def text(self) -> str:
        """The tail as a terminal would leave it: the last ``lines`` lines of the last ``size``
        bytes, each line what follows its last carriage return (a progress bar's latest state),
        no partial character at the cut."""
        data = bytes(self._kept[-self.size:])
        cut = len(self._kept) > self.size or self.total > len(self._kept)
        if cut:
            start = 0
            while start < min(3, len(data)) and 0x80 <= data[start] < 0xC0:  # a character cut in two
                start += 1
            data = data[start:]
        lines = data.decode("utf-8", errors="replace").split("\n")
        lines = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines]
        if cut and len(lines) > 1:
            lines = lines[1:]  # the first line is cut: show whole lines only
        return "\n".join(lines[-self.lines:])


@asynccontextmanager
async def output_progress(ctx: ToolContext, *, every: float = EVERY_S,
                          lines: int = TAIL_LINES, size: int = TAIL_BYTES) -> AsyncIterator[Callable[[bytes], None] | None]:
    """Yield ``feed(chunk)`` for a command's output while it runs, or None when nobody watches.

    The first output is shown at once, then at most one update per ``every`` seconds, each the
    tail so far and only when it differs from the last one sent (output that stops mid-interval
    is still shown when the interval ends). Nothing is sent after the block ends: the call's
    result replaces the progress."""
    if not ctx.shows_progress:
        yield None
        return
    tail = OutputTail(lines, size)
    changed = anyio.Event()
    ended = False

    def feed(chunk: bytes) -> None:
        if chunk:
            tail.feed(chunk)
            changed.set()

    async def pump() -> None:
        nonlocal changed
        sent = ""
        while True:
            await changed.wait()
            changed = anyio.Event()
            if ended:  # woken just before the block ended: the result comes next
                return
            text = tail.text()
            if text != sent and text.strip():
                sent = text
                ctx.progress(text)
            await anyio.sleep(every)

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump)
        try:
            yield feed
        finally:
            ended = True
            tg.cancel_scope.cancel()
