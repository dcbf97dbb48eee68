"""The warm runtime: one confined process per session, a fresh fork per run, nothing carried over.

Each test runs on every sandbox mechanism this machine has (bubblewrap, Landlock alone).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_code_mode._warm import SCOPE_ABI, landlock_abi
from dsh_code_mode.runtime import PythonRuntime
from dsh_code_mode.warm import WarmSlot
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from conftest import run
from dsh_core.state import StateSlots
from dsh_core.types import ToolResultEvent
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio


def _results(turn: Any) -> list[Any]:
    out = []
    for event in turn.of(ToolResultEvent):
        text = event.result.content[0].text
        assert not event.result.is_error, text
        out.append(json.loads(text))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _processes(pred) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if _alive(int(entry)) and pred(cmdline, comm, cwd):
                found.append(int(entry))
    return found


async def _gone(pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while left := _processes(pred):
        assert time.monotonic() < deadline, f"still alive: {left}"
        await anyio.sleep(0.02)


async def _settled(workspace: Path, names: list[str], timeout: float = 10.0) -> None:
    """Wait until the session's processes are exactly ``names`` (the next run is made ready
    concurrently: until its program process has named itself it is one more reaper)."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for pid in _processes(_ours(workspace)):
            with contextlib.suppress(OSError):
                found.append(Path(f"/proc/{pid}/comm").read_text().strip())
        if sorted(found) == names:
            return
        assert time.monotonic() < deadline, f"processes: {sorted(found)}, expected {names}"
        await anyio.sleep(0.02)


FIRST = '''
import json, os, subprocess, sys, threading, time
json.left_behind = "run 1"                             # module state
os.environ["DSH_LEFT_BEHIND"] = "run 1"                # environment
sys.modules["left_behind"] = type(sys)("left_behind")  # an imported module
leaked = open("leaked.txt", "w")                       # a descriptor never closed
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()      # a thread
subprocess.Popen(["sleep", "{marker}"], start_new_session=True)            # a daemon in its own session
return {{"pid": os.getpid(), "reaper": os.getppid(), "threads": threading.active_count()}}
'''

SECOND = '''
import json, os, sys, threading
fds = {{}}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[name] = os.readlink(f"/proc/self/fd/{{name}}")
    except OSError:
        pass  # the listing's own descriptor, closed by now
return {{"pid": os.getpid(), "reaper": os.getppid(), "threads": threading.active_count(),
        "json": hasattr(json, "left_behind"), "env": os.environ.get("DSH_LEFT_BEHIND"),
        "module": "left_behind" in sys.modules, "fds": sorted(fds.values()), "argv": sys.argv[1:]}}
'''


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_runs_share_the_warm_process_and_nothing_else(code_host, workspace, mechanism):
    """Two programs of one session: both forks of one warm process (started once); what the
    first leaves behind — module state, environment, an open file, a thread, a daemon in its own
    session — is gone before its result comes back, and the second sees none of it."""
    require_mechanism(mechanism)
    marker = f"{os.getpid() % 1000}.{secrets.randbelow(10**6)}"
    steps = [run(FIRST.format(marker=marker)), run(SECOND.format()), {"text": "done"}]
    async with code_host(steps, sandbox={"mechanism": mechanism}) as turn:
        await turn.agent.wait_idle()
        slot = turn.agent.state(WarmSlot)
        assert slot.starts == 1  # one warm process served both runs
        warm = slot.process
        assert warm is not None and _alive(warm.proc.pid)
    first, second = _results(turn)
    assert first["threads"] == 2
    assert second["pid"] != first["pid"] and second["reaper"] != first["reaper"]
    assert (second["json"], second["env"], second["module"], second["threads"]) == (False, None, False, 1)
    # stdin /dev/null, stdout and stderr the output pipe, the channel: nothing of the first run
    assert [f for f in second["fds"] if not f.startswith("/proc/")] == ["/dev/null", *sorted(
        f for f in second["fds"] if f.startswith(("pipe:", "socket:")))]
    assert len([f for f in second["fds"] if f.startswith("pipe:")]) == 2
    assert len([f for f in second["fds"] if f.startswith("socket:")]) == 1
    assert not any("leaked.txt" in f for f in second["fds"])
    assert len(second["argv"]) == 1  # the channel's number, as a one-off program process had it
    assert not _processes(lambda cmd, comm, cwd: cmd[:2] == [b"sleep", marker.encode()])


PROBE = '''
import ctypes, os, signal
def parent(pid):
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return 0  # gone, or pid 0
reaper = os.getppid()
warm = parent(reaper)
libc = ctypes.CDLL(None, use_errno=True)
out = {"names": [open(f"/proc/{p}/comm").read().strip() for p in (warm, reaper)]}
import time
for _ in range(200):  # it is made ready while this run starts: give it a moment
    ready = [int(p) for p in os.listdir("/proc") if p.isdigit() and p != str(os.getpid())
             and parent(parent(int(p))) == warm]
    if ready:
        break
    time.sleep(0.01)
# the session's next run, made ready beside this one (its reaper is a child of the warm process)
out["ready"] = len(ready)
for name, target in (("warm", warm), ("reaper", reaper), *(("ready", p) for p in ready)):
    if libc.ptrace(16, target, 0, 0) == 0:  # PTRACE_ATTACH
        out[name + "-ptrace"] = "done"
    else:
        out[name + "-ptrace"] = os.strerror(ctypes.get_errno())
    try:
        with open(f"/proc/{target}/mem", "rb") as f:
            f.read(1)
        out[name + "-mem"] = "done"
    except OSError as exc:
        out[name + "-mem"] = type(exc).__name__
    try:
        os.kill(target, signal.SIGKILL)
        out[name + "-kill"] = "done"
    except OSError as exc:
        out[name + "-kill"] = type(exc).__name__
return out
'''


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_program_cannot_reach_the_warm_process_or_its_reaper(code_host, mechanism):
    """A program cannot trace or read the memory of the warm process it was forked from, of its
    reaper, or of the session's next run already made ready, so it cannot leave anything for the
    next run; with Landlock signal scoping (ABI 6+) it cannot kill them either, and the session
    keeps its warm process."""
    require_mechanism(mechanism)
    steps = [run(PROBE), run('return {"after": "still serving"}'), {"text": "done"}]
    async with code_host(steps, sandbox={"mechanism": mechanism}) as turn:
        await turn.agent.wait_idle()
        starts = turn.agent.state(WarmSlot).starts
    probe, after = _results(turn)
    assert probe["names"] == ["dsh-code-warm", "dsh-code-reaper"]
    assert probe["ready"] == 1
    targets = ["warm", "reaper", "ready"]
    for target in targets:
        assert probe[f"{target}-ptrace"] == "Operation not permitted", probe
        assert probe[f"{target}-mem"] == "PermissionError", probe
    assert after == {"after": "still serving"}
    if landlock_abi() >= SCOPE_ABI:
        assert all(probe[f"{t}-kill"] == "PermissionError" for t in targets), probe
        assert starts == 1
    else:  # pragma: no cover - older kernels: a killed warm process is replaced, the session goes on
        assert starts in (1, 2)


class _Session:
    """What PythonRuntime needs of a session: its state slots."""

    def __init__(self) -> None:
        self.slots = StateSlots()

    def state(self, cls: type, factory: Any = None) -> Any:
        return self.slots.get(cls, factory)


class _NoTools:
    names: tuple[str, ...] = ()

    def call(self, name: str, args: dict[str, Any], arguments: str | None = None) -> Any:  # pragma: no cover
        raise AssertionError("the program makes no calls")


def _ours(workspace: Path):
    return lambda cmd, comm, cwd: comm.startswith("dsh-code-") and cwd == str(workspace)


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_killed_warm_process_is_replaced_and_everything_dies_with_the_session(workspace, mechanism):
    require_mechanism(mechanism)
    async with memory_host("unused.json", plugins=("sandbox-tools",),
                           config={"sandbox-tools": {"mechanism": mechanism}}) as host:
        session = _Session()
        runtime = PythonRuntime(host, str(workspace), session=session)
        with anyio.fail_after(30):
            first = await runtime.run("import os\nreturn os.getpid()", _NoTools(), anyio.Event())
            slot = session.state(WarmSlot)
            assert first.error is None and slot.starts == 1 and slot.spare is not None
            await _settled(workspace, ["dsh-code-ready", "dsh-code-reaper", "dsh-code-warm"])  # the next run, made ready
            assert slot.process is not None
            os.killpg(slot.process.proc.pid, signal.SIGKILL)  # the warm process (and under bwrap its namespace)
            # The ready run's reaper dies with it (its process group; under bwrap the namespace,
            # torn down a little later): once it is gone the next run sees the ready run is dead.
            # A run taken in the instant between (the reaper still up) would fail as worker-exit.
            await _gone(lambda cmd, comm, cwd: comm in ("dsh-code-warm", "dsh-code-reaper") and cwd == str(workspace))
            second = await runtime.run("return 2", _NoTools(), anyio.Event())
            assert second.error is None and second.value == 2
            assert slot.starts == 2  # started again, once
            third = await runtime.run("return 3", _NoTools(), anyio.Event())
            assert third.value == 3 and slot.starts == 2
            assert _processes(_ours(workspace))
            await session.slots.aclose()  # what disposing the session does
            assert not _processes(_ours(workspace))  # the warm process, the ready run: all gone at once


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_run_of_another_mode_is_not_cut_short_by_the_last_runs_refill(workspace, mechanism):
    """A run ends (the session's task is asked to make the next one ready where it ran) and one
    in another mode starts at once (a session that changed its mode): that run replaces the warm
    process, and the ask left from the run before must not replace it back under the running
    program (its reaper dies with the warm process it came from: worker-exit, status None)."""
    require_mechanism(mechanism)
    async with memory_host("unused.json", plugins=("sandbox-tools",),
                           config={"sandbox-tools": {"mechanism": mechanism}}) as host:
        session = _Session()
        wide = PythonRuntime(host, str(workspace), session=session)
        narrow = PythonRuntime(host, str(workspace), session=session, mode="read-only")
        async with anyio.create_task_group() as tg:
            tg.start_soon(wide.keep_ready)
            with anyio.fail_after(60):
                await _until_spare(session)
                first = await wide.run("return 1", _NoTools(), anyio.Event())
                second = await narrow.run("import time\ntime.sleep(0.5)\nreturn 2", _NoTools(), anyio.Event())
            assert (first.error, first.value) == (None, 1)
            assert (second.error, second.value) == (None, 2)
            tg.cancel_scope.cancel()
        await session.slots.aclose()
        assert not _processes(_ours(workspace))


async def test_a_program_offered_to_a_run_it_never_took_is_never_run(workspace, monkeypatch):
    """A run sends its program to the run made ready, then fails before taking it (its
    confinement could not be confirmed): the next run never gets that run made ready, which
    would run the first program on the next one's go."""
    from dsh_core.errors import ToolError

    async with memory_host("unused.json", plugins=("sandbox-tools",)) as host:
        session = _Session()
        runtime = PythonRuntime(host, str(workspace), session=session)
        with anyio.fail_after(30):
            assert (await runtime.run("return 0", _NoTools(), anyio.Event())).value == 0
            await _until_spare(session)
            where = PythonRuntime._where

            async def failing(self):
                monkeypatch.setattr(PythonRuntime, "_where", where)
                raise ToolError("confinement unavailable", code="SANDBOX_UNAVAILABLE")

            monkeypatch.setattr(PythonRuntime, "_where", failing)
            with pytest.raises(ToolError):
                await runtime.run('return "first"', _NoTools(), anyio.Event())
            second = await runtime.run('return "second"', _NoTools(), anyio.Event())
        assert (second.error, second.value) == (None, "second")
        await session.slots.aclose()
        assert not _processes(_ours(workspace))


async def _until_spare(session: _Session) -> None:
    while session.state(WarmSlot).spare is None:
        await anyio.sleep(0.02)


async def test_a_runtime_without_a_session_starts_and_ends_its_own(workspace):
    async with memory_host("unused.json", plugins=("sandbox-tools",)) as host:
        runtime = PythonRuntime(host, str(workspace))
        with anyio.fail_after(30):
            result = await runtime.run('return "alone"', _NoTools(), anyio.Event())
        assert result.value == "alone"
        assert not _processes(_ours(workspace))


async def test_disposing_the_session_ends_its_warm_runtime(code_host, workspace):
    async with code_host([run("return 1"), {"text": "done"}]) as turn:
        await turn.agent.wait_idle()
        assert _processes(_ours(workspace))
        await turn.agent.dispose()
        assert not _processes(_ours(workspace))


async def test_a_new_permission_mode_gets_a_new_warm_process(workspace):
    """The warm process is confined once: when the session's confinement changes, the next run
    gets a new one confined the new way (here: read-only, so the program cannot write), and the
    run made ready under the old one is dropped unused."""
    from dsh_sandbox_tools.sandbox import sandbox_for

    program = textwrap.dedent('''
        try:
            open("written.txt", "w").write("x")
            return "written"
        except OSError as exc:
            return type(exc).__name__
    ''')
    async with memory_host("unused.json", plugins=("sandbox-tools",)) as host:
        session = _Session()
        runtime = PythonRuntime(host, str(workspace), session=session)
        with anyio.fail_after(30):
            first = await runtime.run(program, _NoTools(), anyio.Event())
            (workspace / "written.txt").unlink()
            sandbox_for(host).settings.mode = "read-only"
            second = await runtime.run(program, _NoTools(), anyio.Event())
        assert first.value == "written"
        assert second.value in ("OSError", "PermissionError")  # EROFS under bubblewrap, EACCES under Landlock
        assert not (workspace / "written.txt").exists()
        assert session.state(WarmSlot).starts == 2
        await session.slots.aclose()


class _Echo:
    names: tuple[str, ...] = ("echo",)

    def call(self, name: str, args: dict[str, Any], arguments: str | None = None) -> Any:
        async def answer() -> Any:
            return args

        return answer()


async def _host_cpu_of_a_run(workspace: Path, program: str) -> tuple[Any, float]:
    """``program``'s result and the CPU the host's thread used while it ran: a session's second
    run (the warm process started and this run made ready first, off the measurement)."""
    async with memory_host("unused.json", plugins=("sandbox-tools",)) as host:
        session = _Session()
        runtime = PythonRuntime(host, str(workspace), session=session)
        try:
            with anyio.fail_after(30):
                assert (await runtime.run("return 0", _NoTools())).value == 0
                await _settled(workspace, ["dsh-code-ready", "dsh-code-reaper", "dsh-code-warm"])
                cpu = time.thread_time()
                result = await runtime.run(program, _Echo())
                return result, time.thread_time() - cpu
        finally:
            await session.slots.aclose()


@pytest.mark.parametrize("program", [
    "import time\ntime.sleep(0.4)\nreturn (await tools.echo(n=1))['n']",  # quiet before its first call
    "n = (await tools.echo(n=1))['n']\nimport time\ntime.sleep(0.4)\nreturn n",  # quiet after its last answer
])
async def test_the_host_keeps_its_loop_turning_only_briefly_while_a_program_is_quiet(workspace, program):
    """While the program's next message is due the host keeps its event loop turning (``SPIN_S``,
    0.5 ms), then blocks: a program quiet for 0.4 s costs the host's thread far less CPU than
    that (it would cost all of it if the turning did not stop)."""
    from dsh_code_mode.runtime import SPIN_S

    assert SPIN_S < 0.01
    result, cpu = await _host_cpu_of_a_run(workspace, program)
    assert result.error is None and result.value == 1
    assert cpu < 0.1, f"the host's thread used {cpu * 1000:.0f} ms of CPU during a run quiet for 400 ms"


async def test_a_program_slow_between_its_calls_costs_the_host_one_spin_not_one_per_call(workspace, monkeypatch):
    """After each call a program waits 50 ms: the host keeps its loop turning for the next
    message once (``SPIN_S``, made 20 ms here to tell one from nine), finds it did in vain, and
    blocks after that."""
    import dsh_code_mode.runtime as runtime_module

    monkeypatch.setattr(runtime_module, "SPIN_S", 0.02)
    result, cpu = await _host_cpu_of_a_run(workspace, "import time\nn = 0\nfor i in range(9):\n"
                                                      "    n += (await tools.echo(n=1))['n']\n"
                                                      "    time.sleep(0.05)\nreturn n")
    assert result.error is None and result.value == 9
    # one turning of 20 ms after a call (and one for the first message) and the calls: well under nine
    assert cpu < 0.1, f"the host's thread used {cpu * 1000:.0f} ms of CPU: it kept turning after each call"
