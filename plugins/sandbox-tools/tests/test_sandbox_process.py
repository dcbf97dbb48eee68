"""Process groups, cancellation, timeouts, the scrubbed environment and bounded output."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import time
from itertools import pairwise
from pathlib import Path

import anyio
import pytest
from dsh_sandbox_tools.mechanisms import probe_cached
from dsh_sandbox_tools.policy import is_credential_name
from sandbox_helpers import Session, host_alive_with, mechanisms, running_host, text

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_cancel_kills_grandchildren(mechanism: str, root: Path) -> None:
    token = f"{1000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"
    async with running_host(mechanism=mechanism) as host:
        s = Session(host, root)
        result = []

        async def call() -> None:
            result.append(await s.call("bash", description="test command", command=f"(sleep {token}; echo late > late) & touch started; sleep {token}"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(10):
                while not (root / "started").exists() or len(host_alive_with(token)) < 2:
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        assert not result  # the call was cancelled, not completed
        deadline = time.monotonic() + 5
        while host_alive_with(token) and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        assert host_alive_with(token) == []


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_timeout_kills_group(mechanism: str, root: Path) -> None:
    token = f"77.{secrets.randbelow(10**6):06d}"
    async with running_host(mechanism=mechanism) as host:
        t0 = time.monotonic()
        out = await Session(host, root).call("bash", description="test command", command=f"echo before; sleep {token} & sleep {token}",
                                             timeoutMs=400)
        assert time.monotonic() - t0 < 5
    assert not out.is_error and text(out).startswith("before\n[timed out after 400ms]\n[killed by signal: SIG")
    assert out.structured is not None and out.structured["timed_out"] is True
    assert host_alive_with(token) == []


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_env_is_scrubbed(mechanism: str, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    secrets_env = {
        "DEEPSEEK_API_KEY": "sk-deepseek-1", "GITHUB_TOKEN": "ghp-secret-2", "AWS_SECRET_ACCESS_KEY": "aws-secret-3",
        "MY_SERVICE_PASSWORD": "pw-secret-4", "OPENAI_API_KEY": "sk-oa-5", "SOME_AUTH_HEADER": "Bearer-secret-6",
        "NPM_TOKEN": "npm-secret-7",
    }
    for k, v in secrets_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HARMLESS_SETTING", "kept")
    async with running_host(mechanism=mechanism) as host:
        out = await Session(host, root).call("bash", description="test command", command="env")
    env = text(out)
    for k, v in secrets_env.items():
        assert k not in env and v not in env
    assert "HARMLESS_SETTING=kept" in env and "PATH=" in env
    assert "DSH_SANDBOX=workspace-write" in env


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_env_undecodable_value_reaches_the_command(mechanism: str, monkeypatch: pytest.MonkeyPatch,
                                                        root: Path) -> None:
    """A variable whose bytes are not UTF-8 (a lone surrogate in ``os.environ``) still reaches the
    command byte for byte: the request to the command server falls back to escaped JSON for it."""
    monkeypatch.setenv("ODD_BYTES", "caf\udce9")  # b"caf\xe9" in the process environment
    async with running_host(mechanism=mechanism) as host:
        out = await Session(host, root).call("bash", description="test command",
                                             command='printf %s "$ODD_BYTES" | od -An -tx1')
    assert text(out).split()[:4] == ["63", "61", "66", "e9"]


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_env_changed_after_the_server_started_reaches_the_next_command(
        mechanism: str, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """A call whose environment is the command server's own sends none (the server uses its
    own); one made after the harness's environment changed carries it, and the command sees it."""
    monkeypatch.delenv("LATE_SETTING", raising=False)
    async with running_host(mechanism=mechanism) as host:
        session = Session(host, root)
        first = await session.call("bash", description="test command", command='echo "[$LATE_SETTING]"')
        monkeypatch.setenv("LATE_SETTING", "now")
        monkeypatch.setenv("LATE_API_KEY", "sk-late-secret")  # still scrubbed when sent
        second = await session.call("bash", description="test command", command='echo "[$LATE_SETTING]"; env')
        monkeypatch.delenv("LATE_SETTING")
        third = await session.call("bash", description="test command", command='echo "[$LATE_SETTING]"')
    assert text(first).startswith("[]")
    assert text(second).startswith("[now]") and "sk-late-secret" not in text(second)
    assert text(third).startswith("[]")


def test_credential_names() -> None:
    for name in ["DEEPSEEK_API_KEY", "ANTHROPIC_API_KEY", "GH_TOKEN", "X_SECRET", "DB_PASSWORD", "SSH_AUTH_SOCK",
                 "AWS_ACCESS_KEY_ID", "GOOGLE_APPLICATION_CREDENTIALS", "aws_session_token"]:
        assert is_credential_name(name), name
    for name in ["PATH", "HOME", "LANG", "TERM", "PYTHONPATH", "TMPDIR", "SHELL", "USER"]:
        assert not is_credential_name(name), name


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_spill_holds_full_output(mechanism: str, root: Path, tmp_path: Path) -> None:
    size = 5 * 1024 * 1024
    cmd = f"python3 -c \"import sys; sys.stdout.write(('0123456789abcde' + chr(10)) * {size // 16})\"; echo END"
    async with running_host(mechanism=mechanism) as host:
        s = Session(host, root)
        out = await s.call("bash", description="test command", command=cmd)
        sid = s.agent.session_id
    t = text(out)
    assert not out.is_error
    assert len(t.encode()) < 40_000
    assert t.startswith("0123456789abcde\n") and t.rstrip().endswith("END")
    spill = tmp_path / "dsh-home" / "spill" / sid / "c1.log"
    assert str(spill) in t and "bytes omitted" in t
    data = spill.read_bytes()
    assert len(data) == (size // 16) * 16 + 4
    assert data.endswith(b"END\n")


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_small_output_has_no_spill(mechanism: str, root: Path, tmp_path: Path) -> None:
    async with running_host(mechanism=mechanism, **{"max-output-bytes": 100}) as host:
        out = await Session(host, root).call("bash", description="test command", command="echo hello; exit 3")
    assert text(out) == "hello\n[exit code: 3]" and not out.is_error
    assert not (tmp_path / "dsh-home" / "spill").exists()


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_background_job_does_not_hold_the_call(mechanism: str, root: Path) -> None:
    async with running_host(mechanism=mechanism) as host:
        t0 = time.monotonic()
        out = await Session(host, root).call("bash", description="test command", command="sleep 30 & echo quick")
        assert time.monotonic() - t0 < 3
    assert "quick" in text(out)


def test_probe_reports_mechanisms() -> None:
    bw, ll = probe_cached("bwrap"), probe_cached("landlock")
    assert probe_cached("none").runner is None
    auto = probe_cached("auto")
    if shutil.which("bwrap") is None:  # a machine without bubblewrap says what to install
        assert bw.attempts == {"bwrap": "not installed (Debian package: bubblewrap)"}
    if bw.runner is not None:
        assert auto.runner is not None and auto.runner.name == "bwrap"
    elif ll.runner is not None:
        assert auto.runner is not None and auto.runner.name == "landlock"
    print("bwrap:", bw.summary(), "| landlock:", ll.summary(), "| cpu:", os.cpu_count())


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_a_sessions_command_server_ends_with_the_session(mechanism: str, root: Path) -> None:
    """The confined command server a session's bash calls run through is gone once the session is
    disposed (not left for the pool to evict later); another session's keeps serving."""
    from dsh_sandbox_tools.server import SERVER

    def servers(cwd: Path) -> list[int]:
        found = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    here = os.readlink(f"/proc/{pid}/cwd") == str(cwd)
                except OSError:
                    continue
                if here and SERVER.encode() in cmdline:
                    found.append(int(pid))
        return found

    other_root = root / "other"
    other_root.mkdir()
    async with running_host(mechanism=mechanism) as host:
        s, other = Session(host, root), Session(host, other_root)
        assert text(await s.call("bash", description="test command", command="echo one")).startswith("one")
        assert text(await other.call("bash", description="test command", command="echo two")).startswith("two")
        def ppid(pid: int) -> int:
            try:
                return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                return -1  # a finishing reaper, gone meanwhile

        # each session: a server, and the reapers it forks (the one made in advance, a finishing one)
        listed = servers(other_root)
        kept = [p for p in listed if ppid(p) not in (-1, *listed)]
        assert servers(root) and len(kept) == 1
        await s.agent.dispose()
        with anyio.fail_after(10):
            while servers(root):
                await anyio.sleep(0.02)
        assert kept[0] in servers(other_root)  # the other session's server is untouched
        assert text(await other.call("bash", description="test command", command="echo still")).startswith("still")


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_both_ways_of_running_a_command_show_every_chunk_to_a_tap(mechanism: str, root: Path, tmp_path: Path) -> None:
    from dsh_sandbox_tools.sandbox import sandbox_for

    async with running_host(mechanism=mechanism) as host:
        sb, s = sandbox_for(host), Session(host, root)
        for owner in (None, s.agent):  # a fresh confined process (one-shot), the session's command server
            seen = bytearray()
            result, _ = await sb.run_argv(["bash", "-c", "head -c 200000 /dev/zero | tr '\\0' y; echo E >&2"],
                                          mode=sb.mode_for(s.agent), cwd=str(root), owner=owner, split=True,
                                          spill=tmp_path / f"spill-{owner is None}", tap=seen.extend)
            assert result.exit_code == 0 and result.spill_path is not None  # bounded as before
            assert seen.count(b"y") == 200_000 and b"E\n" in seen  # stdout and stderr, whole


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_a_watched_bash_call_shows_its_growing_output_and_an_unwatched_one_gathers_none(
        mechanism: str, root: Path) -> None:
    command = "for i in 1 2 3; do echo tick$i; sleep 0.4; done"
    async with running_host(mechanism=mechanism) as host:
        s = Session(host, root)
        pieces: list[str] = []
        unwatch = s.agent.watch_progress(lambda agent, piece: pieces.append(piece.text))
        out = await s.call("bash", description="Tick three times", command=command)
        unwatch()
        await s.call("bash", description="Tick three times", command=command)
    assert text(out) == "tick1\ntick2\ntick3\n"
    assert len(pieces) >= 2 and pieces[0] == "tick1\n"  # the first output at once, then the tail as it grows
    assert all(b.startswith(a) and len(b) > len(a) for a, b in pairwise(pieces))
    assert len(pieces) <= 3  # one per change, never after the result; nothing for the unwatched call
    assert not any("tick" in repr(e) for e in s.events)  # progress records nothing durable


def _server_processes(cwd: Path) -> dict[int, int]:
    """pid -> parent pid of every Python process of the command server (the server and its
    reapers; not bubblewrap, whose command line names the server too) whose directory is ``cwd``."""
    from dsh_sandbox_tools.server import SERVER

    found = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if (os.readlink(f"/proc/{pid}/cwd") == str(cwd) and SERVER.encode() in cmdline
                        and os.path.basename(cmdline[0]).startswith(b"python")):
                    found[int(pid)] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return found


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_reapers_serve_call_after_call_without_leaking_and_a_long_call_holds_no_other(
        mechanism: str, root: Path) -> None:
    """A session's reapers are reused (no fork per call), keep no descriptor of a finished call,
    stay few, are replaced when killed, and a call that runs long does not hold up the next:
    another reaper takes it."""
    from dsh_core.reaping import SPARE_REAPERS

    def reapers() -> dict[int, int]:  # reaper pid -> open descriptors
        procs = _server_processes(root)
        out = {}
        for pid, parent in procs.items():
            if parent in procs:
                with contextlib.suppress(OSError):
                    out[pid] = len(os.listdir(f"/proc/{pid}/fd"))
        return out

    async with running_host(mechanism=mechanism) as host:
        s = Session(host, root)
        for i in range(3):
            assert text(await s.call("bash", description="test command", command=f"echo {i}")).startswith(str(i))
        before = reapers()
        for i in range(20):
            assert text(await s.call("bash", description="test command", command=f"echo {i} >&2")) == f"[stderr]\n{i}\n"
        after = reapers()
        assert 1 <= len(after) <= SPARE_REAPERS
        assert set(after) & set(before), (before, after)  # the same processes served the 20 calls
        assert {p: after[p] for p in set(after) & set(before)} == {p: before[p] for p in set(after) & set(before)}

        for pid in after:  # reapers killed while they wait: the server forks another
            os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(10):  # (a call sent while one is dying may be taken down with it)
            while set(after) & set(reapers()):
                await anyio.sleep(0.01)
            assert text(await s.call("bash", description="test command", command="echo again")) == "again\n"

        token = f"3.{secrets.randbelow(10**6):06d}"
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: s.call("bash", description="test command", command=f"sleep {token}"))
            with anyio.fail_after(10):
                while not host_alive_with(token):
                    await anyio.sleep(0.02)
            t0 = time.monotonic()
            assert text(await s.call("bash", description="test command", command="echo meanwhile")) == "meanwhile\n"
            assert time.monotonic() - t0 < 2.5  # not after the sleep
            tg.cancel_scope.cancel()
        assert len(reapers()) <= SPARE_REAPERS + 1  # one more may be finishing its cancelled call


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_a_servers_calls_reuse_their_readiness_sets_and_leave_no_descriptor_open(
        mechanism: str, root: Path) -> None:
    """A command server keeps the readiness set of an ended call (an epoll set registered with the
    event loop) for its next call, at most ``SPARE_READINESS`` of them: call after call, and calls
    at once, open no more descriptors in this process, and the server's end closes the sets."""
    from dsh_sandbox_tools.sandbox import sandbox_for
    from dsh_sandbox_tools.server import SPARE_READINESS

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    async with running_host(mechanism=mechanism) as host:
        s = Session(host, root)

        async def two_at_once() -> None:
            async with anyio.create_task_group() as tg:
                for i in range(2):
                    tg.start_soon(lambda i=i: s.call("bash", description="test command", command=f"sleep 0.1; echo {i}"))

        await two_at_once()
        assert text(await s.call("bash", description="test command", command="echo 1")) == "1\n"
        (server, _), = sandbox_for(host).servers._servers.values()
        spare = list(server._spare)
        assert len(spare) == 2 and all(r._set is not None and not r.fds for r in spare)
        before = fds()
        for i in range(10):
            assert text(await s.call("bash", description="test command", command=f"echo {i} >&2")) == f"[stderr]\n{i}\n"
        await two_at_once()
        assert fds() == before
        assert sorted(map(id, server._spare)) == sorted(map(id, spare))  # the same sets, nothing more
        assert len(server._spare) <= SPARE_READINESS
    assert server._spare == [] and all(r._set is None for r in spare)  # closed with the server
