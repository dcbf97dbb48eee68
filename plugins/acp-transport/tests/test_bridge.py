"""Unit and lifecycle tests of the ACP bridge: an in-process host served over real OS pipes,
driven by a raw JSON-RPC client so that malformed input can be sent byte for byte."""

from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_acp.fdstream import FdReader, FdWriter
from dsh_acp_transport import make_bridge, serve_bridge

from dsh_core import FunctionTool, hookimpl
from dsh_core.compose import Composition
from dsh_core.contracts import AgentSpec
from dsh_core.host import make_plugin_manager, open_host
from dsh_core.types import TextBlock, UserMessage
from dsh_testing import check_frames, streaming

pytestmark = pytest.mark.anyio


class RawClient:
    def __init__(self, writer: FdWriter, reader: FdReader) -> None:
        self.writer, self.reader = writer, reader
        self.buf = b""
        self.raw = bytearray()
        self.frames: list[dict[str, Any]] = []  # every frame received, in order
        self._next = 100

    async def send(self, msg: Any) -> None:
        data = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
        await self.writer.send(data + b"\n")

    async def recv(self, timeout: float = 10) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            while b"\n" not in self.buf:
                chunk = await self.reader.receive()
                if not chunk:
                    raise EOFError
                self.buf += chunk
                self.raw += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        frame = json.loads(line)
        self.frames.append(frame)
        return frame

    async def response(self, rid: Any, timeout: float = 10) -> dict[str, Any]:
        for f in self.frames:
            if f.get("id") == rid and "method" not in f:
                return f
        while True:
            f = await self.recv(timeout)
            if f.get("id") == rid and "method" not in f:
                return f

    async def call(self, method: str, params: Any = None, rid: Any = None) -> dict[str, Any]:
        if rid is None:
            rid, self._next = self._next, self._next + 1
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        return await self.response(rid)

    async def start(self, cwd: Path) -> str:
        assert "result" in await self.call("initialize", {"protocolVersion": 1})
        return (await self.call("session/new", {"cwd": str(cwd), "mcpServers": []}))["result"]["sessionId"]

    def close(self) -> None:
        self.writer.close()


@asynccontextmanager
async def served(script: Path, *extra: object, config: dict | None = None):
    c2a_r, c2a_w = os.pipe()
    a2c_r, a2c_w = os.pipe()
    pm = make_plugin_manager(trace=False)
    names = ["acp-transport", "scripted-model"]
    for i, plugin in enumerate(extra):
        pm.register(plugin, name=f"extra{i}")
    comp = Composition(name="t", path=Path("t/example.toml"), plugins=tuple(names), config=config or {})
    async with open_host(comp, provider="scripted", model=str(script), pm=pm) as host:
        bridge = make_bridge(host, FdReader(c2a_r), FdWriter(a2c_w))
        client = RawClient(FdWriter(c2a_w), FdReader(a2c_r))
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_bridge, bridge)
            try:
                yield client, bridge, host
            finally:
                client.close()
        os.close(a2c_w)
        while True:  # drain whatever is left, so every byte is schema-checked
            try:
                await client.recv(2)
            except (EOFError, TimeoutError, json.JSONDecodeError):
                break
        client.reader.close()
    check_frames(bytes(client.raw))


@pytest.fixture
def echo(scripted):
    return scripted({"rules": [{"when": "hang", "steps": [{"partial": "partial", "delay_ms": 60000}]}]})


# --------------------------------------------------------------------------- malformed input


async def test_malformed_frames_get_jsonrpc_errors_and_the_server_keeps_serving(echo, tmp_path):
    async with served(echo) as (client, _bridge, _host):
        cases = [
            (b'{"jsonrpc":"2.0","id":1,"method":', -32700),
            (b"[]", -32600),
            (b'[{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}]', -32600),
            (b"5", -32600),
            (b'"text"', -32600),
            (b'{"jsonrpc":"1.0","id":7,"method":"initialize","params":{}}', -32600),
            (b'{"jsonrpc":"2.0","id":{"x":1},"method":"initialize"}', -32600),
        ]
        for raw, code in cases:
            await client.send(raw)
            frame = await client.recv()
            assert frame["error"]["code"] == code, (raw, frame)
        # a request before initialize
        resp = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        assert resp["error"]["code"] == -32600 and "initialize" in resp["error"]["message"]
        sid = await client.start(tmp_path)
        # unknown method, wrong param types, unknown notification (no reply), bad cancel (no reply)
        resp = await client.call("session/frobnicate", {})
        assert resp["error"] == {"code": -32601, "message": "Method not found",
                                 "data": {"method": "session/frobnicate", "details": "method not found: session/frobnicate"}}
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": "not a list"})
        assert resp["error"]["code"] == -32602
        resp = await client.call("session/new", {"cwd": 5, "mcpServers": []})
        assert resp["error"]["code"] == -32602
        await client.send({"jsonrpc": "2.0", "method": "_ci/heartbeat", "params": {}})
        await client.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": 42}})
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]})
        assert resp["result"] == {"stopReason": "end_turn"}
        # notifications produced no output at all
        assert [f for f in client.frames if "id" not in f and f.get("method") != "session/update"] == []


async def test_ids_are_echoed_exactly_including_zero_and_strings(echo, tmp_path):
    async with served(echo) as (client, _bridge, _host):
        assert (await client.call("initialize", {"protocolVersion": 1}, rid=0))["id"] == 0
        resp = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}, rid="1")
        assert resp["id"] == "1" and "result" in resp


async def test_second_initialize_is_refused_and_authenticate_is_a_noop(echo, tmp_path):
    async with served(echo) as (client, _bridge, _host):
        await client.start(tmp_path)
        assert (await client.call("initialize", {"protocolVersion": 1}))["error"]["code"] == -32600
        assert (await client.call("authenticate", {"methodId": "x"}))["result"] == {}


@pytest.mark.parametrize(
    "params, message",
    [
        ({"cwd": "relative/dir", "mcpServers": []}, "Invalid params: cwd must be an absolute path: relative/dir"),
        ({"cwd": "/", "mcpServers": [{"name": "x", "command": "y", "args": [], "env": []}]},
         "Invalid params: mcpServers is not supported"),
        ({"cwd": "/", "mcpServers": [], "additionalDirectories": ["/extra"]},
         "Invalid params: additionalDirectories is not supported"),
        ({"cwd": "/definitely/not/here", "mcpServers": []}, "Invalid params: cwd is not a directory: /definitely/not/here"),
    ],
)
async def test_session_new_rules(echo, params, message):
    async with served(echo) as (client, _bridge, host):
        await client.call("initialize", {"protocolVersion": 1})
        resp = await client.call("session/new", params)
        assert resp["error"] == {"code": -32602, "message": message,
                                 "data": {"details": message.removeprefix("Invalid params: ")}}
        assert not host.agents  # nothing was created


async def test_session_ids_are_unguessable_and_distinct(echo, tmp_path):
    async with served(echo) as (client, _bridge, _host):
        await client.call("initialize", {"protocolVersion": 1})
        ids = {(await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["result"]["sessionId"]
               for _ in range(20)}
        assert len(ids) == 20 and all(len(i) == 32 for i in ids)


async def test_unknown_session_prompt_is_invalid_params_and_unknown_cancel_is_silent(echo, tmp_path):
    async with served(echo) as (client, _bridge, _host):
        await client.start(tmp_path)
        resp = await client.call("session/prompt", {"sessionId": "nope", "prompt": [{"type": "text", "text": "x"}]})
        assert resp["error"] == {"code": -32602, "message": "Invalid params: unknown session: nope",
                                 "data": {"details": "unknown session: nope"}}
        await client.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "nope"}})
        assert (await client.call("authenticate", {}))["result"] == {}


async def test_images_are_refused_when_not_advertised(echo, tmp_path):
    async with served(echo) as (client, _bridge, _host):
        sid = await client.start(tmp_path)
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}]})
        assert resp["error"] == {
            "code": -32602, "message": "Invalid params: inline image prompts were not advertised by this connection",
            "data": {"details": "inline image prompts were not advertised by this connection"}}


# --------------------------------------------------------------------------- large frames


async def test_frames_of_tens_of_mib_round_trip(scripted, tmp_path):
    script = scripted({"default": [{"text": "{prompt}"}]})
    big = "x" * (24 * 1024 * 1024)
    async with served(script) as (client, _bridge, _host):
        sid = await client.start(tmp_path)
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": big}]})
        assert resp["result"] == {"stopReason": "end_turn"}
        (chunk,) = [f for f in client.frames if f.get("method") == "session/update"]
        assert chunk["params"]["update"]["content"]["text"] == big


async def test_a_frame_over_the_limit_gets_an_error_and_the_connection_lives(echo, tmp_path):
    config = {"acp-transport": {"max-frame-bytes": 4096}}
    async with served(echo, config=config) as (client, _bridge, _host):
        sid = await client.start(tmp_path)
        await client.send({"jsonrpc": "2.0", "id": 9, "method": "session/prompt",
                           "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "y" * 100_000}]}})
        frame = await client.recv()
        assert frame["id"] is None and frame["error"]["code"] == -32600
        assert "4096" in frame["error"]["message"]
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "small"}]})
        assert resp["result"] == {"stopReason": "end_turn"}


# --------------------------------------------------------------------------- settlement and cancel


async def test_dollar_cancel_request_on_a_prompt_settles_cancelled(echo, tmp_path):
    async with served(echo) as (client, _bridge, _host):
        streamed = streaming(_host)
        sid = await client.start(tmp_path)
        await client.send({"jsonrpc": "2.0", "id": "p1", "method": "session/prompt",
                           "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "hang"}]}})
        with anyio.fail_after(5):
            await streamed.wait()
        await client.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "p1"}})
        assert (await client.response("p1"))["result"] == {"stopReason": "cancelled"}


async def test_cancel_without_a_prompt_cancels_autonomous_work(echo, tmp_path):
    async with served(echo) as (client, bridge, host):
        streamed = streaming(host)
        sid = await client.start(tmp_path)
        agent = bridge.sessions[sid].agent
        agent.submit(UserMessage(id="auto", content=[TextBlock(text="hang")]))  # work nobody prompted
        with anyio.fail_after(5):
            await streamed.wait()
        assert agent.busy
        await client.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}})
        with anyio.fail_after(5):
            await agent.wait_idle()
        # output of an owned agent driven by another producer is still delivered, in order
        assert [f["params"]["update"]["content"]["text"] for f in client.frames
                if f.get("method") == "session/update"] in ([], ["partial"])
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "next"}]})
        assert resp["result"] == {"stopReason": "end_turn"}  # an idle cancel does not poison the next prompt


async def test_an_unrelated_failure_before_inbox_receipt_is_not_the_prompts(scripted, tmp_path):
    script = scripted({"rules": [{"when": "boom", "steps": [{"error": "auth"}]}], "default": [{"text": "fine"}]})
    async with served(script) as (client, bridge, _host):
        sid = await client.start(tmp_path)
        agent = bridge.sessions[sid].agent
        agent.submit(UserMessage(id="auto", content=[TextBlock(text="boom")]))
        await agent.wait_idle()  # an autonomous turn failed before the prompt arrived
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "ok?"}]})
        assert resp.get("result") == {"stopReason": "end_turn"}, resp


async def test_correlated_model_error_rejects_at_quiescence_without_chunks(scripted, tmp_path):
    script = scripted({"default": [{"error": "context_length"}]})
    async with served(script) as (client, bridge, _host):
        sid = await client.start(tmp_path)
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]})
        assert resp["error"]["code"] == -32603
        assert resp["error"]["message"].startswith("Internal error: turn failed: simulated provider error (HTTP 400)")
        assert not [f for f in client.frames if f.get("method") == "session/update"]
        assert not agent_busy(bridge, sid)


def agent_busy(bridge, sid):
    return bridge.sessions[sid].agent.busy


async def test_length_finish_settles_end_turn_and_keeps_its_text(scripted, tmp_path):
    script = scripted({"default": [{"finish": "length", "text": "cut short"}]})
    async with served(script) as (client, _bridge, _host):
        sid = await client.start(tmp_path)
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]})
        # end_turn (ACP-7), and _meta says why, for a client that reads it (a parent dsh)
        assert resp["result"] == {"stopReason": "end_turn", "_meta": {"dsh": {"turnEnd": "max-tokens"}}}
        assert client.frames[-2]["params"]["update"]["content"]["text"] == "cut short"


async def test_every_chunk_precedes_the_response_and_text_blocks_each_become_one_chunk(scripted, tmp_path):
    script = scripted({"default": [{"tool": "noop", "args": {}, "text": "first"}, {"text": "second"}]})

    class Noop:
        @hookimpl
        def dsh_register_tools(self, register):
            async def noop(args, ctx):
                return "ok"
            register(FunctionTool("noop", "no-op", {"type": "object"}, noop))

    async with served(script, Noop()) as (client, _bridge, _host):
        sid = await client.start(tmp_path)
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]})
        texts = [f["params"]["update"]["content"]["text"] for f in client.frames if f.get("method") == "session/update"]
        assert texts == ["first", "second"]
        assert client.frames.index(resp) == len(client.frames) - 1


# --------------------------------------------------------------------------- permission ownership


class Fallback:
    name = "fallback"

    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def answer(self, request):
        self.seen.append(request)
        return "rejected"


async def test_foreign_and_call_less_requests_are_delegated(echo, tmp_path):
    from dsh_core.types import ApprovalRequest

    async with served(echo) as (client, bridge, host):
        sid = await client.start(tmp_path)
        fallback = Fallback()
        host.approvals._answerers.insert(0, fallback)  # an older answerer, tried after the bridge
        owned = bridge.sessions[sid].agent
        impostor = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=owned.route.model,
                                               session_id=sid))  # same id, different object
        assert await host.approvals.request(ApprovalRequest(agent=impostor, tool_name="t", call_id="c", reason="r")) == "rejected"
        assert await host.approvals.request(ApprovalRequest(agent=owned, tool_name="t", call_id=None, reason="r")) == "rejected"
        assert len(fallback.seen) == 2
        assert not [f for f in client.frames if f.get("method") == "session/request_permission"]
        await impostor.dispose()


# --------------------------------------------------------------------------- teardown


async def test_eof_settles_in_flight_prompts_cancelled_and_disposes_every_agent(echo, tmp_path):
    async with served(echo) as (client, bridge, host):
        streamed = streaming(host, calls=3)
        await client.call("initialize", {"protocolVersion": 1})
        sids = [(await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["result"]["sessionId"]
                for _ in range(3)]
        for n, sid in enumerate(sids):
            await client.send({"jsonrpc": "2.0", "id": f"p{n}", "method": "session/prompt",
                               "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "hang"}]}})
        with anyio.fail_after(5):
            await streamed.wait()
        agents = [bridge.sessions[s].agent for s in sids]
        client.close()  # stdin EOF
        for n in range(3):
            assert (await client.response(f"p{n}"))["result"] == {"stopReason": "cancelled"}
        with anyio.fail_after(5):
            await bridge.quiesce()  # memoized: the second call waits for the same routine
        assert all(a.disposed and not a.busy for a in agents)
        assert bridge.closed and not host.agents


async def test_requests_after_close_get_disposed_errors(echo, tmp_path):
    from dsh_acp.rpc import RpcFailure

    async with served(echo) as (client, bridge, _host):
        await client.start(tmp_path)
        await bridge.quiesce()
        with pytest.raises(RpcFailure) as err:
            await bridge.new_session(0, b'{"cwd": "/", "mcpServers": []}')
        assert err.value.code == -32603
        assert err.value.message == ("Internal error: the connection is closing (the client closed stdin, or the agent "
                                     "was signalled to stop); no session was created")


async def test_teardown_raises_every_disposal_failure_together(echo, tmp_path):
    with pytest.raises(BaseExceptionGroup) as outer:  # … and the connection's serve() reports it too
        await _broken_teardown(echo, tmp_path)
    assert "ACP agent teardown failed" in repr(outer.value)


async def _broken_teardown(echo, tmp_path):
    async with served(echo) as (client, bridge, _host):
        await client.call("initialize", {"protocolVersion": 1})
        for _ in range(2):
            await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        for s in bridge.sessions.values():
            async def broken(agent=s.agent):
                raise RuntimeError(f"cannot dispose {agent.session_id[:4]}")
            s.agent.dispose = broken
        with pytest.raises(ExceptionGroup) as err:
            await bridge.quiesce()
        assert "ACP agent teardown failed for 2 session(s)" in str(err.value)
        assert len(err.value.exceptions) == 2
        with pytest.raises(ExceptionGroup):  # memoized: the same failure, not a second teardown
            await bridge.quiesce()


# --------------------------------------------------------------------------- images


class SlowStore:
    """An attachment store whose save takes a while (to cancel during admission)."""

    name = "slow"
    mime_types = ("image/png",)

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.finished = False

    async def save_images(self, batch):
        from dsh_core.types import ImageBlock

        self.started.set()
        await anyio.sleep(0.3)
        self.finished = True
        return [ImageBlock(digest="sha256:" + "0" * 64, mime=m, size=len(d)) for m, d in batch]

    async def read_image(self, ref):  # pragma: no cover - not used here
        raise AssertionError


class StorePlugin:
    def __init__(self, store) -> None:
        self.store = store

    @hookimpl
    def dsh_attachment_store(self, host):
        return self.store


def _png_b64() -> str:
    import base64

    from dsh_testing import make_png

    return base64.b64encode(make_png()).decode()


async def test_cancel_during_image_admission_waits_for_the_write_and_publishes_nothing(scripted, tmp_path):
    script = scripted({"capabilities": {"image_input": True}})
    store = SlowStore()
    async with served(script, StorePlugin(store)) as (client, _bridge, host):
        sid = await client.start(tmp_path)
        await client.send({"jsonrpc": "2.0", "id": "img", "method": "session/prompt", "params": {
            "sessionId": sid, "prompt": [{"type": "text", "text": "see"},
                                         {"type": "image", "data": _png_b64(), "mimeType": "image/png"}]}})
        await store.started.wait()
        await client.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}})
        assert (await client.response("img"))["result"] == {"stopReason": "cancelled"}
        assert store.finished  # the started write was awaited, not abandoned
        events = host.session_store.logs[sid].events
        assert not [e for e in events if type(e).__name__ == "UserMessageEvent"]  # no late message
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "next"}]})
        assert resp["result"] == {"stopReason": "end_turn"}


async def test_image_admission_rechecks_the_sessions_current_route(scripted, tmp_path):
    vision = scripted({"capabilities": {"image_input": True}})
    text_only = scripted({"capabilities": {"image_input": False}})
    async with served(vision, StorePlugin(SlowStore())) as (client, bridge, _host):
        init = await client.call("initialize", {"protocolVersion": 1})
        assert init["result"]["agentCapabilities"]["promptCapabilities"]["image"] is True
        sid = (await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["result"]["sessionId"]
        bridge.sessions[sid].agent.set_route(str(text_only))  # the session's route changed since initialize
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [
            {"type": "image", "data": _png_b64(), "mimeType": "image/png"}]})
        assert resp["error"] == {"code": -32602,
                                 "message": f'Invalid params: model "{text_only}" does not declare image input',
                                 "data": {"details": f'model "{text_only}" does not declare image input'}}


@pytest.mark.parametrize("store, image_route, advertised", [
    (False, False, False), (False, True, False), (True, False, False), (True, True, True)])
async def test_capability_matrix(scripted, tmp_path, store, image_route, advertised):
    script = scripted({"capabilities": {"image_input": image_route}})
    extra = [StorePlugin(SlowStore())] if store else []
    async with served(script, *extra) as (client, _bridge, _host):
        init = await client.call("initialize", {"protocolVersion": 1})
        assert init["result"]["agentCapabilities"]["promptCapabilities"] == {
            "image": advertised, "audio": False, "embeddedContext": True}


async def test_a_failing_store_is_an_internal_error(scripted, tmp_path):
    class Broken(SlowStore):
        async def save_images(self, batch):
            raise OSError("disk full")

    script = scripted({"capabilities": {"image_input": True}})
    async with served(script, StorePlugin(Broken())) as (client, _bridge, _host):
        sid = await client.start(tmp_path)
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [
            {"type": "image", "data": _png_b64(), "mimeType": "image/png"}]})
        assert resp["error"] == {"code": -32603, "message": "Internal error: unable to persist the prompt image batch",
                                 "data": {"details": "unable to persist the prompt image batch"}}


# --------------------------------------------------------------------------- session/close (issue 17)


async def test_close_frees_the_session_agent_and_all_per_session_state(echo, tmp_path):
    import gc
    import weakref

    async with served(echo) as (client, bridge, host):
        sid = await client.start(tmp_path)
        refs = [weakref.ref(bridge.sessions[sid]), weakref.ref(bridge.sessions[sid].agent)]
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]})
        assert resp["result"]["stopReason"] == "end_turn"
        assert sid in host.provider("scripted")._cursors  # the provider kept per-session state
        assert (await client.call("session/close", {"sessionId": sid}))["result"] == {}
        assert bridge.sessions == {} and bridge.closing == {} and host.agents == set()
        assert sid not in host.provider("scripted")._cursors  # Agent.dispose told the provider to forget
        assert not any(e.method == "session/prompt" for e in bridge.peer._inbound.values())
        with anyio.fail_after(5):  # no delivery worker runs once its output is out
            while any(r() is not None for r in refs):  # then nothing holds the session or its agent
                await anyio.sleep(0.01)
                gc.collect()
        again = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]})
        assert again["error"]["code"] == -32602 and "unknown session" in again["error"]["message"]


async def test_an_idle_session_holds_no_delivery_worker_and_queued_output_keeps_its_order(echo, tmp_path):
    from dsh_acp import wire

    async with served(echo) as (client, bridge, _host):
        sid = await client.start(tmp_path)
        resp = await client.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]})
        assert resp["result"]["stopReason"] == "end_turn"
        delivery = bridge.sessions[sid].delivery
        assert not delivery._working and delivery._line is None and delivery._changed is None  # text went out at once
        # an update waits for the worker; text pushed behind it must not overtake it
        delivery.push_update(wire.MessageChunk(content=wire.TextOut(text="queued"), message_id="m1"))
        delivery.push(TextBlock(text="behind"), "m2")
        assert delivery._working and len(delivery._line or ()) == 2
        with anyio.fail_after(5):
            await delivery.drain()
        assert not delivery._working and delivery._line is None
        texts: list[str] = []
        with anyio.fail_after(5):
            while len(texts) < 2:
                frame = await client.recv()
                if frame.get("method") == "session/update":
                    texts.append(frame["params"]["update"]["content"]["text"])
        assert texts == ["queued", "behind"]
        delivery.push(TextBlock(text="alone"), "m3")  # nothing waits again: written at once, no worker
        assert not delivery._working
        delivery.close()
        with pytest.raises(anyio.ClosedResourceError):
            delivery.push(TextBlock(text="late"), "m4")
