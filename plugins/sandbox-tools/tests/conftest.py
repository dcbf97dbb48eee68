"""Fixtures: a workspace under /tmp, a directory outside every writable root, a clean env."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DSH_PERMISSION_MODE", raising=False)
    monkeypatch.delenv("DSH_SANDBOX_MECHANISM", raising=False)
    monkeypatch.setenv("DSH_HOME", str(tmp_path / "dsh-home"))


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


