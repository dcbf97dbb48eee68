"""The warm start: a session with run_code starts its warm runtime (and its bash command server)
as a task of its own when it is created, so its first program finds them ready; a session
without run_code starts nothing; disposing the session ends all of it, even mid-start.

Each test with processes runs on every sandbox mechanism this machine has.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_code_mode import WarmStart
from dsh_code_mode.warm import WarmSlot
from dsh_sandbox_tools.server import SessionServers
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism
from test_warm import _ours, _processes

from conftest import run
from dsh_core.contracts import AgentSpec
from dsh_core.types import TextBlock, ToolResultEvent, UserMessage
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio

PLUGINS = ("scripted-model", "sandbox-tools", "attachment-store", "code-mode")


def _script(tmp_path: Path, steps: list[dict[str, Any]]) -> Path:
    import json

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": steps}))
    return script


def _config(mode: str, mechanism: str | None = None) -> dict[str, Any]:
    return {"code-mode": {"mode": mode}, "sandbox-tools": {"mechanism": mechanism} if mechanism else {}}


async def _until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await anyio.sleep(0.02)


def _names(workspace: Path) -> list[str]:
    out = []
    for pid in _processes(_ours(workspace)):
        with contextlib.suppress(OSError):
            out.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return sorted(out)


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_new_session_starts_its_warm_runtime_before_its_first_program(tmp_path, workspace, mechanism):
    require_mechanism(mechanism)
    script = _script(tmp_path, [run('r = await tools.bash(command="echo hi", description="say hi")\n'
                                    'return r["output"]'), {"text": "done"}])
    async with memory_host(script, plugins=PLUGINS, config=_config("code", mechanism)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
        slot = agent.state(WarmSlot)
        # No prompt yet: the warm process and a run made ready come on their own, and the
        # command server the program's bash calls go through.
        await _until(lambda: _names(workspace) == ["dsh-code-ready", "dsh-code-reaper", "dsh-code-warm"],
                     "the warm process and a ready run")
        await _until(lambda: bool(agent.state(SessionServers).keys), "the session's command server")
        assert slot.starts == 1 and slot.spare is not None
        warm_pid = slot.process.proc.pid
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(30):
            await agent.wait_idle()
        results = [e for e in host.session_store.logs[agent.session_id].events if isinstance(e, ToolResultEvent)]
        assert [r.result.content[0].text for r in results] == ["hi\n"]
        assert slot.starts == 1 and slot.process.proc.pid == warm_pid  # the first run used what was started ahead
        assert len(agent.state(SessionServers).keys) == 1  # and the bash call the server started ahead
        # the session's task made the next run ready meanwhile
        await _until(lambda: slot.spare is not None, "the next run made ready")
        await agent.dispose()
        assert not _processes(_ours(workspace))


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_run_made_ready_waits_as_a_batch_process(tmp_path, workspace, mechanism):
    """The program process runs SCHED_BATCH (the host's messages wake it without it taking the
    host's CPU mid-way); the warm process and the reaper keep the default policy."""
    import os

    require_mechanism(mechanism)
    script = _script(tmp_path, [{"text": "done"}])
    async with memory_host(script, plugins=PLUGINS, config=_config("code", mechanism)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
        await _until(lambda: "dsh-code-ready" in _names(workspace), "a run made ready")
        policies = {}
        for pid in _processes(_ours(workspace)):
            with contextlib.suppress(OSError):
                policies[Path(f"/proc/{pid}/comm").read_text().strip()] = os.sched_getscheduler(pid)
        assert policies == {"dsh-code-ready": os.SCHED_BATCH, "dsh-code-reaper": os.SCHED_OTHER,
                            "dsh-code-warm": os.SCHED_OTHER}
        await agent.dispose()


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_ready_run_is_woken_off_the_hosts_cpu_and_gets_its_whole_mask_back_on_go(tmp_path, workspace,
                                                                                          mechanism):
    """The program process says ``ready`` on its channel; the host learns its pid from the
    credentials the kernel attaches (under bubblewrap too: another pid namespace) and keeps it
    off the host's CPU until ``go``; the program then runs with every CPU it had."""
    import os

    require_mechanism(mechanism)
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("one CPU: there is no other CPU to keep a run on")
    host_cpu = min(allowed)
    script = _script(tmp_path, [run("import os\nreturn sorted(os.sched_getaffinity(0))"), {"text": "done"}])
    async with memory_host(script, plugins=PLUGINS, config=_config("code", mechanism)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
        slot = agent.state(WarmSlot)
        await _until(lambda: "dsh-code-ready" in _names(workspace), "a run made ready")
        [ready] = [pid for pid in _processes(_ours(workspace))
                   if Path(f"/proc/{pid}/comm").read_text().strip() == "dsh-code-ready"]
        assert slot.spare is not None
        await _until(lambda: _readable(slot.spare.channel), "its ready line")
        slot.spare.keep_off(host_cpu)
        assert os.sched_getaffinity(ready) == allowed - {host_cpu}
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(30):
            await agent.wait_idle()
        [result] = [e for e in host.session_store.logs[agent.session_id].events if isinstance(e, ToolResultEvent)]
        assert json.loads(result.result.content[0].text) == sorted(allowed)
        await agent.dispose()


def _readable(sock: Any) -> bool:
    import socket

    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


async def test_the_next_run_is_made_ready_once_the_run_has_ended_not_while_it_runs(tmp_path, workspace):
    """The session's task makes the next run ready after a run ends: while a program waits on a
    call, no other run is being made ready beside it (its forks and rehearsal would take CPU
    from the program and its calls); once the result is in, one is."""
    from dsh_core import FunctionTool, hookimpl

    entered, release = anyio.Event(), anyio.Event()

    class Gate:
        @hookimpl
        def dsh_register_tools(self, register):
            async def gate(args, ctx):
                entered.set()
                await release.wait()
                return "through"

            register(FunctionTool("gate", "Wait at the gate.", {"type": "object", "properties": {}}, gate))

    script = _script(tmp_path, [run('return (await tools.gate())'), {"text": "done"}])
    async with memory_host(script, Gate(), plugins=PLUGINS, config=_config("code")) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
        slot = agent.state(WarmSlot)
        await _until(lambda: slot.spare is not None, "a run made ready ahead")
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(30):
            await entered.wait()
        await anyio.sleep(0.5)  # time enough to have made one ready (a few milliseconds)
        assert slot.spare is None and "dsh-code-ready" not in _names(workspace)
        release.set()
        with anyio.fail_after(30):
            await agent.wait_idle()
        results = [e for e in host.session_store.logs[agent.session_id].events if isinstance(e, ToolResultEvent)]
        assert [r.result.content[0].text for r in results] == ["through"]
        await _until(lambda: slot.spare is not None, "the next run made ready after the result")
        await agent.dispose()
        assert not _processes(_ours(workspace))


async def test_a_session_disposed_while_its_warm_runtime_starts_leaves_nothing(tmp_path, workspace):
    script = _script(tmp_path, [{"text": "done"}])
    async with memory_host(script, plugins=PLUGINS, config=_config("code")) as host:
        for delay in (0.0, 0.03, 0.06, 0.1):  # before the start, and at points inside it
            agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
            await anyio.sleep(delay)
            with anyio.fail_after(30):
                await agent.dispose()
            assert not _processes(_ours(workspace)), f"left behind after a dispose {delay} s in"
            assert agent.state(WarmSlot).process is None


@pytest.mark.parametrize("mode", ["runtime", "no-code-mode"])
async def test_a_session_without_run_code_starts_nothing(tmp_path, workspace, mode):
    """Mode ``runtime`` (workflow's programs run in warm processes of their own) and a
    composition without code-mode: no warm start among the session's tasks, and after a turn
    and a wait no code process exists."""
    script = _script(tmp_path, [{"text": "done"}])
    plugins = PLUGINS if mode == "runtime" else PLUGINS[:-1]
    async with memory_host(script, plugins=plugins, config=_config("runtime") if mode == "runtime" else {}) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
        sources = host.pm.hook.dsh_session_tools(session=agent, host=host)
        assert not any(isinstance(s, WarmStart) for s in sources)
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(30):
            await agent.wait_idle()
        await anyio.sleep(0.5)
        assert not _processes(_ours(workspace))
        assert agent.state(WarmSlot).starts == 0
        await agent.dispose()


@pytest.mark.parametrize("confirmed", ["at once", "slowly"])
async def test_a_session_whose_mode_changed_gets_a_new_warm_process(tmp_path, workspace, monkeypatch, confirmed):
    """Started ahead in the session's mode; the mode changes before the first program: the
    program runs in a warm process confined the new way (read-only: it cannot write). The
    program went to the run made ahead before the host confirmed its confinement (it compiles
    meanwhile): even when that takes half a second, nothing of it runs there (it waits for go)."""
    if confirmed == "slowly":
        from dsh_code_mode.runtime import PythonRuntime

        where = PythonRuntime._where

        async def slow_where(self):
            await anyio.sleep(0.5)  # time enough for the run made ahead to run the program, were it to
            return await where(self)

        monkeypatch.setattr(PythonRuntime, "_where", slow_where)
    program = ('import os\n'
               'try:\n    os.makedirs("runs", exist_ok=True)\n    open("written.txt", "w").write("x")\n'
               '    return "written"\n'
               "except OSError as exc:\n    return type(exc).__name__\n")
    script = _script(tmp_path, [run(program), {"text": "done"}])
    async with memory_host(script, plugins=PLUGINS, config=_config("code")) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
        slot = agent.state(WarmSlot)
        await _until(lambda: slot.spare is not None, "a run made ready ahead")
        agent.configure(mode="read-only")
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(30):
            await agent.wait_idle()
        results = [e for e in host.session_store.logs[agent.session_id].events if isinstance(e, ToolResultEvent)]
        assert results[0].result.content[0].text in ("OSError", "PermissionError")
        assert not (workspace / "written.txt").exists() and not (workspace / "runs").exists()
        assert slot.starts == 2
        await agent.dispose()
        assert not _processes(_ours(workspace))
