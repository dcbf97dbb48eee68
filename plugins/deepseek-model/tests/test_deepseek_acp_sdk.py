"""End to end over real stdio with the official ACP SDK client: ``dsh run --example
acp-agent`` (the shipped example, whose default route is deepseek / deepseek-flash) as a
subprocess, ``DEEPSEEK_BASE_URL`` pointing at the loopback fake and a dummy key.
``spawn_acp`` validates every stdout frame against ACP's schema when the run closes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_deepseek import FakeDeepSeek, Turn

from dsh_testing import spawn_acp

pytest.importorskip("dsh_acp_transport")
acp = pytest.importorskip("acp")

pytestmark = pytest.mark.anyio

NOTE = "The launch code is 0451.\nNothing else of note.\n"


def _session_log(home: Path, session_id: str) -> list[dict]:
    path = home / "sessions" / f"{session_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _kinds(updates: list) -> list[str]:
    return [getattr(u, "session_update", None) for _, u in updates]


async def test_acp_agent_example_over_stdio_with_the_sdk_client(fake: FakeDeepSeek, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text(NOTE)
    home = tmp_path / "home"
    env = {"DSH_HOME": str(home), "DEEPSEEK_BASE_URL": fake.base_url, "DEEPSEEK_API_KEY": fake.api_key}
    fake.push(
        Turn(reasoning="A greeting; answer briefly.", content="Hello from the fake DeepSeek."),
        Turn(reasoning="I should read notes.txt first.", tool_calls=[("read", json.dumps({"file_path": "notes.txt"}))]),
        Turn(reasoning="The file names the code 0451.", content="notes.txt says the launch code is 0451."),
    )
    async with spawn_acp(None, cwd=work, env=env) as run:  # no --provider/--model: the manifest's route
        sid = await run.start()

        # 1. A text turn: the committed answer as one chunk, then end_turn.
        resp = await run.conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid) == ["Hello from the fake DeepSeek."]
        assert _kinds(run.client.updates) == ["agent_message_chunk"]

        # 2. A thinking turn that uses sandbox-tools' read on a file in the cwd, then answers.
        before = len(run.client.updates)
        resp = await run.conn.prompt(session_id=sid, prompt=[acp.text_block("what does notes.txt say?")])
        assert resp.stop_reason == "end_turn"
        turn_updates = run.client.updates[before:]
        assert _kinds(turn_updates) == ["agent_message_chunk"]  # committed text only: no thoughts, no tool noise
        assert [u.content.text for _, u in turn_updates] == ["notes.txt says the launch code is 0451."]
        assert await run.close_stdin() == 0

    stdout, stderr = bytes(run.stdout).decode(), bytes(run.stderr).decode()
    for reasoning in ("A greeting; answer briefly.", "I should read notes.txt first.", "The file names the code 0451."):
        assert reasoning not in stdout
    assert "1: The launch code is 0451." not in stdout  # the tool output stayed between agent and model

    # The manifest's route reached the fake; the tool result went back with the reasoning replayed.
    chats = fake.chat_requests
    assert [r.status for r in chats] == [200, 200, 200]
    assert {r.body["model"] for r in chats} == {"deepseek-flash"}
    last = chats[-1].body["messages"]
    tool_msgs = [m for m in last if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and "The launch code is 0451." in tool_msgs[0]["content"]
    assert [m.get("reasoning_content") for m in last if m["role"] == "assistant"] == [
        "A greeting; answer briefly.", "I should read notes.txt first."]
    assert all(r.headers.get("Authorization") == f"Bearer {fake.api_key}" for r in chats)

    # The session was persisted (jsonl-persistence) and the key is nowhere: stdout, stderr, DSH_HOME.
    log = _session_log(home, sid)
    assert [e["type"] for e in log].count("tool/result") == 1
    assert fake.api_key not in stdout and fake.api_key not in stderr
    files = [p for p in home.rglob("*") if p.is_file()]
    assert any(p.suffix == ".jsonl" for p in files)
    for path in files:
        assert fake.api_key.encode() not in path.read_bytes(), path
