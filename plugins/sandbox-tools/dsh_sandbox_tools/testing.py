"""Pytest helpers: run a sandbox test once per confinement mechanism this machine has.

    @pytest.mark.parametrize("mechanism", MECHANISMS)
    def test_x(mechanism):
        require_mechanism(mechanism)   # skip (with the reason) or fail, see below
        ...                            # config "mechanism" or env DSH_SANDBOX_MECHANISM = mechanism

A parametrisation skips only when the machine lacks that mechanism: bubblewrap not installed,
or installed but unable to start here (e.g. user namespaces disabled), or a kernel without
Landlock. A mechanism that is present but does not confine (or a Landlock launcher that fails
on a Landlock kernel) fails the test: that is a defect, not an environment.
"""

from __future__ import annotations

import shutil

import pytest

from . import _landlock_exec
from .mechanisms import probe_cached

MECHANISMS = ("bwrap", "landlock")


def require_mechanism(name: str) -> None:
    result = probe_cached(name)
    if result.runner is not None:
        return
    outcome = result.attempts.get(name, "")
    if name == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (Debian package: bubblewrap); the Landlock parametrisation runs")
    if name == "bwrap" and outcome.startswith("cannot start"):
        pytest.skip(f"bubblewrap is installed but cannot start on this machine: {outcome}")
    if name == "landlock" and _landlock_exec.abi_version() < 1:
        pytest.skip("this kernel has no Landlock (ABI 0: not built in, or not in the lsm= list)")
    pytest.fail(f"{name} is present on this machine but the real probe says it does not work: {result.summary()}")
