"""Background jobs behind the real door: ``dsh run --example acp-agent`` over real stdio, driven
by the official SDK client. A job outlives the turn that started it; it dies when dsh does —
closed stdin, or ``kill -9`` of dsh itself (no process of the job is left on the machine)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import anyio
import pytest
from acp import text_block
from dsh_sandbox_tools.testing import require_mechanism
from test_jobs import gone, new_marker, sleepers

from dsh_testing import REPO, session_log

pytestmark = pytest.mark.anyio

EXAMPLES = str(REPO / "examples")


def script(marker: str) -> dict:
    return {"rules": [
        {"when": "^start", "steps": [
            {"tool": "bash", "args": {"description": "Run the command", "command": f"setsid sleep {marker} & touch started; sleep {marker}",
                                      "run_in_background": True}},
            {"tool": "bash", "args": {"description": "Run the command", "command": "while [ ! -e started ]; do sleep 0.01; done"}},
            {"text": "started {started_id}"}]},
        {"when": "^read", "steps": [
            {"tool": "job_list", "args": {}}, {"text": "{tool_result}"}]},
    ]}


TIERS = {"bwrap": {"DSH_SANDBOX_MECHANISM": "bwrap"}, "landlock": {"DSH_SANDBOX_MECHANISM": "landlock"},
         "unconfined": {"DSH_PERMISSION_MODE": "danger-full-access"}}


@pytest.mark.parametrize("tier", list(TIERS))
async def test_kill_9_of_dsh_leaves_no_job_behind(acp_agent, scripted, tier):
    if tier != "unconfined":
        require_mechanism(tier)
    marker = new_marker()
    async with acp_agent(scripted(script(marker)), env={"DSH_EXAMPLES_PATH": EXAMPLES, **TIERS[tier]},
                         check=False) as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("start")])
        assert resp.stop_reason == "end_turn" and "".join(run.client.text(sid)) == "started bash-1"
        with anyio.fail_after(10):
            while len(sleepers(marker)) < 2:
                await anyio.sleep(0.02)
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("read")])
        assert "bash-1 [bash] running — setsid sleep" in "".join(run.client.text(sid))
        os.kill(run.proc.pid, signal.SIGKILL)
        await run.proc.wait()
        assert await gone(marker), f"left running after kill -9 of dsh: {sleepers(marker)}"


async def test_closing_stdin_ends_the_jobs_and_the_log_says_so(acp_agent, scripted):
    marker = new_marker()
    async with acp_agent(scripted(script(marker)), env={"DSH_EXAMPLES_PATH": EXAMPLES,
                                                        "DSH_PERMISSION_MODE": "danger-full-access"}) as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("start")])
        with anyio.fail_after(10):  # `touch started` may run before both sleeps have exec'd
            while len(sleepers(marker)) < 2:
                await anyio.sleep(0.02)
        assert await run.close_stdin() == 0
    assert not sleepers(marker)
    events = session_log(acp_agent.home, sid)[1:]
    started = [e for e in events if e["type"] == "job/started"]
    settled = [e for e in events if e["type"] == "job/settled"]
    assert [(e["id"], e["kind"], e["callId"]) for e in started] == [("bash-1", "bash", "call_1")]
    assert [(e["id"], e["status"], e["detail"]) for e in settled] == [("bash-1", "killed", "its session ended")]
    # and `dsh sessions show` prints them
    env = {"PATH": os.environ["PATH"], "DSH_HOME": str(acp_agent.home)}
    out = subprocess.run([sys.executable, "-m", "dsh_core.cli", "sessions", "show", sid], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    shown = [line.split(None, 3)[2:] for line in out.stdout.splitlines()[1:]]
    assert ["job/started", f"bash-1 bash: setsid sleep {marker} & touch started; sleep {marker}  [call_1]"] in shown
    assert ["job/settled", "bash-1 killed: its session ended · 0 bytes of output"] in shown


@pytest.mark.parametrize("tier", list(TIERS))
async def test_kill_9_of_dsh_during_a_foreground_command_leaves_nothing_either(acp_agent, scripted, tier):
    """The same lifeline for a foreground call of the session's tier (in danger-full-access too:
    an unconfined command server, whose reaper outlives dsh long enough to end the call)."""
    if tier != "unconfined":
        require_mechanism(tier)
    marker = new_marker()
    steps = {"rules": [{"when": "^hold", "steps": [
        {"tool": "bash", "args": {"description": "Run the command", "command": f"setsid sleep {marker} & sleep {marker}"}}, {"text": "never"}]}]}
    async with acp_agent(scripted(steps), env={"DSH_EXAMPLES_PATH": EXAMPLES, **TIERS[tier]}, check=False) as run:
        sid = await run.start()
        async with anyio.create_task_group() as tg:
            async def prompt() -> None:
                with contextlib.suppress(Exception):  # the agent is killed under it
                    await run.conn.prompt(session_id=sid, prompt=[text_block("hold")])

            tg.start_soon(prompt)
            with anyio.fail_after(10):
                while len(sleepers(marker)) < 2:
                    await anyio.sleep(0.02)
            os.kill(run.proc.pid, signal.SIGKILL)
            await run.proc.wait()
            tg.cancel_scope.cancel()
        assert await gone(marker), f"left running after kill -9 of dsh: {sleepers(marker)}"
