"""The bubblewrap command line names bwrap as the PATH of the moment finds it (looked up once per PATH)."""

from __future__ import annotations

import os

from dsh_sandbox_tools.mechanisms import bwrap_argv


def test_bwrap_is_looked_up_on_the_current_path(tmp_path, monkeypatch):
    for d in ("one", "two"):
        fake = tmp_path / d / "bwrap"
        fake.parent.mkdir()
        fake.write_text("#!/bin/sh\n")
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}/usr/bin:/bin")
        assert bwrap_argv(["true"], [], str(tmp_path), probe=True)[0] == str(fake)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert bwrap_argv(["true"], [], str(tmp_path), probe=True)[0] == "bwrap"
