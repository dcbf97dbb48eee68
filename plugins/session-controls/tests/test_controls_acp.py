"""session-controls in acp-editor, with the official SDK client over a real ``dsh run`` on stdio
(every frame validated against ACP's schema by the harness): permission modes and plan mode
through config options and legacy modes, exit_plan_mode's permission request, what a resumed
session takes back, and the slash commands. acp-agent offers none of it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from acp import RequestError, text_block
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from dsh_testing import REPO, SHIPPED_EXAMPLES, Recorder, session_log, until

pytestmark = pytest.mark.anyio

SCRIPT = {
    "capabilities": {"context_window": 40000},
    "rules": [
        {"when": "^<transcript>", "steps": [{"text": "The person sent long notes."}]},
        {"when": "^write it", "steps": [{"tool": "write", "args": {"file_path": "a.txt", "content": "x"}},
                                        {"text": "result: {tool_result}"}]},
        {"when": "^plan it", "steps": [
            {"tool": "write", "args": {"file_path": "b.txt", "content": "y"}},
            {"tool": "exit_plan_mode", "args": {"plan": "1. write b.txt\n2. check it"}},
            {"tool": "write", "args": {"file_path": "b.txt", "content": "y"}},
            {"text": "after the plan: {tool_result}"}]},
        {"when": "^Write AGENTS.md", "steps": [{"text": "init ran"}]},
    ],
    "default": [{"text": "the model answered: {prompt}", "usage": {"inputTokens": 3000, "outputTokens": 10}}],
}


def _mine(run, sid):
    return [u for s, u in run.client.updates if s == sid]


def _mode(options) -> str:
    return next(o.current_value for o in options if o.id == "mode")


async def test_a_mode_change_applies_to_the_tools_tells_the_model_and_is_shown(acp_agent, scripted):
    async with acp_agent(scripted(SCRIPT), example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        new = await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])
        sid = new.session_id
        assert _mode(new.config_options) == new.modes.current_mode_id == "workspace-write"
        assert await run.conn.set_session_mode(session_id=sid, mode_id="read-only") is not None
        await until(lambda: any(u.session_update == "current_mode_update" for u in _mine(run, sid)))
        kinds = [u.session_update for u in _mine(run, sid)]
        assert "current_mode_update" in kinds and "config_option_update" in kinds
        (mode,) = [u for u in _mine(run, sid) if u.session_update == "current_mode_update"]
        assert mode.current_mode_id == "read-only"
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("write it")])
        assert resp.stop_reason == "end_turn"
        assert "read-only" in run.client.text(sid)[-1] and not (run.cwd / "a.txt").exists()
        with pytest.raises(RequestError) as bad:
            await run.conn.set_session_mode(session_id=sid, mode_id="yolo")
        assert bad.value.code == -32602
        assert await run.close_stdin() == 0
    events = session_log(acp_agent.home, sid)
    told = [e for e in events if e["type"] == "user/message" and e["message"].get("source") == "hook"]
    assert len(told) == 1 and "read-only" in told[0]["message"]["content"][0]["text"]
    first_request = next(i for i, e in enumerate(events) if e["type"] == "assistant/message")
    assert events.index(told[0]) < first_request  # the model knew before its first call
    (change,) = [e for e in events if e["type"] == "settings/changed"]
    assert change["settings"]["mode"] == "read-only" and change.get("cache", "kept") == "kept"


@pytest.mark.parametrize("answer", ["allow-once", "reject-once"])
async def test_plan_mode_runs_only_reads_until_the_person_approves_the_plan(acp_agent, scripted, answer):
    client = Recorder(permission_answers=[answer])
    async with acp_agent(scripted(SCRIPT), example="acp-editor", env=SHIPPED_EXAMPLES, client=client) as run:
        sid = await run.start()
        changed = await run.conn.set_config_option(config_id="mode", session_id=sid, value="plan")
        assert _mode(changed.config_options) == "plan"
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("plan it")])
        assert resp.stop_reason == "end_turn"
        (asked,) = client.permission_requests
        _, call, options = asked
        assert [(o.option_id, o.name) for o in options] == [
            ("allow-once", "Switch to workspace-write"), ("reject-once", "Keep planning")]
        assert call.kind == "switch_mode" and "1. write b.txt" in call.content[0].content.text
        modes = [u.current_mode_id for u in _mine(run, sid) if u.session_update == "current_mode_update"]
        if answer == "allow-once":
            assert modes == ["plan", "workspace-write"]
            assert (run.cwd / "b.txt").read_text() == "y"  # the write after the approval ran
        else:
            assert modes == ["plan"]
            assert not (run.cwd / "b.txt").exists()  # both writes were refused: still planning
            assert "plan mode" in run.client.text(sid)[-1]
        assert await run.close_stdin() == 0
    results = [e["result"] for e in session_log(acp_agent.home, sid) if e["type"] == "tool/result"]
    assert results[0]["isError"] and "plan mode" in results[0]["content"][0]["text"]  # the first write, refused


async def test_a_resumed_session_takes_back_its_mode_but_never_full_access(acp_agent, scripted):
    script = scripted(SCRIPT)
    sessions = {}
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        for mode in ("read-only", "full-access"):
            sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
            await run.conn.set_config_option(config_id="mode", session_id=sid, value=mode)
            sessions[mode] = sid
        assert await run.close_stdin() == 0
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        resumed = {mode: await run.conn.resume_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
                   for mode, sid in sessions.items()}
        assert _mode(resumed["read-only"].config_options) == resumed["read-only"].modes.current_mode_id == "read-only"
        assert _mode(resumed["full-access"].config_options) == "workspace-write"  # a log does not lift the sandbox
        assert await run.close_stdin() == 0
    assert b"lifts the sandbox" in run.stderr


async def test_slash_commands_are_offered_after_the_session_opens_and_run(acp_agent, scripted):
    async with acp_agent(scripted(SCRIPT), example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        await until(lambda: _mine(run, sid))
        first = _mine(run, sid)[0]
        assert first.session_update == "available_commands_update"
        names = [c.name for c in first.available_commands]
        assert names == ["compact", "status", "init", "approvals"]
        assert next(c for c in first.available_commands if c.name == "init").input.root.hint

        async def ask(text: str) -> str:
            before = len(run.client.text(sid))
            resp = await run.conn.prompt(session_id=sid, prompt=[text_block(text)])
            assert resp.stop_reason == "end_turn"
            (answer,) = run.client.text(sid)[before:]
            return answer

        status = await ask("/status")
        assert f"- **Session:** `{sid}`\n" in status and "\n- **Mode:** workspace-write" in status  # Markdown lines
        assert "\n- **Context:** no model call" in status
        unknown = await ask("/nope please")
        assert unknown.startswith("/nope is not a command here") and "/status" in unknown and "/compact" in unknown
        assert await ask("/compact") == "Nothing to compact: the conversation is empty."
        assert await ask("/usr/bin is slow") == "the model answered: /usr/bin is slow"  # a path, not a command
        assert await ask("/init") == "init ran"  # the command's prompt went to the model
        for n in range(3):
            assert (await ask(f"note {n}: " + "z" * 8000)).startswith("the model answered")
        compacted = await ask("/compact")
        assert compacted.startswith("Compacted: 10 messages are now ")  # five prompts and five answers
        status = await ask("/status")
        assert "**Context:** 3,010 of 40,000 tokens (8%)" not in status  # counted again after the compaction
        assert "**Context:** " in status and "of 40,000 tokens" in status
        assert await run.close_stdin() == 0
    users = [e["message"] for e in session_log(acp_agent.home, sid) if e["type"] == "user/message"]
    texts = [m["content"][0]["text"] for m in users if m.get("source", "user") == "user"]
    assert texts[0] == "/usr/bin is slow" and texts[1].startswith("Write AGENTS.md")  # commands are not prompts
    (summary,) = [e for e in session_log(acp_agent.home, sid) if e["type"] == "compaction/summary"]
    assert summary["reason"] == "manual" and summary["message"]["content"][0]["text"].endswith("The person sent long notes.")


async def test_acp_agent_offers_no_settings_and_no_commands(acp_agent, scripted):
    async with acp_agent(scripted(SCRIPT)) as run:
        await run.conn.initialize(protocol_version=1)
        new = await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])
        assert new.config_options is None and new.modes is None
        for call in (run.conn.set_config_option(config_id="mode", session_id=new.session_id, value="plan"),
                     run.conn.set_session_mode(session_id=new.session_id, mode_id="plan")):
            with pytest.raises(RequestError) as err:
                await call
            assert err.value.code == -32601
        resp = await run.conn.prompt(session_id=new.session_id, prompt=[text_block("/status")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(new.session_id) == ["the model answered: /status"]
        assert [u.session_update for u in _mine(run, new.session_id)] == ["agent_message_chunk"]
        assert await run.close_stdin() == 0


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("mode", ["plan", "read-only"])
async def test_a_narrower_mode_confines_commands_on_every_mechanism(acp_agent, scripted, mechanism, mode):
    """The tier of a chosen mode is the sandbox's, not a promise: a command that writes fails under
    bubblewrap and under Landlock alone, and in plan mode even an escalation is refused unasked."""
    require_mechanism(mechanism)
    script = scripted({"rules": [{"when": "^touch", "steps": [
        {"tool": "bash", "args": {"description": "Run the command", "command": "touch made.txt; echo > made-too.txt; ls"}},
        {"tool": "bash", "args": {"description": "Run the command", "command": "touch escalated.txt", "sandbox_permissions": "danger-full-access",
                                  "justification": "needs to write"}},
        {"text": "done"}]}]})
    client = Recorder(permission_answers=["reject-once"])
    env = {**SHIPPED_EXAMPLES, "DSH_SANDBOX_MECHANISM": mechanism}
    async with acp_agent(script, example="acp-editor", env=env, client=client) as run:
        sid = await run.start()
        await run.conn.set_session_mode(session_id=sid, mode_id=mode)
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("touch")])
        assert resp.stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    assert not any((run.cwd / name).exists() for name in ("made.txt", "made-too.txt", "escalated.txt"))
    results = [e["result"] for e in session_log(acp_agent.home, sid) if e["type"] == "tool/result"]
    assert len(results) == 2
    if mode == "plan":
        assert client.permission_requests == []  # refused before anyone is asked
        assert "plan mode" in results[1]["content"][0]["text"]
    else:
        assert len(client.permission_requests) == 1  # read-only may ask for one wider call; the person said no


async def test_a_new_session_is_titled_by_a_short_model_call_everywhere_it_is_listed(acp_agent, scripted):
    script = scripted({"rules": [{"when": "^fix the login", "steps": [{"text": "\"Login bug fix.\"\nsecond line"}]}]})
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("fix the login bug please\nit fails on empty passwords")])
        await until(lambda: any(u.session_update == "session_info_update" for u in _mine(run, sid)))
        (info,) = [u for u in _mine(run, sid) if u.session_update == "session_info_update"]
        assert info.title == "Login bug fix"  # one clean line: quotes, the full stop and the rest dropped
        await run.conn.prompt(session_id=sid, prompt=[text_block("fix the login again")])
        listed = await run.conn.list_sessions(cwd=str(run.cwd))
        assert [(s.session_id, s.title) for s in listed.sessions] == [(sid, "Login bug fix")]
        assert len([u for u in _mine(run, sid) if u.session_update == "session_info_update"]) == 1  # the first turn only
        assert await run.close_stdin() == 0
    (titled,) = [e for e in session_log(acp_agent.home, sid) if e["type"] == "session/titled"]
    assert titled["title"] == "Login bug fix" and titled.get("by", "model") == "model"
    shown = subprocess.run([sys.executable, "-m", "dsh_core.cli", "sessions", "list"], capture_output=True, text=True,
                           env={**os.environ, "DSH_HOME": str(acp_agent.home)}, check=True).stdout
    assert f"{sid}\t" in shown and shown.rstrip().endswith("\tLogin bug fix")


async def test_the_commands_are_sent_again_when_the_set_changes(acp_agent, scripted, tmp_path):
    root = tmp_path / "examples" / "editor-commands"
    root.mkdir(parents=True)
    text = (REPO / "examples" / "acp-editor" / "example.toml").read_text()
    (root / "example.toml").write_text(text.replace('"session-controls"]', '"session-controls", "testkit-commands"]'))
    async with acp_agent(scripted(SCRIPT), example="editor-commands", env={"DSH_EXAMPLES_PATH": str(root.parent)}) as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("hello")])  # now /turns exists
        await run.conn.prompt(session_id=sid, prompt=[text_block("hello again")])  # no change: not sent again
        await until(lambda: len([u for u in _mine(run, sid) if u.session_update == "available_commands_update"]) >= 2)
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("/turns")])
        assert resp.stop_reason == "end_turn" and run.client.text(sid)[-1] == "4 messages so far"
        assert await run.close_stdin() == 0
    sent = [[c.name for c in u.available_commands] for u in _mine(run, sid) if u.session_update == "available_commands_update"]
    assert sent == [["compact", "status", "init", "approvals"], ["compact", "status", "init", "turns", "approvals"]]


async def test_a_command_that_becomes_a_prompt_keeps_the_prompts_images(acp_agent, scripted):
    import base64

    from acp import image_block

    from dsh_testing import make_png

    script = scripted({**SCRIPT, "capabilities": {"image_input": True}})
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await run.start()
        image = image_block(base64.b64encode(make_png()).decode(), "image/png")
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("/init"), image])
        assert resp.stop_reason == "end_turn" and run.client.text(sid)[-1] == "init ran"
        assert await run.close_stdin() == 0
    (prompt,) = [e["message"] for e in session_log(acp_agent.home, sid) if e["type"] == "user/message"
                 and e["message"].get("source", "user") == "user"]
    assert [b["type"] for b in prompt["content"]] == ["text", "image"]
    assert prompt["content"][0]["text"].startswith("Write AGENTS.md")
