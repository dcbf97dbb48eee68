"""Fixtures: a workspace under /tmp, directories outside every writable root (and HOME there), a clean env."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # DSH_HOME: every test already has its own (dsh_core.testing's autouse dsh_home fixture).
    monkeypatch.delenv("DSH_PERMISSION_MODE", raising=False)
    monkeypatch.delenv("DSH_SANDBOX_MECHANISM", raising=False)


@pytest.fixture(autouse=True)
def _home_outside_roots(monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME (``~`` for the file tools, ``$HOME`` for bash) is a fresh directory outside every writable
    root, so the escape attempts on it never touch the user's real home, and they mean the same
    whatever HOME the suite was started with (a HOME under /tmp would be a writable root)."""
    d = Path("/var/tmp") / f"dsh-sandbox-home-{secrets.token_hex(4)}"
    d.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(d))
    yield d.resolve()
    shutil.rmtree(d, ignore_errors=True)


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


