"""Raw file descriptors (pipes, ttys, files) as anyio byte streams.

``FdReader`` is an ``anyio.abc.ByteReceiveStream`` and ``FdWriter`` an
``anyio.abc.ByteSendStream``; they wait with ``anyio.wait_readable``/``wait_writable``, so
nothing here assumes asyncio. ``rpc.Peer`` runs over these or over any other anyio byte
stream (memory-backed ones in the unit tests). ``FdWriter`` also offers what the peer's fast
path uses: ``send_nowait`` (write what the pipe takes now) and ``abort`` (drop output that
waits for a reader that stopped reading).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

import anyio
import anyio.abc

READ_CHUNK = 1 << 20


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
    async def receive(self, max_bytes: int = READ_CHUNK) -> bytes:
        """The next chunk (at most ``max_bytes``); raises ``FdEndOfStream`` at EOF."""
        while True:
            try:
                data = os.read(self.fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self.fd)
                continue
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EIO):
                    raise FdEndOfStream from None
                raise
            if not data:
                raise FdEndOfStream
            return data


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
