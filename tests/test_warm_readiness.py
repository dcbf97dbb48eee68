"""dsh_core.warmserver.Readiness: one wait in the calling task on several real descriptors (a
command-server call's output pipes and its call socket); and dsh_core.state.wait_either, the other
wait that registers with the asyncio loop directly (each with the fallback for another backend)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import anyio
import pytest

from dsh_core.state import Flag, wait_either
from dsh_core.warmserver import Readiness

pytestmark = pytest.mark.anyio


async def test_wakes_for_whichever_descriptor_becomes_readable_and_stays_registered():
    r1, w1 = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ready = Readiness()
    try:
        ready.watch(r1)
        ready.watch(ours.fileno(), r1)  # several at once; twice is once
        assert ready.fds == [r1, ours.fileno()]
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.sleep, 0)

            async def later() -> None:
                await anyio.sleep(0.05)
                theirs.send(b"exit 0")

            tg.start_soon(later)
            with anyio.fail_after(5):
                await ready.wait()
        assert ours.recv(64) == b"exit 0"
        os.write(w1, b"x")  # the same registration, a second wait
        with anyio.fail_after(5):
            await ready.wait()
        assert os.read(r1, 8) == b"x"
        ready.unwatch(r1)
        os.write(w1, b"y")  # no longer watched: this wait does not wake for it
        with anyio.move_on_after(0.1) as idle:
            await ready.wait()
        assert idle.cancelled_caught
        theirs.close()  # end of file counts as readable
        with anyio.fail_after(5):
            await ready.wait()
        assert ours.recv(64) == b""
    finally:
        ready.close()
        assert ready.fds == []
        for fd in (r1, w1):
            os.close(fd)
        ours.close()
        theirs.close()


async def test_a_cancelled_wait_leaves_it_usable():
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    ready = Readiness()
    try:
        ready.watch(r)
        with anyio.move_on_after(0.05) as scope:
            await ready.wait()
        assert scope.cancelled_caught
        os.write(w, b"z")
        with anyio.fail_after(5):
            await ready.wait()
    finally:
        ready.close()
        os.close(r)
        os.close(w)


async def _a_deadline_ends_the_wait(ready: Readiness, r: int, w: int) -> None:
    ready.watch(r)
    async with anyio.create_task_group() as tg:  # a wake ends a wait with no deadline (a job's stop)

        async def later() -> None:
            await anyio.sleep(0.05)
            ready.wake()

        tg.start_soon(later)
        with anyio.fail_after(5):
            assert await ready.wait()
    start = time.monotonic()
    with anyio.fail_after(5):
        assert await ready.wait(start + 0.05)  # nothing readable: it ends at the deadline
    assert time.monotonic() - start >= 0.045
    assert not await ready.wait(time.monotonic() - 0.001)  # already past: no wait at all
    os.write(w, b"a")
    with anyio.fail_after(5):
        assert await ready.wait(time.monotonic() + 60)  # readable first: the wait ends at once


async def test_a_deadline_ends_the_wait_and_one_already_past_does_not_wait():
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    ready = Readiness()
    try:
        await _a_deadline_ends_the_wait(ready, r, w)
    finally:
        ready.close()
        os.close(r)
        os.close(w)


async def test_waiting_on_nothing_is_refused():
    with pytest.raises(RuntimeError):
        await Readiness().wait()


# The paths for another anyio backend (trio: no asyncio loop is running), taken here on asyncio
# by hiding the loop from the module under test; the waits then go through anyio's own calls.

@pytest.fixture
def no_asyncio_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from dsh_core import state, warmserver

    def no_loop() -> None:
        raise RuntimeError("no running event loop")

    monkeypatch.setattr(warmserver, "asyncio", types.SimpleNamespace(get_running_loop=no_loop))
    monkeypatch.setattr(state, "asyncio", types.SimpleNamespace(_get_running_loop=lambda: None))


async def test_without_an_asyncio_loop_readiness_waits_on_each_descriptor(no_asyncio_loop: None):
    r1, w1 = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    r2, w2 = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    ready = Readiness()
    try:
        ready.watch(r1)
        ready.watch(r2)
        with anyio.move_on_after(0.1) as idle:  # nothing readable: it waits
            await ready.wait()
        assert idle.cancelled_caught
        async with anyio.create_task_group() as tg:

            async def later() -> None:
                await anyio.sleep(0.05)
                os.write(w2, b"b")

            tg.start_soon(later)
            with anyio.fail_after(5):
                await ready.wait()  # the second descriptor ends the wait (and the first's task)
        assert os.read(r2, 8) == b"b"
        os.write(w1, b"a")
        with anyio.fail_after(5):
            await ready.wait()  # usable again after a wait ended by the other descriptor
        assert os.read(r1, 8) == b"a"
        assert ready._loop is None  # the fallback: nothing was registered with an asyncio loop
    finally:
        ready.close()
        for fd in (r1, w1, r2, w2):
            os.close(fd)


async def test_without_an_asyncio_loop_a_deadline_ends_the_wait(no_asyncio_loop: None):
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    ready = Readiness()
    try:
        await _a_deadline_ends_the_wait(ready, r, w)
        assert ready._loop is None
    finally:
        ready.close()
        os.close(r)
        os.close(w)


async def _either_of_two_ends_on_the_first(waiting: Callable[[Flag], bool], let_go: Callable[[Flag], bool]) -> None:
    """``wait_either`` on two flags ends when either is set (and only then), the other left unset;
    ``waiting(flag)`` says the flag holds the waiter meanwhile, ``let_go(flag)`` that it does not after."""
    for which in (0, 1):
        flags = (Flag(), Flag())
        done: list[int] = []

        async def waiter(flags: tuple[Flag, Flag] = flags, done: list[int] = done) -> None:
            await wait_either(*flags)
            done.append(1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert done == [] and all(waiting(f) for f in flags)
            flags[which].set()
        assert done == [1] and not flags[1 - which].is_set() and all(let_go(f) for f in flags)


async def test_waiting_on_either_of_two_flags_ends_on_the_first_and_leaves_neither_holding_it():
    await _either_of_two_ends_on_the_first(lambda f: bool(f._waiters), lambda f: f._waiters is None)
    flag, other = Flag(), Flag()
    with anyio.CancelScope() as scope:  # cancelled while waiting: both flags let go of it
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_either, flag, other)
            await anyio.wait_all_tasks_blocked()
            scope.cancel()
    assert scope.cancelled_caught and flag._waiters is None and other._waiters is None
    with anyio.CancelScope() as scope:  # one already set: a checkpoint, as a set event's wait
        scope.cancel()
        await wait_either(Flag(), Flag(True))
    assert scope.cancelled_caught


async def test_without_an_asyncio_loop_wait_either_ends_on_either_flag(no_asyncio_loop: None):
    await _either_of_two_ends_on_the_first(lambda f: isinstance(f._waiters, anyio.Event), lambda f: True)
    flag, other = Flag(), Flag()
    with anyio.move_on_after(0.05) as scope:  # cancelled while waiting: it ends, nothing is set
        await wait_either(flag, other)
    assert scope.cancelled_caught and not flag.is_set() and not other.is_set()
    async with anyio.create_task_group() as tg:  # a flag waited on by two sides wakes both
        tg.start_soon(wait_either, flag, other)
        tg.start_soon(flag.wait)
        await anyio.wait_all_tasks_blocked()
        flag.set()
