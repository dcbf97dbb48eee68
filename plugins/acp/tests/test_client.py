"""The ACP client module (dsh_acp.client) against real peers over real pipes:
our own acp-agent with the scripted model, and a third-party agent written with the
official SDK's agent side (peer_agent.py)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import anyio
import pytest
from dsh_acp.client import (
    AcpClientError,
    open_client,
    pick_option,
    scrub_env,
    tree_pids,
)
from dsh_acp.testing import live, peer_argv

from dsh_testing import REPO

pytestmark = pytest.mark.anyio

DEMO = REPO / "examples" / "acp-agent" / "demo.json"


def child_env(**extra: str) -> dict[str, str]:
    """What the client module gives a child (scrubbed), keeping the test's own DSH_HOME so a spawned
    dsh writes its session logs under the test's tmp_path, not the user's data dir."""
    return scrub_env(inherit=["DSH_HOME"], extra=extra)


def dsh_argv(script: Path, example: str = "acp-agent") -> list[str]:
    return [sys.executable, "-m", "dsh_core.cli", "run", "--example", example, "--provider", "scripted",
            "--model", str(script)]  # fmt: skip


def test_scrub_env_drops_credentials_and_ambient_dsh_but_keeps_configured():
    base = {"PATH": "/bin", "DEEPSEEK_API_KEY": "sk", "GH_TOKEN": "t", "DB_PASSWORD": "p", "MY_SECRET_X": "s",
            "DSH_HOME": "/h", "DSH_PERMISSION_MODE": "yolo", "LANG": "C"}  # fmt: skip
    assert scrub_env(base) == {"PATH": "/bin", "LANG": "C"}
    env = scrub_env(base, inherit=["DSH_HOME", "DEEPSEEK_API_KEY"], extra={"DSH_SUBAGENT_DEPTH": "1"})
    assert env == {"PATH": "/bin", "LANG": "C", "DSH_HOME": "/h", "DEEPSEEK_API_KEY": "sk", "DSH_SUBAGENT_DEPTH": "1"}


def test_pick_option_never_invents_an_id():
    opts = [("always", "allow_always"), ("once", "allow_once"), ("no", "reject_once")]
    assert pick_option(opts, "allow") == "once"
    assert pick_option(opts, "reject") == "no"
    assert pick_option([("always", "allow_always")], "allow") == "always"
    assert pick_option([("once", "allow_once")], "reject") is None  # → cancelled


async def test_our_acp_agent_answers_and_exits_on_eof(tmp_path):
    chunks: list[str] = []
    async with open_client(dsh_argv(DEMO), cwd=str(tmp_path), env=child_env()) as client:
        sid = await client.start()
        tree = tree_pids(client.pid)
        result = await client.prompt("ping", on_text=chunks.append)
        assert (result.stop_reason, result.text, result.session_id) == ("end_turn", "PONG", sid)
        result = await client.prompt("where are you?")
        assert result.text == f"I am working in {tmp_path}."  # absolute cwd reached session/new
    assert chunks == ["PONG"]
    assert client.exit_status == "eof"
    assert live(tree) == []


async def test_third_party_agent_text_thoughts_and_tool_updates_ignored(tmp_path):
    async with open_client(peer_argv("answer"), cwd=str(tmp_path), env=child_env()) as client:
        assert await client.start() == "peer-session-1"
        result = await client.prompt("hello")
    assert (result.stop_reason, result.text) == ("end_turn", "peer: hello")


@pytest.mark.parametrize("mode, stop", [("stop:max_tokens", "max_tokens"), ("stop:refusal", "refusal")])
async def test_stop_reasons_pass_through(tmp_path, mode, stop):
    async with open_client(peer_argv(mode), cwd=str(tmp_path), env=child_env()) as client:
        await client.start()
        assert (await client.prompt("x")).stop_reason == stop


@pytest.mark.parametrize(
    "verdict, answer", [("allow", "once"), ("reject", "no"), ("cancelled", "cancelled"), (RuntimeError("x"), "no")]
)
async def test_permission_goes_through_the_policy_and_picks_an_offered_option(tmp_path, verdict, answer):
    asked = []

    async def policy(ask):
        asked.append(ask)
        if isinstance(verdict, Exception):
            raise verdict
        return verdict

    async with open_client(peer_argv("permission"), cwd=str(tmp_path), env=child_env(), on_permission=policy) as c:
        await c.start()
        result = await c.prompt("go")
    assert result.text == f"peer permission: {answer}"
    (ask,) = asked
    assert (ask.tool_call_id, ask.title, ask.kind) == ("peer-call-7", "rm -rf build", "execute")


async def test_a_crash_mid_prompt_is_an_error_result_not_a_hang(tmp_path):
    with anyio.fail_after(10):
        async with open_client(peer_argv("crash"), cwd=str(tmp_path), env=child_env()) as client:
            await client.start()
            result = await client.prompt("go")
    assert result.stop_reason == "error"
    assert result.text == "partial"
    assert "exit status 3" in result.error


async def test_large_frames_and_a_stderr_flood_do_not_break_the_client(tmp_path):
    async with open_client(peer_argv("big"), cwd=str(tmp_path), env=child_env(), stderr_limit=4096) as client:
        await client.start()
        result = await client.prompt("go")
    assert result.stop_reason == "end_turn"
    assert len(result.text) == 5 << 20
    assert 0 < len(client.stderr_text()) <= 4096 + (1 << 20)  # bounded tail, never blocked


async def test_cancel_sends_session_cancel_and_keeps_the_partial_output(tmp_path):
    async with open_client(peer_argv("hang"), cwd=str(tmp_path), env=child_env()) as client:
        await client.start()
        async with anyio.create_task_group() as tg:
            box = []

            async def run():
                box.append(await client.prompt("go"))

            tg.start_soon(run)
            while client.text != "partial":
                await anyio.sleep(0.01)
            await client.cancel()
        assert (box[0].stop_reason, box[0].text) == ("cancelled", "partial")


async def test_cancelling_the_caller_cancels_the_child_and_waits_for_its_partial(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"rules": [{"when": "hang", "steps": [{"partial": "part", "delay_ms": 60000}]}]}))
    home = tmp_path / "home"
    async with open_client(dsh_argv(script), cwd=str(tmp_path), env=scrub_env(extra={"DSH_HOME": str(home)})) as c:
        sid = await c.start()
        with anyio.move_on_after(0.5):
            await c.prompt("hang")
        assert c.text == "part"
    log = [json.loads(line) for line in (home / "sessions" / f"{sid}.jsonl").read_text().splitlines()]
    end = [e for e in log if e["type"] == "turn/end"]
    assert end and end[-1]["reason"] == "aborted" and end[-1]["abortKind"] == "user"  # session/cancel, not a kill
    assert c.exit_status == "eof"


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.15, 0.4])
async def test_cancel_at_each_phase_leaves_no_process(tmp_path, delay):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"default": [{"partial": "p", "delay_ms": 60000}]}))
    seen: list[int] = []
    tracked: dict[int, int] = {}
    with anyio.move_on_after(delay):
        async with open_client(dsh_argv(script), cwd=str(tmp_path), env=child_env()) as client:
            seen.append(client.pid)
            tracked.update(tree_pids(client.pid))
            await client.start()
            await client.prompt("hang")
    if delay == 0.0:
        assert seen == []  # cancelled before the spawn: nothing was started
    else:
        assert seen and live([seen[0], *tracked]) == []


async def test_a_child_that_ignores_cancel_eof_and_sigterm_is_killed_with_its_tree(tmp_path):
    mark = tmp_path / "mark"
    started = time.monotonic()
    env = child_env(PEER_MARK=str(mark))
    async with open_client(peer_argv("stubborn"), cwd=str(tmp_path), env=env, eof_grace=0.3, term_grace=0.3) as c:
        await c.start()
        with anyio.move_on_after(0.3):
            await c.prompt("go", cancel_grace=0.2)
        kids = [int(p) for p in Path(str(mark) + ".kids").read_text().split()]
        assert len(live(kids)) == 2
    assert c.exit_status == "sigkill"
    assert live([c.pid, *kids]) == []  # including the grandchild in its own session
    # The graces add up to under a second; the loose bound only proves that teardown does not
    # wait on the child (which would never exit by itself), without flaking on a loaded machine.
    assert time.monotonic() - started < 30


async def test_version_mismatch_is_refused(tmp_path):
    async with open_client(peer_argv("version"), cwd=str(tmp_path), env=child_env()) as client:
        with pytest.raises(AcpClientError, match="protocol version 2"):
            await client.start()


async def test_a_missing_command_is_a_clear_error(tmp_path):
    with pytest.raises(AcpClientError, match="cannot start the ACP agent '/nonexistent/agent'"):
        async with open_client(["/nonexistent/agent"], cwd=str(tmp_path)):
            pass


async def test_a_child_that_exits_at_once_reports_its_stderr(tmp_path):
    argv = [sys.executable, "-m", "dsh_core.cli", "run", "--example", "no-such-example"]
    async with open_client(argv, cwd=str(tmp_path), env=child_env()) as client:
        with pytest.raises(AcpClientError, match="unknown example 'no-such-example'"):
            await client.start()


async def test_env_reaches_the_child_scrubbed(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-test")
    monkeypatch.setenv("DSH_SOMETHING", "1")
    env = scrub_env(extra={"PEER_EXTRA": "yes"})
    async with open_client(peer_argv("env"), cwd=str(tmp_path), env=env) as client:
        await client.start()
        report = json.loads((await client.prompt("env")).text)
    assert report["has_deepseek_key"] is False and report["dsh_vars"] == []
    assert report["extra"] == "yes"
    assert report["cwd"] == report["session_cwd"] == str(tmp_path)
    assert os.environ["DEEPSEEK_API_KEY"] == "sk-test"
