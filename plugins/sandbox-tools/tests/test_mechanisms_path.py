"""The bubblewrap command line names bwrap as the PATH of the moment finds it (looked up once per
PATH), through PATH's absolute directories only: an empty or relative entry names the directory
of the moment, which may be a repository someone else wrote."""

from __future__ import annotations

import os

from dsh_sandbox_tools.mechanisms import FALLBACK_BWRAP, bwrap_argv, bwrap_path, probe


def _fake_bwrap(d) -> str:
    d.mkdir(parents=True, exist_ok=True)
    fake = d / "bwrap"
    fake.write_text("#!/bin/sh\ntouch \"$(dirname \"$0\")/ran\"\n")
    fake.chmod(0o755)
    return str(fake)


def test_bwrap_is_looked_up_on_the_current_path(tmp_path, monkeypatch):
    for d in ("one", "two"):
        fake = _fake_bwrap(tmp_path / d)
        monkeypatch.setenv("PATH", f"{tmp_path / d}{os.pathsep}/usr/bin:/bin")
        assert bwrap_argv(["true"], [], str(tmp_path), probe=True)[0] == fake
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert bwrap_path() is None
    assert bwrap_argv(["true"], [], str(tmp_path), probe=True)[0] == FALLBACK_BWRAP


def test_a_bwrap_in_the_directory_of_the_moment_is_never_the_sandbox(tmp_path, monkeypatch):
    """PATH with an empty entry (``:/usr/bin``) and with ``.``, the dsh process in a directory
    holding a ``bwrap``: it is never named, and the probe never runs it."""
    repo = tmp_path / "repo"
    _fake_bwrap(repo)
    monkeypatch.chdir(repo)
    for path in (f"{os.pathsep}{tmp_path / 'empty'}", f".{os.pathsep}{tmp_path / 'empty'}", ""):
        monkeypatch.setenv("PATH", path)
        assert bwrap_path() is None
        assert bwrap_argv(["true"], [], str(tmp_path), probe=True)[0] == FALLBACK_BWRAP
        assert probe("bwrap").runner is None
    assert not (repo / "ran").exists()


def test_the_bash_tools_shell_is_never_one_in_the_directory_of_the_moment(tmp_path, monkeypatch):
    from dsh_sandbox_tools.bash import _bash

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "bash").write_text("#!/bin/sh\n")
    (repo / "bash").chmod(0o755)
    monkeypatch.chdir(repo)
    monkeypatch.setenv("PATH", ":/usr/bin:/bin")
    assert os.path.isabs(_bash()) and _bash() != str(repo / "bash")
