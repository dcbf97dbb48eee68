from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dsh_deepseek_model import (
    DeepSeekProvider,
    _config,
    parse_settings,
)
from fake_deepseek import FakeDeepSeek

from dsh_core import diag

# Tiny delays so the suite stays fast; the shapes are the production ones.
FAST: dict[str, Any] = {
    "retry": {"max-retries": 3, "base-delay": 0.01, "max-delay": 2.0, "jitter": 0.0},
    "connect-timeout": 2.0,
    "first-event-timeout": 5.0,
    "idle-timeout": 5.0,
    "deadline": 10.0,
}



@pytest.fixture(autouse=True)
def _fresh_diag_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # The plugin warns through diag.warn, whose stderr budget is per process: a test that expects a
    # warning must not depend on how much earlier tests in the same process warned.
    monkeypatch.setattr(diag.handler, "spent", 0)


@pytest.fixture
def fake() -> Iterator[FakeDeepSeek]:
    with FakeDeepSeek(keepalive_every_s=0.05) as server:
        yield server


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No ambient key, endpoint or .env: the cwd and the 'repo root' are empty temp dirs."""
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    monkeypatch.delenv("DEEPSEEK_BASE_URL", raising=False)
    root = tmp_path / "root"
    root.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(_config, "repo_root", lambda: root)
    monkeypatch.chdir(work)
    return work


@pytest.fixture
def env(fake: FakeDeepSeek, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDeepSeek:
    monkeypatch.setenv("DEEPSEEK_API_KEY", fake.api_key)
    monkeypatch.setenv("DEEPSEEK_BASE_URL", fake.base_url)
    return fake


def make_provider(**overrides: Any) -> DeepSeekProvider:
    table = {**FAST, **overrides}
    return DeepSeekProvider(parse_settings(table))
