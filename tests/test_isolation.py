"""Tests keep to their temporary directories: every test has its own DSH_HOME, the dsh processes
it starts inherit it, and a run in which a test leaves a session log in the user's data dir fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dsh_testing import REPO, minimal_env

INNER_TEST = '''
import subprocess, sys
from dsh_testing import minimal_env

DEMO = {demo!r}

def test_a_dsh_without_dsh_home(tmp_path):
    env = {{k: v for k, v in minimal_env().items() if k != "DSH_HOME"}} if {leak!r} else minimal_env()
    r = subprocess.run([sys.executable, "-m", "dsh_core.cli", "ask", "--provider", "scripted", "--model", DEMO, "ping"],
                       cwd=tmp_path, env=env, capture_output=True, timeout=60)
    assert r.stdout.strip() == b"PONG", r.stderr
'''


def test_every_test_has_its_own_dsh_home(dsh_home: Path, tmp_path: Path) -> None:
    assert os.environ["DSH_HOME"] == str(dsh_home) and dsh_home.parent == tmp_path
    assert minimal_env()["DSH_HOME"] == str(dsh_home)  # what spawn_acp and the CLI tests pass to a child


def run_inner(tmp_path: Path, leak: bool) -> subprocess.CompletedProcess:
    """A pytest run of one test that starts a real `dsh ask`, with HOME pointing into tmp_path."""
    inner = tmp_path / ("leaky" if leak else "tidy")
    inner.mkdir()
    (inner / "conftest.py").write_text('pytest_plugins = ["dsh_testing"]\n')
    demo = str(REPO / "examples" / "acp-agent" / "demo.json")
    (inner / "test_inner.py").write_text(INNER_TEST.format(demo=demo, leak=leak))
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_DATA_HOME", "DSH_HOME", "PYTEST_ADDOPTS")}
    env["HOME"] = str(inner / "home")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(inner / "tmp"), str(inner)],
        cwd=inner, env=env, capture_output=True, text=True, timeout=120,
    )


def test_a_run_that_leaves_a_session_log_in_the_user_data_dir_fails(tmp_path: Path) -> None:
    leaky = run_inner(tmp_path, leak=True)
    # the inner test itself passes; the run fails at its end, naming the file the real dsh left behind
    assert "1 passed" in leaky.stdout and leaky.returncode == 1, leaky.stdout + leaky.stderr
    data_dir = tmp_path / "leaky" / "home" / ".local" / "share" / "dsh"  # platformdirs on Linux, XDG_DATA_HOME unset
    logs = list((data_dir / "sessions").glob("*.jsonl"))
    assert len(logs) == 1 and str(logs[0]) in leaky.stdout
    assert "session log(s) outside their temporary directories" in leaky.stdout

    tidy = run_inner(tmp_path, leak=False)
    assert "1 passed" in tidy.stdout and tidy.returncode == 0, tidy.stdout + tidy.stderr
    assert not (tmp_path / "tidy" / "home").exists()
