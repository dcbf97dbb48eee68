"""Where dsh keeps its data: the answers follow the variables they come from (they are cached
per value, not once per process)."""

from __future__ import annotations

from pathlib import Path

from dsh_core.paths import config_home, credentials_home


def test_the_config_and_credentials_homes_follow_their_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("DSH_CONFIG_HOME", str(tmp_path / "a"))
    assert credentials_home() == tmp_path / "a" / "credentials"
    monkeypatch.setenv("DSH_CONFIG_HOME", str(tmp_path / "b"))
    assert config_home() == tmp_path / "b" and credentials_home() == tmp_path / "b" / "credentials"
    monkeypatch.delenv("DSH_CONFIG_HOME")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert credentials_home() == tmp_path / "xdg" / "dsh" / "credentials"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config_home() == tmp_path / "home" / ".config" / "dsh"


def test_a_relative_config_home_is_taken_from_the_directory_of_the_moment(tmp_path, monkeypatch):
    monkeypatch.setenv("DSH_CONFIG_HOME", "rel")
    for d in ("one", "two"):
        (tmp_path / d).mkdir()
        monkeypatch.chdir(tmp_path / d)
        assert config_home() == Path(tmp_path / d / "rel")


def test_a_program_is_found_through_absolute_path_entries_only(tmp_path, monkeypatch):
    """``find_program``: an empty or relative PATH entry names the directory of the moment (which
    may be a repository someone else wrote); a program there is never found. An absolute entry
    is, and the answer follows PATH."""
    from dsh_core.paths import find_program

    here, there = tmp_path / "here", tmp_path / "there"
    for d in (here, there):
        d.mkdir()
        (d / "prog").write_text("#!/bin/sh\n")
        (d / "prog").chmod(0o755)
    monkeypatch.chdir(here)
    for path in (f":{tmp_path / 'empty'}", f".:{tmp_path / 'empty'}", "", "here"):
        monkeypatch.setenv("PATH", path)
        assert find_program("prog") is None
    monkeypatch.setenv("PATH", f":{there}")
    assert find_program("prog") == str(there / "prog")
