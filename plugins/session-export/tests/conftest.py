from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # recorded.py, beside this file

from recorded import Recorded, materialize, scenario_dirs


@pytest.fixture(scope="session")
def recorded_store(tmp_path_factory) -> tuple[Path, list[Recorded]]:
    """Every snapshot scenario's recorded sessions, in one store: (DSH_HOME, what each scenario put there)."""
    root = tmp_path_factory.mktemp("recorded")
    home, work = root / "home", root / "work"
    work.mkdir()
    return home, [materialize(d, home / "sessions", work) for d in scenario_dirs()]

