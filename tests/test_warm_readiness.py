"""dsh_core.warmserver.Readiness: one wait in the calling task on several real descriptors (a
command-server call's output pipes and its call socket)."""

from __future__ import annotations

import os
import socket

import anyio
import pytest

from dsh_core.warmserver import Readiness

pytestmark = pytest.mark.anyio


async def test_wakes_for_whichever_descriptor_becomes_readable_and_stays_registered():
    r1, w1 = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ready = Readiness()
    try:
        ready.watch(r1)
        ready.watch(ours.fileno())
        ready.watch(r1)  # twice is once
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


async def test_waiting_on_nothing_is_refused():
    with pytest.raises(RuntimeError):
        await Readiness().wait()
