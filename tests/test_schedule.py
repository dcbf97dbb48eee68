"""dsh_core.schedule: submission order, overlap of parallel-safe calls up to the limit, exclusive calls alone."""

from __future__ import annotations

import anyio
import pytest

from dsh_core.schedule import ToolScheduler

pytestmark = pytest.mark.anyio


async def _run(kinds: list[bool], limit: int | None) -> tuple[list[tuple[str, int]], int]:
    sched = ToolScheduler(limit)
    log: list[tuple[str, int]] = []
    peak = 0
    tickets = [sched.ticket(k) for k in kinds]

    async def one(i: int) -> None:
        nonlocal peak
        async with tickets[i]:
            log.append(("start", i))
            peak = max(peak, sched.running)
            await anyio.sleep(0.01)
            log.append(("end", i))

    async with anyio.create_task_group() as tg:
        for i in reversed(range(len(kinds))):  # spawn order does not matter: tickets keep the line
            tg.start_soon(one, i)
    return log, peak


async def test_parallel_safe_calls_overlap_up_to_the_limit():
    log, peak = await _run([True] * 5, limit=2)
    assert peak == 2
    assert {i for _, i in log[:2]} == {0, 1}  # the first two in line start first …
    assert log.index(("start", 2)) > min(log.index(("end", 0)), log.index(("end", 1)))  # … then the next


async def test_exclusive_calls_run_alone_and_in_submission_order():
    log, peak = await _run([True, True, False, True, False], limit=10)
    assert peak == 2  # only the two leading reads overlap
    # the exclusive call 2 starts after both reads ended; read 3 starts after 2 ended, 4 after 3
    assert log.index(("start", 2)) > max(log.index(("end", 0)), log.index(("end", 1)))
    assert log.index(("start", 3)) > log.index(("end", 2))
    assert log.index(("start", 4)) > log.index(("end", 3))


async def test_a_cancelled_waiter_gives_its_place_up():
    sched = ToolScheduler(1)
    first = sched.ticket(False)
    second = sched.ticket(True)
    third = sched.ticket(True)
    async with first:
        with anyio.move_on_after(0.01):
            async with second:
                pytest.fail("admitted while an exclusive call runs")  # pragma: no cover
    async with third:
        assert sched.running == 1
    assert sched.running == 0


async def test_a_ticket_admitted_at_once_is_entered_without_a_loop_turn():
    """A ticket admitted when it was taken runs its call at once (no yield to the loop: a burst of
    reads took a loop turn each), yet a cancel still stops it before the call, giving its place up."""
    sched = ToolScheduler()
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)  # would run first if entering the ticket yielded
        async with sched.ticket(True):
            ran.append("call")
    assert ran == ["call", "other"]
    with anyio.CancelScope() as scope:
        scope.cancel()
        async with sched.ticket(True):
            pytest.fail("entered under a cancel")  # pragma: no cover
    assert sched.running == 0
    async with sched.ticket(False):  # an exclusive call is admitted: nothing was left running
        assert sched.running == 1


def test_limit_must_be_positive():
    with pytest.raises(ValueError):
        ToolScheduler(0)
