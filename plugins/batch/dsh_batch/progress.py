"""Progress on stderr: a rich live bar on a terminal, plain periodic lines otherwise, and
a summary table at the end (``--json`` puts a summary object on stdout instead)."""

from __future__ import annotations

import sys
import time
from typing import Any

from .engine import Stats


def _rate(stats: Stats) -> float:
    return stats.finished / stats.elapsed if stats.elapsed > 0 else 0.0


def _eta(stats: Stats) -> str:
    rate = _rate(stats)
    left = stats.total - stats.finished
    if rate <= 0 or left <= 0:
        return "-"
    seconds = int(left / rate)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class LiveBar:
    """rich's Progress on stderr: done/total, failed, running, rate, ETA, tokens."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]dsh batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[red]{task.fields[failed]} failed[/] · {task.fields[running]} running"),
            TextColumn("· {task.fields[rate]:.1f}/s · ETA {task.fields[eta]} · {task.fields[tokens]:,} tokens"),
            TimeElapsedColumn(),
            console=self.console,
            refresh_per_second=8,
            transient=False,
        )
        self.task: Any = None

    def start(self, stats: Stats) -> None:
        self.task = self.progress.add_task("batch", total=stats.total, failed=0, running=0, rate=0.0, eta="-", tokens=0)
        self.progress.start()

    def update(self, stats: Stats) -> None:
        self.progress.update(
            self.task,
            completed=stats.finished,
            failed=stats.failed,
            running=stats.running,
            rate=_rate(stats),
            eta=_eta(stats),
            tokens=stats.tokens,
        )

    def note(self, message: str) -> None:
        self.progress.console.print(f"dsh batch: {message}", markup=False, highlight=False)

    async def tick(self, stats: Stats) -> None:
        import anyio

        while True:  # rate and ETA move even when no task finishes
            await anyio.sleep(0.5)
            self.update(stats)

    def stop(self, stats: Stats) -> None:
        self.update(stats)
        self.progress.stop()


class PlainLines:
    """Not a terminal: one line every ``interval`` seconds (and one at the end)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval

    def start(self, stats: Stats) -> None:
        pass

    def line(self, stats: Stats) -> str:
        return (
            f"dsh batch: {stats.finished}/{stats.total} finished ({stats.ok} ok, {stats.failed} failed"
            + (f", {stats.interrupted} interrupted" if stats.interrupted else "")
            + f"), {stats.running} running, {_rate(stats):.1f} tasks/s, ETA {_eta(stats)}, {stats.tokens:,} tokens"
        )

    def update(self, stats: Stats) -> None:
        pass

    def note(self, message: str) -> None:
        print(f"dsh batch: {message}", file=sys.stderr, flush=True)

    async def tick(self, stats: Stats) -> None:
        import anyio

        while True:
            await anyio.sleep(self.interval)
            print(self.line(stats), file=sys.stderr, flush=True)

    def stop(self, stats: Stats) -> None:
        print(self.line(stats), file=sys.stderr, flush=True)


class Quiet(PlainLines):
    def __init__(self) -> None:
        super().__init__(0)

    async def tick(self, stats: Stats) -> None:
        import anyio

        await anyio.sleep_forever()

    def stop(self, stats: Stats) -> None:
        pass


def summary(stats: Stats, *, out: str, engine: str, invalid: int, status: int) -> dict[str, Any]:
    return {
        "out": out,
        "engine": engine,
        "total": stats.total + stats.skipped,
        "skipped": stats.skipped,
        "ran": stats.finished,
        "ok": stats.ok,
        "failed": stats.failed,
        "interrupted": stats.interrupted,
        "notStarted": stats.total - stats.finished,
        "invalidLines": invalid,
        "retries": stats.retries,
        "failures": dict(sorted(stats.failures.items())),
        "tokens": stats.tokens,
        "seconds": round(stats.elapsed, 3),
        "tasksPerSecond": round(stats.finished / stats.elapsed, 2) if stats.elapsed > 0 else None,
        "exitStatus": status,
    }


def print_table(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"dsh batch → {data['out']} ({data['engine']})", title_justify="left")
    table.add_column("", style="bold")
    table.add_column("tasks", justify="right")
    rows = [
        ("ok", data["ok"]),
        ("failed", data["failed"]),
        *((f"  {cls}", n) for cls, n in data["failures"].items()),
        ("interrupted", data["interrupted"]),
        ("not started", data["notStarted"]),
        ("already done (skipped)", data["skipped"]),
        ("invalid task lines", data["invalidLines"]),
        ("retries (crashed/unstartable agent)", data["retries"]),
    ]
    for label, n in rows:
        table.add_row(label, f"{n:,}")
    rate = data["tasksPerSecond"]
    table.caption = f"{data['ran']} ran in {data['seconds']:.1f} s" + (f" ({rate:.1f} tasks/s)" if rate else "") + f", {data['tokens']:,} tokens"
    state = data.get("results")
    if state:
        table.caption += "\n--out now: " + ", ".join(f"{n:,} {k}" for k, n in state.items() if n or k == "ok")
    Console(stderr=True, highlight=False).print(table)


def now() -> float:
    return time.monotonic()
