"""Fixtures: a workspace under /tmp, directories outside every writable root (and HOME there), a clean env."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import pytest
from dsh_sandbox_tools.testing import home_outside_roots


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # DSH_HOME: every test already has its own (dsh_testing's autouse dsh_home fixture).
    monkeypatch.delenv("DSH_PERMISSION_MODE", raising=False)
    monkeypatch.delenv("DSH_SANDBOX_MECHANISM", raising=False)


@pytest.fixture(autouse=True)
def _home(monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME (``~`` for the file tools, ``$HOME`` for bash) lies outside every writable root."""
    with home_outside_roots(monkeypatch) as home:
        yield home


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "ws"
    r.mkdir()
    return r.resolve()


@pytest.fixture
def outside() -> Path:
    """A directory that is writable to the test but in no writable root (not under /tmp)."""
    d = Path("/var/tmp") / f"dsh-sandbox-outside-{secrets.token_hex(4)}"
    d.mkdir(parents=True)
    (d / "victim").write_text("original\n")
    yield d.resolve()
    shutil.rmtree(d, ignore_errors=True)


