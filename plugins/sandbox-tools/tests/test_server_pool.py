"""The command-server pool's bound (``ServerPool``): it limits what idle sessions hold, never the
working set. Found by the 64-session load (tests/reliability/test_load.py, bench/load.py): with
more sessions making bash calls at once than the limit, each session's server was closed as
least recently used between two of its calls, and nearly every call started a fresh confined
server (the load ran about three times slower)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from dsh_sandbox_tools.server import IDLE_KEEP_S, ServerPool
from sandbox_helpers import Session as HostSession
from sandbox_helpers import mechanisms, running_host, text

pytestmark = pytest.mark.anyio


class FakeServer:
    """What the pool looks at: start, aclose, active, closed, last_used."""

    def __init__(self) -> None:
        self.active = 0
        self.closed = False
        self.started = False
        self.last_used = time.monotonic()

    async def start(self) -> None:
        self.started = True

    async def aclose(self) -> None:
        self.closed = True


class Session:
    disposed = False


async def _get(pool: ServerPool, key: str, owner: Any) -> Any:
    return await pool.get(key, owner, FakeServer)


async def test_servers_of_live_sessions_in_use_are_kept_beyond_the_limit() -> None:
    pool = ServerPool(limit=2)
    owners = [Session() for _ in range(5)]
    servers = [await _get(pool, f"s{i}", o) for i, o in enumerate(owners)]
    # five live sessions, each server used just now and idle between calls: none is closed
    assert len(pool) == 5 and not any(s.closed for s in servers)
    # their next calls reuse them: no fresh server
    assert [await _get(pool, f"s{i}", o) for i, o in enumerate(owners)] == servers


async def test_idle_servers_beyond_the_limit_close_finished_sessions_first_then_least_recently_used() -> None:
    pool = ServerPool(limit=2)
    owners = [Session() for _ in range(4)]
    servers = [await _get(pool, f"s{i}", o) for i, o in enumerate(owners)]
    long_ago = time.monotonic() - IDLE_KEEP_S - 1
    for s in servers[:3]:
        s.last_used = long_ago  # s0, s1, s2 idle for longer than the grace; s3 in use
    owners[2].disposed = True  # s2's session finished
    await _get(pool, "s4", Session())  # a fifth server: the pool is over its limit by three
    assert [s.closed for s in servers] == [True, True, True, False]
    assert len(pool) == 2  # s3 and s4


async def test_a_finished_sessions_server_goes_even_if_it_ran_a_moment_ago() -> None:
    pool = ServerPool(limit=1)
    done, live = Session(), Session()
    first = await _get(pool, "done", done)
    done.disposed = True
    second = await _get(pool, "live", live)
    assert first.closed and not second.closed and len(pool) == 1


async def test_a_server_running_a_call_is_never_closed() -> None:
    pool = ServerPool(limit=1)
    busy = await _get(pool, "busy", Session())
    busy.active, busy.last_used = 1, time.monotonic() - IDLE_KEEP_S - 1
    await _get(pool, "other", Session())
    assert not busy.closed


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_sessions_calling_bash_in_turn_beyond_the_limit_keep_their_servers(mechanism: str, root: Path) -> None:
    """The real thing: three sessions over a pool bounded to one server take turns making bash
    calls; each session's confined server is the same process on its second call."""
    from dsh_sandbox_tools.server import SERVER

    def server_of(cwd: Path) -> int:
        pids = {}
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    here = os.readlink(f"/proc/{pid}/cwd") == str(cwd)
                    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if here and SERVER.encode() in cmdline:
                    pids[int(pid)] = ppid
        (top,) = [p for p, pp in pids.items() if pp not in pids]  # the server, not the reapers it forks
        return top

    roots = [root / f"s{i}" for i in range(3)]
    async with running_host(mechanism=mechanism) as host:
        host.tools["bash"].sb.servers.limit = 1
        sessions = []
        for r in roots:
            r.mkdir()
            sessions.append(HostSession(host, r))
        first = []
        for s, r in zip(sessions, roots, strict=True):
            assert text(await s.call("bash", description="test command", command="echo one")).startswith("one")
            first.append(server_of(r))
        for s in sessions:
            assert text(await s.call("bash", description="test command", command="echo two")).startswith("two")
        assert [server_of(r) for r in roots] == first
