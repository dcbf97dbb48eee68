"""Terminals behind the real door: ``dsh run --example acp-extended`` over real stdio, driven by
the official SDK client. A terminal outlives the turn that opened it, and ends with its session:
``session/close``, end of file on stdin, and ``kill -9`` of dsh itself leave no process behind."""

from __future__ import annotations

import os
import signal

import anyio
import pytest
from acp import text_block
from dsh_sandbox_tools.testing import require_mechanism

from dsh_testing import REPO, live_processes, new_sleep_marker, session_log, sleepers
from dsh_testing import sleepers_gone as gone

pytestmark = pytest.mark.anyio

EXAMPLES = str(REPO / "examples")
TIERS = {"bwrap": {"DSH_SANDBOX_MECHANISM": "bwrap"}, "landlock": {"DSH_SANDBOX_MECHANISM": "landlock"},
         "unconfined": {"DSH_PERMISSION_MODE": "danger-full-access"}}


def new_marker() -> str:
    return new_sleep_marker(5000)


def script(marker: str) -> dict:
    """``start`` opens a terminal that leaves three sleeps (one setsid'd, one nohup'd, one in the
    foreground); ``more`` sends to the same terminal in a later turn."""
    def send(text: str) -> dict:
        return {"tool": "terminal_send", "args": {"sessionId": "pty-1", "text": text}}

    return {"rules": [
        {"when": "^start", "steps": [
            {"tool": "terminal_open", "args": {"type": "shell", "name": "main"}},
            send("export KEPT=yes"),
            send(f"(setsid sleep {marker} &); nohup sleep {marker} >/dev/null 2>&1 & sleep {marker}"),
            {"text": "started"}]},
        {"when": "^more", "steps": [
            {"tool": "terminal_signal", "args": {"sessionId": "pty-1", "signal": "SIGINT"}},
            send("echo kept=$KEPT"), {"text": "{tool_result}"}]},
    ]}


async def _started(run, sid, marker) -> None:
    resp = await run.conn.prompt(session_id=sid, prompt=[text_block("start")])
    assert resp.stop_reason == "end_turn" and run.client.text(sid) == ["started"]
    with anyio.fail_after(10):
        while len(sleepers(marker)) < 3:
            await anyio.sleep(0.02)


@pytest.mark.parametrize("tier", list(TIERS))
async def test_kill_9_of_dsh_leaves_no_terminal_process_behind(acp_agent, scripted, tier):
    if tier != "unconfined":
        require_mechanism(tier)
    marker = new_marker()
    env = {"DSH_EXAMPLES_PATH": EXAMPLES, **TIERS[tier]}
    async with acp_agent(scripted(script(marker)), example="acp-extended", env=env, check=False) as run:
        sid = await run.start()
        await _started(run, sid, marker)
        os.kill(run.proc.pid, signal.SIGKILL)
        await run.proc.wait()
        assert await gone(marker), f"left running after kill -9 of dsh: {sleepers(marker)}"


@pytest.mark.parametrize("tier", ["bwrap", "landlock"])
async def test_a_terminal_survives_turns_and_ends_with_session_close(acp_agent, scripted, tier):
    marker = new_marker()
    env = {"DSH_EXAMPLES_PATH": EXAMPLES, **TIERS[tier]}
    require_mechanism(tier)
    async with acp_agent(scripted(script(marker)), example="acp-extended", env=env) as run:
        sid = await run.start()
        await _started(run, sid, marker)
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("more")])
        assert resp.stop_reason == "end_turn"
        # (the prompt the interrupt brought back may land after the send began: it may lead the output)
        assert run.client.text(sid)[-1].endswith("echo kept=$KEPT\nkept=yes\ndsh> \n[wait: stdin_read]\n"
                                                 "[session: running]")
        await anyio.sleep(0.2)
        assert len(sleepers(marker)) == 2  # SIGINT ended the foreground sleep only
        with anyio.fail_after(20):
            await run.conn.close_session(session_id=sid)
        assert await gone(marker), f"left running after session/close: {sleepers(marker)}"
    events = session_log(acp_agent.home, sid)
    calls = [e["name"] for e in events if e.get("type") == "tool/call"]
    assert calls == ["terminal_open", "terminal_send", "terminal_send", "terminal_signal", "terminal_send"]


async def test_end_of_file_on_stdin_ends_the_terminals(acp_agent, scripted):
    marker = new_marker()
    env = {"DSH_EXAMPLES_PATH": EXAMPLES, "DSH_PERMISSION_MODE": "danger-full-access"}
    async with acp_agent(scripted(script(marker)), example="acp-extended", env=env) as run:
        sid = await run.start()
        await _started(run, sid, marker)
        assert await run.close_stdin() == 0
    assert not sleepers(marker)


@pytest.mark.parametrize("tier", ["bwrap", "landlock"])
async def test_a_terminal_cannot_signal_dsh(acp_agent, scripted, tier):
    """``kill -9`` up the whole ancestor chain from inside a terminal (its keeper and dsh
    included): dsh answers, and the terminal's keeper still ends the shell with the session."""
    from dsh_sandbox_tools import _landlock_exec

    require_mechanism(tier)
    if tier == "landlock" and not _landlock_exec.signal_scoped():
        pytest.skip(f"Landlock ABI {_landlock_exec.abi_version()} has no signal scoping (ABI 6)")
    attack = ("p=$PPID; while [ \"$p\" -gt 1 ] 2>/dev/null; do n=$(cut -d' ' -f4 /proc/$p/stat 2>/dev/null || echo 0); "
              "kill -9 $p 2>/dev/null; p=$n; done; echo survived")
    steps = {"default": [
        {"tool": "terminal_open", "args": {"type": "shell"}},
        {"tool": "terminal_send", "args": {"sessionId": "pty-1", "text": attack}},
        {"text": "dsh is alive: {tool_result}"}]}
    env = {"DSH_EXAMPLES_PATH": EXAMPLES, **TIERS[tier]}
    async with acp_agent(scripted(steps), example="acp-extended", env=env) as run:
        sid = await run.start()
        reply = await run.conn.prompt(session_id=sid, prompt=[text_block("attack")])
        assert reply.stop_reason == "end_turn"
        (answer,) = run.client.text(sid)
        assert answer.startswith("dsh is alive") and "survived\ndsh> " in answer, answer
        assert run.proc.returncode is None


async def test_cancelling_a_send_interrupts_the_foreground_and_the_terminal_lives(acp_agent, scripted):
    """session/cancel during a send that would run on: the call ends, the foreground program gets
    Ctrl-C (SIGINT), and the same terminal takes the next send."""
    marker = new_marker()
    looping = f"bash -c 'while :; do echo tick; sleep 0.1; done' {marker}"
    steps = {"rules": [
        {"when": "^hold", "steps": [
            {"tool": "terminal_open", "args": {"type": "shell"}},
            {"tool": "terminal_send", "args": {"sessionId": "pty-1", "text": looping}}, {"text": "never"}]},
        {"when": "^again", "steps": [
            {"tool": "terminal_send", "args": {"sessionId": "pty-1", "text": "echo back"}}, {"text": "{tool_result}"}]},
    ]}

    def loopers() -> list[int]:
        return live_processes(lambda argv, cwd: argv[-2:] == [marker.encode(), b""] or argv[-1:] == [marker.encode()])

    env = {"DSH_EXAMPLES_PATH": EXAMPLES, "DSH_PERMISSION_MODE": "danger-full-access"}
    async with acp_agent(scripted(steps), example="acp-extended", env=env) as run:
        sid = await run.start()
        async with anyio.create_task_group() as tg:
            stop_reason = []

            async def prompt() -> None:
                resp = await run.conn.prompt(session_id=sid, prompt=[text_block("hold")])
                stop_reason.append(resp.stop_reason)

            tg.start_soon(prompt)
            with anyio.fail_after(10):
                while not loopers():
                    await anyio.sleep(0.02)
            await run.conn.cancel(session_id=sid)
        assert stop_reason == ["cancelled"]
        with anyio.fail_after(10):
            while loopers():
                await anyio.sleep(0.05)
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("again")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid)[-1].endswith("echo back\nback\ndsh> \n[wait: stdin_read]\n[session: running]")
