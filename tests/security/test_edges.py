"""Crafted input nested deeper than any decoder recurses (issue 22 item 7): a replay log at
start-up, an ACP frame, a session log that is listed or resumed. Each gives one clear, bounded
line and loses nothing; none gives a raw ``RecursionError``. (Deep ``run_code`` values are in
``plugins/code-mode/tests/test_hostile_values.py``; a huge session id in ``test_sessions.py``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from acp import RequestError, text_block

from dsh_testing.harness import minimal_env

pytestmark = pytest.mark.anyio

STRESS = os.environ.get("DSH_STRESS") == "1"
DEPTH = 1_000_000 if STRESS else 200_000
DEEP = b"[" * DEPTH + b"]" * DEPTH


def test_a_deeply_nested_replay_log_is_one_clear_line_at_start_up(tmp_path):
    log = tmp_path / "session.jsonl"
    log.write_bytes(b'{"type":"session","id":"x","junk":' + DEEP + b"}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dsh_core.cli", "run", "--example", "acp-agent", "--provider", "replay",
         "--model", str(log)],
        input=b"", capture_output=True, timeout=60, cwd=tmp_path, env=minimal_env(DSH_HOME=str(tmp_path / "home")),
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2 and proc.stdout == b"", (proc.returncode, err[-500:])
    assert "Traceback" not in err and "RecursionError" not in err, err[-500:]
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert "nested too deeply" in line and "session.jsonl:1" in line and len(line) < 400


async def test_a_deeply_nested_frame_gets_an_error_and_the_agent_serves_on(acp_agent, scripted):
    script = scripted({"default": [{"text": "PONG"}]})
    async with acp_agent(script) as run:
        sid = await run.start()
        assert run.proc.stdin is not None
        run.proc.stdin.write(b'{"jsonrpc":"2.0","id":"deep","method":"session/prompt","params":' + DEEP + b"}\n")
        await run.proc.stdin.drain()
        reply = await run.conn.prompt(session_id=sid, prompt=[text_block("still there?")])
        assert reply.stop_reason == "end_turn" and run.client.text(sid) == ["PONG"]
    frames = [json.loads(x) for x in run.stdout.splitlines() if x.strip()]
    errors = [f for f in frames if "error" in f]
    assert errors and all(len(json.dumps(f)) < 2_000 for f in errors)
    assert "Traceback" not in run.stderr.decode()


async def test_a_crafted_session_log_is_refused_plainly_on_list_and_resume(acp_agent, scripted):
    script = scripted({"default": [{"text": "PONG"}]})
    sessions = acp_agent.home / "sessions"
    sessions.mkdir(parents=True)
    header = {"type": "session", "id": "crafted", "cwd": str(acp_agent.work), "provider": "scripted", "model": "x"}
    deep_prompt = (b'{"type":"user/message","seq":1,"time":1,"message":{"id":"u","content":[{"type":"text",'
                   b'"text":"x","extra":' + DEEP + b"}]}}\n")
    (sessions / "crafted.jsonl").write_bytes(json.dumps(header).encode() + b"\n" + deep_prompt
                                             + b'{"type":"turn/end","seq":2,"time":1,"turn":1,"reason":"done"}\n')
    async with acp_agent(script) as run:
        await run.conn.initialize(protocol_version=1)
        listed = await run.conn.list_sessions()
        assert [s.session_id for s in listed.sessions] == ["crafted"]  # listed, without a title
        with pytest.raises(RequestError) as err:
            await run.conn.resume_session(session_id="crafted", cwd=str(run.cwd))
        details = err.value.data["details"]
        assert "nested too deeply" in details and len(details) < 500, details
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("x")])).stop_reason == "end_turn"
    assert "Traceback" not in run.stderr.decode()
