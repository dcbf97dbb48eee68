"""FdReader over a real pipe: on asyncio it stays registered with the loop and reads in the
loop's reader callback; nothing read is lost to a cancelled receive, and close wakes a waiter."""

from __future__ import annotations

import os

import anyio
import pytest
from dsh_acp.fdstream import FdEndOfStream, FdReader

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_frames_written_later_are_read_in_order_and_eof_ends_the_stream():
    r, w = os.pipe()
    reader = FdReader(r)
    got: list[bytes] = []

    async def write_slowly() -> None:
        for i in range(20):
            await anyio.sleep(0.002)
            os.write(w, b"frame %d\n" % i)
        os.close(w)

    async with anyio.create_task_group() as tg:
        tg.start_soon(write_slowly)
        with pytest.raises(FdEndOfStream):
            while True:
                got.append(await reader.receive())
    assert b"".join(got) == b"".join(b"frame %d\n" % i for i in range(20))
    reader.close()


async def test_data_that_arrives_after_a_cancelled_receive_waits_for_the_next():
    r, w = os.pipe()
    reader = FdReader(r)
    with anyio.move_on_after(0.05):
        await reader.receive()  # nothing to read: cancelled while waiting
    os.write(w, b"after the cancel\n")
    await anyio.sleep(0.05)  # the data waits while nobody reads (the reader stops watching the fd)
    assert await reader.receive() == b"after the cancel\n"
    os.close(w)
    reader.close()


async def test_receives_cut_short_by_timeouts_while_frames_arrive_lose_nothing():
    r, w = os.pipe()
    reader = FdReader(r)
    frames = [b"%03d;" % i for i in range(60)]
    got: list[bytes] = []

    async def write_at_odd_times() -> None:
        for i, frame in enumerate(frames):
            await anyio.sleep(0.0005 * (i % 4))
            os.write(w, frame)
        os.close(w)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(write_at_odd_times)
            ended = False
            while not ended:
                with anyio.move_on_after(0.0007):  # often cancelled while waiting, or just after a read
                    try:
                        got.append(await reader.receive())
                    except FdEndOfStream:
                        ended = True
    assert b"".join(got) == b"".join(frames)
    reader.close()


async def test_close_wakes_a_waiting_receive_with_end_of_stream():
    r, w = os.pipe()
    reader = FdReader(r)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def closer() -> None:
                await anyio.sleep(0.05)
                reader.close()

            tg.start_soon(closer)
            with pytest.raises(FdEndOfStream):
                await reader.receive()
    os.close(w)


async def test_data_read_for_a_receive_cancelled_before_it_resumed_is_kept_for_the_next():
    import asyncio

    r, w = os.pipe()
    reader = FdReader(r)
    # A plain asyncio cancel (anyio's scopes wait for a done future's task to resume): the loop's
    # callback has read the data for the receive, which is cancelled before it returns it.
    task = asyncio.ensure_future(reader.receive())
    with anyio.fail_after(5):
        while reader._waiter is None:
            await asyncio.sleep(0)
        os.write(w, b"kept")
        while not reader._waiter.done():
            await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with anyio.fail_after(5):  # the pipe is empty now: only the kept data can answer
        assert await reader.receive() == b"kept"
    os.close(w)
    reader.close()
