"""A real DeepSeek-compatible HTTP server on loopback, for tests (plugin README, "Tests").

Stdlib only: ``http.server.ThreadingHTTPServer`` in a daemon thread, HTTP/1.1 with
chunked transfer encoding for streams. Scripted per chat request with ``Turn`` (an
answer plus transport behaviour) or ``Fault`` (an HTTP error); an empty script answers
``ok``. Every request is recorded (method, path, headers, parsed body, arrival time,
events sent, whether the client went away) for assertions.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import select
import socket
import string
import struct
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODELS = {
    # id: (display name, image input)
    "deepseek-flash": ("DeepSeek-V4.1-Flash", True),
    "deepseek-v4-pro": ("DeepSeek-V4-Pro", False),
    "deepseek-v4-flash": ("DeepSeek-V4.1-Flash", True),
    "deepseek-v4-flash-vision-exp": ("DeepSeek-V4.1-Flash", True),
}
EFFORTS = {"low", "medium", "high", "max", "minimal", "xhigh", "ultra"}
REASONING_400 = "The `reasoning_content` in the thinking mode must be passed back to the API."
TOOL_CHOICE_400 = "Thinking mode does not support this tool_choice"
CONTEXT_WINDOW = 1_048_576
MAX_OUTPUT = 393_216


@dataclass
class Turn:
    """One scripted answer and how to deliver it."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON text)
    finish_reason: str | None = None  # default: tool_calls when there are calls, else stop
    usage_mode: str = "attached"  # attached | trailing | both
    queue_s: float = 0.0  # keep-alive comments before the first event
    delay_per_event_s: float = 0.0
    interleave: bool = False  # interleave the argument fragments of parallel calls
    malformed_after: int | None = None  # write a broken JSON event after n events
    close_after: int | None = None  # end the stream after n events, before [DONE]
    close_mode: str = "clean"  # clean (proper chunked EOF) | reset (TCP RST)
    stall: bool = False  # after the text, keep-alives forever (tests the overall deadline)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Fault:
    """An HTTP error answer with DeepSeek's error body."""

    status: int
    message: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    type: str = "invalid_request_error"
    raw_body: bytes | None = None


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    time: float
    status: int = 0
    events_sent: int = 0
    cancelled: bool = False
    finished: bool = False
    prompt_tokens: int = 0
    cache_hit_tokens: int = 0


_DEFAULT_ERRORS = {
    400: ("Invalid Format", "invalid_request_error"),
    401: ("Authentication Fails (no such user)", "authentication_error"),
    402: ("Insufficient Balance", "unknown_error"),
    422: ("Invalid Parameters", "invalid_request_error"),
    429: ("Rate Limit Reached", "rate_limit_error"),
    500: ("Server Error", "server_error"),
    502: ("Bad Gateway", "server_error"),
    503: ("Server Overloaded", "server_error"),
}


def error_body(message: str, type_: str = "invalid_request_error") -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": None, "code": "invalid_request_error"}}
    ).encode()


class _Reject(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error") -> None:
        self.status, self.message, self.type = status, message, type_


class _Gone(Exception):
    """The client closed the connection."""


# --------------------------------------------------------------------------- token model


def _tokens(piece: str) -> list[bytes]:
    raw = piece.encode("utf-8")
    return [raw[i : i + 4] for i in range(0, len(raw), 4)]


def _count(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 4)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type") == "text":
                    out.append(str(part.get("text", "")))
                elif part.get("type") == "image_url":
                    out.append("<image:" + str((part.get("image_url") or {}).get("url", ""))[-64:] + ">")
        return "".join(out)
    return ""


def _calls_text(calls: Any) -> str:
    out = []
    for c in calls or []:
        fn = c.get("function") or {}
        out.append(f"{c.get('id')}|{fn.get('name')}|{fn.get('arguments')};")
    return "".join(out)


def _tool_spans(messages: list[dict[str, Any]]) -> list[bool]:
    """For each message: does it sit in a user→user span that contains a tool call?"""
    flags = [False] * len(messages)
    start = 0
    for i in range(len(messages) + 1):
        if i == len(messages) or messages[i].get("role") == "user":
            has = any(m.get("role") == "assistant" and m.get("tool_calls") for m in messages[start:i])
            for j in range(start, i):
                flags[j] = has
            start = i + 1
    return flags


def render_assistant(reasoning: str | None, content: str, calls: Any, with_reasoning: bool) -> list[bytes]:
    seq = _tokens("<|assistant|>")
    if with_reasoning and isinstance(reasoning, str):
        seq += _tokens(reasoning)
    seq += _tokens(content or "")
    seq += _tokens(_calls_text(calls))
    return seq


def render_prompt(body: dict[str, Any]) -> list[bytes]:
    seq: list[bytes] = []
    if body.get("tools"):
        seq += _tokens(json.dumps(body["tools"], ensure_ascii=False, separators=(",", ":")))
    messages = body["messages"]
    spans = _tool_spans(messages)
    for m, in_span in zip(messages, spans, strict=False):
        role = m.get("role")
        if role == "assistant":
            seq += render_assistant(m.get("reasoning_content"), _content_text(m.get("content")), m.get("tool_calls"), in_span)
        else:
            seq += _tokens(f"<|{role}|>") + _tokens(_content_text(m.get("content")))
            if role == "tool":
                seq += _tokens(str(m.get("tool_call_id")))
    return seq


def _lcp(a: list[bytes], b: list[bytes]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# --------------------------------------------------------------------------- the server


class FakeDeepSeek:
    def __init__(
        self,
        *,
        api_key: str = "sk-fake-test-0123456789abcdef",
        seed: int = 7,
        keepalive_every_s: float = 1.0,
        usage_always: bool = False,
        crlf: bool = False,
        max_concurrency: int | None = None,
        context_window: int = CONTEXT_WINDOW,
        block: int = 64,
        cache_enabled: bool = True,
        strict_span: bool = False,
        balance: str = "110.00",
        max_write: int = 64,
    ) -> None:
        self.api_key = api_key
        self.seed = seed
        self.keepalive_every_s = keepalive_every_s
        self.usage_always = usage_always
        self.crlf = crlf
        self.max_concurrency = max_concurrency
        self.context_window = context_window
        self.block = block
        self.cache_enabled = cache_enabled
        self.strict_span = strict_span
        self.balance = balance
        self.max_write = max_write
        self.script: deque[Turn | Fault] = deque()
        self.requests: list[Recorded] = []
        self._cache: dict[tuple[str, str], list[list[bytes]]] = {}
        self._in_flight: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._chat_index = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> FakeDeepSeek:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeDeepSeek:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def push(self, *items: Turn | Fault) -> None:
        self.script.extend(items)

    @property
    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def wait_for(self, predicate: Any, timeout: float = 5.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            time.sleep(0.01)
        return predicate()

    # -- validation (first match wins) -------------------------------------

    def validate(self, body: Any) -> tuple[bool, list[bytes]]:
        _check_shape(body)
        messages = body["messages"]
        model = body["model"]
        if model not in MODELS:
            raise _Reject(400, "Model Not Exist")
        thinking = not (isinstance(body.get("thinking"), dict) and body["thinking"].get("type") == "disabled")
        effort = body.get("reasoning_effort")
        if effort is not None and effort not in EFFORTS:
            raise _Reject(400, f"Invalid reasoning_effort: {effort}")
        choice = body.get("tool_choice")
        if thinking and (choice == "required" or isinstance(choice, dict)):
            raise _Reject(400, TOOL_CHOICE_400)
        if thinking:
            self._check_reasoning(messages)
        _check_tool_ids(messages)
        prompt = self._check_length(body, thinking)
        if not MODELS[model][1]:
            _check_no_images(model, messages)
        return thinking, prompt

    def _check_reasoning(self, messages: list[dict[str, Any]]) -> None:
        """Thinking mode: an assistant message with tool calls (or, strict, any in a tool span)
        must carry its reasoning_content back."""
        spans = _tool_spans(messages)
        for m, in_span in zip(messages, spans, strict=False):
            if m["role"] != "assistant":
                continue
            needs = bool(m.get("tool_calls")) or (self.strict_span and in_span)
            if needs and not isinstance(m.get("reasoning_content"), str):
                raise _Reject(400, REASONING_400)

    def _check_length(self, body: dict[str, Any], thinking: bool) -> list[bytes]:
        """The rendered prompt, once max_tokens is in range and prompt plus completion fit the window."""
        max_tokens = body.get("max_tokens", 8192 if not thinking else 65536)
        if not isinstance(max_tokens, int) or max_tokens < 1 or max_tokens > MAX_OUTPUT:
            raise _Reject(400, f"Invalid max_tokens value, the valid range of max_tokens is [1, {MAX_OUTPUT}]")
        prompt = render_prompt(body)
        if len(prompt) + max_tokens > self.context_window:
            raise _Reject(
                400,
                f"This model's maximum context length is {self.context_window} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.",
            )
        return prompt

    # -- cache accounting ----------------------------------------------------

    def account(self, key: str, user: str, prompt: list[bytes]) -> int:
        if not self.cache_enabled:
            return 0
        with self._lock:
            stored = self._cache.setdefault((key, user), [])
            best = max((_lcp(prompt, s) for s in stored), default=0)
            stored.append(prompt)
        return (best // self.block) * self.block

    def remember_output(self, key: str, user: str, seq: list[bytes]) -> None:
        if self.cache_enabled:
            with self._lock:
                self._cache.setdefault((key, user), []).append(seq)

    def next_item(self) -> Turn | Fault:
        with self._lock:
            self._chat_index += 1
            return self.script.popleft() if self.script else Turn(content="ok")


def _deser(where: str, what: str) -> _Reject:
    return _Reject(422, f"Failed to deserialize the JSON body into the target type: {where}: {what} at line 1 column 1")


def _check_shape(body: Any) -> None:
    """The body deserializes into a chat request: an object, messages, a model, known roles and
    content of the right type (422 otherwise)."""
    if not isinstance(body, dict):
        raise _deser("", "invalid type: expected struct ChatCompletionRequest")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _deser("messages", "invalid length 0, expected at least one message")
    if not isinstance(body.get("model"), str):
        raise _deser("model", "missing field `model`")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in {"system", "user", "assistant", "tool"}:
            raise _deser(f"messages[{i}]", "unknown variant, expected one of `system`, `user`, `assistant`, `tool`")
        role, content = m["role"], m.get("content", ...)
        if role in ("system", "tool", "user") and content is ...:
            raise _deser(f"messages[{i}]", "missing field `content`")
        if role in ("system", "tool", "assistant") and isinstance(content, list):
            raise _deser(f"messages[{i}]", "invalid type: sequence, expected a string")
        if role == "user" and not isinstance(content, (str, list)):
            raise _deser(f"messages[{i}]", "invalid type, expected a string or a sequence")


def _check_tool_ids(messages: list[dict[str, Any]]) -> None:
    """Assistant messages have content or tool calls; a tool message answers an earlier call."""
    seen_calls: set[str] = set()
    for m in messages:
        if m["role"] == "assistant":
            if m.get("content") is None and not m.get("tool_calls"):
                raise _Reject(400, "content or tool_calls must be set")
            for c in m.get("tool_calls") or []:
                seen_calls.add(c.get("id"))
        if m["role"] == "tool" and m.get("tool_call_id") not in seen_calls:
            raise _Reject(400, f"tool_call_id {m.get('tool_call_id')!r} matches no earlier tool call")


def _check_no_images(model: str, messages: list[dict[str, Any]]) -> None:
    for m in messages:
        if isinstance(m.get("content"), list) and any(
            isinstance(p, dict) and p.get("type") in ("image_url", "file") for p in m["content"]
        ):
            raise _Reject(400, f"Model {model} does not support image input")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeDeepSeek

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (OSError, ValueError):  # the client went away, or we reset the connection on purpose
            self.close_connection = True

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            super().finish()

    # -- plumbing ----------------------------------------------------------

    def _json(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)

    def _gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable:
                return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
        return False

    def _write_chunk(self, data: bytes) -> None:
        if self._gone():
            raise _Gone
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        except OSError:
            raise _Gone from None

    def _write_split(self, data: bytes, rng: random.Random) -> None:
        i = 0
        while i < len(data):
            n = rng.randint(1, self.server_fake.max_write)
            self._write_chunk(data[i : i + n])
            i += n

    def _sleep(self, seconds: float) -> None:
        if seconds > 0 and self.server_fake._stop.wait(seconds):
            raise _Gone

    def _keepalive_for(self, seconds: float, rng: random.Random) -> None:
        end = time.monotonic() + seconds
        every = self.server_fake.keepalive_every_s
        while time.monotonic() < end:
            self._write_split(b": keep-alive" + self._eol * 2, rng)
            self._sleep(min(every, max(0.0, end - time.monotonic())))

    @property
    def _eol(self) -> bytes:
        return b"\r\n" if self.server_fake.crlf else b"\n"

    def _authorized(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        fake = self.server_fake
        if auth != f"Bearer {fake.api_key}":
            self._json(401, error_body(*_DEFAULT_ERRORS[401]))
            return None
        return fake.api_key

    # -- routes --------------------------------------------------------------

    def do_GET(self) -> None:
        fake = self.server_fake
        rec = Recorded("GET", self.path, dict(self.headers.items()), None, time.monotonic())
        fake.requests.append(rec)
        if self._authorized() is None:
            rec.status = 401
            return
        path = self.path.removeprefix("/v1").removeprefix("/beta")
        if path == "/models":
            data = [
                {
                    "id": mid, "object": "model", "owned_by": "deepseek", "name": name,
                    "context_window": fake.context_window, "max_output_tokens": MAX_OUTPUT,
                    "input_modalities": ["text", "image"] if image else ["text"], "output_modalities": ["text"],
                    "effort": {"supported_levels": ["low", "high", "max"], "default_level": "high"},
                }
                for mid, (name, image) in MODELS.items()
            ]
            rec.status = 200
            self._json(200, json.dumps({"object": "list", "data": data}).encode())
        elif path == "/user/balance":
            rec.status = 200
            self._json(200, json.dumps({
                "is_available": float(fake.balance) > 0,
                "balance_infos": [{"currency": "USD", "total_balance": fake.balance, "granted_balance": "0.00",
                                   "topped_up_balance": fake.balance}],
            }).encode())
        else:
            rec.status = 404
            self._json(404, error_body("Not Found"))

    def do_POST(self) -> None:
        fake = self.server_fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        rec = Recorded("POST", self.path, dict(self.headers.items()), body, time.monotonic())
        fake.requests.append(rec)
        path = self.path.removeprefix("/v1").removeprefix("/beta")
        if path != "/chat/completions":
            rec.status = 404
            self._json(404, error_body("Not Found"))
            return
        key = self._authorized()
        if key is None:
            rec.status = 401
            return
        with fake._lock:
            busy = fake._in_flight.get(key, 0)
            over = fake.max_concurrency is not None and busy >= fake.max_concurrency
            if not over:
                fake._in_flight[key] = busy + 1
        if over:
            rec.status = 429
            self._json(429, error_body("Rate Limit Reached", "rate_limit_error"))
            return
        try:
            self._chat(rec, key, body)
        finally:
            with fake._lock:
                fake._in_flight[key] -= 1

    def _chat(self, rec: Recorded, key: str, body: Any) -> None:
        fake = self.server_fake
        if float(fake.balance) <= 0:
            rec.status = 402
            self._json(402, error_body(*_DEFAULT_ERRORS[402]))
            return
        try:
            thinking, prompt = fake.validate(body)
        except _Reject as rej:
            rec.status = rej.status
            self._json(rej.status, error_body(rej.message, rej.type))
            return
        item = fake.next_item()
        if isinstance(item, Fault):
            rec.status = item.status
            default = _DEFAULT_ERRORS.get(item.status, ("Error", "unknown_error"))
            payload = item.raw_body if item.raw_body is not None else error_body(item.message or default[0], default[1])
            self._json(item.status, payload, item.headers)
            return
        user = str(body.get("user_id") or "")
        hit = fake.account(key, user, prompt)
        rec.prompt_tokens, rec.cache_hit_tokens = len(prompt), hit
        rng = random.Random(fake.seed * 1_000_003 + fake._chat_index)
        calls = [
            (f"call_{i:02d}_" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(24)), n, a)
            for i, (n, a) in enumerate(item.tool_calls)
        ]
        reasoning = item.reasoning if thinking else ""
        finish = item.finish_reason or ("tool_calls" if calls else "stop")
        completion = _count(reasoning) + _count(item.content) + sum(_count(a) for _, _, a in calls)
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": completion,
            "total_tokens": len(prompt) + completion,
            "prompt_tokens_details": {"cached_tokens": hit},
            "completion_tokens_details": {"reasoning_tokens": _count(reasoning)},
            "prompt_cache_hit_tokens": hit,
            "prompt_cache_miss_tokens": len(prompt) - hit,
        }
        wire_calls = [{"id": cid, "type": "function", "function": {"name": n, "arguments": a}} for cid, n, a in calls]
        tail_has_tools = any(m.get("role") == "assistant" and m.get("tool_calls")
                             for m in _after_last_user(body["messages"]))
        output = render_assistant(reasoning, item.content, wire_calls, bool(calls) or tail_has_tools)
        if body.get("stream"):
            include_usage = fake.usage_always or bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(rec, item, body, thinking, reasoning, calls, finish, usage if include_usage else None, rng)
        else:
            message: dict[str, Any] = {"role": "assistant", "content": item.content}
            if thinking:
                message["reasoning_content"] = reasoning
            if wire_calls:
                message["tool_calls"] = [dict(c, index=i) for i, c in enumerate(wire_calls)]
            payload = {
                "id": str(uuid.uuid4()), "object": "chat.completion", "created": int(time.time()),
                "model": body["model"], "system_fingerprint": "fp_fake_deepseek",
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
                "usage": usage,
            }
            rec.status = 200
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                end = time.monotonic() + item.queue_s
                while time.monotonic() < end:
                    self.wfile.write(b"\n")
                    self.wfile.flush()
                    self._sleep(min(fake.keepalive_every_s, max(0.0, end - time.monotonic())))
                self.wfile.write(json.dumps(payload).encode())
                rec.finished = True
            except (OSError, _Gone):
                rec.cancelled = True
        if rec.finished:
            fake.remember_output(key, user, prompt + output)

    def _stream(self, rec: Recorded, item: Turn, body: dict[str, Any], thinking: bool, reasoning: str,
                calls: list[tuple[str, str, str]], finish: str, usage: dict[str, Any] | None,
                rng: random.Random) -> None:
        rid, created, model = str(uuid.uuid4()), int(time.time()), body["model"]
        chunker = _Chunker(rid, created, model, self._eol)
        events, text_events = _stream_events(chunker, item, thinking, reasoning, calls, finish, usage, rng)
        rec.status = 200
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-request-id", rid)
        for k, v in item.headers.items():
            self.send_header(k, v)
        self.end_headers()
        try:
            self._send_events(rec, item, events, text_events, rng)
        except _Gone:
            rec.cancelled = True
            self.close_connection = True

    def _send_events(self, rec: Recorded, item: Turn, events: list[bytes], text_events: int,
                     rng: random.Random) -> None:
        """The SSE body with the turn's faults: queueing keep-alives, a close, a malformed event, a stall."""
        eol = self._eol
        self._keepalive_for(item.queue_s, rng)
        for n, event in enumerate(events):
            if item.close_after is not None and n >= item.close_after:
                self._close(item.close_mode)
                return
            if item.malformed_after is not None and n == item.malformed_after:
                self._write_split(b'data: {"id": "broken' + eol + eol, rng)
            if item.stall and n == text_events:
                while True:
                    self._keepalive_for(self.server_fake.keepalive_every_s, rng)
            self._write_split(event, rng)
            rec.events_sent += 1
            self._sleep(item.delay_per_event_s)
        self.wfile.write(b"0\r\n\r\n")
        rec.finished = True

    def _close(self, mode: str) -> None:
        self.close_connection = True
        if mode == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        else:
            self.wfile.write(b"0\r\n\r\n")


@dataclass
class _Chunker:
    """Frames one streamed answer's chunks as SSE events."""

    rid: str
    created: int
    model: str
    eol: bytes

    def __call__(self, delta: dict[str, Any] | None, finish_reason: str | None = None, usage_: Any = None,
                 choices: bool = True) -> bytes:
        payload = {
            "id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "system_fingerprint": "fp_fake_deepseek",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}] if choices else [],
            "usage": usage_,
        }
        return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + self.eol + self.eol


def _pieces(text: str, lo: int, hi: int, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(lo, hi)
        out.append(text[i : i + n])
        i += n
    return out


def _stream_events(chunk: _Chunker, item: Turn, thinking: bool, reasoning: str, calls: list[tuple[str, str, str]],
                   finish: str, usage: dict[str, Any] | None, rng: random.Random) -> tuple[list[bytes], int]:
    """The answer's SSE events, and how many of them carry the role, reasoning and text."""
    events: list[bytes] = []
    events.append(chunk({"role": "assistant", "content": None, "reasoning_content": ""} if thinking
                        else {"role": "assistant", "content": ""}))
    for p in _pieces(reasoning, 1, 8, rng):
        events.append(chunk({"content": None, "reasoning_content": p}))
    for p in _pieces(item.content, 1, 8, rng):
        events.append(chunk({"content": p, "reasoning_content": None}))
    text_events = len(events)
    frags: list[list[dict[str, Any]]] = []
    for i, (cid, name, args) in enumerate(calls):
        seq = [{"index": i, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}]
        seq += [{"index": i, "function": {"arguments": p}} for p in _pieces(args, 1, 6, rng)]
        frags.append(seq)
    if item.interleave:
        while any(frags):
            for seq in frags:
                if seq:
                    events.append(chunk({"tool_calls": [seq.pop(0)]}))
    else:
        for seq in frags:
            events.extend(chunk({"tool_calls": [f]}) for f in seq)
    attached = usage if item.usage_mode in ("attached", "both") else None
    events.append(chunk({"content": "", "reasoning_content": None}, finish, attached))
    if usage is not None and item.usage_mode in ("trailing", "both"):
        events.append(chunk(None, None, usage, choices=False))
    events.append(b"data: [DONE]" + chunk.eol + chunk.eol)
    return events, text_events


def _after_last_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return messages[i + 1 :]
    return messages
