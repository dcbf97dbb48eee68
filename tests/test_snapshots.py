"""Keyless snapshot scenarios over the assembled example, over real stdio (tox -e snapshots).

Each scenario boots `dsh run --example …` with a scripted model, drives it with the
official SDK client, and pins two readable files under snapshots/acp-agent/<scenario>/:
`stdout.jsonl` (every frame the agent wrote, ids renumbered) and `session.jsonl` (every
durable event of every session, times zeroed). Snapshots change only through
`tox -e update-snapshots`, reviewed in the diff.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from acp import RequestError, text_block
from acp.helpers import resource_link_block

from dsh_core.testing import Recorder, normalize_transcript

pytestmark = [pytest.mark.anyio, pytest.mark.snapshot_scenario]
SNAPSHOTS = Path(__file__).resolve().parent.parent / "snapshots" / "acp-agent"

HEX = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")


def normalize_log(home: Path, session_ids: list[str], replacements: dict[str, str]) -> str:
    lines = []
    for n, sid in enumerate(session_ids):
        for raw in (home / "sessions" / f"{sid}.jsonl").read_text().splitlines():
            rec = json.loads(raw)
            for key in ("time", "createdAt"):
                if key in rec:
                    rec[key] = 0
            text = json.dumps(rec, sort_keys=True)
            for old, new in replacements.items():
                text = text.replace(old, new)
            text = text.replace(sid, f"{{{{session{n}}}}}")
            lines.append(HEX.sub("{{id}}", text))
    return "\n".join(lines) + "\n"


def normalize_stdout(frames: list[dict], session_ids: list[str], replacements: dict[str, str]) -> str:
    raw = json.dumps(frames)
    for n, sid in enumerate(session_ids):
        raw = raw.replace(sid, f"{{{{session{n}}}}}")
    text = normalize_transcript(json.loads(raw))
    for old, new in replacements.items():
        text = text.replace(old, new)
    return HEX.sub("{{id}}", text)


async def _handshake(run, sids):
    await run.conn.initialize(protocol_version=1)
    sids.append((await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id)


async def _prompt(run, sid, *blocks):
    return await run.conn.prompt(session_id=sid, prompt=list(blocks))


async def sc_handshake(run, sids):
    await _handshake(run, sids)


async def sc_reject_extra_dirs(run, sids):
    await run.conn.initialize(protocol_version=1)
    with pytest.raises(RequestError):
        await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[], additional_directories=["/extra-dir"])


async def sc_text_turn(run, sids):
    await _handshake(run, sids)
    await _prompt(run, sids[0], text_block("ping"))


async def sc_multi_turn(run, sids):
    await _handshake(run, sids)
    await _prompt(run, sids[0], text_block("ping"))
    await _prompt(run, sids[0], text_block("ping again"))


async def sc_error_finish(run, sids):
    await _handshake(run, sids)
    with pytest.raises(RequestError):
        await _prompt(run, sids[0], text_block("fail please"))


async def sc_cancel(run, sids):
    await _handshake(run, sids)
    task = asyncio.create_task(_prompt(run, sids[0], text_block("hang")))
    log = run.home / "sessions" / f"{sids[0]}.jsonl"
    for _ in range(1000):
        if log.exists() and "turn/start" in log.read_text():
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    await run.conn.cancel(session_id=sids[0])
    assert (await task).stop_reason == "cancelled"


async def sc_max_tokens_continue(run, sids):
    await _handshake(run, sids)
    assert (await _prompt(run, sids[0], text_block("long story"))).stop_reason == "end_turn"
    assert (await _prompt(run, sids[0], text_block("continue"))).stop_reason == "end_turn"


async def sc_escalation_approved(run, sids):
    run.client.permission_answers.append("allow-once")
    await _handshake(run, sids)
    await _prompt(run, sids[0], text_block("write it"))


async def sc_escalation_rejected(run, sids):
    run.client.permission_answers.append("reject-once")
    await _handshake(run, sids)
    await _prompt(run, sids[0], text_block("write it"))


async def sc_resource_link(run, sids):
    await _handshake(run, sids)
    await _prompt(run, sids[0], text_block("summarise "), resource_link_block("spec.md", "file:///docs/spec.md"))


async def sc_two_sessions(run, sids):
    await _handshake(run, sids)
    sids.append((await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id)
    await _prompt(run, sids[0], text_block("ping"))
    await _prompt(run, sids[1], text_block("ping from two"))
    await _prompt(run, sids[0], text_block("where"))


SCRIPT = {
    "rules": [
        {"when": "^ping", "steps": [{"reasoning": "easy", "text": "PONG", "usage": {"inputTokens": 12, "outputTokens": 1}}]},
        {"when": "fail", "steps": [{"error": "auth"}]},
        {"when": "hang", "steps": [{"partial": "partial", "delay_ms": 60000}]},
        {"when": "long story", "steps": [{"finish": "length", "text": "Once upon a"}]},
        {"when": "continue", "steps": [{"text": "time."}]},
        {"when": "write it", "steps": [
            {"tool": "guarded_write", "args": {"path": "out.txt", "content": "hello"}},
            {"text": "tool said: {tool_result}"}]},
        {"when": "where", "steps": [{"text": "in {cwd}"}]},
    ],
    "default": [{"text": "echo: {prompt}"}],
}

SCENARIOS = {
    "handshake": ("acp-agent", sc_handshake),
    "reject-extra-dirs": ("acp-agent", sc_reject_extra_dirs),
    "text-turn": ("acp-agent", sc_text_turn),
    "multi-turn": ("acp-agent", sc_multi_turn),
    "error-finish": ("acp-agent", sc_error_finish),
    "cancel": ("acp-agent", sc_cancel),
    "max-tokens-continue": ("acp-agent", sc_max_tokens_continue),
    "escalation-approved": ("acp-testkit", sc_escalation_approved),
    "escalation-rejected": ("acp-testkit", sc_escalation_rejected),
    "resource-link": ("acp-agent", sc_resource_link),
    "two-sessions": ("acp-agent", sc_two_sessions),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_scenario(name, acp_agent, scripted, snapshot):
    example, body = SCENARIOS[name]
    script = scripted(SCRIPT)
    sids: list[str] = []
    async with acp_agent(script, example=example, client=Recorder()) as run:
        run.home = acp_agent.home
        await body(run, sids)
    replacements = {str(script): "{{script}}", str(run.cwd): "{{cwd}}"}
    snapshot.snapshot_dir = SNAPSHOTS / name
    snapshot.assert_match(normalize_stdout(run.frames, sids, replacements), "stdout.jsonl")
    logs = [s for s in sids if (acp_agent.home / "sessions" / f"{s}.jsonl").exists()]
    snapshot.assert_match(normalize_log(acp_agent.home, logs, replacements) if logs else "", "session.jsonl")
