"""Pytest helpers: run a sandbox test once per confinement mechanism this machine has.

    @pytest.mark.parametrize("mechanism", MECHANISMS)
    def test_x(mechanism):
        require_mechanism(mechanism)   # skip (with the reason) or fail, see below
        ...                            # config "mechanism" or env DSH_SANDBOX_MECHANISM = mechanism

``home_outside_roots(monkeypatch)`` points HOME at a fresh directory outside every writable
root, so escape tests aimed at ``~`` never touch the real home and mean the same wherever the
suite was started (a HOME under /tmp would itself be a writable root).

Fixtures a plugin's ``tests/conftest.py`` takes by importing them (``from dsh_sandbox_tools.testing
import _home, outside, root``): ``_home`` (autouse) clears ``DSH_PERMISSION_MODE`` and
``DSH_SANDBOX_MECHANISM`` and puts HOME outside every writable root; ``root`` is a workspace
directory under ``tmp_path``; ``outside`` a writable directory in no writable root (with a
``victim`` file).

A parametrisation skips only when the machine lacks that mechanism: bubblewrap not installed,
or installed but unable to start here (e.g. user namespaces disabled), or a kernel without
Landlock. A mechanism that is present but does not confine (or a Landlock launcher that fails
on a Landlock kernel) fails the test: that is a defect, not an environment.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from . import _landlock_exec
from .mechanisms import bwrap_path, probe_cached

MECHANISMS = ("bwrap", "landlock")


def require_mechanism(name: str) -> None:
    if name == "none":  # no mechanism at all (a host without a sandbox): every machine has that
        return
    result = probe_cached(name)
    if result.runner is not None:
        return
    outcome = result.attempts.get(name, "")
    if name == "bwrap" and bwrap_path() is None:
        pytest.skip("bubblewrap is not installed (Debian package: bubblewrap); the Landlock parametrisation runs")
    if name == "bwrap" and outcome.startswith("cannot start"):
        pytest.skip(f"bubblewrap is installed but cannot start on this machine: {outcome}")
    if name == "landlock" and _landlock_exec.abi_version() < 1:
        pytest.skip("this kernel has no Landlock (ABI 0: not built in, or not in the lsm= list)")
    pytest.fail(f"{name} is present on this machine but the real probe says it does not work: {result.summary()}")


@contextmanager
def home_outside_roots(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    d = Path("/var/tmp") / f"dsh-test-home-{secrets.token_hex(4)}"
    d.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(d))
    try:
        yield d.resolve()
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A clean env and HOME (``~`` for the file tools, ``$HOME`` for bash) outside every writable root."""
    # DSH_HOME: every test already has its own (dsh_testing's autouse dsh_home fixture).
    monkeypatch.delenv("DSH_PERMISSION_MODE", raising=False)
    monkeypatch.delenv("DSH_SANDBOX_MECHANISM", raising=False)
    with home_outside_roots(monkeypatch) as home:
        yield home


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "ws"
    r.mkdir()
    return r.resolve()


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory that is writable to the test but in no writable root (not under /tmp)."""
    d = Path("/var/tmp") / f"dsh-test-outside-{secrets.token_hex(4)}"
    d.mkdir(parents=True)
    (d / "victim").write_text("original\n")
    yield d.resolve()
    shutil.rmtree(d, ignore_errors=True)
