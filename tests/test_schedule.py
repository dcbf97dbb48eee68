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


def test_a_caller_may_skip_the_wait_of_a_ticket_admitted_at_once():
    """``admitted``: the call may run now (a caller then runs it without ``async with`` and its
    yield, and ``leave``s when it ends); the next in line is admitted on that leave, once."""
    sched = ToolScheduler()
    read, write, later = sched.ticket(True), sched.ticket(False), sched.ticket(True)
    assert read.admitted and not write.admitted and not later.admitted
    read.leave()
    assert write.admitted and not later.admitted and sched.running == 1
    read.leave()  # a second leave changes nothing
    assert write.admitted and not later.admitted and sched.running == 1
    write.leave()
    assert later.admitted
    later.leave()
    assert sched.running == 0


def test_limit_must_be_positive():
    with pytest.raises(ValueError):
        ToolScheduler(0)
