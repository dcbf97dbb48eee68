"""A language server is never less confined than a ``bash`` call of its session: the confinement
tests bash has, run against a real server process (tests/fixture_server.py reports, from inside,
what it could do) once per mechanism: no write outside the writable roots, no key readable, no
signal to dsh or to an unrelated process; and by default it runs read-only (``mode``)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dsh_sandbox_tools import _landlock_exec
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from conftest import text
from dsh_core.paths import credentials_home

pytestmark = pytest.mark.anyio

FIXTURE = str(Path(__file__).with_name("fixture_server.py"))


@pytest.fixture
def outside():
    d = Path("/var/tmp") / f"dsh-lsp-outside-{secrets.token_hex(4)}"
    d.mkdir(parents=True)
    yield d.resolve()
    shutil.rmtree(d, ignore_errors=True)


def fixture(options: dict, mode: str = "read-only") -> dict:
    return {"servers": {"fixture": {"command": [sys.executable, FIXTURE], "extensions": {".ts": "typescript"},
                                    "initialization-options": options}}, "mode": mode}


async def report(lsp_host, workspace: Path, mechanism: str, options: dict, mode: str = "read-only") -> dict:
    (workspace / "subject.ts").write_text("export const answer = 42\n")
    async with lsp_host(lsp=fixture(options, mode), sandbox={"mechanism": mechanism}) as s:
        out = await s.call("lsp", operation="hover", file_path="subject.ts", line=1, character=1)
    assert not out.is_error, text(out)
    return json.loads(text(out))


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_the_server_writes_nowhere_outside_the_roots_and_by_default_nowhere(lsp_host, workspace, outside,
                                                                                   mechanism):
    require_mechanism(mechanism)
    options = {"outside": str(outside), "inside": str(workspace)}
    read_only = await report(lsp_host, workspace, mechanism, options)
    session_tier = await report(lsp_host, workspace, mechanism, options, mode="session")
    assert read_only["write_outside"] != "done" and session_tier["write_outside"] != "done"
    assert read_only["write_inside"] != "done"  # read-only, the default mode
    assert session_tier["write_inside"] == "done"  # the session's workspace-write tier
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_key_stored_by_login_is_hidden_from_the_server(lsp_host, workspace, mechanism):
    require_mechanism(mechanism)
    creds = credentials_home()
    creds.mkdir(parents=True, exist_ok=True)
    (creds / "deepseek-api-key").write_text("sk-stored-by-login-0451\n")
    got = await report(lsp_host, workspace, mechanism, {"key": str(creds / "deepseek-api-key")})
    assert "sk-stored-by-login" not in got.get("key_text", ""), got
    assert got["read_key"] != "done"


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_the_server_cannot_signal_dsh_or_an_unrelated_process(lsp_host, workspace, mechanism):
    require_mechanism(mechanism)
    if mechanism == "landlock" and not _landlock_exec.signal_scoped():
        pytest.skip(f"Landlock ABI {_landlock_exec.abi_version()} has no signal scoping (ABI 6); bubblewrap's "
                    "parametrisation covers it")
    victim = subprocess.Popen(["sleep", "60"])
    try:
        got = await report(lsp_host, workspace, mechanism, {"signal": True, "victims": [victim.pid]})
        with open(f"/proc/{victim.pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        assert state != "T", "the server stopped an unrelated process"
        assert got.get(f"kill {victim.pid}") != "done", got
        assert all(v != "done" for k, v in got.items() if k.startswith("kill ")), got
        if mechanism == "landlock":  # it saw dsh among its ancestors and could not signal it
            assert os.getpid() in got["ancestors"], got
        else:  # bubblewrap: a pid namespace of its own, dsh is not even visible
            assert os.getpid() not in got["ancestors"], got
    finally:
        victim.kill()
        victim.wait()
