"""The five tools over real stdio (the official ACP SDK client, a real ``dsh`` process, real JSONL
logs, real SQLite): a session finds and reads another session of its workspace, never one of
another workspace, and ``dsh sessions search`` finds the same for a person."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from acp import text_block

pytestmark = pytest.mark.anyio

WORD = "PAPAYA-42"


def _log(home: Path, sid: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (home / "sessions" / f"{sid}.jsonl").read_text().splitlines()]


def _results(home: Path, sid: str) -> dict[str, dict[str, Any]]:
    """The session's tool results by call id: text, error, code."""
    out = {}
    for rec in _log(home, sid):
        if rec["type"] == "tool/result":
            r = rec["result"]
            out[r["callId"]] = {"text": "\n".join(b.get("text", "") for b in r["content"]),
                                "error": r.get("isError", False), "code": rec.get("code")}
    return out


def _calls(scripted: Any, steps: list[dict[str, Any]]) -> Path:
    return scripted({"rules": [{"when": "^ask", "steps": [*steps, {"text": "DONE"}]},
                               {"when": ".", "steps": [{"text": f"noted {WORD}"}]}]})


async def _session(run: Any, cwd: Path, prompt: str) -> str:
    sid = (await run.conn.new_session(cwd=str(cwd), mcp_servers=[])).session_id
    assert (await run.conn.prompt(session_id=sid, prompt=[text_block(prompt)])).stop_reason == "end_turn"
    return sid


async def test_a_session_finds_reads_and_traces_another_of_its_workspace_only(acp_agent, scripted, tmp_path):
    other = acp_agent.work.parent / "elsewhere"
    other.mkdir()
    first = _calls(scripted, [])
    async with acp_agent(first, example="acp-extended") as run:
        await run.conn.initialize(protocol_version=1)
        mine = await _session(run, run.cwd, f"remember {WORD} for later")
        theirs = await _session(run, other, f"remember {WORD} somewhere else")
        assert await run.close_stdin() == 0

    steps = [
        {"tool": "session_search", "args": {"query": WORD}},
        {"tool": "session_event_read", "args": {"session_id": mine, "seq": 1, "after": 2}},
        {"tool": "session_trace", "args": {"session_id": mine}},
        {"tool": "session_event_search", "args": {"session_id": mine, "query": WORD.lower()}},
        {"tool": "session_event_trace", "args": {"session_id": mine, "seq": 1}},
        {"tool": "session_event_read", "args": {"session_id": theirs, "seq": 1}},
        {"tool": "session_event_search", "args": {"session_id": "no-such-session", "query": "x"}},
        {"tool": "session_event_search", "args": {"query": "needle-in-its-own-call"}},
        {"tool": "session_search", "args": {"query": WORD, "created_at_from": "yesterday"}},
    ]
    second = _calls(scripted, steps)
    async with acp_agent(second, example="acp-extended") as run:
        await run.conn.initialize(protocol_version=1)
        asker = await _session(run, run.cwd, "ask around")
        assert await run.close_stdin() == 0
    results = list(_results(acp_agent.home, asker).values())
    found, read, trace, events, etrace, foreign, unknown, itself, bad_time = results

    # the other workspace's session matched too, but is not shown; the asker never finds itself
    assert found["text"].startswith("Session search results (1):\n\n1. Session " + mine + f" — remember {WORD} for later")
    assert theirs not in found["text"] and "Parent: root" in found["text"]
    assert "Availability: persisted" in found["text"]
    best = found["text"].split("Best match: seq ", 1)[1]  # the answer (a shorter text ranks first in BM25)
    assert best.startswith("5 | assistant/message | current | 20") and best.endswith(f"Snippet: noted {WORD}")
    assert read["text"].startswith(f"Session {mine} — remember {WORD} for later\nTarget event seq 1:\n```json\n")
    body = read["text"].split("```json\n", 1)[1].split("\n```", 1)[0]
    logged = _log(acp_agent.home, mine)[1]  # the logged record, unabridged, its time in ISO 8601
    stamp = datetime.fromtimestamp(logged["time"], tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert list(json.loads(body).items()) == list({**logged, "time": stamp}.items())
    assert "\nAfter:\n- seq 2 | agent/inbox/claimed |" in read["text"]
    assert trace["text"].endswith("Ancestors (nearest first):\n- none (target is a root session)\n\nDescendants:\n- none")
    assert "Event search results (" in events["text"] and "| user/message | current |" in events["text"]
    assert etrace["text"].splitlines()[-1] == "Direct derived events: 2"  # the claim of the prompt
    for refused in (foreign, unknown):  # another workspace and no session at all answer alike
        assert refused["error"] and refused["code"] == "SESSION_QUERY_TOOL_UNAUTHORIZED"
        assert refused["text"].endswith("session target is outside the caller workspace")
    # its own session, but not the step that asks: the call cannot find itself
    assert itself["text"].endswith("No prior event matches found.")
    assert bad_time["error"] and bad_time["code"] == "SESSION_QUERY_INVALID_FILTER"


async def test_people_search_every_workspace_with_dsh_sessions_search(acp_agent, scripted):
    other = acp_agent.work.parent / "elsewhere"
    other.mkdir()
    async with acp_agent(_calls(scripted, []), example="acp-extended") as run:
        await run.conn.initialize(protocol_version=1)
        mine = await _session(run, run.cwd, f"remember {WORD} here")
        theirs = await _session(run, other, f"and {WORD} there")
        assert await run.close_stdin() == 0
    env = {**os.environ, "DSH_HOME": str(acp_agent.home)}
    dsh = [sys.executable, "-m", "dsh_core.cli"]
    out = subprocess.run([*dsh, "sessions", "search", WORD, "--json"], env=env, capture_output=True, text=True,
                         check=True)
    assert {h["sessionId"] for h in json.loads(out.stdout)} == {mine, theirs}
    one = subprocess.run([*dsh, "sessions", "search", WORD, "--cwd", str(other)], env=env, capture_output=True,
                         text=True, check=True)
    assert one.stdout.startswith(theirs + "\t") and mine not in one.stdout
    none = subprocess.run([*dsh, "sessions", "search", "nothing like it"], env=env, capture_output=True, text=True)
    assert none.returncode == 1 and none.stdout == "" and "no session matches" in none.stderr


async def test_a_session_reads_its_subagents_transcript_and_lineage(acp_agent, scripted):
    child_word = "KIWI-977"
    script = scripted({"rules": [
        {"when": "^child:", "steps": [{"text": f"the child found {child_word}"}]},
        {"when": "^ask", "steps": [
            {"tool": "subagent", "args": {"description": "look", "prompt": "child: look around",
                                           "run_in_background": False}},
            {"tool": "session_search", "args": {"query": child_word}},
            {"tool": "session_trace", "args": {}},
            {"text": "DONE"},
        ]},
    ]})
    async with acp_agent(script, example="acp-extended") as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("ask the child")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    child = next(p.stem for p in (acp_agent.home / "sessions").glob("*.jsonl")
                 if _log(acp_agent.home, p.stem)[0].get("parentSession") == sid)
    _, found, trace = _results(acp_agent.home, sid).values()
    assert found["text"].startswith(f"Session search results (1):\n\n1. Session {child} — child: look around")
    assert f"Parent: {sid}" in found["text"] and f"Snippet: the child found {child_word}" in found["text"]
    # a foreground run is disposed once its answer is collected (as the original's): only its log remains
    assert "Availability: persisted" in found["text"]
    assert trace["text"].split("Descendants:\n", 1)[1].startswith(f"- {child} — child: look around |")


async def test_without_session_logs_the_tools_say_search_is_disabled(scripted, tmp_path):
    from dsh_core.contracts import AgentSpec
    from dsh_testing import memory_host

    script = scripted({"default": [{"text": "ok"}]})
    async with memory_host(script, plugins=("scripted-model", "session-query")) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        out = await agent.call_tool("session_search", {"query": "x"}, call_id="c1", turn=1, step=1)
    assert out.is_error and out.code == "SESSION_QUERY_SEARCH_DISABLED"
