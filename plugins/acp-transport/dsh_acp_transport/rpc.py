"""Newline-delimited JSON-RPC 2.0 over a pair of byte streams: one peer, either side.

``FdReader``/``FdWriter`` read and write raw file descriptors (pipes, ttys, files)
through ``anyio.wait_readable``/``wait_writable``, so nothing here assumes asyncio.
``Peer`` frames lines (any length up to a documented limit), dispatches inbound
requests concurrently, matches responses to its own outbound requests, and writes
whole frames one at a time through a single lock.

Hand-written rather than built on the ACP SDK: the SDK's pydantic models cost about
6x msgspec per frame in our measurements (bench/acp_roundtrip.py), its reader uses
asyncio's 64 KiB line limit (docs/acp-contract.md#client-facts, 8), and it skips garbage lines
without the -32700 Parse error that JSON-RPC 2.0 prescribes (ACP-1, docs/acp-contract.md).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

from dsh_core.diag import debug, warn

from .wire import (
    ErrorResponse,
    Frame,
    Notification,
    Request,
    RequestId,
    Response,
    RpcError,
    encoder,
)

DEFAULT_MAX_FRAME = 64 * 1024 * 1024  # 64 MiB: a 40 MiB image in base64 fits
READ_CHUNK = 1 << 20

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800


class RpcFailure(Exception):
    """Raised by a handler to answer with a JSON-RPC error (or received from the peer)."""

    def __init__(self, code: int, message: str, data: Any = msgspec.UNSET) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def invalid_params(detail: str) -> RpcFailure:
    return RpcFailure(INVALID_PARAMS, f"Invalid params: {detail}")


def internal_error(detail: str) -> RpcFailure:
    return RpcFailure(INTERNAL_ERROR, f"Internal error: {detail}")


class TransportClosed(Exception):
    pass


# --------------------------------------------------------------------------- fd streams


class FdReader:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._pollable = not stat.S_ISREG(os.fstat(fd).st_mode)  # epoll refuses regular files
        if self._pollable:
            os.set_blocking(fd, False)

    async def receive(self) -> bytes:
        """Return the next chunk, b"" at EOF."""
        while True:
            try:
                return os.read(self.fd, READ_CHUNK)
            except BlockingIOError:
                await anyio.wait_readable(self.fd)
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EIO):
                    return b""
                raise

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class FdWriter:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._pollable = not stat.S_ISREG(os.fstat(fd).st_mode)
        if self._pollable:
            os.set_blocking(fd, False)

    def send_nowait(self, data: bytes) -> int:
        """Write what the pipe takes now without waiting; returns the number of bytes written."""
        try:
            return os.write(self.fd, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise TransportClosed(str(exc)) from exc

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
                view = view[n:]
            except BlockingIOError:
                await anyio.wait_writable(self.fd)
            except (BrokenPipeError, ConnectionResetError, OSError) as exc:
                raise TransportClosed(str(exc)) from exc

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


# --------------------------------------------------------------------------- the peer

Handler = Callable[[Any, msgspec.Raw | None], Awaitable[Any]]
NotificationHandler = Callable[[msgspec.Raw | None], Awaitable[None] | None]


class _Pending:
    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: msgspec.Raw | None = None
        self.error: RpcFailure | None = None


class Peer:
    """One JSON-RPC connection. ``serve()`` reads until EOF; handlers run in its task group."""

    def __init__(
        self,
        reader: FdReader,
        writer: FdWriter,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        name: str = "dsh",
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.max_frame = max_frame
        self.name = name
        self.requests: dict[str, Handler] = {}
        self.notifications: dict[str, NotificationHandler] = {}
        # Called for an inbound request before dispatch; may raise RpcFailure (e.g. "not initialized").
        self.gate: Callable[[str], None] | None = None
        self.on_cancel_request: Callable[[RequestId], bool] | None = None
        # A semaphore, not a Lock: a frame started by one task may be finished by another.
        self._write_lock = anyio.Semaphore(1)
        self._next_id = 0
        self._pending: dict[RequestId, _Pending] = {}
        self._inbound: dict[Any, anyio.CancelScope] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.closed = False
        self._handlers_idle = anyio.Event()
        self._handlers_idle.set()
        self._handlers = 0
        self._read_scope = anyio.CancelScope()

    # ------------------------------------------------------------------ writing

    async def write(self, message: Any) -> None:
        """Write one whole frame; frames never interleave."""
        data = encoder.encode(message) + b"\n"
        if self._write_lock.value:
            # Fast path: nobody is mid-frame and a pipe usually takes a small frame at once, so
            # skip the lock's checkpoint (about a fifth of a prompt round trip in our profile).
            n = self.writer.send_nowait(data)
            if n == len(data):
                return
            self._write_lock.acquire_nowait()  # no await since the check: still ours
            try:
                await self.writer.send(data[n:])
            finally:
                self._write_lock.release()
            return
        async with self._write_lock:
            await self.writer.send(data)

    def write_nowait(self, message: Any) -> bool:
        """Commit a whole frame to the stream without awaiting, if no frame is mid-write.

        True: the frame is written, or its unwritten tail is being finished by a task that
        holds the write lock (so later frames still come after it). False: another frame
        holds the lock; nothing was written and the caller should ``await write()``."""
        if not self._write_lock.value:
            return False
        data = encoder.encode(message) + b"\n"
        n = self.writer.send_nowait(data)
        if n < len(data):
            self._write_lock.acquire_nowait()
            assert self._tg is not None
            self._tg.start_soon(self._finish_write, data[n:])
        return True

    async def _finish_write(self, tail: bytes) -> None:
        try:
            await self.writer.send(tail)
        except TransportClosed:
            pass
        finally:
            self._write_lock.release()

    async def notify(self, method: str, params: Any) -> None:
        await self.write(Notification(method=method, params=params))

    async def request(self, method: str, params: Any, *, timeout: float | None = None) -> msgspec.Raw:
        """Send a request; return the raw result or raise RpcFailure / TimeoutError / TransportClosed."""
        if self.closed:
            raise TransportClosed("connection closed")
        rid = self._next_id
        self._next_id += 1
        pending = self._pending[rid] = _Pending()
        try:
            await self.write(Request(id=rid, method=method, params=params))
            with anyio.fail_after(timeout):
                await pending.done.wait()
        except BaseException:
            if self._pending.pop(rid, None) is not None and not self.closed:
                with anyio.CancelScope(shield=True):
                    try:
                        await self.notify("$/cancel_request", {"requestId": rid})
                    except Exception:
                        pass
            raise
        self._pending.pop(rid, None)
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    # ------------------------------------------------------------------ reading

    async def serve(self, on_close: Callable[[], Awaitable[None]] | None = None, grace: float = 5.0) -> None:
        """Read frames until EOF or a transport error; then fail outstanding outbound requests,
        run ``on_close`` (shielded), give in-flight handlers ``grace`` seconds to answer, and
        cancel the rest."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                with self._read_scope:
                    await self._read_loop()
            finally:
                self.closed = True
                for p in self._pending.values():
                    p.error = RpcFailure(INTERNAL_ERROR, "connection closed")
                    p.done.set()
                with anyio.CancelScope(shield=True):
                    if on_close is not None:
                        await on_close()
                    with anyio.move_on_after(grace):
                        await self._handlers_idle.wait()
                tg.cancel_scope.cancel()

    def stop_reading(self) -> None:
        """End the read loop as if the peer had closed its end (signals, tests)."""
        self._read_scope.cancel()

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        assert self._tg is not None
        self._tg.start_soon(fn, *args)

    async def wait_handlers(self) -> None:
        await self._handlers_idle.wait()

    def cancel_handlers(self) -> None:
        for scope in list(self._inbound.values()):
            scope.cancel()

    async def _read_loop(self) -> None:
        buf = bytearray()
        scan = 0
        discarding = False
        while True:
            try:
                chunk = await self.reader.receive()
            except Exception as exc:
                warn(f"{self.name}: transport read failed: {exc!r}")
                return
            if not chunk:
                if buf and not discarding:
                    await self._frame(bytes(buf))
                return
            buf += chunk
            while True:
                nl = buf.find(b"\n", scan)
                if nl < 0:
                    scan = len(buf)
                    if len(buf) > self.max_frame:
                        if not discarding:
                            discarding = True
                            await self._too_large()
                        buf.clear()
                        scan = 0
                    break
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                scan = 0
                if discarding:
                    discarding = False  # the tail of the oversized frame
                    continue
                if len(line) > self.max_frame:
                    await self._too_large()
                    continue
                await self._frame(line)

    async def _too_large(self) -> None:
        await self._safe_write(
            ErrorResponse(
                id=None,
                error=RpcError(
                    code=INVALID_REQUEST,
                    message=f"Invalid request: frame exceeds the {self.max_frame} byte limit",
                    data={"maxFrameBytes": self.max_frame},
                ),
            )
        )

    async def _safe_write(self, message: Any) -> None:
        try:
            await self.write(message)
        except TransportClosed:
            pass

    async def _frame(self, line: bytes) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            return
        try:
            frame = msgspec.json.decode(line, type=Frame)
        except msgspec.ValidationError:
            # valid JSON, wrong shape (array, scalar, wrong member types)
            try:
                msgspec.json.decode(line)
            except msgspec.DecodeError:
                await self._safe_write(ErrorResponse(id=None, error=RpcError(code=PARSE_ERROR, message="Parse error")))
                return
            await self._safe_write(
                ErrorResponse(id=None, error=RpcError(code=INVALID_REQUEST, message="Invalid request"))
            )
            return
        except msgspec.DecodeError:
            await self._safe_write(ErrorResponse(id=None, error=RpcError(code=PARSE_ERROR, message="Parse error")))
            return
        has_id = frame.id is not msgspec.UNSET
        if frame.jsonrpc != "2.0":
            if has_id or frame.method is not msgspec.UNSET:
                await self._safe_write(
                    ErrorResponse(
                        id=frame.id if has_id else None,  # type: ignore[arg-type]
                        error=RpcError(code=INVALID_REQUEST, message='Invalid request: jsonrpc must be "2.0"'),
                    )
                )
            return
        if frame.method is not msgspec.UNSET:
            params = frame.params if frame.params is not msgspec.UNSET else None
            if has_id:
                self._handlers += 1
                if self._handlers == 1:
                    self._handlers_idle = anyio.Event()
                assert self._tg is not None
                self._tg.start_soon(self._handle, frame.id, frame.method, params)
            else:
                await self._notification(frame.method, params)
            return
        if has_id and (frame.result is not msgspec.UNSET or frame.error is not msgspec.UNSET):
            pending = self._pending.get(frame.id)  # type: ignore[arg-type]
            if pending is None:
                debug(f"{self.name}: dropped a response to unknown request id {frame.id!r}")
                return
            if frame.error is not msgspec.UNSET:
                err = frame.error if isinstance(frame.error, dict) else {}
                pending.error = RpcFailure(
                    int(err.get("code", INTERNAL_ERROR)) if isinstance(err.get("code"), int) else INTERNAL_ERROR,
                    str(err.get("message", "error")),
                    err.get("data", msgspec.UNSET),
                )
            else:
                pending.result = frame.result  # type: ignore[assignment]
            pending.done.set()
            return
        await self._safe_write(
            ErrorResponse(
                id=frame.id if has_id else None,  # type: ignore[arg-type]
                error=RpcError(code=INVALID_REQUEST, message="Invalid request"),
            )
        )

    async def _notification(self, method: str, params: msgspec.Raw | None) -> None:
        if method == "$/cancel_request":
            try:
                rid = msgspec.json.decode(params or b"{}", type=dict).get("requestId")
            except Exception:
                return
            if self.on_cancel_request is not None and self.on_cancel_request(rid):
                return
            scope = self._inbound.get(rid)
            if scope is not None:
                scope.cancel()
            return
        handler = self.notifications.get(method)
        if handler is None:
            return  # unknown notifications are ignored, never answered
        try:
            result = handler(params)
            if result is not None:
                await result
        except Exception as exc:
            warn(f"{self.name}: notification {method} failed: {exc!r}")

    async def _handle(self, rid: RequestId, method: str, params: msgspec.Raw | None) -> None:
        reply: Any
        try:
            with anyio.CancelScope() as scope:
                self._inbound[rid] = scope
                try:
                    if self.gate is not None:
                        self.gate(method)
                    handler = self.requests.get(method)
                    if handler is None:
                        raise RpcFailure(METHOD_NOT_FOUND, "Method not found", {"method": method})
                    result = await handler(rid, params)
                    reply = Response(id=rid, result=result)
                except RpcFailure as exc:
                    reply = ErrorResponse(id=rid, error=RpcError(code=exc.code, message=exc.message, data=exc.data))
                except Exception as exc:
                    warn(f"{self.name}: {method} failed: {exc!r}")
                    reply = ErrorResponse(id=rid, error=RpcError(code=INTERNAL_ERROR, message=f"Internal error: {exc}"))
            if scope.cancelled_caught:
                reply = ErrorResponse(id=rid, error=RpcError(code=REQUEST_CANCELLED, message="Request cancelled"))
            if not self.write_nowait(reply):
                with anyio.CancelScope(shield=True):
                    await self._safe_write(reply)
        finally:
            self._inbound.pop(rid, None)
            self._handlers -= 1
            if self._handlers == 0:
                self._handlers_idle.set()


def decode_params(params: msgspec.Raw | None, type_: type[Any]) -> Any:
    """Decode a request's params or raise ``-32602`` naming what is wrong."""
    try:
        return msgspec.json.decode(params if params is not None else b"null", type=type_)
    except msgspec.ValidationError as exc:
        raise invalid_params(str(exc)) from None
    except msgspec.DecodeError as exc:  # pragma: no cover - the frame already parsed
        raise invalid_params(str(exc)) from None
