from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dsh_jsonl_persistence as plugin
import msgspec
import pytest
from dsh_jsonl_persistence import JsonlStore, SessionRead, data_home

from dsh_core.errors import DshError
from dsh_core.types import (
    AssistantMessage,
    AssistantMessageEvent,
    Note,
    SessionHeader,
    TextBlock,
    ToolCallEvent,
    ToolResultEvent,
    ToolResultMessage,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
    UserMessageEvent,
    log_decoder,
)


@pytest.fixture
def home(dsh_home: Path) -> Path:
    """This test's ``DSH_HOME`` (dsh_testing's autouse fixture sets it)."""
    return dsh_home


def sample_events() -> list:
    evs = [
        UserMessageEvent(message=UserMessage(id="u1", content=[TextBlock(text="hi\nthere \u4f60\u597d")])),
        TurnStart(turn=1),
        ToolCallEvent(turn=1, step=1, call_id="c1", name="bash", arguments='{"cmd": "ls"}'),
        ToolResultEvent(turn=1, step=1, result=ToolResultMessage(call_id="c1", name="bash", content=[TextBlock(text="a\nb")])),
        AssistantMessageEvent(
            turn=1,
            step=2,
            message=AssistantMessage(id="a1", content=[TextBlock(text="done")], provider="p", model="m"),
            usage=Usage(input_tokens=3, output_tokens=1),
        ),
        TurnEnd(turn=1, reason="completed"),
        Note(kind="trace", data={"x": [1, 2]}),
    ]
    for i, ev in enumerate(evs, 1):
        ev.seq = i
        ev.time = 1700000000.0 + i
    return evs


def header(sid: str = "sess_0123abcd", **kw) -> SessionHeader:
    return SessionHeader(id=sid, cwd="/work", provider="p", model="m", created_at=1700000000.0, **kw)


# ----------------------------------------------------------------------------- paths


def test_data_home_uses_dsh_home(home: Path) -> None:
    assert data_home() == home
    assert JsonlStore().root == home / "sessions"


def test_data_home_without_dsh_home_minimal_env(tmp_path: Path) -> None:
    env = {k: os.environ[k] for k in ("PATH", "SHELL", "TERM", "USER", "LOGNAME") if k in os.environ}
    env["HOME"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", "import dsh_jsonl_persistence as p; print(p.sessions_dir())"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert out.startswith(str(tmp_path)) and out.endswith(os.path.join("dsh", "sessions"))


def test_unsafe_ids_are_refused(home: Path) -> None:
    store = JsonlStore()
    for bad in ("../x", "a/b", ".hidden", "", "-rf", "x" * 201):
        with pytest.raises(DshError, match="not usable as a file name"):
            store.path_for(bad)


# ----------------------------------------------------------------------------- round trip


@pytest.mark.anyio
async def test_events_round_trip_in_order(home: Path) -> None:
    store = JsonlStore()
    log = store.open(header())
    # open() writes the header at once: a session with no prompt yet exists on disk (issue 22 item 8)
    first = (home / "sessions" / "sess_0123abcd.jsonl").read_bytes()
    assert first.endswith(b"\n") and first.count(b"\n") == 1
    assert isinstance(log_decoder.decode(first), SessionHeader)
    events = sample_events()
    for ev in events:
        log.append(ev)
    await log.close()

    path = home / "sessions" / "sess_0123abcd.jsonl"
    raw = path.read_bytes().split(b"\n")
    assert raw[-1] == b"" and len(raw) == len(events) + 2  # header + events, newline-terminated
    assert isinstance(log_decoder.decode(raw[0]), SessionHeader)
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)

    result = await store.read("sess_0123abcd")
    h, got = result
    assert isinstance(result, SessionRead) and result.torn is None
    assert h == header()
    assert got == events
    assert [e.seq for e in got] == list(range(1, len(events) + 1))
    assert await store.list_sessions() == [header()]


@pytest.mark.anyio
async def test_a_session_without_events_is_on_disk_from_open(home: Path) -> None:
    """session/new writes the header: a session that never got a prompt can be listed, resumed
    and deleted (acpx's ``sessions new`` then ``prompt`` from another process)."""
    store = JsonlStore()
    log = store.open(header("sess_empty"))
    await log.close()
    assert [h.id for h in await store.list_sessions()] == ["sess_empty"]
    h, events = await store.read("sess_empty")
    assert h.id == "sess_empty" and events == []


@pytest.mark.anyio
async def test_each_append_is_one_write(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = JsonlStore()
    log = store.open(header())
    writes: list[bytes] = []
    real_write = os.write

    def spy(fd: int, data) -> int:
        writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", spy)
    events = sample_events()
    for ev in events:
        log.append(ev)
    await log.close()
    assert len(writes) == len(events)  # the header was written by open(), before the spy
    assert all(w.count(b"\n") == 1 for w in writes)


@pytest.mark.anyio
async def test_two_sessions_are_separate_and_listed_oldest_first(home: Path) -> None:
    store = JsonlStore()
    a = store.open(SessionHeader(id="sess_b", created_at=2.0))
    b = store.open(SessionHeader(id="sess_a", created_at=1.0))
    ev1, ev2 = sample_events()[:2]
    a.append(ev1)
    b.append(ev2)
    await a.close()
    await b.close()
    assert [h.id for h in await store.list_sessions()] == ["sess_a", "sess_b"]
    assert (await store.read("sess_b"))[1] == [ev1]
    assert (await store.read("sess_a"))[1] == [ev2]


# ----------------------------------------------------------------------------- crashes


def write_log(home: Path, events, tail: bytes = b"") -> Path:
    d = home / "sessions"
    d.mkdir(parents=True, exist_ok=True)
    path = d / "sess_0123abcd.jsonl"
    body = msgspec.json.encode(header()) + b"\n" + b"".join(msgspec.json.encode(e) + b"\n" for e in events)
    path.write_bytes(body + tail)
    return path


@pytest.mark.anyio
async def test_torn_last_line_is_tolerated_and_reported(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = sample_events()
    full = msgspec.json.encode(events[-1])
    write_log(home, events[:-1], tail=full[: len(full) // 2])
    result = await JsonlStore().read("sess_0123abcd")
    _, got = result
    assert got == events[:-1]
    assert result.torn is not None and result.torn.line == len(events) and result.torn.data == full[: len(full) // 2]
    assert "torn" in capsys.readouterr().err


@pytest.mark.anyio
async def test_zero_filled_tail_is_treated_as_torn(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = sample_events()
    write_log(home, events, tail=b"\0\0\0\0\n")
    result = await JsonlStore().read("sess_0123abcd")
    assert result[1] == events and result.torn is not None
    assert "torn" in capsys.readouterr().err


@pytest.mark.anyio
async def test_corruption_in_the_middle_is_an_error(home: Path) -> None:
    events = sample_events()
    path = write_log(home, events)
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:10]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(DshError, match=r"sess_0123abcd.jsonl:3: corrupt record"):
        await JsonlStore().read("sess_0123abcd")


@pytest.mark.anyio
async def test_unknown_event_type_is_skipped_and_reported(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = sample_events()
    path = write_log(home, events[:1])
    with open(path, "ab") as f:
        f.write(b'{"type":"future/thing","seq":2,"time":1.0}\n' + msgspec.json.encode(events[1]) + b"\n")
    result = await JsonlStore().read("sess_0123abcd")
    assert result[1] == events[:2]
    assert len(result.contents.skipped) == 1
    assert "cannot decode" in capsys.readouterr().err


@pytest.mark.anyio
async def test_reopen_after_crash_cuts_torn_tail_then_appends(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = sample_events()
    write_log(home, events[:3], tail=b'{"type":"turn/st')
    log = JsonlStore().open(header())
    log.append(events[3])
    await log.close()
    result = await JsonlStore().read("sess_0123abcd")
    assert result.torn is None
    assert result[1] == events[:4]
    assert "dropping a torn last line" in capsys.readouterr().err


@pytest.mark.anyio
async def test_prefix_lookup(home: Path) -> None:
    write_log(home, sample_events())
    assert (await JsonlStore().read("sess_0123"))[0].id == "sess_0123abcd"


# ----------------------------------------------------------------------------- through a real host


@pytest.mark.anyio
async def test_host_picks_the_jsonl_store_and_agent_events_land_on_disk(home: Path, tmp_path: Path) -> None:
    from dsh_core.compose import Composition
    from dsh_core.contracts import AgentSpec
    from dsh_core.host import hookimpl, make_plugin_manager, open_host
    from dsh_core.types import Finish, ModelInfo, RetryPolicy, TextDelta

    class Provider:
        name = "fake"
        retry_policy = RetryPolicy(max_retries=0)

        def resolve(self, model: str) -> ModelInfo:
            return ModelInfo(provider="fake", model=model)

        async def stream(self, request):
            yield TextDelta(text="pong")
            yield Finish(reason="stop")

    class FakeModel:
        @hookimpl
        def dsh_register_models(self, register) -> None:
            register(Provider())

    pm = make_plugin_manager(trace=False)
    pm.register(plugin, name="jsonl-persistence")
    pm.register(FakeModel(), name="fake-model")
    comp = Composition(name="t", path=tmp_path / "example.toml", plugins=("jsonl-persistence", "fake-model"))
    async with open_host(comp, provider="fake", model="m", pm=pm) as host:
        assert isinstance(host.session_store, JsonlStore)
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="fake", model="m"))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="ping")]))
        await agent.wait_idle()
        sid = agent.session_id
    h, events = await JsonlStore().read(sid)
    assert h.id == sid and h.cwd == str(tmp_path)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert isinstance(events[0], UserMessageEvent)
    assert any(isinstance(e, AssistantMessageEvent) and e.message.content == [TextBlock(text="pong")] for e in events)


# ----------------------------------------------------------------------------- CLI (real subprocess)


def dsh(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: os.environ[k] for k in ("PATH", "SHELL", "TERM", "USER", "LOGNAME", "HOME") if k in os.environ}
    env["DSH_HOME"] = str(home)
    # The test kit's noisy plugin is installed too: its import-time prints must land on stderr.
    return subprocess.run([sys.executable, "-m", "dsh_core.cli", *args], env=env, capture_output=True, text=True, timeout=60)


def test_cli_list_and_show(home: Path) -> None:
    events = sample_events()
    path = write_log(home, events)
    out = dsh(home, "sessions", "list")
    assert out.returncode == 0, out.stderr
    sid, updated, cwd, title = out.stdout.rstrip("\n").split("\t")
    assert (sid, cwd, title) == ("sess_0123abcd", "/work", "hi") and updated.endswith("Z")

    out = dsh(home, "sessions", "list", "--json")
    assert [r["sessionId"] for r in json.loads(out.stdout)] == ["sess_0123abcd"]

    out = dsh(home, "sessions", "show", "sess_0123abcd")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("session sess_0123abcd")
    assert len(lines) == 1 + len(events)
    assert "user/message" in lines[1] and "hi\\nthere" in lines[1]
    assert "assistant/message" in lines[5] and "done" in lines[5]

    out = dsh(home, "sessions", "show", "--json", "sess_0123")
    assert out.stdout.encode() == path.read_bytes()


def test_cli_list_shows_subagents_under_their_parent(home: Path) -> None:
    """Children (and theirs) indented under their parent, oldest first; a child whose parent's log is
    gone is not listed at the top (it is a subagent); ACP session/list still shows parents only."""
    d = home / "sessions"
    d.mkdir(parents=True)

    def log(sid: str, created: float, parent: str | None, prompt: str) -> None:
        h = SessionHeader(id=sid, cwd="/work", created_at=created, parent_session=parent,
                          delegation_depth=0 if parent is None else 1)
        msg = UserMessageEvent(seq=1, time=created, message=UserMessage(id="m", content=[TextBlock(text=prompt)]))
        (d / f"{sid}.jsonl").write_bytes(msgspec.json.encode(h) + b"\n" + msgspec.json.encode(msg) + b"\n")

    log("top", 1.0, None, "the task")
    log("kid2", 3.0, "top", "second child")
    log("kid1", 2.0, "top", "first child")
    log("grand", 4.0, "kid1", "grandchild")
    log("orphan", 5.0, "gone", "no parent log")
    out = dsh(home, "sessions", "list")
    assert out.returncode == 0, out.stderr
    shape = [(line.split("\t")[0], line.split("\t")[-1]) for line in out.stdout.splitlines()]
    assert shape == [("top", "the task"), ("└ kid1", "first child"), ("  └ grand", "grandchild"),
                     ("└ kid2", "second child")]
    rows = json.loads(dsh(home, "sessions", "list", "--json").stdout)
    assert [r["sessionId"] for r in rows] == ["top"]
    assert [(c["sessionId"], [g["sessionId"] for g in c.get("children", [])]) for c in rows[0]["children"]] == [
        ("kid1", ["grand"]), ("kid2", [])]
    assert [s.id for s in JsonlStore().summaries_sync()] == ["top"]


def test_cli_show_renders_each_model_call(home: Path) -> None:
    """Per model call: reasoning, text, tool calls with their arguments, finish, usage; a failed call
    with its error class."""
    from dsh_core.types import ModelCallFailed, ReasoningBlock, ToolCallBlock

    evs = [
        ModelCallFailed(turn=1, step=1, attempt=0, message="rate limit reached", code="RATE_LIMIT", retryable=True,
                        status=429),
        AssistantMessageEvent(
            turn=1, step=1, finish="tool-calls", usage=Usage(input_tokens=30, output_tokens=4, cache_hit_tokens=20),
            message=AssistantMessage(id="a1", content=[
                ReasoningBlock(text="look first"), TextBlock(text="listing"),
                ToolCallBlock(id="call_7", name="bash", arguments='{"command": "ls"}')]),
        ),
    ]
    for i, ev in enumerate(evs, 1):
        ev.seq, ev.time = i, 1700000000.0 + i
    write_log(home, evs)
    out = dsh(home, "sessions", "show", "sess_0123abcd")
    assert out.returncode == 0, out.stderr
    failed, answer = out.stdout.splitlines()[1:]
    assert "llm/error" in failed and "RATE_LIMIT (HTTP 429, retryable): rate limit reached" in failed
    assert "attempt 0" in failed
    assert "[reasoning: look first] listing bash({\"command\": \"ls\"}) [call_7]" in answer
    assert answer.endswith("· tool-calls · in 30 (cache 20) out 4")


def test_cli_show_torn_and_missing(home: Path) -> None:
    path = write_log(home, sample_events(), tail=b'{"type":"no')
    out = dsh(home, "sessions", "show", "--json", "sess_0123abcd")
    assert out.returncode == 0
    assert out.stdout.encode() == path.read_bytes()[: -len(b'{"type":"no')]
    assert "torn" in out.stderr

    out = dsh(home, "sessions", "show", "nope")
    assert out.returncode != 0 and "no session 'nope'" in out.stderr

    out = dsh(home, "sessions", "show", "../etc")
    assert out.returncode != 0 and "not usable as a file name" in out.stderr


@pytest.mark.anyio
async def test_descriptor_is_append_only(home: Path) -> None:
    log = JsonlStore().open(header())
    log.append(sample_events()[0])
    fdinfo = Path(f"/proc/self/fdinfo/{log._fd}")
    if not fdinfo.exists():  # pragma: no cover - not Linux
        pytest.skip("needs /proc")
    flags = int(next(line for line in fdinfo.read_text().splitlines() if line.startswith("flags:")).split()[1], 8)
    await log.close()
    assert flags & os.O_APPEND
