"""Hostile and sloppy ACP clients (issue 12, items 1, 2, 4, 5, 6, 8): one test per failure
seen, in process where the reader alone is at stake and over real stdio where the process is.
The permission-answer races are also fuzzed (hypothesis) at the end."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import termios
import time

import anyio
import pytest
from acp_harness import STRESS, finish, in_process, spawn_raw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.anyio

SCRIPT = {
    "rules": [
        {"when": "^ping", "steps": [{"text": "PONG"}]},
        {"when": "^slow", "steps": [{"text": "ran", "delay_ms": 300}]},
        {"when": "^write it", "steps": [
            {"tool": "guarded_write", "args": {"path": "out.txt", "content": "hello"}},
            {"text": "result: {tool_result}"}]},
    ],
    "default": [{"text": "echo: {prompt}"}],
}


def req(rid, method, params) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n"


def note(method, params) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode() + b"\n"


def prompt(rid, sid, text) -> bytes:
    return req(rid, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]})


async def start(conn, cwd) -> str:
    await conn.call("init", "initialize", {"protocolVersion": 1})
    return (await conn.call("new", "session/new", {"cwd": str(cwd), "mcpServers": []}))["result"]["sessionId"]


def chunks(frames, sid=None) -> list[str]:
    return [f["params"]["update"]["content"]["text"] for f in frames
            if f.get("method") == "session/update" and (sid is None or f["params"]["sessionId"] == sid)]


# --------------------------------------------------------------------------- 1. no frame crashes the agent

DEEP = b'{"jsonrpc":"2.0","id":7,"method":"authenticate","params":' + b"[" * 1000 + b"]" * 1000 + b"}\n"


async def test_deeply_nested_frame_is_refused_and_the_connection_lives(scripted, tmp_path):
    async with in_process(scripted(SCRIPT)) as conn:
        sid = await start(conn, tmp_path)
        await conn.write(DEEP)
        refused = await conn.response(None)
        assert refused["error"]["code"] == -32600 and "nested deeper than 128" in refused["error"]["message"]
        assert (await conn.call("p", "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "ping"}]}))[
            "result"] == {"stopReason": "end_turn"}


@pytest.mark.parametrize("request_id", [[1], {"a": 1}, [], 1.5, True])
async def test_cancel_request_with_an_odd_request_id_is_ignored(scripted, tmp_path, request_id):
    async with in_process(scripted(SCRIPT)) as conn:
        sid = await start(conn, tmp_path)
        await conn.write(note("$/cancel_request", {"requestId": request_id}))
        resp = await conn.call("p", "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "ping"}]})
        assert resp["result"] == {"stopReason": "end_turn"}
        assert [f for f in conn.frames if "id" in f and f["id"] is None] == []  # a notification is never answered


def test_hostile_frames_over_real_stdio_leave_the_process_alive(scripted, tmp_path):
    raw = spawn_raw(scripted(SCRIPT), cwd=tmp_path, home=tmp_path / "home")
    try:
        sid = raw.start(tmp_path)
        raw.write(DEEP + note("$/cancel_request", {"requestId": [1]}) + note("$/cancel_request", {"requestId": {"a": 1}}))
        assert raw.next_frame()["error"]["code"] == -32600
        done = raw.call("p", "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "ping"}]})
        assert done["result"] == {"stopReason": "end_turn"}
    finally:
        code = finish(raw)
    assert code == 0, bytes(raw.err)[-2000:]


# --------------------------------------------------------------------------- 2. a cancel in the prompt's write


@pytest.mark.parametrize("cancel", ["session/cancel", "$/cancel_request"])
async def test_a_cancel_in_the_same_write_as_its_prompt_applies(scripted, tmp_path, cancel):
    async with in_process(scripted(SCRIPT)) as conn:
        sid = await start(conn, tmp_path)
        stop = note(cancel, {"sessionId": sid} if cancel == "session/cancel" else {"requestId": "a"})
        # one write: a prompt, its cancel, then a prompt read after the cancel (untouched by it)
        await conn.write(prompt("a", sid, "slow") + stop + prompt("b", sid, "slow again"))
        assert (await conn.response("a"))["result"] == {"stopReason": "cancelled"}
        assert (await conn.response("b"))["result"] == {"stopReason": "end_turn"}
        assert chunks(conn.frames, sid) == ["ran"]  # only b's turn ran


def test_a_cancel_in_the_same_write_as_its_prompt_applies_over_real_stdio(scripted, tmp_path):
    raw = spawn_raw(scripted(SCRIPT), cwd=tmp_path, home=tmp_path / "home")
    try:
        sid = raw.start(tmp_path)
        raw.write(prompt("a", sid, "slow") + note("session/cancel", {"sessionId": sid})
                  + prompt("b", sid, "ping") + note("$/cancel_request", {"requestId": "b"}))
        assert raw.response("a")["result"] == {"stopReason": "cancelled"}
        assert raw.response("b")["result"] == {"stopReason": "cancelled"}
        assert chunks(raw.frames) == []
    finally:
        assert finish(raw) == 0


# --------------------------------------------------------------------------- 4 and 5. permission answers

ALLOW = {"outcome": {"outcome": "selected", "optionId": "allow-once"}}
REJECT = {"outcome": {"outcome": "selected", "optionId": "reject-once"}}


def response(rid, **members) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, **members}).encode() + b"\n"


async def permission_round(scripted, tmp_path, answer) -> tuple[str, bool, list]:
    """Prompt a tool that asks permission; ``answer(request_id) -> bytes`` is written in one go.
    Returns the text the model saw, whether the file was written, and every frame."""
    import dsh_testkit.approval as testkit

    config = {"acp-transport": {"permission-timeout": 300}}  # a hang would outlast the test
    async with in_process(scripted(SCRIPT), testkit, config=config) as conn:
        sid = await start(conn, tmp_path)
        await conn.write(prompt("w", sid, "write it"))
        ask = await conn.request("session/request_permission")
        assert ask["params"]["toolCall"]["kind"] == "edit"
        await conn.write(answer(ask["id"]))
        resp = await conn.response("w", timeout=20)  # settled at once, not at the 300 s timeout
        assert resp["result"] == {"stopReason": "end_turn"}
        return chunks(conn.frames, sid)[-1], (tmp_path / "out.txt").exists(), conn.frames


@pytest.mark.parametrize("first, second, written", [(REJECT, ALLOW, False), (ALLOW, REJECT, True)])
async def test_the_first_permission_answer_settles_the_request(scripted, tmp_path, first, second, written):
    text, wrote, frames = await permission_round(
        scripted, tmp_path, lambda rid: response(rid, result=first) + response(rid, result=second))
    assert wrote is written
    assert text == ("result: wrote out.txt" if written else "result: not written: approval rejected")
    assert [f for f in frames if "id" in f and f["id"] is None] == []  # the late answer is dropped silently


MALFORMED = {
    "error is a string": lambda rid: response(rid, error="nope"),
    "error is null": lambda rid: response(rid, error=None),
    "allow beside error null": lambda rid: response(rid, result=ALLOW, error=None),
    "allow beside an error": lambda rid: response(rid, result=ALLOW, error={"code": 1, "message": "x"}),
    "allow without jsonrpc": lambda rid: json.dumps({"id": rid, "result": ALLOW}).encode() + b"\n",
    "allow with jsonrpc 1.0": lambda rid: json.dumps({"jsonrpc": "1.0", "id": rid, "result": ALLOW}).encode() + b"\n",
    "allow with bad utf-8": lambda rid: response(rid, result=ALLOW).replace(b"allow-once", b"allow-once\xff"),
    "allow with a lone surrogate": lambda rid: response(rid, result=ALLOW).replace(b"allow-once", b"allow-once\\ud800"),
    "result null": lambda rid: response(rid, result=None),
    "result a string": lambda rid: response(rid, result="allow-once"),
    "error object": lambda rid: response(rid, error={"code": -32000, "message": "declined"}),
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_permission_answer_denies_at_once(scripted, tmp_path, case):
    text, wrote, _ = await permission_round(scripted, tmp_path, MALFORMED[case])
    assert not wrote
    assert text in ("result: not written: approval rejected", "result: not written: approval unavailable")


async def test_late_answers_of_any_shape_are_ignored_silently(scripted, tmp_path):
    text, wrote, frames = await permission_round(scripted, tmp_path, lambda rid: response(rid, result=REJECT) + b"".join(
        MALFORMED[k](rid) for k in ("allow with jsonrpc 1.0", "allow without jsonrpc", "error is a string")))
    assert not wrote and text == "result: not written: approval rejected"
    (ask,) = [f for f in frames if f.get("method") == "session/request_permission"]
    assert [f for f in frames if "method" not in f and f.get("id") == ask["id"]] == []


_ANSWERS = st.sampled_from(["allow", "reject", *MALFORMED])


@pytest.mark.timeout(3600 if STRESS else 120)
@settings(max_examples=400 if STRESS else 25, deadline=None, derandomize=not STRESS, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(answers=st.lists(_ANSWERS, min_size=1, max_size=5), stray=st.booleans())
def test_permission_answer_races(scripted, tmp_path, answers, stray):
    """Several answers to one permission request in one write (plus stray answers to other
    ids): allowed exactly when the first answer to that id is a well-formed allow."""
    (tmp_path / "out.txt").unlink(missing_ok=True)

    def answer(rid):
        data = b"".join(
            response(rid, result=ALLOW) if a == "allow" else response(rid, result=REJECT) if a == "reject"
            else MALFORMED[a](rid) for a in answers)
        if stray:
            data = response(rid + 1000, result=REJECT) + data + response("x", result=REJECT)
        return data

    async def round_() -> None:
        text, wrote, frames = await permission_round(scripted, tmp_path, answer)
        assert wrote is (answers[0] == "allow"), (answers, text)
        (ask,) = [f for f in frames if f.get("method") == "session/request_permission"]
        # no answer of any shape to the permission request's id is itself answered
        assert [f for f in frames if "method" not in f and f.get("id") == ask["id"]] == []

    anyio.run(round_)


# --------------------------------------------------------------------------- 6. a client that stops reading


def _unread(fd: int) -> int:
    buf = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int.from_bytes(buf, "little")


def _read_until(raw, rid, deadline: float = 20) -> None:
    """Read stdout by hand (no reader thread) until the answer to ``rid`` has arrived."""
    buf = b""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        buf += raw.proc.stdout.read1(1 << 16)
        for line in buf.split(b"\n")[:-1]:
            frame = json.loads(line)
            if frame.get("id") == rid and "method" not in frame:
                raw.frames.append(frame)
                return
    raise AssertionError(f"no answer to {rid!r}")


@pytest.mark.parametrize("how", ["eof", "sigterm"])
def test_a_client_that_stops_reading_does_not_keep_the_agent_alive(scripted, tmp_path, how):
    raw = spawn_raw(scripted(SCRIPT), cwd=tmp_path, home=tmp_path / "home", read_stdout=False)
    try:
        raw.write(req("init", "initialize", {"protocolVersion": 1}))
        _read_until(raw, "init")
        raw.write(req("new", "session/new", {"cwd": str(tmp_path), "mcpServers": []}))
        buf = b""
        while b'"new"' not in buf or not buf.endswith(b"\n"):
            buf += raw.proc.stdout.read1(1 << 16)
        sid = json.loads(buf.splitlines()[-1])["result"]["sessionId"]
        # the echo of a 300 KB prompt: the agent blocks writing it, the client never reads again
        raw.write(prompt("big", sid, "x" * 300_000))
        fd = raw.proc.stdout.fileno()
        deadline = time.monotonic() + 20
        while _unread(fd) < 60_000:  # the pipe is full: the agent's write is blocked
            assert time.monotonic() < deadline, "the agent never filled the pipe"
            time.sleep(0.01)
        if how == "eof":
            raw.close_stdin()
        else:
            raw.proc.send_signal(signal.SIGTERM)
        code = raw.proc.wait(15)  # before: still running long after (a write that never returns)
        assert code == 0
    except subprocess.TimeoutExpired:
        pytest.fail("the agent was still running 15 s after the client went away")
    finally:
        if raw.proc.poll() is None:
            os.killpg(raw.proc.pid, 9)
            raw.proc.wait()


# --------------------------------------------------------------------------- 8. edges


async def test_a_lone_surrogate_escape_is_carried_and_the_request_answered(scripted, tmp_path):
    async with in_process(scripted(SCRIPT)) as conn:
        sid = await start(conn, tmp_path)
        line = prompt("s", sid, "PLACEHOLDER").replace(b"PLACEHOLDER", rb"a\ud800b \udc00 \ud83d\ude00 \\ud800")
        await conn.write(line)
        assert (await conn.response("s"))["result"] == {"stopReason": "end_turn"}
        # lone halves became U+FFFD, the pair stayed an emoji, the escaped backslash stayed text
        assert chunks(conn.frames, sid) == ["echo: a\ufffdb \ufffd \U0001F600 \\ud800"]


async def test_invalid_utf8_in_a_string_is_invalid_params_with_the_right_id(scripted, tmp_path):
    async with in_process(scripted(SCRIPT)) as conn:
        sid = await start(conn, tmp_path)
        await conn.write(prompt("u", sid, "PLACEHOLDER").replace(b"PLACEHOLDER", b"caf\xe9"))
        resp = await conn.response("u")
        assert resp["error"]["code"] == -32602 and "UTF-8" in resp["error"]["message"]
        assert resp["error"]["data"]["details"]
        assert (await conn.call("p", "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "ping"}]}))[
            "result"] == {"stopReason": "end_turn"}


async def test_an_empty_object_is_an_invalid_request_with_id_null(scripted, tmp_path):
    async with in_process(scripted(SCRIPT)) as conn:
        await conn.write(b"{}\n")
        resp = await conn.response(None)
        assert resp["error"]["code"] == -32600


def test_session_new_just_before_eof_gets_an_error_a_client_can_act_on(scripted, tmp_path):
    # stdin holds both requests and then EOF before the agent starts: the reader sees all three at once
    stdin = req("init", "initialize", {"protocolVersion": 1}) + req("new", "session/new",
                                                                    {"cwd": str(tmp_path), "mcpServers": []})
    raw = spawn_raw(scripted(SCRIPT), cwd=tmp_path, home=tmp_path / "home", stdin=stdin)
    assert raw.proc.wait(20) == 0
    assert "result" in raw.response("init")
    resp = raw.response("new")
    assert resp["error"]["code"] == -32603
    assert "the connection is closing" in resp["error"]["message"]
    assert "no session was created" in resp["error"]["data"]["details"]
