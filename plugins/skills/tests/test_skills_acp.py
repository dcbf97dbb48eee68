"""Skills behind the real door (the official SDK client over real stdio): acp-editor offers each
skill a person may start as a slash command, and `/<skill> text` runs a turn with the skill as the
prompt; the two invocation flags decide what the model's catalog (the request header), the `skill`
tool and the editor's `available_commands_update` hold."""

from __future__ import annotations

import pytest
from acp import text_block

from dsh_testing import SHIPPED_EXAMPLES, session_log, until

pytestmark = pytest.mark.anyio

RESOLVE = ("Resolve relative paths mentioned by this skill against the base directory before using them. "
           "Load referenced resources only as needed.")

# The original's skill-load workspace: no flag, the model kept out, the person kept out.
SKILLS = {
    "snapshot-skill": "",
    "user-only-skill": "disable-model-invocation: true\n",
    "model-only-skill": "user-invocable: false\n",
}


def seed(work):
    root = work / ".dsh" / "skills"
    for name, flags in SKILLS.items():
        (root / name).mkdir(parents=True)
        (root / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: About {name}.\n{flags}---\n\n"
                                              f"Follow the {name} instructions.\n")
    return root


def block(root, name):
    return (f'<skill_content name="{name}">\n<skill_resources>\nBase directory for this skill: {root / name}\n'
            f"{RESOLVE}\n</skill_resources>\n\n<skill_instructions>\nFollow the {name} instructions.\n"
            "</skill_instructions>\n</skill_content>")


async def test_a_skill_is_a_slash_command_in_the_editor(acp_agent, scripted):
    script = scripted({"rules": [{"when": "^<skill_content", "steps": [{"text": "got: {prompt}"}]}],
                       "default": [{"text": "plain: {prompt}"}]})
    folder = acp_agent.work / ".agents" / "skills" / "release-notes"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: release-notes\ndescription: Write the release notes.\n---\n\n"
                                     "List the changes, then write NOTES.md.\n")
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        await until(lambda: any(u.session_update == "available_commands_update" for s, u in run.client.updates))
        (offered,) = [u for s, u in run.client.updates if s == sid and u.session_update == "available_commands_update"]
        by_name = {c.name: c for c in offered.available_commands}
        assert by_name["release-notes"].description == "Write the release notes."
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("/release-notes for v2.0")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid)[-1] == (
            f'got: <skill_content name="release-notes">\n<skill_resources>\nBase directory for this skill: {folder}\n'
            f"{RESOLVE}\n</skill_resources>\n\n<skill_instructions>\nList the changes, then write NOTES.md.\n"
            "</skill_instructions>\n</skill_content>\n\nfor v2.0")


async def test_the_flags_decide_the_models_catalog_and_what_the_skill_tool_loads(acp_agent, scripted):
    script = scripted({"default": [
        {"tool": "skill", "args": {"name": "user-only-skill"}},
        {"tool": "skill", "args": {"name": "model-only-skill"}},
        {"tool": "skill", "args": {"name": "snapshot-skill"}},
        {"text": "DONE"}]})
    root = seed(acp_agent.work)
    async with acp_agent(script) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("load the skills")])
        assert resp.stop_reason == "end_turn"
    log = session_log(acp_agent.home, sid)
    (header,) = [e for e in log if e["type"] == "request/header"]
    catalog = header["system"].split("# Skills\n", 1)[1]
    assert "- model-only-skill: About model-only-skill." in catalog
    assert "- snapshot-skill: About snapshot-skill." in catalog
    assert "user-only-skill" not in header["system"]
    results = {r["result"]["callId"]: r["result"] for r in log if r["type"] == "tool/result"}
    refused, model_only, plain = (results[f"call_{i}"] for i in (1, 2, 3))
    assert refused.get("isError") is True
    assert refused["content"][0]["text"] == (
        'Error: skill "user-only-skill" is not available for model invocation: its front matter says '
        "disable-model-invocation: true, so only a person starts it")
    assert model_only["content"][0]["text"] == block(root, "model-only-skill")
    assert plain["content"][0]["text"] == block(root, "snapshot-skill")


async def test_the_flags_decide_the_editors_slash_commands(acp_agent, scripted):
    script = scripted({"rules": [{"when": "^<skill_content", "steps": [{"text": "got: {prompt}"}]}],
                       "default": [{"text": "plain: {prompt}"}]})
    root = seed(acp_agent.work)
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        await until(lambda: any(u.session_update == "available_commands_update" for s, u in run.client.updates))
        (offered,) = [u for s, u in run.client.updates if s == sid and u.session_update == "available_commands_update"]
        names = {c.name for c in offered.available_commands}
        assert {"snapshot-skill", "user-only-skill"} <= names and "model-only-skill" not in names
        # the model may not start user-only-skill; the person may
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("/user-only-skill now")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid)[-1] == f"got: {block(root, 'user-only-skill')}\n\nnow"
        # model-only-skill is no command: the door says so, and no turn starts
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("/model-only-skill now")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid)[-1].startswith("/model-only-skill is not a command here. Commands:\n")
        # a skill whose author turns the person away while the session lives is no command any more
        (root / "snapshot-skill" / "SKILL.md").write_text(
            "---\nname: snapshot-skill\ndescription: About snapshot-skill.\nuser-invocable: false\n---\n\nLater.\n")
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("/snapshot-skill now")])
        assert resp.stop_reason == "end_turn"
        refused = run.client.text(sid)[-1]
        assert refused.startswith("/snapshot-skill is not a command here. Commands:\n")
        assert "/user-only-skill" in refused and "/snapshot-skill " not in refused.split("\n", 1)[1]
    assert [e["type"] for e in session_log(acp_agent.home, sid)].count("turn/start") == 1
