"""The dialect-neutral core: matchers, config parsing (rejected whole), output decoding, the
most-restrictive fold, and a real command run (process group, timeout, bounded output)."""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from dsh_hooks.protocol import (
    HookConfigError,
    HookOutput,
    decode,
    load_hook_file,
    matcher_problem,
    matches,
    merge,
    parse_hooks,
    run_command,
)
from dsh_hooks_claude_code import DIALECT as CC
from dsh_hooks_codex import DIALECT as CODEX
from dsh_sandbox_tools.testing import require_mechanism

from dsh_core.contracts import AgentSpec
from dsh_core.errors import DshError
from dsh_core.interception import BeforeTool, fold_before_tool
from dsh_testing import memory_host


def test_matchers_by_dialect():
    for pattern in (None, "", "*"):
        assert matches(pattern, "anything", True) and matches(pattern, "anything", False)
    assert matches("Bash|bash", "bash", True) and not matches("Bash|bash", "bashful", True)  # exact names
    assert matches("bash", "bashful", False)  # Codex: always an unanchored regex
    assert matches("^(read|write)$", "write", True) and not matches("^(read|write)$", "edit", True)
    assert matcher_problem("[", True) and matcher_problem("[", False) and matcher_problem("Bash|Edit", True) is None
    assert not matches("[", "x", False)  # a direct caller still gets no match, never a crash


def test_config_is_rejected_whole_and_names_event_and_pattern():
    raw = {"hooks": {"UserPromptSubmit": [{"hooks": [{"type": "command", "command": "true"}]}],
                     "PreToolUse": [{"matcher": "[", "hooks": [{"type": "command", "command": "exit 2"}]}]}}
    with pytest.raises(HookConfigError, match=r'PreToolUse: invalid matcher regex "\["'):
        parse_hooks(raw, "hooks.json", CC)
    # no matcher subject for UserPromptSubmit/Stop: their matcher is ignored, never an error
    ok, skipped = parse_hooks({"UserPromptSubmit": [{"matcher": "[", "hooks": [
        {"type": "command", "command": "true", "timeout": 5}, {"type": "prompt", "prompt": "x"}]}]}, "h", CC)
    (group,) = ok.points["UserPromptSubmit"]
    assert group.matcher is None and group.hooks[0].timeout_s == 5 and skipped == ['"prompt" hook on UserPromptSubmit']


def test_codex_keys_and_aliases():
    raw = {"pre_tool_use": [{"matcher": "bash", "hooks": [{"command": "a", "timeoutSec": 3},
                                                          {"command": "b", "async": True}]}],
           "Stop": [{"hooks": [{"type": "command", "command": "c"}]}], "PreCompact": [{"hooks": "ignored"}]}
    parsed, skipped = parse_hooks(raw, "codex-hooks.json", CODEX)
    assert [h.command for g in parsed.points["PreToolUse"] for h in g.hooks] == ["a"]
    assert parsed.points["PreToolUse"][0].hooks[0].timeout_s == 3 and "Stop" in parsed.points
    assert skipped == ["async hook on pre_tool_use"]


def test_a_bad_file_warns_once_and_registers_nothing(tmp_path, capsys):
    bad = tmp_path / "settings.json"
    bad.write_text("{not json")
    assert load_hook_file(str(bad), CC) is None
    err = capsys.readouterr().err
    assert err.count(str(bad)) == 1 and "none of its hooks run" in err


def test_decode_exit_codes_and_json():
    assert decode(2, "", " nope \n", "PreToolUse").decision == "block"
    assert decode(2, "", "nope", None).reason == "nope"
    out = decode(1, '{"decision": "block"}', "err", "PreToolUse")
    assert out.decision is None  # other exits: non-blocking, stdout not read
    out = decode(0, json.dumps({"decision": "deny"}), "", "PreToolUse")
    assert out.decision is None  # allow/deny/ask only as permissionDecision
    specific = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "ask",
                                       "permissionDecisionReason": "why", "additionalContext": "ctx"},
                "decision": "approve", "continue": False, "stopReason": "halt"}
    out = decode(0, json.dumps(specific), "", "PreToolUse")
    assert (out.decision, out.reason, out.context, out.cont, out.stop_reason) == ("ask", "why", "ctx", False, "halt")
    out = decode(0, json.dumps(specific), "", "PostToolUse")  # another event's block: ignored
    assert out.decision == "approve" and out.context is None
    assert decode(0, "plain text", "", None).stdout == "plain text"


def test_fold_is_most_restrictive():
    m = merge([HookOutput(0, decision="allow"), HookOutput(0, decision="ask", reason="a"),
               HookOutput(2, decision="block", reason="b1"), HookOutput(2, decision="deny", reason="b2"),
               HookOutput(0, context="c1"), HookOutput(0, context="c2")])
    assert (m.decision, m.reason, m.context) == ("deny", "b1\n\nb2", ["c1", "c2"])
    assert merge([HookOutput(0, decision="allow"), HookOutput(0, decision="ask", reason="a")]).decision == "ask"
    assert merge([]).decision is None
    # the spine's own fold for native plugins, same precedence
    assert fold_before_tool([BeforeTool(decision="allow"), BeforeTool(decision="ask", reason="x")]) == \
        BeforeTool(decision="ask", reason="x")
    assert fold_before_tool([BeforeTool(decision="deny"), BeforeTool(decision="ask", reason="x")]).decision == "deny"


# Where a hook's pids are the host's (no pid namespace): unconfined, and Landlock.
REAL_PIDS = [("danger-full-access", "auto"), ("workspace-write", "landlock")]
ALL = [*REAL_PIDS, ("workspace-write", "bwrap")]


@asynccontextmanager
async def _session(tmp_path: Path, monkeypatch, mode: str, mechanism: str):
    """A real session of a host that mounts sandbox-tools: hooks run through its Confinement seam
    (the session's confined command server)."""
    if mode != "danger-full-access":
        require_mechanism(mechanism)
    monkeypatch.setenv("DSH_PERMISSION_MODE", mode)
    monkeypatch.setenv("DSH_SANDBOX_MECHANISM", mechanism)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": [{"text": "ok"}]}))
    async with memory_host(script, plugins=("scripted-model", "sandbox-tools")) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        try:
            yield agent
        finally:
            await agent.dispose()


@pytest.mark.anyio
@pytest.mark.parametrize(("mode", "mechanism"), ALL)
async def test_run_command_stdin_exit_and_bound(tmp_path: Path, monkeypatch, mode, mechanism):
    async with _session(tmp_path, monkeypatch, mode, mechanism) as session:
        code, out, err, timed_out = await run_command(
            "cat; echo oops >&2; head -c 3000000 /dev/zero | tr '\\0' y; echo $X >&2; exit 3", session=session,
            cwd=str(tmp_path), stdin=b'{"a": 1}\n', env={"X": "1"}, timeout_s=30, output_limit=4096)
    assert (code, timed_out) == (3, False)
    assert out.startswith('{"a": 1}\n') and len(out) == 4096 and err == "oops\n1\n"


@pytest.mark.anyio
@pytest.mark.parametrize(("mode", "mechanism"), REAL_PIDS)
async def test_timeout_kills_the_whole_group(tmp_path: Path, monkeypatch, mode, mechanism):
    async with _session(tmp_path, monkeypatch, mode, mechanism) as session:
        started = time.monotonic()
        code, _, _, timed_out = await run_command(
            "(sleep 30; touch late) & echo $! > child; sleep 30", session=session, cwd=str(tmp_path), stdin=b"",
            env={}, timeout_s=0.5)
        assert timed_out and code is None and time.monotonic() - started < 5
        assert await _gone(int((tmp_path / "child").read_text()))


@pytest.mark.anyio
@pytest.mark.parametrize(("mode", "mechanism"), REAL_PIDS)
async def test_cancel_kills_the_group(tmp_path: Path, monkeypatch, mode, mechanism):
    async with _session(tmp_path, monkeypatch, mode, mechanism) as session:
        with anyio.move_on_after(0.5):
            await run_command("echo $$ > pid; sleep 30", session=session, cwd=str(tmp_path), stdin=b"", env={},
                              timeout_s=60)
        assert await _gone(int((tmp_path / "pid").read_text()))


@pytest.mark.anyio
async def test_without_a_confinement_provider_a_hook_does_not_run(tmp_path: Path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": [{"text": "ok"}]}))
    async with memory_host(script) as host:  # no sandbox-tools: host.confinement is None
        assert host.confinement is None
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        with pytest.raises(DshError, match="never runs unconfined"):
            await run_command("touch ran", session=agent, cwd=str(tmp_path), stdin=b"", env={}, timeout_s=5)
        await agent.dispose()
    assert not (tmp_path / "ran").exists()


async def _gone(pid: int) -> bool:
    """Dead (or a zombie nobody has reaped yet), within 2 s."""
    for _ in range(100):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        await anyio.sleep(0.02)
    return False
