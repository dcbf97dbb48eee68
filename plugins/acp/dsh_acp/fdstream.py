"""Raw file descriptors (pipes, ttys, files) as anyio byte streams.

``FdReader`` is an ``anyio.abc.ByteReceiveStream`` and ``FdWriter`` an
``anyio.abc.ByteSendStream``; they wait with ``anyio.wait_readable``/``wait_writable``, so
nothing here assumes asyncio. On asyncio, ``FdReader`` keeps its fd registered with the loop
between reads instead (``anyio.wait_readable`` adds and removes it around every wait: two
``epoll_ctl`` calls and an event per frame read, bench/profile_prompt.py); the reader owns its
fd, so nothing else may wait on it. ``rpc.Peer`` runs over these or over any other anyio byte
stream (memory-backed ones in the unit tests). ``FdWriter`` also offers what the peer's fast
path uses: ``send_nowait`` (write what the pipe takes now) and ``abort`` (drop output that
waits for a reader that stopped reading).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat

import anyio
import anyio.abc

READ_CHUNK = 1 << 20
# What the loop's reader callback reads at most: a pipe holds 64 KiB, and a smaller buffer is
# served from the heap (a 1 MiB one is mmapped, shrunk and unmapped on every read).
CALLBACK_CHUNK = 1 << 16


class TransportClosed(anyio.BrokenResourceError):
    """The other end went away (or the connection is closing): nothing more can be written."""


class FdEndOfStream(anyio.EndOfStream, EOFError):
    """The end of an fd's data: anyio's ``EndOfStream``, and an ``EOFError`` for plain callers."""


class _Fd:
    """An fd this stream owns: non-blocking unless a regular file (epoll refuses those); closed once."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._pollable = not stat.S_ISREG(os.fstat(fd).st_mode)
        if self._pollable:
            os.set_blocking(fd, False)

    def close(self) -> None:
        """Idempotent: a second close must not close whatever reused the fd number."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        with contextlib.suppress(OSError):
            os.close(fd)

    async def aclose(self) -> None:
        self.close()


class FdReader(_Fd, anyio.abc.ByteReceiveStream):
    def __init__(self, fd: int) -> None:
        super().__init__(fd)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the fd stays registered with
        self._waiter: asyncio.Future[bytes | None] | None = None
        self._want = READ_CHUNK  # max_bytes of the waiting receive
        self._stash: bytes | None = None  # read for a receive that was cancelled before it returned
        self._unwatched = 0  # readiness reports in a row with nobody waiting

    async def receive(self, max_bytes: int = READ_CHUNK) -> bytes:
        """The next chunk (at most ``max_bytes``); raises ``FdEndOfStream`` at EOF."""
        if self._stash is not None:
            data, self._stash = self._stash, None
            return self._took(data, max_bytes)
        # Always read first, even after a short read (where it usually says EAGAIN, ~1 µs): what
        # is already there, end of file included, is seen before anything else runs. Waiting
        # first let a session/new sent just before EOF create a session the closing connection
        # could never use (tests/reliability/test_acp_hostile.py).
        while True:
            try:
                data = os.read(self.fd, max_bytes)
            except BlockingIOError:
                ready = await self._wait_readable(max_bytes)
                if ready is None:
                    continue
                data = ready
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EIO):
                    raise FdEndOfStream from None
                raise
            return self._took(data, max_bytes)

    def _took(self, data: bytes, max_bytes: int) -> bytes:
        if not data:
            raise FdEndOfStream
        return data

    async def _wait_readable(self, max_bytes: int) -> bytes | None:
        """Wait until the fd is readable. On asyncio the loop's reader callback reads it and this
        returns the data (None: read again); elsewhere it returns None."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another anyio backend (trio)
            await anyio.wait_readable(self.fd)
            return None
        if self._loop is not loop:
            self._unregister()
            loop.add_reader(self.fd, self._readable)
            self._loop = loop
        waiter: asyncio.Future[bytes | None] = loop.create_future()
        self._waiter = waiter
        self._want = max_bytes
        try:
            return await waiter  # a cancel scope cancels the task here, as at any checkpoint
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._stash = waiter.result()  # read already: the next receive returns it
            raise
        finally:
            self._waiter = None

    def _readable(self) -> None:
        """The loop's reader callback: read for the waiting receive, in the callback itself (a
        readiness report the loop polled before the data was read finds EAGAIN here, and wakes
        nobody)."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            # Nobody waits. Twice in a row, the data waits for a reader busy elsewhere: stop
            # watching until it waits again (level-triggered, it would fire on every loop turn).
            self._unwatched += 1
            if self._unwatched > 1:
                self._unregister()
            return
        self._unwatched = 0
        try:
            data = os.read(self.fd, min(self._want, CALLBACK_CHUNK))
        except BlockingIOError:
            return
        except OSError as exc:
            waiter.set_exception(FdEndOfStream() if exc.errno in (errno.EBADF, errno.EIO) else exc)
            return
        waiter.set_result(data)

    def _unregister(self) -> None:
        self._unwatched = 0
        loop, self._loop = self._loop, None
        if loop is not None and self.fd >= 0:
            with contextlib.suppress(Exception):  # a closed loop
                loop.remove_reader(self.fd)

    def close(self) -> None:
        """Idempotent; a read waiting now retries, and finds the fd closed."""
        self._unregister()
        waiter = self._waiter
        super().close()
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

class FdWriter(_Fd, anyio.abc.ByteSendStream):
    def __init__(self, fd: int) -> None:
        super().__init__(fd)
        self.aborted = False
        self._blocked: set[anyio.CancelScope] = set()

    @property
    def blocked(self) -> bool:
        """A send is waiting for the reader to make room."""
        return bool(self._blocked)

    def send_nowait(self, data: bytes) -> int:
        """Write what the pipe takes now without waiting; returns the number of bytes written."""
        if self.aborted:
            raise TransportClosed("output dropped: the connection is closing")
        try:
            return os.write(self.fd, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise TransportClosed(str(exc)) from exc

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while view:
            if self.aborted:
                raise TransportClosed("output dropped: the connection is closing")
            try:
                n = os.write(self.fd, view)
                view = view[n:]
            except BlockingIOError:
                with anyio.CancelScope() as scope:  # abort() cancels it, even inside a shield
                    self._blocked.add(scope)
                    try:
                        await anyio.wait_writable(self.fd)
                    finally:
                        self._blocked.discard(scope)
            except OSError as exc:  # BrokenPipeError, ConnectionResetError, EBADF, …
                raise TransportClosed(str(exc)) from exc

    def abort(self) -> None:
        """Drop what is still waiting for the reader: blocked and later sends raise TransportClosed."""
        self.aborted = True
        for scope in list(self._blocked):
            scope.cancel()
