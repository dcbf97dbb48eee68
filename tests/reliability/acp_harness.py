"""Helpers for the ACP reliability tests: the real reader and bridge in process (fed exact
byte chunks, output collected in memory), a raw `dsh run` subprocess driven byte for byte,
and hypothesis strategies for hostile frames with the number of answers each must get.

Not a test module; the tests import it (``from acp_harness import …``)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
from hypothesis import strategies as st

from dsh_testing import REPO, check_frames, memory_host, minimal_env

STRESS = os.environ.get("DSH_STRESS") == "1"

# A keyless script: "ping" answers PONG, anything else echoes; nothing hangs.
SCRIPT = {
    "rules": [{"when": "^ping", "steps": [{"text": "PONG"}]}],
    "default": [{"text": "echo: {prompt}"}],
}

# --------------------------------------------------------------------------- in process


class ChunkReader:
    """The reader's byte source, fed exact chunks (so splits and merges are what the test says)."""

    def __init__(self) -> None:
        self._send, self._recv = anyio.create_memory_object_stream[bytes](1000)

    async def feed(self, chunk: bytes) -> None:
        await self._send.send(chunk)

    def eof(self) -> None:
        self._send.close()

    async def receive(self) -> bytes:
        try:
            return await self._recv.receive()
        except anyio.EndOfStream:
            return b""

    def close(self) -> None:
        self._send.close()


class MemWriter:
    """Collects everything the agent writes; never blocks."""

    aborted = False
    blocked = False

    def __init__(self) -> None:
        self.data = bytearray()
        self.grew = anyio.Event()

    def send_nowait(self, data: bytes) -> int:
        self.data += data
        self.grew.set()
        return len(data)

    async def send(self, data: bytes) -> None:
        self.send_nowait(data)

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        pass


class InProcess:
    """One ACP connection served by the real Peer and Bridge over ChunkReader/MemWriter."""

    def __init__(self, bridge: Any, reader: ChunkReader, writer: MemWriter) -> None:
        self.bridge, self.reader, self.writer = bridge, reader, writer
        self._seen = 0
        self.frames: list[dict[str, Any]] = []

    def _parse(self) -> None:
        end = self.writer.data.rfind(b"\n") + 1
        if end > self._seen:
            for line in bytes(self.writer.data[self._seen:end]).splitlines():
                self.frames.append(json.loads(line))
            self._seen = end

    async def write(self, data: bytes) -> None:
        await self.reader.feed(data)

    async def response(self, rid: Any, timeout: float = 10) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            while True:
                self._parse()
                for f in self.frames:
                    if "method" not in f and f.get("id") == rid and type(f.get("id")) is type(rid):
                        return f
                self.writer.grew = anyio.Event()
                await self.writer.grew.wait()

    async def request(self, method: str, timeout: float = 10) -> dict[str, Any]:
        """The first request the agent sent with this method."""
        with anyio.fail_after(timeout):
            while True:
                self._parse()
                for f in self.frames:
                    if f.get("method") == method and "id" in f:
                        return f
                self.writer.grew = anyio.Event()
                await self.writer.grew.wait()

    async def call(self, rid: Any, method: str, params: Any) -> dict[str, Any]:
        await self.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n")
        return await self.response(rid)

    async def idle(self, timeout: float = 10) -> None:
        with anyio.fail_after(timeout):
            await self.bridge.peer.wait_handlers()

    def output(self) -> bytes:
        return bytes(self.writer.data)


@asynccontextmanager
async def in_process(script: Path, *extra: object, config: dict | None = None):
    from dsh_acp_transport import make_bridge, serve_bridge

    async with memory_host(script, *extra, plugins=("acp-transport", "scripted-model"), config=config) as host:
        reader, writer = ChunkReader(), MemWriter()
        bridge = make_bridge(host, reader, writer)  # type: ignore[arg-type]
        conn = InProcess(bridge, reader, writer)
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_bridge, bridge)
            try:
                yield conn
            finally:
                reader.eof()


# --------------------------------------------------------------------------- a real process


@dataclass
class RawProcess:
    """``dsh run`` as a subprocess, written to byte for byte; stdout is read by a thread
    unless ``read_stdout=False`` (a client that stops reading)."""

    proc: subprocess.Popen
    out: bytearray = field(default_factory=bytearray)
    lines: queue.Queue[bytes] = field(default_factory=queue.Queue)
    frames: list[dict[str, Any]] = field(default_factory=list)
    err: bytearray = field(default_factory=bytearray)

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()

    def next_frame(self, timeout: float = 20) -> dict[str, Any]:
        line = self.lines.get(timeout=timeout)
        if line == b"":
            raise EOFError("agent closed stdout")
        frame = json.loads(line)
        self.frames.append(frame)
        return frame

    def response(self, rid: Any, timeout: float = 20) -> dict[str, Any]:
        for f in self.frames:
            if "method" not in f and f.get("id") == rid and type(f.get("id")) is type(rid):
                return f
        deadline = time.monotonic() + timeout
        while True:
            f = self.next_frame(max(deadline - time.monotonic(), 0.01))
            if "method" not in f and f.get("id") == rid and type(f.get("id")) is type(rid):
                return f

    def call(self, rid: Any, method: str, params: Any) -> dict[str, Any]:
        self.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n")
        return self.response(rid)

    def start(self, cwd: Path) -> str:
        assert "result" in self.call("init", "initialize", {"protocolVersion": 1})
        return self.call("new", "session/new", {"cwd": str(cwd), "mcpServers": []})["result"]["sessionId"]


def _pump(stream: Any, sink: bytearray, lines: queue.Queue[bytes] | None) -> None:
    buf = b""
    while chunk := stream.read1(1 << 16):
        sink += chunk
        if lines is not None:
            buf += chunk
            *complete, buf = buf.split(b"\n")
            for line in complete:
                lines.put(line)
    if lines is not None:
        lines.put(b"")


def spawn_raw(script: Path, *, cwd: Path, home: Path, example: str = "acp-agent",
              read_stdout: bool = True, env: dict[str, str] | None = None, stdin: bytes | None = None) -> RawProcess:
    """``stdin``: bytes already waiting in a closed pipe when the agent starts (under 64 KiB)."""
    argv = [sys.executable, "-m", "dsh_core.cli", "run", "--example", example,
            "--provider", "scripted", "--model", str(script)]
    full_env = minimal_env(DSH_HOME=str(home), DSH_EXAMPLES_PATH=str(REPO / "tests" / "examples"), **(env or {}))
    source: Any = subprocess.PIPE
    if stdin is not None:
        source, w = os.pipe()
        os.write(w, stdin)
        os.close(w)
    proc = subprocess.Popen(argv, stdin=source, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=str(cwd), env=full_env, start_new_session=True)
    if stdin is not None:
        os.close(source)
    raw = RawProcess(proc)
    threading.Thread(target=_pump, args=(proc.stderr, raw.err, None), daemon=True).start()
    if read_stdout:
        threading.Thread(target=_pump, args=(proc.stdout, raw.out, raw.lines), daemon=True).start()
    return raw


def finish(raw: RawProcess, timeout: float = 10) -> int:
    """Close stdin, wait for the exit (killing the group on a hang), and return the exit code."""
    raw.close_stdin()
    try:
        return raw.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(raw.proc.pid, 9)
        raw.proc.wait()
        raise


# --------------------------------------------------------------------------- hostile frames


@dataclass(frozen=True)
class Spec:
    """One line to send. ``@ID@`` becomes a fresh integer id (answered exactly once when
    ``exact``), ``@SID@`` the live session id, ``@PREV@`` the last id handed out.
    ``lo``/``hi`` bound how many answers of any id the line may get."""

    line: bytes
    lo: int
    hi: int
    exact: bool = False


def _req(method: str, params: Any, *, id_text: str = "@ID@") -> bytes:
    return b'{"jsonrpc":"2.0","id":' + id_text.encode() + b',"method":"' + method.encode() + b'","params":' + (
        params if isinstance(params, bytes) else json.dumps(params).encode()) + b"}"


def _prompt(blocks: Any) -> bytes:
    return b'{"sessionId":"@SID@","prompt":' + (blocks if isinstance(blocks, bytes) else json.dumps(blocks).encode()) + b"}"


VALID_REQUESTS = [
    _req("authenticate", {}),
    _req("initialize", {"protocolVersion": 1}),  # a second initialize: -32600
    _req("no/such/method", {}),
    _req("session/new", {"cwd": "relative/dir", "mcpServers": []}),
    _req("session/new", {"cwd": 5}),
    _req("session/prompt", _prompt([{"type": "text", "text": "hello"}])),
    _req("session/prompt", {"sessionId": "nope", "prompt": [{"type": "text", "text": "x"}]}),
    _req("session/prompt", _prompt("not a list")),
    _req("session/prompt", _prompt([{"type": "resource", "resource": {"uri": "file:///a", "text": "A"}}])),
    _req("session/prompt", _prompt([{"type": "resource", "resource": {"uri": "file:///b", "blob": "AAAA"}}])),
    _req("session/prompt", _prompt([{"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}])),
    _req("session/prompt", _prompt(rb'[{"type":"text","text":"lone \ud800 surrogate"}]')),
    _req("session/prompt", _prompt(rb'[{"type":"text","text":"low \udc00 first \ud83d\ude00 pair"}]')),
    _req("session/prompt", _prompt(b'[{"type":"text","text":"bad \xff\xfe utf-8"}]')),
    _req("authenticate", {"methodId": "caf\u00e9"}),
    _req("authenticate", rb'{"x":"\ud800"}'),
    _req("authenticate", {}, id_text='"s-@ID@"'),
    _req("session/cancel", {"sessionId": "@SID@"}),  # a notification method called as a request: -32601
]

NOTIFICATIONS = [
    b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"@SID@"}}',
    b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":42}}',
    b'{"jsonrpc":"2.0","method":"session/cancel"}',
    b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":@PREV@}}',
    b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":[1,2]}}',
    b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":{"a":1}}}',
    b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":1.5}}',
    b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":true}}',
    b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":null}}',
    b'{"jsonrpc":"2.0","method":"$/cancel_request","params":[]}',
    b'{"jsonrpc":"2.0","method":"$/cancel_request"}',
    b'{"jsonrpc":"2.0","method":"_ci/heartbeat","params":{}}',
    b'{"jsonrpc":"2.0","method":"session/update","params":{"x":"\xff"}}',
    b'{"jsonrpc":"2.0","method":"_x","params":1e400}',  # params stay raw: never decoded, never answered
    # responses to requests the agent never sent: dropped silently
    b'{"jsonrpc":"2.0","id":987654,"result":{}}',
    b'{"jsonrpc":"2.0","id":"zz","error":{"code":1,"message":"m"}}',
    b'{"jsonrpc":"2.0","id":987655,"error":"nope"}',
    b'{"jsonrpc":"2.0","id":987656,"result":{},"error":null}',
]

GARBAGE = [
    b"{}",
    b"[]",
    b"[{}]",
    b"5",
    b'"text"',
    b"null",
    b'{"jsonrpc":"1.0","id":7,"method":"authenticate"}',
    b'{"jsonrpc":"2.0"}',
    b'{"id":1}',
    b'{"jsonrpc":"2.0","id":[1],"method":"authenticate"}',
    b'{"jsonrpc":"2.0","id":{"a":1},"method":"authenticate"}',
    b'{"jsonrpc":"2.0","id":1.5,"method":"authenticate"}',
    b'{"jsonrpc":"2.0","id":true,"method":"authenticate"}',
    b'{"jsonrpc":"2.0","id":1e400,"method":"authenticate"}',
    b'{"jsonrpc":"2.0","id":1,"method":5}',
    b'{"jsonrpc":"2.0","id":1,"method":',
    b"\xff\xfe\xfd",
    b'{"a":"\\ud800',  # a truncated lone surrogate
]

_NON_OBJECT_JSON = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20),
    st.lists(st.one_of(st.integers(), st.text(max_size=5)), max_size=4),
)


def _no_newline(data: bytes) -> bytes:
    return data.replace(b"\n", b" ")


@st.composite
def deep(draw: Any) -> Spec:
    depth = draw(st.integers(129, 3000))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    body = opener * depth + b"1" + closer * depth
    where = draw(st.sampled_from(["params", "id", "top"]))
    if where == "params":
        return Spec(_req("authenticate", body), 1, 1)
    if where == "id":
        return Spec(b'{"jsonrpc":"2.0","id":' + body + b',"method":"authenticate"}', 1, 1)
    return Spec(body, 1, 1)


def _edit(line: bytearray, op: str, pos: int, byte: int) -> None:
    """One byte edit at ``pos``: flip ("f"), insert ("i") or delete (any other op); never a newline."""
    if op == "f" and line:
        line[pos] = byte
    elif op == "i":
        line.insert(pos, byte)
    elif line:
        del line[pos]


@st.composite
def mutated(draw: Any) -> Spec:
    line = bytearray(draw(st.sampled_from(VALID_REQUESTS + NOTIFICATIONS)).replace(b"@ID@", b'"m@ID@"'))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from("fid"))
        pos = draw(st.integers(0, max(len(line) - 1, 0)))
        _edit(line, op, pos, draw(st.integers(0, 255).filter(lambda b: b != 10)))
    return Spec(bytes(line), 0, 1)


def _garbage(data: bytes) -> Spec:
    data = _no_newline(data)
    blank = not (data[:-1] if data.endswith(b"\r") else data).strip()
    return Spec(data, 0 if blank else 1, 0 if blank else 1)


SPEC = st.one_of(
    st.sampled_from(VALID_REQUESTS).map(lambda line: Spec(line, 1, 1, exact=True)),
    st.sampled_from(NOTIFICATIONS).map(lambda line: Spec(line, 0, 0)),
    st.sampled_from(GARBAGE).map(_garbage),
    st.binary(min_size=1, max_size=64).map(_garbage),
    _NON_OBJECT_JSON.map(lambda v: _garbage(json.dumps(v).encode())),
    st.tuples(st.sampled_from(VALID_REQUESTS), st.floats(0, 1)).map(  # truncated
        lambda t: _garbage(t[0][: min(max(int(len(t[0]) * t[1]), 1), len(t[0]) - 1)])),
    deep(),
    mutated(),
    st.just(Spec(b"", 0, 0)),
    st.just(Spec(b"   \r", 0, 0)),
)


def _mutate(line: bytes, rng: random.Random) -> bytes:
    data = bytearray(line)
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(max(len(data), 1))
        op = rng.choice("fid")
        _edit(data, op, pos, rng.choice([b for b in range(256) if b != 10]))
    return bytes(data)


@st.composite
def batches(draw: Any, min_size: int = 1, max_size: int = 40,
            amplify: int = 1) -> tuple[list[Spec], list[int], bool]:
    """Frames, cut points (where writes split the stream), and whether lines end in CRLF.

    ``amplify`` > 1 (the stress run) appends that many reshuffled copies of the drawn frames,
    a tenth of them byte-mutated, from a hypothesis-seeded generator: volume cheaply."""
    specs = draw(st.lists(SPEC, min_size=min_size, max_size=max_size))
    if amplify > 1:
        rng = random.Random(draw(st.integers(0, 2**32)))
        base = list(specs)
        for _ in range(amplify - 1):
            copy = base[:]
            rng.shuffle(copy)
            specs += [Spec(_mutate(sp.line.replace(b"@ID@", b'"m@ID@"'), rng), 0, 1) if rng.random() < 0.1 else sp
                      for sp in copy]
    cuts = draw(st.lists(st.integers(0, 1 << 24), max_size=12 * amplify))
    return specs, cuts, draw(st.booleans())


class Ids:
    def __init__(self, start: int = 1_000_000) -> None:
        self.next = start
        self.last = 0

    def take(self) -> int:
        self.last, self.next = self.next, self.next + 1
        return self.last


def render(specs: list[Spec], sid: str, ids: Ids, crlf: bool) -> tuple[bytes, list[int], int, int]:
    """The bytes to send, the exact ids, and the bounds on the total number of answers."""
    out, exact = [], []
    lo = hi = 0
    for spec in specs:
        line = spec.line.replace(b"@SID@", sid.encode()).replace(b"@PREV@", str(ids.last).encode())
        if b"@ID@" in line:
            rid = ids.take()
            line = line.replace(b"@ID@", str(rid).encode())
            if spec.exact:
                exact.append(rid)
        out.append(line + (b"\r\n" if crlf and not line.endswith(b"\r") else b"\n"))
        lo, hi = lo + spec.lo, hi + spec.hi
    return b"".join(out), exact, lo, hi


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in pairwise(points) if b > a]


def check_answers(frames: list[dict[str, Any]], exact: list[int], lo: int, hi: int,
                  setup_ids: set[Any]) -> Counter:
    """Every exact request answered exactly once; the total number of answers within bounds."""
    answers = [f for f in frames if "method" not in f and f.get("id") not in setup_ids]
    by_id = Counter(json.dumps(f.get("id")) for f in answers)
    for rid in exact:
        assert by_id[json.dumps(rid)] + by_id[json.dumps(f"s-{rid}")] == 1, (rid, by_id)
    assert lo <= len(answers) <= hi, (lo, len(answers), hi)
    return by_id


_SEEN_SHAPES: set[bytes] = set()


def schema_checked(raw: bytes) -> list[dict[str, Any]]:
    """Every line is a JSON-RPC 2.0 object (checked here), and every distinct frame shape
    validates against ACP's schema (``check_frames``; ids and session ids normalised, so the
    many frames that differ only there are validated once per run)."""
    assert raw == b"" or raw.endswith(b"\n"), "stdout ends in a partial frame"
    frames, fresh = [], []
    for line in raw.splitlines():
        frame = json.loads(line)
        assert isinstance(frame, dict) and frame.get("jsonrpc") == "2.0", line[:200]
        frames.append(frame)
        shape = dict(frame)
        if "id" in shape and shape["id"] is not None:
            shape["id"] = 0 if isinstance(shape["id"], int) else "s"
        key = json.dumps(shape, sort_keys=True).encode()
        if isinstance(frame.get("params"), dict) and "sessionId" in frame["params"]:
            key = key.replace(frame["params"]["sessionId"].encode(), b"SID")
        if key not in _SEEN_SHAPES:
            _SEEN_SHAPES.add(key)
            fresh.append(line)
    if fresh:
        check_frames(b"\n".join(fresh) + b"\n")
    return frames
