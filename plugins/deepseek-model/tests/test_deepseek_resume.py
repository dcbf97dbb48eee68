"""``session/resume`` in a new process (issue 17), over real stdio with the official SDK client,
against the loopback DeepSeek fake (a thinking route: reasoning must be replayed, and the
fake's prefix cache shows whether the resumed requests still hit)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest
from acp import RequestError, text_block
from fake_deepseek import Turn

from dsh_testing import spawn_acp, until

pytest.importorskip("dsh_acp_transport")
pytestmark = pytest.mark.anyio

MANIFEST = """
[example]
description = "acp + deepseek (fake) + a slow tool, with the JSONL store"
front-door = "acp-stdio"
plugins = ["acp-transport", "jsonl-persistence", "deepseek-model", "testkit-approval"]

[route]
provider = "deepseek"
model = "deepseek-flash"

[config.deepseek-model]
deadline = 30
retry = { max-retries = 1, base-delay = 0.01, max-delay = 0.1, jitter = 0.0 }
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def setup(env, tmp_path: Path):
    example = tmp_path / "acp-deepseek-resume"
    example.mkdir()
    (example / "example.toml").write_text(MANIFEST)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    home = tmp_path / "home"
    proc_env = {"DSH_HOME": str(home), "DEEPSEEK_API_KEY": env.api_key, "DEEPSEEK_BASE_URL": env.base_url}

    def spawn(**kw):
        return spawn_acp(None, cwd=work, example=str(example / "example.toml"), env=proc_env, **kw)

    return env, spawn, work, home



async def wait_for(predicate, timeout: float = 15.0) -> None:
    await until(predicate, timeout)


def log_of(home: Path, sid: str) -> list[dict]:
    return [json.loads(line) for line in (home / "sessions" / f"{sid}.jsonl").read_text().splitlines()]


def roles(body: dict) -> list[tuple[str, str]]:
    out = []
    for m in body["messages"]:
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        out.append((m["role"], text or ""))
    return out


async def test_resume_after_sigkill_mid_turn_continues_without_rerunning_the_torn_turn(setup):
    fake, spawn, work, home = setup
    fake.push(
        Turn(reasoning="think one", content="The answer is 41."),
        Turn(reasoning="think two", tool_calls=[("slow", '{"ms": 60000}')]),
    )
    async with spawn(check=False) as run:  # its stdout ends mid-stream: checked below up to the kill
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("remember 41")])).stop_reason == "end_turn"
        torn = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("now wait")]))
        await wait_for(lambda: (work / "slow-started").exists())
        os.killpg(run.proc.pid, signal.SIGKILL)
        await run.proc.wait()
        with pytest.raises(ConnectionError):  # the agent died with the prompt unanswered
            await asyncio.wait_for(torn, 10)
    log_path = home / "sessions" / f"{sid}.jsonl"
    with open(log_path, "ab") as f:
        f.write(b'{"type":"assistant/message","turn":2,"st')  # a torn tail, as if killed mid-write
    (work / "slow-started").unlink()

    fake.push(Turn(reasoning="think three", content="Still 41."))
    async with spawn() as run:
        init = await run.conn.initialize(protocol_version=1)
        caps = init.agent_capabilities.session_capabilities
        assert caps.resume is not None and caps.list is not None
        listed = await run.conn.list_sessions(cwd=str(work))
        assert [s.session_id for s in listed.sessions] == [sid] and listed.sessions[0].title == "remember 41"
        await run.conn.resume_session(session_id=sid, cwd=str(work))
        assert run.client.updates == []  # nothing replayed to the client
        with pytest.raises(RequestError) as err:  # open here already
            await run.conn.resume_session(session_id=sid, cwd=str(work))
        assert "already open" in err.value.data["details"]
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("what was it?")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid) == ["Still 41."]
        assert await run.close_stdin() == 0
    assert not (work / "slow-started").exists()  # the torn turn's tool was not re-run
    body = fake.chat_requests[-1].body
    seen = roles(body)
    assert [r for r, _ in seen] == ["system", "user", "assistant", "user", "assistant", "tool", "user"]
    assert "remember 41" in seen[1][1] and "41" in seen[2][1] and "now wait" in seen[3][1]
    assert "interrupted" in seen[5][1] and "not re-run" in seen[5][1]
    assert "what was it?" in seen[6][1]
    # the thinking route got the reasoning of the tool-calling message back (the fake enforces it)
    assert body["messages"][4].get("reasoning_content") == "think two"
    log = log_of(home, sid)
    assert sum(1 for e in log if e["type"] == "session") == 1  # appended to the same file, one header
    ends = [(e["turn"], e["reason"], e.get("abortKind")) for e in log if e["type"] == "turn/end"]
    assert ends == [(1, "completed", None), (2, "aborted", "interrupted"), (3, "completed", None)]
    assert [e["seq"] for e in log[1:]] == list(range(1, len(log)))  # numbering continues
    assert b"\"st\n" not in log_path.read_bytes()  # the torn fragment was cut before appending


async def test_resume_keeps_the_prefix_cache_hitting_and_refuses_what_it_cannot_do(setup, tmp_path):
    fake, spawn, work, home = setup
    fake.block = 1  # token-exact cache accounting, so the ratio says exactly what was reused
    fake.push(Turn(reasoning="r1", content="one"), Turn(reasoning="r2", content="two"))
    async with spawn() as run:
        sid = await run.start()
        for text in ("first question, with some length to it", "second question"):
            assert (await run.conn.prompt(session_id=sid, prompt=[text_block(text)])).stop_reason == "end_turn"
        last_before = fake.chat_requests[-1]
        await run.conn.close_session(session_id=sid)
        with pytest.raises(RequestError):  # a closed session is not open
            await run.conn.prompt(session_id=sid, prompt=[text_block("x")])
    fake.push(Turn(reasoning="r3", content="three"))
    other = tmp_path / "other"
    other.mkdir()
    async with spawn() as run:
        await run.conn.initialize(protocol_version=1)
        for bad, needle in (({"session_id": "nope", "cwd": str(work)}, "unknown session"),
                            ({"session_id": "../x", "cwd": str(work)}, "unknown session"),
                            ({"session_id": sid, "cwd": str(other)}, "differs")):
            with pytest.raises(RequestError) as err:
                await run.conn.resume_session(**bad)
            assert needle in err.value.data["details"]
        await run.conn.resume_session(session_id=sid, cwd=str(work))
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("third")])).stop_reason == "end_turn"
        resumed = fake.chat_requests[-1]
        await run.conn.close_session(session_id=sid)
    ratio = resumed.cache_hit_tokens / resumed.prompt_tokens
    print(f"\nresumed request: {resumed.cache_hit_tokens}/{resumed.prompt_tokens} prompt tokens from cache "
          f"({ratio:.0%}); the last request before: {last_before.cache_hit_tokens}/{last_before.prompt_tokens}")
    # everything the last pre-restart request sent (system, tools, history) is a cached prefix again
    assert resumed.cache_hit_tokens >= last_before.prompt_tokens
    # a newer log format is refused with a clear reason
    path = home / "sessions" / f"{sid}.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["version"] = 99
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    async with spawn() as run:
        await run.conn.initialize(protocol_version=1)
        with pytest.raises(RequestError) as err:
            await run.conn.resume_session(session_id=sid, cwd=str(work))
        assert "newer" in err.value.data["details"]
