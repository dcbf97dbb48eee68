"""Two ``Peer``s talking over in-memory anyio byte streams (no fds, no processes): requests and
their answers, notifications, errors, cancellation and EOF, through the ``Dispatcher``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import msgspec
import pytest
from dsh_acp.rpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_CANCELLED,
    Dispatcher,
    Peer,
    RpcFailure,
    decode_params,
)
from dsh_acp.wire import CancelParams

pytestmark = pytest.mark.anyio


class Add(msgspec.Struct):
    a: int
    b: int


class Tap(anyio.abc.ByteSendStream):
    """A byte send stream into a memory object stream that also keeps every byte sent."""

    def __init__(self, send: anyio.abc.ObjectSendStream[bytes]) -> None:
        self._send = send
        self.sent = bytearray()

    async def send(self, item: bytes) -> None:
        self.sent += item
        await self._send.send(item)

    async def aclose(self) -> None:
        await self._send.aclose()

    def frames(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in bytes(self.sent).splitlines()]


@asynccontextmanager
async def pair(server: Dispatcher, client: Dispatcher | None = None) -> AsyncIterator[tuple[Peer, Peer, Tap, Tap]]:
    """(client peer, server peer, what the client wrote, what the server wrote), both serving."""
    c2s_send, c2s_recv = anyio.create_memory_object_stream[bytes](100)
    s2c_send, s2c_recv = anyio.create_memory_object_stream[bytes](100)
    c_out, s_out = Tap(c2s_send), Tap(s2c_send)
    c = Peer(s2c_recv, c_out, client, name="client")
    s = Peer(c2s_recv, s_out, server, name="server")
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.serve)
        tg.start_soon(c.serve)
        await anyio.sleep(0)
        try:
            with anyio.fail_after(10):
                yield c, s, c_out, s_out
        finally:
            await c_out.aclose()  # EOF for the server, which then closes its side
            await s_out.aclose()


def adder() -> Dispatcher:
    d = Dispatcher()

    async def add(rid: Any, params: msgspec.Raw | None) -> int:
        p = decode_params(params, Add)  # typed: p is an Add
        return p.a + p.b

    d.on_request("add", add)
    return d


async def test_a_request_gets_its_answer():
    async with pair(adder()) as (c, _s, _c_out, s_out):
        assert msgspec.json.decode(await c.request("add", {"a": 2, "b": 3})) == 5
        assert msgspec.json.decode(await c.request("add", {"a": -1, "b": 1})) == 0
    assert s_out.frames() == [
        {"jsonrpc": "2.0", "id": 0, "result": 5},
        {"jsonrpc": "2.0", "id": 1, "result": 0},
    ]


async def test_concurrent_requests_are_matched_by_id():
    d = Dispatcher()
    server_out: list[Any] = []

    async def slow_echo(rid: Any, params: msgspec.Raw | None) -> Any:
        value = msgspec.json.decode(params or b"null")
        with anyio.fail_after(5):  # the first asked answers last: value v once 2 - v answers are out
            while len(server_out[0].frames()) < 2 - value:
                await anyio.sleep(0)
        return value

    d.on_request("echo", slow_echo)
    results: dict[int, Any] = {}
    async with pair(d) as (c, _s, _c_out, s_out):
        server_out.append(s_out)

        async def ask(n: int) -> None:
            results[n] = msgspec.json.decode(await c.request("echo", n))

        async with anyio.create_task_group() as tg:
            for n in range(3):
                tg.start_soon(ask, n)
    assert results == {0: 0, 1: 1, 2: 2}
    assert [f["id"] for f in s_out.frames()] == [2, 1, 0]


async def test_a_notification_reaches_its_handler_and_is_never_answered():
    got: list[Any] = []
    d = adder()

    def on_note(params: msgspec.Raw | None) -> None:
        got.append(decode_params(params, CancelParams).session_id)

    d.on_notification("session/cancel", on_note)
    async with pair(d) as (c, _s, _c_out, s_out):
        await c.notify("session/cancel", {"sessionId": "s1"})
        await c.notify("no/such/notification", {})
        await c.notify("session/cancel", {"no": "sessionId"})  # its handler fails: only a warning
        # frames are handled in the order read: once this is answered, the notifications were seen
        assert msgspec.json.decode(await c.request("add", {"a": 0, "b": 0})) == 0
    assert got == ["s1"]
    assert s_out.frames() == [{"jsonrpc": "2.0", "id": 0, "result": 0}]  # no notification was answered


async def test_errors_unknown_method_invalid_params_gate_and_handler_failure():
    d = adder()

    async def broken(rid: Any, params: msgspec.Raw | None) -> Any:
        raise RuntimeError("boom")

    d.on_request("broken", broken)

    def gate(method: str) -> None:
        if method == "closed":
            raise RpcFailure(INVALID_REQUEST, "Invalid request: closed", details="the door is closed")

    d.gate = gate
    async with pair(d) as (c, _s, _c_out, _s_out):
        with pytest.raises(RpcFailure) as err:
            await c.request("nope", {})
        assert err.value.code == METHOD_NOT_FOUND
        with pytest.raises(RpcFailure) as err:
            await c.request("add", {"a": "two", "b": 3})
        assert err.value.code == INVALID_PARAMS and "Expected `int`" in err.value.message
        with pytest.raises(RpcFailure) as err:
            await c.request("closed", {})
        assert err.value.code == INVALID_REQUEST and err.value.data == {"details": "the door is closed"}
        with pytest.raises(RpcFailure) as err:
            await c.request("broken", {})
        assert err.value.code == -32603 and err.value.data == {"details": "boom"}
        # the connection is still fine
        assert msgspec.json.decode(await c.request("add", {"a": 1, "b": 1})) == 2


async def test_a_malformed_line_is_a_parse_error_and_the_peer_keeps_serving():
    c2s_send, c2s_recv = anyio.create_memory_object_stream[bytes](100)
    s2c_send, _s2c_recv = anyio.create_memory_object_stream[bytes](100)
    out = Tap(s2c_send)
    s = Peer(c2s_recv, out, adder(), name="server")
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.serve)
        # one frame split across chunks, a garbage line, then a frame merged with the next chunk
        await c2s_send.send(b'{"jsonrpc":"2.0","id":1,"meth')
        await c2s_send.send(b'od":"add","params":{"a":1,"b":2}}\nnot json\n{"jsonrpc":"2.0","id":2,')
        await c2s_send.send(b'"method":"add","params":{"a":3,"b":4}}\n')
        await c2s_send.aclose()
    frames = out.frames()
    assert {"jsonrpc": "2.0", "id": 1, "result": 3} in frames
    assert {"jsonrpc": "2.0", "id": 2, "result": 7} in frames
    parse = [f for f in frames if "error" in f]
    assert len(parse) == 1 and parse[0]["id"] is None and parse[0]["error"]["code"] == -32700


async def test_a_cancelled_request_cancels_the_handler_which_answers_request_cancelled():
    started, finished = anyio.Event(), anyio.Event()
    outcome: list[str] = []
    d = Dispatcher()

    async def hang(rid: Any, params: msgspec.Raw | None) -> Any:
        started.set()
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            outcome.append("cancelled")
            raise
        finally:
            finished.set()

    d.on_request("hang", hang)
    async with pair(d) as (c, _s, c_out, s_out):
        with anyio.move_on_after(5) as scope:
            async with anyio.create_task_group() as tg:

                async def ask() -> None:
                    await c.request("hang", {})

                tg.start_soon(ask)
                await started.wait()
                tg.cancel_scope.cancel()  # the caller gives up: the peer sends $/cancel_request
        assert not scope.cancelled_caught
        await finished.wait()
        with anyio.fail_after(5):
            while not s_out.frames():
                await anyio.sleep(0.01)
    assert outcome == ["cancelled"]
    assert c_out.frames()[-1] == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 0}}
    answer = s_out.frames()[0]
    assert answer["id"] == 0 and answer["error"]["code"] == REQUEST_CANCELLED


async def test_the_dispatcher_may_take_over_a_cancel_request():
    taken: list[tuple[Any, str]] = []
    release = anyio.Event()
    d = Dispatcher()

    async def work(rid: Any, params: msgspec.Raw | None) -> Any:
        await release.wait()
        return "settled my way"

    def on_cancel_request(rid: Any, method: str) -> bool:
        taken.append((rid, method))
        release.set()  # e.g. the door turns it into session/cancel and answers normally
        return True

    d.on_request("work", work)
    d.on_cancel_request = on_cancel_request
    async with pair(d) as (_c, _s, c_out, s_out):
        await c_out.send(b'{"jsonrpc":"2.0","id":"w","method":"work","params":{}}\n')
        await c_out.send(b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"w"}}\n')
        with anyio.fail_after(5):
            while not s_out.frames():
                await anyio.sleep(0.01)
    assert taken == [("w", "work")]
    assert s_out.frames() == [{"jsonrpc": "2.0", "id": "w", "result": "settled my way"}]


async def test_a_method_cancelled_by_its_handler_runs_without_a_peer_scope_and_its_cancel_goes_to_the_hook():
    taken: list[tuple[Any, str]] = []
    release = anyio.Event()
    scoped: list[bool] = []
    d = Dispatcher()

    async def work(rid: Any, params: msgspec.Raw | None) -> Any:
        await release.wait()
        return "settled my way"

    async def other(rid: Any, params: msgspec.Raw | None) -> Any:
        await anyio.sleep(60)

    def on_cancel_request(rid: Any, method: str) -> bool:
        taken.append((rid, method))
        if method == "work":
            release.set()
            return True
        return False

    d.on_request("work", work)
    d.on_request("other", other)
    d.on_cancel_request = on_cancel_request
    d.cancelled_by_handler = frozenset({"work"})
    async with pair(d) as (_c, server, c_out, s_out):
        await c_out.send(b'{"jsonrpc":"2.0","id":"w","method":"work","params":{}}\n')
        await c_out.send(b'{"jsonrpc":"2.0","id":"o","method":"other","params":{}}\n')
        with anyio.fail_after(5):
            while server.inbound("o") is None:
                await anyio.sleep(0.01)
        scoped = [server.inbound("w").scope is None, server.inbound("o").scope is not None]
        await c_out.send(b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"w"}}\n')
        await c_out.send(b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"o"}}\n')
        with anyio.fail_after(5):
            while len(s_out.frames()) < 2:
                await anyio.sleep(0.01)
    assert scoped == [True, True]
    assert taken == [("w", "work"), ("o", "other")]
    frames = {f["id"]: f for f in s_out.frames()}
    assert frames["w"] == {"jsonrpc": "2.0", "id": "w", "result": "settled my way"}
    assert frames["o"]["error"]["code"] == -32800  # the peer's own scope cancelled it


async def test_eof_fails_outstanding_requests_and_ends_serve():
    d = Dispatcher()
    started = anyio.Event()

    async def never(rid: Any, params: msgspec.Raw | None) -> Any:
        started.set()
        await anyio.sleep(60)

    d.on_request("never", never)
    c2s_send, c2s_recv = anyio.create_memory_object_stream[bytes](100)
    s2c_send, s2c_recv = anyio.create_memory_object_stream[bytes](100)
    c = Peer(s2c_recv, Tap(c2s_send), name="client")
    s = Peer(c2s_recv, Tap(s2c_send), d, name="server")
    errors: list[RpcFailure] = []
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.serve)

            async def serve_then_hang_up() -> None:
                await s.serve(grace=0.1)  # EOF from the client: the handler gets 0.1 s, then is cancelled
                await s2c_send.aclose()  # … and the client reads EOF in turn

            tg.start_soon(serve_then_hang_up)

            async def ask() -> None:
                try:
                    await c.request("never", {})
                except RpcFailure as exc:
                    errors.append(exc)

            tg.start_soon(ask)
            await started.wait()
            await c2s_send.aclose()
    assert s.closed and c.closed
    assert [e.message for e in errors] == ["connection closed"]
    with pytest.raises(Exception, match="connection closed"):
        await c.request("never", {})
