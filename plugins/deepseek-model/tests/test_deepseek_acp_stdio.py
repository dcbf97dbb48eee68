"""The assembled ACP front door over real stdio, with DEEPSEEK_BASE_URL pointing at the fake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_deepseek import Turn

from dsh_testing import REPO

pytest.importorskip("dsh_acp_transport")

# the example the recorded DeepSeek scenarios run (tests/examples): acp-stdio, the JSONL store,
# deepseek-model with millisecond retries and no .env
EXAMPLE = REPO / "tests" / "examples" / "acp-deepseek-fast-retry" / "example.toml"


def test_acp_prompt_over_stdio_reaches_the_fake(env, tmp_path: Path):
    env.push(Turn(reasoning="hidden thoughts", content="Hello over ACP."))
    frames = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}},
        {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": str(tmp_path), "mcpServers": []}},
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_core.cli", "run", "--example", str(EXAMPLE)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "DSH_HOME": str(tmp_path / "home")}, cwd=tmp_path, text=True,
    )
    assert proc.stdin and proc.stdout
    try:
        def send(frame: dict) -> None:
            proc.stdin.write(json.dumps(frame) + "\n")
            proc.stdin.flush()

        def until(frame_id: int) -> tuple[dict, list[dict]]:
            seen = []
            for line in proc.stdout:
                msg = json.loads(line)
                if msg.get("id") == frame_id and "method" not in msg:
                    return msg, seen
                seen.append(msg)
            raise AssertionError(f"stdout closed before the answer to {frame_id}")

        for frame in frames:
            send(frame)
            answer, _ = until(frame["id"])
            assert "result" in answer, answer
        session_id = answer["result"]["sessionId"]
        send({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
              "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]}})
        answer, updates = until(3)
        assert answer["result"]["stopReason"] == "end_turn", answer
        chunks = [u["params"]["update"] for u in updates if u.get("method") == "session/update"]
        text = "".join(c["content"]["text"] for c in chunks if c.get("sessionUpdate") == "agent_message_chunk")
        assert text == "Hello over ACP."
    finally:
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert env.api_key not in err
    assert env.chat_requests and env.chat_requests[-1].body["model"] == "deepseek-flash"
