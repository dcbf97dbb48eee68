"""A directory name must not choose commands (issue 22 item 3): ``${CLAUDE_PROJECT_DIR}`` reaches a
hook as an environment variable the shell expands, never as text pasted into the command."""

from __future__ import annotations

import json

import pytest
from acp import text_block
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

pytestmark = pytest.mark.anyio

NAMES = ["ws $(touch INJECTED)", 'a"; touch INJECTED; "b', "b`touch INJECTED`", "c'; touch INJECTED; '"]


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("name", NAMES)
async def test_a_hostile_directory_name_runs_nothing(acp_agent, scripted, mechanism, name):
    require_mechanism(mechanism)
    ws = acp_agent.work / name
    (ws / ".claude").mkdir(parents=True)
    hooks = [
        {"type": "command", "command": 'printf "%s" "${CLAUDE_PROJECT_DIR}" > seen-quoted.txt'},
        {"type": "command", "command": "echo ${CLAUDE_PROJECT_DIR} > seen-bare.txt"},
        {"type": "command", "command": 'printf "%s" "$CLAUDE_PROJECT_DIR" > seen-plain.txt'},
    ]
    (ws / ".claude" / "settings.json").write_text(json.dumps({"hooks": {"UserPromptSubmit": [{"hooks": hooks}]}}))
    script = scripted({"default": [{"text": "ok"}]})
    async with acp_agent(script, cwd=ws, env={"DSH_SANDBOX_MECHANISM": mechanism}) as run:
        sid = await run.start()
        reply = await run.conn.prompt(session_id=sid, prompt=[text_block("hello")])
        assert reply.stop_reason == "end_turn"
    assert not list(acp_agent.work.rglob("INJECTED")), "a directory name ran a command"
    assert (ws / "seen-quoted.txt").read_text() == str(ws)
    assert (ws / "seen-plain.txt").read_text() == str(ws)
    assert (ws / "seen-bare.txt").read_text().strip()  # word-split by the shell, as any unquoted variable
