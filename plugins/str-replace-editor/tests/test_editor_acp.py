"""str_replace_editor behind the real door: ``dsh run --example acp-extended`` over real stdio, driven
by the official ACP SDK client, writing real files under the real sandbox (bubblewrap, Landlock, and
unconfined): create, view, str_replace and insert land on disk with the original's result texts, a
blind edit is refused, and a write outside the workspace is denied in the confined tiers."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import pytest
from acp import text_block
from dsh_sandbox_tools.testing import require_mechanism

from dsh_testing import REPO, session_log

pytestmark = pytest.mark.anyio

EXAMPLES = str(REPO / "examples")
NOTE = "{cwd}/note.txt"

SCRIPT = {"rules": [
    {"when": "^edit", "steps": [
        {"tool": "str_replace_editor", "args": {"command": "create", "path": NOTE, "file_text": "target:\n\told\n"}},
        {"tool": "str_replace_editor", "args": {"command": "view", "path": NOTE}},
        {"tool": "str_replace_editor", "args": {"command": "str_replace", "path": NOTE, "old_str": "\told",
                                                 "new_str": "\tnew"}},
        {"tool": "str_replace_editor", "args": {"command": "insert", "path": NOTE, "insert_line": 0,
                                                 "new_str": "# notes"}},
        {"text": "{tool_result}"}]},
    {"when": "^blind", "steps": [
        {"tool": "str_replace_editor", "args": {"command": "str_replace", "path": "{cwd}/seeded.txt",
                                                 "old_str": "seed", "new_str": "x"}},
        {"text": "{tool_result}"}]},
    {"when": "^/var/tmp/", "steps": [  # the prompt is the path
        {"tool": "str_replace_editor", "args": {"command": "create", "path": "{prompt}", "file_text": "pwned"}},
        {"text": "{tool_result}"}]},
]}

TIERS = {"bwrap": {"DSH_SANDBOX_MECHANISM": "bwrap"}, "landlock": {"DSH_SANDBOX_MECHANISM": "landlock"},
         "unconfined": {"DSH_PERMISSION_MODE": "danger-full-access"}}


async def ask(run, sid: str, prompt: str) -> str:
    before = len("".join(run.client.text(sid)))
    resp = await run.conn.prompt(session_id=sid, prompt=[text_block(prompt)])
    assert resp.stop_reason == "end_turn"
    return "".join(run.client.text(sid))[before:]


@pytest.mark.parametrize("tier", sorted(TIERS))
async def test_the_editor_over_acp(tier: str, acp_agent, scripted) -> None:
    if tier != "unconfined":
        require_mechanism(tier)
    work = acp_agent.work.resolve()
    (work / "seeded.txt").write_text("seed\n")
    outside = Path("/var/tmp") / f"dsh-editor-acp-{secrets.token_hex(4)}"
    outside.mkdir()
    try:
        env = {"DSH_EXAMPLES_PATH": EXAMPLES, **TIERS[tier]}
        async with acp_agent(scripted(SCRIPT), example="acp-extended", env=env) as run:
            sid = await run.start()
            assert await ask(run, sid, "edit") == f"The file {work}/note.txt has been edited successfully."
            blind = await ask(run, sid, "blind")
            assert blind == f'Error: edit requires reading "{work}/seeded.txt" first — view the file, then retry'
            escaped = await ask(run, sid, f"{outside}/a")
        assert (work / "note.txt").read_text() == "# notes\ntarget:\n\tnew\n"
        assert (work / "seeded.txt").read_text() == "seed\n"
        if tier == "unconfined":
            assert escaped == f"New file created successfully at: {outside}/a"
        else:
            assert escaped.startswith("Error: [sandbox: file access denied under workspace-write mode] "
                                      f'cannot write "{outside}/a"'), escaped
            assert list(outside.iterdir()) == []
        results = [r for r in session_log(acp_agent.home, sid) if r.get("type") == "tool/result"]
        texts = ["".join(b["text"] for b in r["result"]["content"]) for r in results]
        assert texts[:4] == [
            f"New file created successfully at: {work}/note.txt",
            f"Here's the content of {work}/note.txt with line numbers (which has a total of 3 lines):\n"
            "     1  target:\n     2  \told\n     3  \n",
            f"The file {work}/note.txt has been edited successfully.",
            f"The file {work}/note.txt has been edited successfully.",
        ]
        assert results[4]["code"] == "NOT_READ"
    finally:
        shutil.rmtree(outside, ignore_errors=True)
