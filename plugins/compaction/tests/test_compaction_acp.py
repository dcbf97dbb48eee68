"""Compaction over real stdio with the official ACP SDK client: a keyless scripted session
that outgrows a small ``context_window``, and DeepSeek sessions (the loopback fake server,
whose token counts and 400 overflow are the real API's shape) that outgrow a small
configured window — by pressure, and by the provider's overflow error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fake_deepseek import FakeDeepSeek, Turn

from dsh_testing import spawn_acp

acp = pytest.importorskip("acp")
pytestmark = pytest.mark.anyio

ACP_AGENT = Path(__file__).resolve().parents[3] / "examples" / "acp-agent" / "example.toml"


def _log(home: Path, sid: str) -> list[dict]:
    return [json.loads(line) for line in (home / "sessions" / f"{sid}.jsonl").read_text().splitlines()]


async def test_keyless_scripted_session_outgrowing_its_window_compacts_and_ends_end_turn(tmp_path: Path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({
        "capabilities": {"context_window": 4000},  # the acp-agent prefix (system + tool schemas) is ~1900
        "rules": [{"when": "^<transcript>", "steps": [{"text": "The user sent four long notes; each was noted."}]}],
        "default": [{"text": "noted {prompt}"}],
    }))
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    async with spawn_acp(script, cwd=work, env={"DSH_HOME": str(home)}) as run:
        sid = await run.start()
        for n in range(5):
            resp = await run.conn.prompt(session_id=sid, prompt=[acp.text_block(f"note {n}: " + "z" * 1200)])
            assert resp.stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    log = _log(home, sid)
    summaries = [e for e in log if e["type"] == "compaction/summary"]
    assert summaries and summaries[0]["reason"] == "pressure"
    assert summaries[0]["message"]["content"][0]["text"].endswith("The user sent four long notes; each was noted.")
    assert [e["reason"] for e in log if e["type"] == "turn/end"] == ["completed"] * 5
    assert "compaction" not in bytes(run.stdout).decode()  # nothing of it on the ACP wire
    assert run.client.text(sid)[-1].startswith("noted note 4: zzz")


def _example(tmp_path: Path, *, window: int, threshold: float) -> Path:
    """acp-agent as shipped, with the DeepSeek route's window made small (and the compaction threshold set)."""
    root = tmp_path / "examples" / "small-window"
    root.mkdir(parents=True)
    text = ACP_AGENT.read_text()
    text += (f'\n[config.deepseek-model.models.deepseek-flash]\ncontext-window = {window}\nmax-output = 1000\n'
             f'\n[config.compaction]\nthreshold-ratio = {threshold}\n')
    (root / "example.toml").write_text(text)
    return root.parent


@pytest.mark.parametrize("threshold, reason", [(0.8, "pressure"), (0.99, "overflow")])
async def test_deepseek_session_outgrowing_a_small_window_completes(tmp_path: Path, threshold: float, reason: str):
    window = 10000  # 6000 until acp-agent's prefix grew by the job tools, 7000 until the tools' guidance sections and goals
    examples = _example(tmp_path, window=window, threshold=threshold)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    burst = json.dumps({"command": "head -c 4600 /dev/zero | tr '\\0' y", "description": "Print a burst"})
    steps = 12
    with FakeDeepSeek(keepalive_every_s=0.05, context_window=window) as fake:
        # Every answer carries text, so whichever one the summary call takes is a usable summary;
        # the session then simply has one tool step fewer.
        fake.push(*[Turn(reasoning=f"step {i}", content=f"Burst {i} of the long task.", tool_calls=[("bash", burst)])
                    for i in range(steps)], Turn(reasoning="done", content="All bursts are done."))
        env = {"DSH_HOME": str(home), "DEEPSEEK_BASE_URL": fake.base_url, "DEEPSEEK_API_KEY": fake.api_key,
               "DSH_EXAMPLES_PATH": os.pathsep.join([str(examples)])}
        async with spawn_acp(None, cwd=work, env=env, example="small-window") as run:
            sid = await run.start()
            resp = await run.conn.prompt(session_id=sid, prompt=[acp.text_block("run the long task")])
            assert resp.stop_reason == "end_turn"
            assert run.client.text(sid)[-1] == "All bursts are done."
            assert await run.close_stdin() == 0
        chats = fake.chat_requests
    log = _log(home, sid)
    kinds = [e["type"] for e in log]
    assert "compaction/failed" not in kinds and kinds[-1] == "turn/end" and log[-1]["reason"] == "completed"
    starts = [e for e in log if e["type"] == "compaction/start"]
    assert starts and starts[0]["reason"] == reason
    # Without compaction the session would not fit: the full history is larger than the window.
    full = sum(len(json.dumps(e.get("result") or e.get("message") or {})) for e in log) // 4
    assert full > window
    statuses = [r.status for r in chats]
    if reason == "overflow":
        assert 400 in statuses  # the provider said no, and the turn went on
        assert statuses.count(400) == len(starts)  # each overflow was compacted and retried once
    else:
        assert 400 not in statuses  # the meter compacted before the provider had to refuse
    assert max(r.prompt_tokens for r in chats if r.status == 200) + 1000 <= window
