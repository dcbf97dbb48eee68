"""A run's end is final: once its result is returned nothing of the program runs any more.

The result no longer waits for the run's teardown (the reaper's report, the cgroup's removal):
where the run has a cgroup, the host kills every process in it and waits only until it is
empty. These tests hold a hostile program to that in the real sandbox, on both mechanisms: a
thread and a forked daemon of its own keep writing files, and the daemon keeps calling a tool
over the program's channel, after its ``return``. At the moment the result event is emitted
none of them may change anything any more; and what the program printed before it returned
(from a thread too) is in the result, as before.
"""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import anyio
import pytest
from dsh_code_mode.limits import PIDS_V1, ProcessBound
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from conftest import run
from dsh_core.types import ToolResultEvent

pytestmark = pytest.mark.anyio

PROGRAM = '''
import json, os, sys, threading, time

CHANNEL = int(sys.argv[1])

def keep_writing(path):
    n = 0
    while True:
        n += 1
        with open(path, "a") as f:
            f.write(f"{n}\\n")

def said_by_a_thread():
    print("printed by a thread")

t = threading.Thread(target=said_by_a_thread)
t.start()
t.join()
threading.Thread(target=keep_writing, args=("by-thread.txt",), daemon=True).start()
if os.fork() == 0:  # a daemon: a session of its own, no output pipe; it writes a file and calls a tool
    os.setsid()
    null = os.open("/dev/null", os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    if os.fork() == 0:
        n = 1000
        while True:
            n += 1
            line = {"t": "call", "id": n, "name": "write", "args": {"file_path": f"by-tool-{n}.txt", "content": "x"}}
            try:
                os.write(CHANNEL, json.dumps(line).encode() + b"\\n")
            except OSError:
                pass
            time.sleep(0.002)
    keep_writing("by-daemon.txt")
while not all(os.path.exists(p) for p in ("by-thread.txt", "by-daemon.txt")):
    time.sleep(0.001)
time.sleep(0.05)  # everything is under way
print("printed just before return")
return "returned"
'''


def _state(workspace: Path) -> dict[str, int]:
    """What the program's leftovers changed: the size of each file they write, and how many the tool made."""
    sizes = {name: (workspace / name).stat().st_size for name in ("by-thread.txt", "by-daemon.txt")}
    return {**sizes, "tool files": len(list(workspace.glob("by-tool-*.txt")))}


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_nothing_of_a_run_runs_once_its_result_is_returned(code_host, workspace, mechanism):
    require_mechanism(mechanism)
    seen: list[dict[str, int]] = []

    def observe(agent, event) -> None:  # synchronously, as the result is emitted
        if isinstance(event, ToolResultEvent):
            seen.append(_state(workspace))

    with anyio.fail_after(60):
        async with code_host([run(textwrap.dedent(PROGRAM)), {"text": "{tool_result}"}],
                             sandbox={"mechanism": mechanism}) as turn:
            unsubscribe = turn.agent.subscribe(observe)
            await turn.agent.wait_idle()
            unsubscribe()
            await anyio.sleep(0.3)  # the session still lives: its teardown of the run may still run
            later = _state(workspace)
    (result,) = turn.of(ToolResultEvent)
    text = result.result.content[0].text
    assert not result.result.is_error, text
    assert text.split("\n") == ["printed by a thread", "printed just before return", "returned"]
    (at_result,) = seen
    assert at_result["by-thread.txt"] > 0 and at_result["by-daemon.txt"] > 0  # they did run
    assert later == at_result  # and nothing of them ran after the result
    assert _state(workspace) == at_result  # nor after the session ended


def _pids_cgroup() -> ProcessBound:
    bound = ProcessBound.create(8)
    if bound.kind != "pids-cgroup":
        bound.close()
        pytest.skip("not root, or no writable pids cgroup hierarchy: runs have no cgroup to kill through (see README)")
    return bound


def test_the_cgroup_kill_signals_its_members_and_nothing_else():
    """``kill_members`` signals a pid only while it is in the run's cgroup (a pid listed, then
    freed and reused by another process, is left alone), and its pidfd says when it is gone."""
    import select
    import subprocess

    bound = _pids_cgroup()
    member = subprocess.Popen(["sleep", "30"])
    outsider = subprocess.Popen(["sleep", "30"])
    try:
        (bound.cgroup / "cgroup.procs").write_text(str(member.pid))
        assert bound.members() == [member.pid]
        fds = bound.kill_members([outsider.pid, member.pid])  # the outsider is listed as a stale pid would be
        try:
            assert len(fds) == 1
            assert select.select(fds, [], [], 5)[0] == fds  # readable: the member has exited
        finally:
            for fd in fds:
                os.close(fd)
        assert member.wait(5) == -signal.SIGKILL
        assert outsider.poll() is None  # never signalled
        assert bound.members() == []
    finally:
        for p in (member, outsider):
            p.kill()
            p.wait()
        bound.close()


def test_settled_says_whether_anything_of_the_run_can_still_run():
    """``settled`` (what a run's end waits for): False while a thread in the cgroup is live, True
    once every one is gone or inside its exit; None without a cgroup. A name that holds ``) ``
    (the separator /proc/PID/stat is read by) does not fool it."""
    import subprocess
    import sys

    assert ProcessBound("none").settled() is None
    bound = _pids_cgroup()
    assert bound.settled() is True  # empty
    # a process named to look like the end of its stat's name field, with a second thread
    code = ("import ctypes, threading, time; ctypes.CDLL(None).prctl(15, b'x) R 1 2 3', 0, 0, 0); "
            "threading.Thread(target=time.sleep, args=(30,)).start(); print('ok', flush=True); time.sleep(30)")
    member = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        (bound.cgroup / "cgroup.procs").write_text(str(member.pid))
        assert member.stdout is not None and member.stdout.readline() == b"ok\n"
        assert len((bound.cgroup / "tasks").read_text().split()) == 2
        assert bound.settled() is False
        member.kill()
        member.wait()
        assert bound.settled() is True
    finally:
        member.kill()
        member.wait()
        bound.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_runs_cgroup_is_removed_off_the_event_loop(code_host, workspace, mechanism, monkeypatch):
    """A cgroup's rmdir waits for the kernel's cgroup lock (held through an RCU grace period by
    anything moving a process between cgroups meanwhile): 1-10 ms measured. It happens in a worker thread, never
    in the event loop, where it stalled every session of the process; two runs in a row (the
    second's spare is made ready while the first is torn down) all end with no cgroup left."""
    import threading
    from pathlib import Path as _Path

    require_mechanism(mechanism)
    _pids_cgroup().close()  # skips where runs have no cgroup
    loop_thread = threading.get_ident()
    removed: list[tuple[str, bool]] = []
    rmdir = _Path.rmdir

    def recording_rmdir(self: _Path) -> None:
        if self.name.startswith("dsh-code-"):
            removed.append((self.name, threading.get_ident() == loop_thread))
        rmdir(self)

    monkeypatch.setattr(_Path, "rmdir", recording_rmdir)
    with anyio.fail_after(60):
        async with code_host([run("return 1"), run("return 2"), {"text": "done"}],
                             sandbox={"mechanism": mechanism}) as turn:
            await turn.agent.wait_idle()
            results = [r.result.content[0].text for r in turn.of(ToolResultEvent)]
            assert results == ["1", "2"]
            await turn.agent.dispose()  # the session's teardowns and its spare run end with it
    assert len({name for name, _ in removed}) >= 2, removed  # both runs' cgroups (and the spare's)
    assert not [name for name, in_loop in removed if in_loop], removed
    assert not list(PIDS_V1.glob(f"dsh-code-{os.getpid()}-*"))


@pytest.mark.parametrize("size", [0, 100, 1 << 16, (1 << 16) + 1, 3 << 16])
def test_a_kernel_file_is_read_whole_whatever_its_size(tmp_path, size):
    """``limits._read`` stops at the first read that does not fill its buffer (kernel files fill
    it as far as they go): a file of exactly one buffer, or of several, still comes whole."""
    from dsh_code_mode.limits import _read

    data = bytes(i % 251 for i in range(size))
    (tmp_path / "f").write_bytes(data)
    assert _read(str(tmp_path / "f")) == data
