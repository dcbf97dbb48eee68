"""Newline-delimited JSON-RPC 2.0 over a pair of byte streams: one peer, either side.

``Peer`` reads from any anyio byte receive stream and writes to any byte send stream
(``fdstream.FdReader``/``FdWriter`` for pipes and stdio, memory-backed streams in unit
tests). It frames lines (any length up to a documented limit), hands inbound requests and
notifications to its ``Dispatcher`` (requests run concurrently), matches responses to its
own outbound requests, and writes whole frames one at a time through a single lock.

Hand-written rather than built on the ACP SDK: the SDK's pydantic models cost about
6x msgspec per frame in our measurements (bench/acp_roundtrip.py), its reader uses
asyncio's 64 KiB line limit (docs/acp-contract.md#client-facts, 8), and it skips garbage lines
without the -32700 Parse error that JSON-RPC 2.0 prescribes (ACP-1, docs/acp-contract.md).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec

from .fdstream import TransportClosed
from .wire import (
    CancelRequestParams,
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
MAX_DEPTH = 128  # arrays/objects nested deeper than this are refused before decoding
WRITE_GRACE = 1.0  # seconds a blocked write may still take once the connection is closing

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800
AUTH_REQUIRED = -32000  # ACP: the agent needs a credential first (authMethods)


class RpcFailure(Exception):
    """Raised by a handler to answer with a JSON-RPC error (or received from the peer).

    ``details`` is the reason in words a person can act on; an answer carries it as
    ``error.data.details`` (clients such as Toad show only that), beside any other ``data``."""

    def __init__(self, code: int, message: str, data: Any = msgspec.UNSET, *, details: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.details = details

    def rpc_error(self) -> RpcError:
        return error_with_details(self.code, self.message, self.data, self.details)


def error_with_details(code: int, message: str, data: Any = msgspec.UNSET, details: str | None = None) -> RpcError:
    """An error object whose ``data`` also says ``details`` (the message when no detail is given)."""
    details = details or message
    if data is msgspec.UNSET or data is None:
        data = {"details": details}
    elif isinstance(data, dict) and "details" not in data:
        data = {**data, "details": details}
    return RpcError(code=code, message=message, data=data)


SHOWN_MAX = 80  # characters of a client-chosen value (a session id) an error message repeats


def shown(value: object, limit: int = SHOWN_MAX) -> str:
    """A client-chosen value as an error message may repeat it: whole when short, else its head
    and its length, so a 100 KB id is never echoed back in full (nor into a log). The spine's
    ``dsh_core.errors.shown`` does the same for reprs; this library does not import the spine."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def invalid_params(detail: str) -> RpcFailure:
    return RpcFailure(INVALID_PARAMS, f"Invalid params: {detail}", details=detail)


def internal_error(detail: str) -> RpcFailure:
    return RpcFailure(INTERNAL_ERROR, f"Internal error: {detail}", details=detail)


# --------------------------------------------------------------------------- the peer

T = TypeVar("T")

Handler = Callable[[Any, msgspec.Raw | None], Awaitable[Any]]
"""A request handler: (request id, raw params) → the result to answer with (or raise RpcFailure)."""
NotificationHandler = Callable[[msgspec.Raw | None], Awaitable[None] | None]
"""A notification handler: raw params → nothing; it is never answered, its errors only warned about."""


class Dispatcher:
    """What a peer does with what it reads: request handlers (each answered) and notification
    handlers (never answered) by method name, an optional gate run before every request
    handler, and an optional hook for ``$/cancel_request``.

    ``gate(method)`` may raise ``RpcFailure`` (e.g. "not initialized"): the request is answered
    with it and its handler does not run. ``on_cancel_request(id, method)`` is called for a
    ``$/cancel_request`` naming an open inbound request (started or not); it returns True when
    it took care of the cancel, else the handler's scope is cancelled (answered ``-32800``).
    ``cancelled_by_handler`` names the methods whose cancel ``on_cancel_request`` always takes
    (``session/prompt``: the door settles it ``cancelled``): their handlers run without a cancel
    scope of the peer's, which costs ~20 Python calls a request (bench/profile_prompt.py)."""

    __slots__ = ("_notifications", "_requests", "cancelled_by_handler", "gate", "on_cancel_request")

    def __init__(
        self,
        *,
        gate: Callable[[str], None] | None = None,
        on_cancel_request: Callable[[Any, str], bool] | None = None,
    ) -> None:
        self._requests: dict[str, Handler] = {}
        self._notifications: dict[str, NotificationHandler] = {}
        self.gate = gate
        self.on_cancel_request = on_cancel_request
        self.cancelled_by_handler: frozenset[str] = frozenset()

    def on_request(self, method: str, handler: Handler) -> None:
        self._requests[method] = handler

    def on_notification(self, method: str, handler: NotificationHandler) -> None:
        self._notifications[method] = handler

    def handles(self, method: str) -> bool:
        """A request handler is registered for ``method``."""
        return method in self._requests

    def request_handler(self, method: str) -> Handler | None:
        return self._requests.get(method)

    def notification_handler(self, method: str) -> NotificationHandler | None:
        return self._notifications.get(method)


@runtime_checkable
class NowaitSend(Protocol):
    """A send stream that can also write without waiting (``FdWriter``): the peer writes small
    frames through ``send_nowait`` and, when closing, ``abort``s sends a stalled reader blocks."""

    def send_nowait(self, data: bytes) -> int: ...

    def abort(self) -> None: ...

    async def send(self, item: bytes) -> None: ...


_EOF_ERRORS = (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError)


class _Pending:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: msgspec.Raw | None = None
        self.error: RpcFailure | None = None


class Inbound:
    """An inbound request from the moment it is read (before its handler starts) to its answer.

    ``seq`` is its place in the one ordered stream of frames read; ``cancel_requested`` is set
    by a ``$/cancel_request`` read after it, whether or not its handler has started."""

    __slots__ = ("after", "cancel_requested", "method", "scope", "seq")

    def __init__(self, seq: int, method: str, scoped: bool = True) -> None:
        self.seq = seq
        self.method = method
        self.scope: anyio.CancelScope | None = anyio.CancelScope() if scoped else None  # None: see Dispatcher
        self.cancel_requested = False
        self.after: list[Callable[[], None]] | None = None  # run once its success response is written


class _Unscoped:
    """What a handler of a ``cancelled_by_handler`` method runs in: no scope, never cancelled here."""

    cancelled_caught = False

    def __enter__(self) -> _Unscoped:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        return False


_UNSCOPED = _Unscoped()

_FRAME = msgspec.json.Decoder(Frame)
_CANCEL_REQUEST = msgspec.json.Decoder(CancelRequestParams)
# One JSON escape at a time, left to right: an escaped backslash, a valid surrogate pair, or a
# lone surrogate (legal JSON that msgspec refuses). Only the last is rewritten, to U+FFFD.
_ESCAPES = re.compile(
    rb"\\(?:\\|u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|(u[dD][89a-fA-F][0-9a-fA-F]{2}))"
)
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _lone_surrogates_replaced(line: bytes) -> bytes | None:
    """``line`` with each lone-surrogate escape replaced by ``\\ufffd``, or None if it has none."""
    found = False

    def fix(m: re.Match[bytes]) -> bytes:
        nonlocal found
        if m.group(1) is None:
            return m.group(0)
        found = True
        return rb"\ufffd"

    fixed = _ESCAPES.sub(fix, line)
    return fixed if found else None


def nesting_depth_exceeds(line: bytes, limit: int = MAX_DEPTH) -> bool:
    """True when arrays/objects in ``line`` nest deeper than ``limit`` (brackets inside strings
    do not count). Cheap unless the line holds more than ``limit`` opening brackets."""
    if line.count(b"[") + line.count(b"{") <= limit:
        return False
    depth = 0
    for b in _STRINGS.sub(b'""', line).translate(None, _NOT_BRACKETS):
        if b == 91 or b == 123:  # [ {
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


class Peer:
    """One JSON-RPC connection. ``serve()`` reads until EOF; handlers run in its task group.

    Frames are one ordered stream: each is numbered as it is read (``read_seq``), and an
    inbound request is registered (``inbound(id)``) before its handler starts, so that a
    cancel read after it applies even when the handler has not run yet."""

    def __init__(
        self,
        reader: anyio.abc.AnyByteReceiveStream,
        writer: anyio.abc.AnyByteSendStream,
        dispatcher: Dispatcher | None = None,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        name: str = "dsh",
        write_grace: float = WRITE_GRACE,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.dispatcher = dispatcher if dispatcher is not None else Dispatcher()
        self.max_frame = max_frame
        self.name = name
        self.log = logging.getLogger(f"dsh.{name}")  # diagnostics as dsh: <name>: …
        self.write_grace = write_grace
        # FdWriter (and the like) take small frames without awaiting; other streams always await.
        self._nowait: NowaitSend | None = writer if isinstance(writer, NowaitSend) else None
        self._aborted = False  # for other streams: output is dropped once the connection closes
        self._blocked: set[anyio.CancelScope] = set()
        # A semaphore, not a Lock: a frame started by one task may be finished by another.
        self._write_lock = anyio.Semaphore(1)
        self._next_id = 0
        self._pending: dict[RequestId, _Pending] = {}
        self._inbound: dict[Any, Inbound] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.closed = False
        self.read_seq = 0  # the number of the frame being (or last) read
        self._handlers_idle: anyio.Event | None = None  # made when someone waits for running handlers
        self._handlers = 0
        self._read_scope = anyio.CancelScope()

    # ------------------------------------------------------------------ writing

    async def write(self, message: Any) -> None:
        """Write one whole frame; frames never interleave."""
        data = encoder.encode(message) + b"\n"
        if self._write_lock.value and self._nowait is not None:
            # Fast path: nobody is mid-frame and a pipe usually takes a small frame at once, so
            # skip the lock's checkpoint (about a fifth of a prompt round trip in our profile).
            n = self._nowait.send_nowait(data)
            if n == len(data):
                return
            self._write_lock.acquire_nowait()  # no await since the check: still ours
            try:
                await self._send(data[n:])
            finally:
                self._write_lock.release()
            return
        async with self._write_lock:
            await self._send(data)

    def write_nowait(self, message: Any) -> bool:
        """Commit a whole frame to the stream without awaiting, if no frame is mid-write.

        True: the frame is written, or its unwritten tail is being finished by a task that
        holds the write lock (so later frames still come after it). False: another frame
        holds the lock, or the stream cannot write without awaiting; nothing was written and
        the caller should ``await write()``."""
        if not self._write_lock.value or self._nowait is None:
            return False
        data = encoder.encode(message) + b"\n"
        n = self._nowait.send_nowait(data)
        if n < len(data):
            self._write_lock.acquire_nowait()
            assert self._tg is not None
            self._tg.start_soon(self._finish_write, data[n:])
        return True

    async def _send(self, data: bytes) -> None:
        """Send through the stream; its failures (and output dropped at close) are TransportClosed."""
        if self._nowait is not None:
            await self._nowait.send(data)  # the fd writer aborts its own blocked sends
            return
        if self._aborted:
            raise TransportClosed("output dropped: the connection is closing")
        with anyio.CancelScope() as scope:  # _abort_output() cancels it, even inside a shield
            self._blocked.add(scope)
            try:
                await self.writer.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                raise TransportClosed(str(exc) or type(exc).__name__) from exc
            finally:
                self._blocked.discard(scope)
        if scope.cancelled_caught:
            raise TransportClosed("output dropped: the connection is closing")

    def _abort_output(self) -> None:
        """Drop output still waiting for the reader: blocked and later sends raise TransportClosed."""
        if self._nowait is not None:
            self._nowait.abort()
            return
        self._aborted = True
        for scope in list(self._blocked):
            scope.cancel()

    def _output_blocked(self) -> bool:
        return bool(getattr(self.writer, "blocked", False) or self._blocked)

    async def _finish_write(self, tail: bytes) -> None:
        try:
            await self._send(tail)
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
                    with contextlib.suppress(Exception):
                        await self.notify("$/cancel_request", {"requestId": rid})
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
        cancel the rest. Output still blocked ``write_grace`` seconds after the close (a client
        that stopped reading) is dropped, so nothing waits on it."""
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
                self._pending.clear()
                tg.start_soon(self._drop_output_after, self.write_grace)
                with anyio.CancelScope(shield=True):
                    if on_close is not None:
                        await on_close()
                    with anyio.move_on_after(grace):
                        await self.wait_handlers()
                self._abort_output()
                tg.cancel_scope.cancel()

    async def _drop_output_after(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        if self._output_blocked():
            self.log.debug(f"the client is not reading; dropping output still blocked after {seconds:g}s")
        self._abort_output()

    def stop_reading(self) -> None:
        """End the read loop as if the peer had closed its end (signals, tests)."""
        self._read_scope.cancel()

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        assert self._tg is not None
        self._tg.start_soon(fn, *args)

    async def wait_handlers(self) -> None:
        """Until no request handler runs (an event only then: not one per request)."""
        if self._handlers == 0:
            await anyio.lowlevel.checkpoint()
            return
        if self._handlers_idle is None:
            self._handlers_idle = anyio.Event()
        await self._handlers_idle.wait()

    def after_reply(self, rid: Any, fn: Callable[[], None]) -> None:
        """Run ``fn`` right after the success response to inbound request ``rid`` is written (or
        queued behind what is already being written): what must reach the client after the answer
        (ACP's ``available_commands_update`` after ``session/new``). Dropped when the request
        fails or is cancelled."""
        entry = self._inbound.get(rid)
        if entry is not None:
            entry.after = [*(entry.after or ()), fn]

    def inbound(self, rid: Any) -> Inbound | None:
        """The open inbound request with this id (registered when read, before its handler runs)."""
        try:
            return self._inbound.get(rid)
        except TypeError:  # unhashable
            return None

    async def _read_loop(self) -> None:
        buf = bytearray()
        scan = 0
        discarding = False
        while True:
            try:
                chunk = await self.reader.receive()
            except _EOF_ERRORS:
                chunk = b""  # a stream that says EOF by exception; a plain reader returns b""
            except Exception as exc:
                self.log.warning(f"transport read failed: {exc!r}")
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
        await self._error(None, INVALID_REQUEST, f"Invalid request: frame exceeds the {self.max_frame} byte limit",
                          {"maxFrameBytes": self.max_frame})

    async def _error(self, rid: Any, code: int, message: str, data: Any = msgspec.UNSET,
                     details: str | None = None) -> None:
        await self._safe_write(ErrorResponse(id=rid, error=error_with_details(code, message, data, details)))

    async def _safe_write(self, message: Any) -> None:
        with contextlib.suppress(TransportClosed):
            await self.write(message)

    async def _frame(self, line: bytes) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            return
        self.read_seq += 1
        try:
            await self._dispatch(line)
        except Exception as exc:  # a frame never ends the connection
            self.log.warning(f"a frame could not be handled: {exc!r}")

    async def _dispatch(self, line: bytes) -> None:
        decoded = await self._decode(line)
        if decoded is None:
            return
        frame, bad_utf8 = decoded
        rid = frame.id
        has_id = rid is not msgspec.UNSET
        id_ok = has_id and (rid is None or type(rid) is int or type(rid) is str)  # null, integer or string
        reply_id = rid if id_ok else None
        if frame.method is msgspec.UNSET and self._took_response(frame, has_id, id_ok, bad_utf8):
            return  # (a frame with a method is never a response)
        if frame.jsonrpc != "2.0":
            await self._error(reply_id, INVALID_REQUEST, 'Invalid request: jsonrpc must be "2.0"')
            return
        if frame.method is not msgspec.UNSET:
            await self._incoming(frame, has_id, id_ok, reply_id, bad_utf8)
            return
        await self._error(reply_id, INVALID_REQUEST, "Invalid request",
                          details="not a request, a notification or a response")

    async def _decode(self, line: bytes) -> tuple[Frame, bool] | None:
        """The line's frame and whether the line was invalid UTF-8; None once the line has been
        answered with an error (too deep, not an object, not JSON)."""
        if line.count(b"[") + line.count(b"{") > MAX_DEPTH and nesting_depth_exceeds(line):  # (its own cheap test, first)
            await self._error(None, INVALID_REQUEST, f"Invalid request: nested deeper than {MAX_DEPTH} levels",
                              {"maxDepth": MAX_DEPTH})
            return None
        bad_utf8 = False
        if not line.isascii():
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                bad_utf8 = True  # not JSON; decoded leniently only to answer the right id
                line = line.decode("utf-8", "replace").encode("utf-8")
        try:
            return _FRAME.decode(line), bad_utf8
        except msgspec.ValidationError:  # valid JSON, wrong shape (array, scalar) or out-of-range numbers
            await self._error(None, INVALID_REQUEST, "Invalid request", details="a frame must be one JSON-RPC 2.0 object")
            return None
        except msgspec.DecodeError:
            fixed = _lone_surrogates_replaced(line) if b"\\u" in line else None
            try:
                if fixed is None:
                    raise
                return _FRAME.decode(fixed), bad_utf8  # lone surrogates (legal JSON) are carried as U+FFFD
            except msgspec.ValidationError:
                await self._error(None, INVALID_REQUEST, "Invalid request",
                                  details="a frame must be one JSON-RPC 2.0 object")
                return None
            except msgspec.DecodeError:
                await self._error(None, PARSE_ERROR, "Parse error", details="the line is not valid JSON")
                return None

    def _took_response(self, frame: Frame, has_id: bool, id_ok: bool, bad_utf8: bool) -> bool:
        """True when ``frame`` answers a request of ours: it settles the request, or (a later
        answer to a request already settled, in any shape) is only a debug note."""
        is_response = (
            frame.method is msgspec.UNSET and has_id
            and (frame.result is not msgspec.UNSET or frame.error is not msgspec.UNSET)
        )
        if not is_response:
            return False
        pending = self._pending.pop(frame.id, None) if id_ok else None
        if pending is not None:  # the first response settles the request; later ones find nothing
            self._settle(pending, frame, bad_utf8)
            return True
        if id_ok and (frame.jsonrpc == "2.0" or self._issued(frame.id)):
            self.log.debug(f"dropped a response to unknown or settled request id {frame.id!r}")
            return True
        return False

    async def _incoming(self, frame: Frame, has_id: bool, id_ok: bool, reply_id: RequestId, bad_utf8: bool) -> None:
        """A request (its handler started now, in order) or a notification from the other side."""
        if not isinstance(frame.method, str) or (has_id and not id_ok):
            await self._error(reply_id, INVALID_REQUEST, "Invalid request",
                              details="method must be a string and id a string, an integer or null")
            return
        params = frame.params if frame.params is not msgspec.UNSET else None
        if not has_id:
            if not bad_utf8:
                await self._notification(frame.method, params)
            return
        if bad_utf8:
            await self._error(frame.id, INVALID_PARAMS, "Invalid params: the frame is not valid UTF-8",
                              details="the frame is not valid UTF-8")
            return
        entry = Inbound(self.read_seq, frame.method, frame.method not in self.dispatcher.cancelled_by_handler)
        self._inbound[frame.id] = entry  # registered now: a cancel read next applies to it
        self._handlers += 1
        assert self._tg is not None
        self._tg.start_soon(self._handle, frame.id, frame.method, params, entry)

    def _issued(self, rid: Any) -> bool:
        return type(rid) is int and 0 <= rid < self._next_id

    def _settle(self, pending: _Pending, frame: Frame, bad_utf8: bool) -> None:
        """Anything but a well-formed result is an error for the requester (which fails closed)."""
        if frame.jsonrpc == "2.0" and frame.error is msgspec.UNSET and not bad_utf8:
            pending.result = frame.result  # type: ignore[assignment]
        else:
            err = frame.error if isinstance(frame.error, dict) else {}
            code = err.get("code")
            message = err.get("message")
            pending.error = RpcFailure(
                code if type(code) is int else INTERNAL_ERROR,
                message if isinstance(message, str) else "malformed response",
                err.get("data", msgspec.UNSET),
            )
        pending.done.set()

    async def _notification(self, method: str, params: msgspec.Raw | None) -> None:
        if method == "$/cancel_request":
            try:
                rid = _CANCEL_REQUEST.decode(params or b"{}").request_id
            except (msgspec.ValidationError, msgspec.DecodeError):
                self.log.debug("ignored a $/cancel_request without a valid requestId")
                return
            entry = self._inbound.get(rid)
            if entry is None:
                self.log.debug(f"$/cancel_request for unknown request id {rid!r} ignored")
                return
            entry.cancel_requested = True
            on_cancel = self.dispatcher.on_cancel_request
            if on_cancel is not None and on_cancel(rid, entry.method):
                return
            if entry.scope is None:  # a method whose cancel the hook promised to take
                self.log.warning(f"$/cancel_request for {entry.method} was not taken by the door; ignored")
                return
            entry.scope.cancel()  # before its handler starts, too: it then answers -32800 at once
            return
        handler = self.dispatcher.notification_handler(method)
        if handler is None:
            return  # unknown notifications are ignored, never answered
        try:
            result = handler(params)
            if result is not None:
                await result
        except Exception as exc:
            self.log.warning(f"notification {method} failed: {exc!r}")

    async def _handle(self, rid: RequestId, method: str, params: msgspec.Raw | None, entry: Inbound) -> None:
        reply: Any
        try:
            with entry.scope if entry.scope is not None else _UNSCOPED as scope:
                try:
                    gate = self.dispatcher.gate
                    if gate is not None:
                        gate(method)
                    handler = self.dispatcher.request_handler(method)
                    if handler is None:
                        raise RpcFailure(METHOD_NOT_FOUND, "Method not found", {"method": method},
                                         details=f"method not found: {method}")
                    if entry.cancel_requested:
                        await anyio.lowlevel.checkpoint()  # cancelled before it started
                    result = await handler(rid, params)
                    reply = Response(id=rid, result=result)
                except RpcFailure as exc:
                    reply = ErrorResponse(id=rid, error=exc.rpc_error())
                except Exception as exc:
                    self.log.warning(f"{method} failed: {exc!r}")
                    reply = ErrorResponse(id=rid, error=error_with_details(
                        INTERNAL_ERROR, f"Internal error: {exc}", details=str(exc) or type(exc).__name__))
            if scope.cancelled_caught:
                reply = ErrorResponse(id=rid, error=error_with_details(
                    REQUEST_CANCELLED, "Request cancelled", details="the client cancelled this request"))
            try:
                written = self.write_nowait(reply)
            except TransportClosed:
                written = True
            if not written:
                with anyio.CancelScope(shield=True):
                    await self._safe_write(reply)
            if entry.after and isinstance(reply, Response):
                for fn in entry.after:
                    try:
                        fn()
                    except Exception as exc:
                        self.log.warning(f"after answering {method}: {exc!r}")
        finally:
            if self._inbound.get(rid) is entry:
                del self._inbound[rid]
            self._handlers -= 1
            if self._handlers == 0 and self._handlers_idle is not None:
                self._handlers_idle.set()
                self._handlers_idle = None


def decode_params(params: msgspec.Raw | None, type_: type[T]) -> T:
    """Decode a request's params as ``type_`` or raise ``-32602`` naming what is wrong."""
    try:
        return msgspec.json.decode(params if params is not None else b"null", type=type_)
    except msgspec.ValidationError as exc:
        raise invalid_params(str(exc)) from None
    except msgspec.DecodeError as exc:  # e.g. invalid UTF-8 is caught per frame; kept as a guard
        raise invalid_params(str(exc)) from None
