"""Hook bridges over the assembled acp-agent example (issue 15): the 15 behaviours of the
original's hook scenarios as snapshot scenarios (snapshots/acp-agent/hook-*/), plus the hook
that hangs, the hook that floods stdout, cancel during a hook, the PreToolUse deny from a
workspace's ``.claude/settings.json``, and a hook denying a ``run_code`` nested call.

Each scenario seeds real shell hook scripts in the session's workspace (``hooks.json`` /
``codex-hooks.json`` name them, as the original's examples do; the example mounts those
names as project files), drives ``dsh run`` over real stdio with the official SDK client and
pins what went on the wire and into the session log (hook/invoked, hook/result, the context
and feedback the model got). The scripted model answers from rules matched on the latest user
message, so a rule keyed on a hook's text proves the model saw it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from acp import text_block
from test_snapshots import SNAPSHOTS

from dsh_testing import live_processes

pytestmark = [pytest.mark.anyio]


SAY_RESULT = {"text": "tool said: {tool_result}"}
BASH_HELLO = {"tool": "bash", "args": {"description": "Run the command", "command": "echo HELLO"}}
SCRIPT = {
    "rules": [
        {"when": "^ping", "steps": [{"text": "PONG"}]},
        {"when": "^run echo once", "steps": [BASH_HELLO, SAY_RESULT]},
        {"when": "^retry echo", "steps": [BASH_HELLO, BASH_HELLO, SAY_RESULT]},
        {"when": "^create the file", "steps": [
            {"tool": "bash", "args": {"description": "Run the command", "command": "echo HELLO > created.txt && cat created.txt"}}, SAY_RESULT]},
        {"when": "favorite color is teal", "steps": [{"text": "teal"}]},
        {"when": "^What is my favorite color", "steps": [{"text": "no idea"}]},
        {"when": "^Reply with the single word FIRST", "steps": [{"text": "FIRST"}]},
        {"when": "single word SECOND", "steps": [{"text": "SECOND"}]},
    ],
    "default": [{"text": "the model ran: {prompt}"}],
}

# ---------------------------------------------------------------------------- hook scripts

DENY = "#!/bin/sh\ncat > .pretool-payload.json\necho 'bash is disabled by policy in this session' >&2\nexit 2\n"
ASK = ("#!/bin/sh\ncat > .pretool-payload.json\n"
       "printf '%s\\n' '{\"hookSpecificOutput\":{\"hookEventName\":\"PreToolUse\",\"permissionDecision\":\"ask\","
       "\"permissionDecisionReason\":\"bash requires manual approval in this session\"}}'\n")
POST_ONCE = ("#!/bin/sh\ncat > .posttool-payload.json\nif test -e .posttool-blocked; then\n  exit 0\nfi\n"
             ": > .posttool-blocked\nprintf '%s\\n' 'tool output rejected by policy: retry once' >&2\nexit 2\n")
POST_CONTEXT = ("#!/bin/sh\ncat > .posttool-payload.json\n"
                "printf '%s\\n' '{\"hookSpecificOutput\":{\"hookEventName\":\"PostToolUse\","
                "\"additionalContext\":\"Note: command output has been verified against the audit log.\"}}'\n")
POST_BLOCK = "#!/bin/sh\necho 'tool output rejected by codex policy: summarize instead' >&2\nexit 2\n"
PROMPT_BLOCK = ("#!/bin/sh\ncat > .prompt-payload.json\ngrep -q 'Delete everything' .prompt-payload.json || exit 0\n"
                "echo 'blocked by policy hook' >&2\nexit 2\n")
PROMPT_CONTEXT_JSON = ("#!/bin/sh\ncat > .prompt-payload.json\n"
                       "printf '%s\\n' '{\"hookSpecificOutput\":{\"hookEventName\":\"UserPromptSubmit\","
                       "\"additionalContext\":\"The user has previously stated their favorite color is teal.\"}}'\n")
PROMPT_CONTEXT_PLAIN = ("#!/bin/sh\ncat > .prompt-payload.json\n"
                        "echo 'The user has previously stated their favorite color is teal.'\n")
STOP_ONCE = ("#!/bin/sh\ncat > .stop-payload-$(ls .stop-payload-* 2>/dev/null | wc -l).json\n"
             "if [ -f .stop_fired ]; then exit 0; fi\ntouch .stop_fired\n"
             "echo 'Also reply with the single word SECOND, then stop.' >&2\nexit 2\n")
MUST_NOT_RUN = "#!/bin/sh\ntouch .must-not-run\necho 'must not run' >&2\nexit 2\n"


def hook_file(events: dict[str, list[tuple[str | None, str]]]) -> str:
    """A hooks file: event -> [(matcher, script name)], each run as ``sh hooks/<name>``."""
    table = {}
    for event, groups in events.items():
        table[event] = [{**({"matcher": m} if m is not None else {}),
                         "hooks": [{"type": "command", "command": f"sh hooks/{script}"}]} for m, script in groups]
    return json.dumps({"hooks": table}, indent=2) + "\n"


def seed(cwd: Path, name: str, events: dict[str, list[tuple[str | None, str]]], scripts: dict[str, str]) -> None:
    (cwd / "hooks").mkdir(exist_ok=True)
    for script, text in scripts.items():
        (cwd / "hooks" / script).write_text(text)
    (cwd / name).parent.mkdir(parents=True, exist_ok=True)
    (cwd / name).write_text(hook_file(events))


def payload(cwd: Path, name: str) -> dict:
    return json.loads((cwd / name).read_text())


# ---------------------------------------------------------------------------- scenarios


async def _open(run, sids):
    await run.conn.initialize(protocol_version=1)
    sids.append((await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id)


async def _ask(run, sid, text):
    return await run.conn.prompt(session_id=sid, prompt=[text_block(text)])


def invalid_matcher(file):
    async def body(run, sids):
        seed(run.cwd, file, {"UserPromptSubmit": [(None, "must-not-run.sh")], "PreToolUse": [("[", "deny.sh")]},
             {"must-not-run.sh": MUST_NOT_RUN, "deny.sh": DENY})
        await _open(run, sids)
        assert (await _ask(run, sids[0], "ping")).stop_reason == "end_turn"
        assert run.client.text(sids[0]) == ["PONG"]
        assert not (run.cwd / ".must-not-run").exists()
        err = run.stderr.decode()
        # one warning naming the file, the event and the pattern; the agent still served
        assert err.count(f"{run.cwd / file} rejected") == 1, err
        assert "PreToolUse" in err and '"["' in err

    return body


def pretool_block(file, dialect):
    async def body(run, sids):
        seed(run.cwd, file, {"PreToolUse": [("bash", "deny.sh")]}, {"deny.sh": DENY})
        await _open(run, sids)
        await _ask(run, sids[0], "create the file")
        assert run.client.text(sids[0]) == ["tool said: Error: bash is disabled by policy in this session"]
        assert not (run.cwd / "created.txt").exists()  # the call never ran
        sent = payload(run.cwd, ".pretool-payload.json")
        assert sent["hook_event_name"] == "PreToolUse" and sent["tool_name"] == "bash"
        assert sent["session_id"] == sids[0] and sent["cwd"] == str(run.cwd)
        assert sent["transcript_path"] == str(run.home / "sessions" / f"{sids[0]}.jsonl")
        command = "echo HELLO > created.txt && cat created.txt"
        if dialect == "codex":  # Codex's shape for every tool: the command alone
            assert sent["tool_input"] == {"command": command}
            assert sent["turn_id"] == "1" and sent["model"]
        else:  # Claude Code's: the arguments exactly as the model sent them
            assert sent["tool_input"] == {"description": "Run the command", "command": command}
            assert "turn_id" not in sent

    return body


async def sc_cc_pretool_ask(run, sids):
    seed(run.cwd, "hooks.json", {"PreToolUse": [("bash", "ask.sh")]}, {"ask.sh": ASK})
    run.client.permission_answers.append("reject-once")
    await _open(run, sids)
    await _ask(run, sids[0], "create the file")
    assert not (run.cwd / "created.txt").exists()
    ((_, tool_call, _),) = run.client.permission_requests  # one one-shot question, answered reject-once
    assert tool_call.raw_input == {"description": "Run the command", "command": "echo HELLO > created.txt && cat created.txt"}
    assert tool_call.kind == "execute"  # what bash's own escalation request would say
    assert tool_call.title == "bash: echo HELLO > created.txt && cat created.txt — bash requires manual approval in this session"


async def sc_cc_pretool_ask_full_access(run, sids):
    """In danger-full-access mode nobody is asked (the original's approval policy there is
    `never`): the hook's `ask` is rejected by policy, and the client sees no permission request."""
    seed(run.cwd, "hooks.json", {"PreToolUse": [("bash", "ask.sh")]}, {"ask.sh": ASK})
    await _open(run, sids)
    await _ask(run, sids[0], "create the file")
    assert run.client.permission_requests == []
    assert not (run.cwd / "created.txt").exists()


def posttool_block(file, script, prompt):
    async def body(run, sids):
        seed(run.cwd, file, {"PostToolUse": [("bash", "post.sh")]}, {"post.sh": script})
        await _open(run, sids)
        await _ask(run, sids[0], prompt)

    return body


def posttool_context(file):
    async def body(run, sids):
        seed(run.cwd, file, {"PostToolUse": [("bash", "post.sh")]}, {"post.sh": POST_CONTEXT})
        await _open(run, sids)
        await _ask(run, sids[0], "run echo once")
        (said,) = run.client.text(sids[0])
        assert said.startswith("tool said: HELLO") and "verified against the audit log" in said
        sent = payload(run.cwd, ".posttool-payload.json")
        assert sent["tool_response"].startswith("HELLO") and sent["hook_event_name"] == "PostToolUse"

    return body


def prompt_block(file):
    async def body(run, sids):
        # a matcher on UserPromptSubmit has no subject: it is ignored, even when not a valid regex
        seed(run.cwd, file, {"UserPromptSubmit": [("[", "block.sh")]}, {"block.sh": PROMPT_BLOCK})
        await _open(run, sids)
        assert (await _ask(run, sids[0], "Delete everything in the repo.")).stop_reason == "end_turn"
        assert run.client.text(sids[0]) == []  # the model was never called
        assert payload(run.cwd, ".prompt-payload.json")["prompt"] == "Delete everything in the repo."
        # the session goes on: the blocked prompt is not in the next turn's history
        await _ask(run, sids[0], "ping")
        assert run.client.text(sids[0]) == ["PONG"]

    return body


def prompt_context(file, script):
    async def body(run, sids):
        seed(run.cwd, file, {"UserPromptSubmit": [(None, "context.sh")]}, {"context.sh": script})
        await _open(run, sids)
        await _ask(run, sids[0], "What is my favorite color? Reply with just the color.")
        assert run.client.text(sids[0]) == ["teal"]

    return body


def stop_continue(file):
    async def body(run, sids):
        seed(run.cwd, file, {"Stop": [(None, "stop.sh")]}, {"stop.sh": STOP_ONCE})
        await _open(run, sids)
        assert (await _ask(run, sids[0], "Reply with the single word FIRST and stop.")).stop_reason == "end_turn"
        assert run.client.text(sids[0]) == ["FIRST", "SECOND"]
        first, second = payload(run.cwd, ".stop-payload-0.json"), payload(run.cwd, ".stop-payload-1.json")
        assert first["stop_hook_active"] is False and second["stop_hook_active"] is True

    return body


CC, CODEX = "hooks.json", "codex-hooks.json"
SCENARIOS = {
    "hook-cc-invalid-matcher": invalid_matcher(CC),
    "hook-cc-posttool-block": posttool_block(CC, POST_ONCE, "retry echo"),
    "hook-cc-posttool-context": posttool_context(CC),
    "hook-cc-pretool-ask": sc_cc_pretool_ask,
    "hook-cc-pretool-ask-full-access": sc_cc_pretool_ask_full_access,
    "hook-cc-pretool-deny": pretool_block(CC, "claude-code"),
    "hook-cc-promptsubmit-block": prompt_block(CC),
    "hook-cc-promptsubmit-context": prompt_context(CC, PROMPT_CONTEXT_JSON),
    "hook-cc-stop-continue": stop_continue(CC),
    "hook-codex-invalid-matcher": invalid_matcher(CODEX),
    "hook-codex-posttool-block": posttool_block(CODEX, POST_BLOCK, "run echo once"),
    "hook-codex-posttool-context": posttool_context(CODEX),
    "hook-codex-pretool-block": pretool_block(CODEX, "codex"),
    "hook-codex-promptsubmit-block": prompt_block(CODEX),
    "hook-codex-promptsubmit-context": prompt_context(CODEX, PROMPT_CONTEXT_PLAIN),
    "hook-codex-stop-continue": stop_continue(CODEX),
}




# ------------------------------------------------------------------------------ conversion
# The scenarios above are converted (tests/snapshot_convert.py --module tests/test_snapshots_hooks.py
# NAME…) to scenario directories under snapshots/acp-agent/ (input.json, the recording, the expected
# stdout and workspace/ holding the seeded hook files) that replay keyless (dsh_testing.scenarios,
# collected from snapshots/). The bodies stay as the conversion's source; the tests at the end of
# this file check each body's point on the committed recordings and transcripts.


def conversion(name: str) -> dict:
    """How tests/snapshot_convert.py converts ``name`` (see its docstring)."""
    if name.endswith("-full-access"):  # the mode's own system prompt: a header class of its own
        return {"example": "acp-agent", "body": SCENARIOS[name], "script": SCRIPT,
                "env": {"DSH_PERMISSION_MODE": "danger-full-access"}, "header": "acp-agent-full-access"}
    return {"example": "acp-agent", "body": SCENARIOS[name], "script": SCRIPT}


def _converted(name: str) -> bool:
    return (SNAPSHOTS / name / "input.json").is_file()


def test_every_hook_scenario_replays_from_its_directory():
    """The table above is the source the scenario directories were converted from; each runs by
    replay (snapshots/acp-agent/hook-*/input.json). A new entry needs
    `python tests/snapshot_convert.py --module tests/test_snapshots_hooks.py NAME`."""
    assert [name for name in SCENARIOS if not _converted(name)] == []


# ---------------------------------------------------------------------------- the limits


def _events(home: Path, sid: str) -> list[dict]:
    return [json.loads(line) for line in (home / "sessions" / f"{sid}.jsonl").read_text().splitlines()]


WRITE_NOTE = {"file_path": "note.txt", "content": "hi\n"}
WRITE_SCRIPT = {"rules": [{"when": "^write", "steps": [{"tool": "write", "args": WRITE_NOTE}, SAY_RESULT]}]}


async def test_hooks_see_a_file_tool_call_as_the_model_sent_it(acp_agent, scripted):
    """A Claude Code hook gets ``tool_input`` exactly as the model sent it (the original's
    ``file_path``); a Codex hook gets Codex's shape for every tool, ``{command}`` ('' for a file tool)."""
    cwd = acp_agent.work
    seed(cwd, CC, {"PreToolUse": [("write", "cc.sh")]}, {"cc.sh": "#!/bin/sh\ncat > .cc-payload.json\n"})
    seed(cwd, CODEX, {"PreToolUse": [("write", "codex.sh")]}, {"codex.sh": "#!/bin/sh\ncat > .codex-payload.json\n"})
    async with acp_agent(scripted(WRITE_SCRIPT), env={"DSH_PERMISSION_MODE": "workspace-write"}) as run:
        await _open(run, sids := [])
        await _ask(run, sids[0], "write the note")
    assert (cwd / "note.txt").read_text() == "hi\n"
    cc, codex = payload(cwd, ".cc-payload.json"), payload(cwd, ".codex-payload.json")
    assert cc["tool_name"] == codex["tool_name"] == "write"
    assert cc["tool_input"] == WRITE_NOTE and list(cc["tool_input"]) == ["file_path", "content"]
    assert codex["tool_input"] == {"command": ""}


async def test_pretool_deny_from_claude_settings(acp_agent, scripted):
    """Done when: a PreToolUse deny in the workspace's .claude/settings.json stops a scripted bash
    call (the file it would create does not exist) and the model sees the reason."""
    cwd = acp_agent.work
    (cwd / ".claude").mkdir()
    (cwd / ".claude" / "settings.json").write_text(json.dumps({
        "permissions": {"allow": []},
        "hooks": {"PreToolUse": [{"matcher": "Bash|bash", "hooks": [
            {"type": "command", "command": "sh \"${CLAUDE_PROJECT_DIR}/.claude/deny.sh\""}]}]},
    }))
    (cwd / ".claude" / "deny.sh").write_text(
        "#!/bin/sh\nprintf '%s' \"$CLAUDE_PROJECT_DIR\" > .project-dir\n"
        "printf '%s\\n' '{\"hookSpecificOutput\":{\"hookEventName\":\"PreToolUse\",\"permissionDecision\":\"deny\","
        "\"permissionDecisionReason\":\"no shell commands in this repository\"}}'\n")
    async with acp_agent(scripted(SCRIPT), env={"DSH_PERMISSION_MODE": "workspace-write"}) as run:
        await _open(run, sids := [])
        await _ask(run, sids[0], "create the file")
        assert run.client.text(sids[0]) == ["tool said: Error: no shell commands in this repository"]
    assert not (cwd / "created.txt").exists()
    assert (cwd / ".project-dir").read_text() == str(cwd)
    results = [e for e in _events(acp_agent.home, sids[0]) if e["type"] == "hook/result"]
    assert [(r["point"], r["decision"], r["exitCode"]) for r in results] == [("PreToolUse", "deny", 0)]


def _write_hook(path: Path, event: str, command: str, matcher: str | None = None, **extra: object) -> None:
    """A hooks file at ``path``: one command hook on ``event`` (``extra``: its other fields, e.g. timeout)."""
    group = {"matcher": matcher} if matcher else {}
    path.write_text(json.dumps({"hooks": {event: [{**group, "hooks": [{"type": "command", "command": command, **extra}]}]}}))


def _running(command: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line is ``command``."""
    return live_processes(lambda argv, cwd: b" ".join(argv).decode(errors="replace").strip() == command)


async def test_hanging_hook_is_killed_at_its_timeout(acp_agent, scripted):
    cwd = acp_agent.work
    _write_hook(cwd / "hooks.json", "PreToolUse", "touch hook-started; sleep 5.0417; touch hook-survived", timeout=1)
    async with acp_agent(scripted(SCRIPT), env={"DSH_PERMISSION_MODE": "workspace-write"}) as run:
        await _open(run, sids := [])
        started = time.monotonic()
        assert (await _ask(run, sids[0], "run echo once")).stop_reason == "end_turn"
        took = time.monotonic() - started
        assert run.client.text(sids[0]) == ["tool said: HELLO\n"]  # the turn went on: the tool ran
    assert (cwd / "hook-started").exists() and took < 4.5, took
    # killed, not left running: when the turn has settled, no process of the hook is alive
    # (checked on the host's /proc, which sees bubblewrap's processes too; no sleep to wait out)
    assert _running("sleep 5.0417") == [] and not (cwd / "hook-survived").exists()
    (result,) = [e for e in _events(acp_agent.home, sids[0]) if e["type"] == "hook/result"]
    assert result["timedOut"] is True and "exitCode" not in result and result["decision"] == "pass"
    assert "timed out after 1s" in result["stderrSummary"]


async def test_flooding_hook_output_is_bounded(acp_agent, scripted):
    """10 MB on stdout: read to the end, 1 MiB kept, and the model gets at most 10,000 characters."""
    cwd = acp_agent.work
    _write_hook(cwd / "codex-hooks.json", "UserPromptSubmit",
                "head -c 10000000 /dev/zero | tr '\\0' x; echo; touch flood-done")
    async with acp_agent(scripted(SCRIPT), env={"DSH_PERMISSION_MODE": "workspace-write"}) as run:
        await _open(run, sids := [])
        assert (await _ask(run, sids[0], "ping")).stop_reason == "end_turn"
        assert run.client.text(sids[0]) == ["PONG"]  # the script matched the user's prompt, not the context
    assert (cwd / "flood-done").exists()  # it was not killed for writing: its output was drained
    log = (acp_agent.home / "sessions" / f"{sids[0]}.jsonl").read_bytes()
    assert len(log) < 100_000
    (ctx,) = [e for e in map(json.loads, log.splitlines()) if e["type"] == "user/message"
              and e["message"].get("source") == "hook"]  # what the model was given after the prompt
    assert [b["text"] for b in ctx["message"]["content"]] == ["<system-reminder>\n" + "x" * 10_000
                                                             + "\n[… hook output truncated: 1038576 more characters]\n</system-reminder>"]


async def test_cancel_during_a_hook_kills_it(acp_agent, scripted):
    cwd = acp_agent.work
    _write_hook(cwd / "hooks.json", "PreToolUse", "touch hook-started; sleep 3.0417; touch hook-survived")
    async with acp_agent(scripted(SCRIPT), env={"DSH_PERMISSION_MODE": "workspace-write"}) as run:
        await _open(run, sids := [])
        task = asyncio.create_task(_ask(run, sids[0], "create the file"))
        for _ in range(1000):
            if (cwd / "hook-started").exists():
                break
            await asyncio.sleep(0.01)
        await run.conn.cancel(session_id=sids[0])
        assert (await task).stop_reason == "cancelled"
        assert (await _ask(run, sids[0], "ping")).stop_reason == "end_turn"  # still usable
    assert _running("sleep 3.0417") == []  # the cancel killed it: nothing of the hook is alive
    assert not (cwd / "hook-survived").exists() and not (cwd / "created.txt").exists()
    events = _events(acp_agent.home, sids[0])
    assert next(e["decision"] for e in events if e["type"] == "hook/result") == "cancelled"
    assert any(e["type"] == "turn/end" and e["reason"] == "aborted" for e in events)


NESTED = 'r = await tools.bash(description="Run the command", command="echo NESTED > nested.txt")\nreturn r["output"]'
CODE_SCRIPT = {"rules": [{"when": "^code", "steps": [
    {"tool": "run_code", "args": {"code": NESTED, "description": "one nested call"}},
    {"text": "program said: {tool_result}"}]}]}


async def test_hook_denies_a_run_code_nested_call(acp_agent, scripted):
    """code mode's nested calls go through Agent.call_tool, where dsh_before_tool sits: a PreToolUse
    hook sees them (tool_use_id <parent>:code:<n>) and its deny stops them."""
    cwd = acp_agent.work
    (cwd / ".claude").mkdir()
    _write_hook(cwd / ".claude" / "settings.json", "PreToolUse",
                "cat > .nested-payload.json; echo 'nested bash is not allowed' >&2; exit 2", matcher="bash")
    async with acp_agent(scripted(CODE_SCRIPT), example="hooks-code-mode",
                         env={"DSH_PERMISSION_MODE": "workspace-write"}) as run:
        await _open(run, sids := [])
        await _ask(run, sids[0], "code please")
        (said,) = run.client.text(sids[0])
    assert "ToolCallError: bash: nested bash is not allowed" in said, said
    assert not (cwd / "nested.txt").exists()
    sent = payload(cwd, ".nested-payload.json")
    assert sent["tool_name"] == "bash" and ":code:" in sent["tool_use_id"]


# ---------------------------------------------------------------------------- continue: false


def _json_hook(obj: dict, save: str) -> str:
    return f"#!/bin/sh\ncat > {save}\nprintf '%s\\n' '{json.dumps(obj)}'\n"


HALT_PRE = _json_hook({"continue": False, "stopReason": "paused for review by the release hook",
                       "hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow"}},
                      ".pretool-payload.json")
HALT_POST = _json_hook({"continue": False, "stopReason": "paused for review by the release hook"},
                       ".posttool-payload.json")


@pytest.mark.parametrize(("file", "event", "script", "ran"), [
    (CC, "PreToolUse", HALT_PRE, False),  # continue: false wins over the allow in the same answer
    (CODEX, "PostToolUse", HALT_POST, True),
    (CC, "PostToolUse", HALT_POST, True),
])
async def test_continue_false_stops_the_turn(acp_agent, scripted, file, event, script, ran):
    """``continue: false`` halts the turn after that hook point: the model is not called again, the
    turn ends ``stopped`` (``end_turn`` on the wire), and ``stopReason`` — for the user, not the
    model — is in the hook/result event and the turn/stopped note, never in the history."""
    cwd = acp_agent.work
    seed(cwd, file, {event: [("bash", "halt.sh")]}, {"halt.sh": script})
    async with acp_agent(scripted(SCRIPT), env={"DSH_PERMISSION_MODE": "workspace-write"}) as run:
        await _open(run, sids := [])
        assert (await _ask(run, sids[0], "create the file")).stop_reason == "end_turn"
        assert run.client.text(sids[0]) == []  # no "tool said: …": no model call after the hook
        assert (await _ask(run, sids[0], "ping")).stop_reason == "end_turn"  # the session goes on
        assert run.client.text(sids[0]) == ["PONG"]
    assert (cwd / "created.txt").exists() is ran
    events = _events(acp_agent.home, sids[0])
    (result,) = [e for e in events if e["type"] == "hook/result"]
    assert (result["point"], result["decision"], result["stopReason"]) == (
        event, "stop", "paused for review by the release hook")
    assert [e["reason"] for e in events if e["type"] == "turn/end"] == ["stopped", "completed"]
    (note,) = [e for e in events if e["type"] == "note" and e["kind"] == "turn/stopped"]
    assert note["data"] == {"turn": 1, "point": "before_tool" if event == "PreToolUse" else "after_tool",
                            "reason": "paused for review by the release hook"}
    (tool_result,) = [e for e in events if e["type"] == "tool/result"]
    said = tool_result["result"]["content"][0]["text"]
    assert said == ("HELLO\n" if ran else "Error: not run: a hook stopped the turn")
    model_saw = [json.dumps(e) for e in events if e["type"] in ("user/message", "tool/result", "assistant/message")]
    assert not any("release hook" in m for m in model_saw)


async def test_updated_input_and_system_message_are_warned_once_per_file(acp_agent, scripted):
    """Neither is honoured (as in the original): the call runs with the model's own arguments, and
    the file gets one warning per field however often its hooks return them."""
    cwd = acp_agent.work
    rewrite = _json_hook({"systemMessage": "shown to the user in Claude Code",
                          "hookSpecificOutput": {"hookEventName": "PreToolUse",
                                                 "updatedInput": {"command": "echo REWRITTEN"}}}, ".pre.json")
    seed(cwd, CC, {"PreToolUse": [("bash", "rewrite.sh")]}, {"rewrite.sh": rewrite})
    async with acp_agent(scripted(SCRIPT), env={"DSH_PERMISSION_MODE": "workspace-write"}) as run:
        await _open(run, sids := [])
        await _ask(run, sids[0], "retry echo")  # two bash calls, two hook runs
        assert run.client.text(sids[0]) == ["tool said: HELLO\n"]
        err = run.stderr.decode()
    assert err.count("returned updatedInput") == 1 and err.count("returned systemMessage") == 1, err
    assert f"{cwd / CC}: a PreToolUse hook returned updatedInput" in err
    assert len([e for e in _events(acp_agent.home, sids[0]) if e["type"] == "hook/result"]) == 2


# ---------------------------------------------------------------------------- PostToolUse on nested calls


@pytest.mark.parametrize("mode", ["block", "context"])
async def test_post_tool_hook_sees_a_run_code_nested_call(acp_agent, scripted, mode):
    """PostToolUse runs for code mode's nested calls too (Agent.call_tool): a block makes the program
    see an error instead of the result; context, which the program would not pass on, is appended
    for the model after the step's tool results."""
    cwd = acp_agent.work
    (cwd / ".claude").mkdir()
    if mode == "block":
        command = "cat > .nested-post.json; echo 'nested output withheld by policy' >&2; exit 2"
    else:
        out = {"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": "nested output audited"}}
        command = f"cat > .nested-post.json; printf '%s\\n' '{json.dumps(out)}'"
    _write_hook(cwd / ".claude" / "settings.json", "PostToolUse", command, matcher="bash")
    async with acp_agent(scripted(CODE_SCRIPT), example="hooks-code-mode",
                         env={"DSH_PERMISSION_MODE": "workspace-write"}) as run:
        await _open(run, sids := [])
        await _ask(run, sids[0], "code please")
        (said,) = run.client.text(sids[0])
    assert (cwd / "nested.txt").exists()  # the nested call ran; its hook came after
    sent = payload(cwd, ".nested-post.json")
    assert sent["hook_event_name"] == "PostToolUse" and sent["tool_name"] == "bash"
    assert ":code:" in sent["tool_use_id"] and sent["tool_input"] == {"description": "Run the command",
                                                                 "command": "echo NESTED > nested.txt"}
    events = _events(acp_agent.home, sids[0])
    (dispatch,) = [e for e in events if e["type"] == "tool/code-dispatch"]
    if mode == "block":
        assert "ToolCallError: bash: nested output withheld by policy" in said, said
        assert dispatch["isError"] and dispatch["code"] == "BLOCKED"
        return
    assert not dispatch.get("isError") and "audited" not in said and "Error" not in said, said  # the program's result as is
    kinds = [(e["type"], e.get("message", {}).get("source")) for e in events
             if e["type"] in ("tool/result", "user/message")]
    assert kinds[-2:] == [("tool/result", None), ("user/message", "tool")]  # after the run_code result
    spliced = [e for e in events if e["type"] == "user/message"][-1]["message"]["content"]
    assert spliced == [{"type": "text", "text": "<system-reminder>\nnested output audited\n</system-reminder>"}]


async def test_continue_false_wins_over_a_stop_block(acp_agent, scripted):
    cwd = acp_agent.work
    halt = _json_hook({"continue": False, "stopReason": "enough for today", "decision": "block",
                       "reason": "Also reply with the single word SECOND, then stop."}, ".stop.json")
    seed(cwd, CODEX, {"Stop": [(None, "stop.sh")]}, {"stop.sh": halt})
    async with acp_agent(scripted(SCRIPT), env={"DSH_PERMISSION_MODE": "workspace-write"}) as run:
        await _open(run, sids := [])
        assert (await _ask(run, sids[0], "Reply with the single word FIRST and stop.")).stop_reason == "end_turn"
        assert run.client.text(sids[0]) == ["FIRST"]  # no second step
    events = _events(acp_agent.home, sids[0])
    assert [(e["decision"], e["stopReason"]) for e in events if e["type"] == "hook/result"] == [
        ("stop", "enough for today")]
    assert [e["reason"] for e in events if e["type"] == "turn/end"] == ["stopped"]


# ------------------------------------------------------------- the converted scenarios' points
# Each body's point, checked on the committed transcripts and recordings (a careless refresh cannot
# bless a regression). The payload files the hooks wrote were checked by the bodies at conversion.


def _committed(name: str) -> tuple[str, list[dict]]:
    sc = SNAPSHOTS / name
    log = [json.loads(line) for line in (sc / "session.jsonl").read_text().splitlines() if line.strip()]
    return (sc / "stdout.expected.jsonl").read_text(), log


def _said(stdout: str) -> list[str]:
    return [f["params"]["update"]["content"]["text"] for f in map(json.loads, stdout.splitlines())
            if f.get("method") == "session/update"
            and f["params"]["update"].get("sessionUpdate") == "agent_message_chunk"]


@pytest.mark.parametrize("name", ["hook-cc-invalid-matcher", "hook-codex-invalid-matcher"])
def test_invalid_matcher_scenarios_still_answer(name):
    stdout, log = _committed(name)
    assert _said(stdout) == ["PONG"]
    assert not [r for r in log if r["type"].startswith("hook/")]  # neither hook ran


@pytest.mark.parametrize("name", ["hook-cc-pretool-deny", "hook-codex-pretool-block"])
def test_pretool_scenarios_block_the_call(name):
    stdout, log = _committed(name)
    assert _said(stdout) == ["tool said: Error: bash is disabled by policy in this session"]
    (result,) = [r for r in log if r["type"] == "tool/result"]
    assert result["code"] == "BLOCKED" and result["result"]["isError"]


def test_pretool_ask_in_danger_full_access_is_rejected_without_asking():
    stdout, log = _committed("hook-cc-pretool-ask-full-access")
    assert not [f for f in map(json.loads, stdout.splitlines()) if f.get("method") == "session/request_permission"]
    (decided,) = [e for e in log if e["type"] == "approval/decided"]
    assert (decided["outcome"], decided["answeredBy"]) == ("rejected", "policy")
    (result,) = [e for e in log if e["type"] == "tool/result"]
    assert result["code"] == "REJECTED" and result["result"]["isError"]


def test_pretool_ask_scenario_asks_once_and_is_rejected():
    stdout, log = _committed("hook-cc-pretool-ask")
    asks = [f for f in map(json.loads, stdout.splitlines()) if f.get("method") == "session/request_permission"]
    (ask,) = asks
    call = ask["params"]["toolCall"]
    assert call["kind"] == "execute" and call["rawInput"] == {"description": "Run the command",
                                                              "command": "echo HELLO > created.txt && cat created.txt"}
    assert call["title"].endswith("— bash requires manual approval in this session")
    assert not [r for r in log if r["type"] == "tool/result" and not r["result"]["isError"]]


@pytest.mark.parametrize("name", ["hook-cc-posttool-context", "hook-codex-posttool-context"])
def test_posttool_context_scenarios_reach_the_model(name):
    (said,) = _said(_committed(name)[0])
    assert said.startswith("tool said: HELLO") and "verified against the audit log" in said


@pytest.mark.parametrize("name", ["hook-cc-promptsubmit-block", "hook-codex-promptsubmit-block"])
def test_promptsubmit_block_scenarios_skip_the_model_then_go_on(name):
    stdout, log = _committed(name)
    assert _said(stdout) == ["PONG"]  # the blocked prompt never reached the model
    assert len([r for r in log if r["type"] == "assistant/message"]) == 1


@pytest.mark.parametrize("name", ["hook-cc-posttool-block", "hook-codex-posttool-block"])
def test_posttool_block_scenarios_feed_the_block_back(name):
    _, log = _committed(name)
    assert [r for r in log if r["type"] == "hook/result" and r["decision"] == "block"]


@pytest.mark.parametrize("name", ["hook-cc-promptsubmit-context", "hook-codex-promptsubmit-context"])
def test_promptsubmit_context_scenarios_reach_the_model(name):
    stdout, log = _committed(name)
    assert _said(stdout) == ["teal"]  # the model answered from the hook's context
    (ctx,) = [r for r in log if r["type"] == "user/message" and r["message"].get("source") == "hook"]
    assert "teal" in json.dumps(ctx)


@pytest.mark.parametrize("name", ["hook-cc-stop-continue", "hook-codex-stop-continue"])
def test_stop_continue_scenarios_take_one_more_step(name):
    stdout, log = _committed(name)
    assert _said(stdout) == ["FIRST", "SECOND"]
    stops = [r["decision"] for r in log if r["type"] == "hook/result" and r["point"] == "Stop"]
    assert stops == ["block", "pass"]  # blocked once (one more step), then let the turn end
    assert len([r for r in log if r["type"] == "assistant/message"]) == 2
