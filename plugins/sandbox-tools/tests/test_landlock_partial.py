"""DSH_LANDLOCK_MAX_ABI: the Landlock launcher behaves as on an older kernel (partial enforcement)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dsh_sandbox_tools import _landlock_exec
from dsh_sandbox_tools.mechanisms import LAUNCHER, PARTIAL_NOTICE, probe
from dsh_sandbox_tools.testing import require_mechanism


def _launch(tmp_path: Path, env_cap: str | None, command: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"} | ({_landlock_exec.MAX_ABI_ENV: env_cap} if env_cap else {})
    return subprocess.run([sys.executable, "-I", "-S", LAUNCHER, "--rw", str(tmp_path), "--rw-file", "/dev/null", "--", "sh", "-c", command],
                          capture_output=True, text=True, env=env, timeout=30)


def test_a_capped_abi_prints_the_partial_notice_and_still_confines(tmp_path, monkeypatch):
    require_mechanism("landlock")
    if _landlock_exec.abi_version() < 3:
        pytest.skip("this kernel's Landlock is partial already")
    full = _launch(tmp_path, None, "false")
    assert full.returncode == 1 and full.stderr == ""
    capped = _launch(tmp_path, "2", "false; (echo x > /var/tmp/dsh-landlock-partial-$$) 2>/dev/null && echo LEAK")
    assert capped.stderr == PARTIAL_NOTICE + "\n"  # the notice, on stderr, before the command ran
    assert "LEAK" not in capped.stdout  # ABI 2 still denies creating files outside the roots
    monkeypatch.setenv(_landlock_exec.MAX_ABI_ENV, "2")
    runner = probe("landlock").runner
    assert runner is not None and runner.partial and runner.detail == "Landlock ABI 2"
