"""Settings.spill_root follows the environment it is made from (it is remembered between calls)."""

from __future__ import annotations

from pathlib import Path

from dsh_sandbox_tools.policy import Settings


def test_the_spill_root_follows_dsh_home_and_an_explicit_dir(tmp_path, monkeypatch):
    s = Settings.from_config(None)
    monkeypatch.setenv("DSH_HOME", str(tmp_path / "a"))
    assert s.spill_root() == tmp_path / "a" / "spill"
    assert s.spill_root() == tmp_path / "a" / "spill"  # remembered: the same answer
    monkeypatch.setenv("DSH_HOME", str(tmp_path / "b"))
    assert s.spill_root() == tmp_path / "b" / "spill"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DSH_HOME", "rel")  # relative: taken from the cwd each time, never remembered
    assert s.spill_root() == tmp_path / "rel" / "spill"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert s.spill_root() == tmp_path / "elsewhere" / "rel" / "spill"
    monkeypatch.delenv("DSH_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert s.spill_root() == tmp_path / "xdg" / "dsh" / "spill"
    assert Settings.from_config({"spill-dir": str(tmp_path / "own")}).spill_root() == Path(tmp_path / "own")
