"""Skills behind the real door (the official SDK client over real stdio): acp-editor offers each
skill as a slash command, and `/<skill> text` runs a turn with the skill as the prompt."""

from __future__ import annotations

import pytest
from acp import text_block

from dsh_testing import REPO, until

pytestmark = pytest.mark.anyio

EXAMPLES = {"DSH_EXAMPLES_PATH": str(REPO / "examples")}


async def test_a_skill_is_a_slash_command_in_the_editor(acp_agent, scripted):
    script = scripted({"rules": [{"when": "^Use the skill release-notes", "steps": [{"text": "got: {prompt}"}]}],
                       "default": [{"text": "plain: {prompt}"}]})
    folder = acp_agent.work / ".agents" / "skills" / "release-notes"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: release-notes\ndescription: Write the release notes.\n---\n\n"
                                     "List the changes, then write NOTES.md.\n")
    async with acp_agent(script, example="acp-editor", env=EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        await until(lambda: any(u.session_update == "available_commands_update" for s, u in run.client.updates))
        (offered,) = [u for s, u in run.client.updates if s == sid and u.session_update == "available_commands_update"]
        by_name = {c.name: c for c in offered.available_commands}
        assert by_name["release-notes"].description == "Write the release notes."
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("/release-notes for v2.0")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid)[-1] == (f"got: Use the skill release-notes (folder {folder}):\n\n"
                                            "List the changes, then write NOTES.md.\n\nfor v2.0")
