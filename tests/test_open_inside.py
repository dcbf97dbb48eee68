"""dsh_core.paths.open_inside on real files: what the dsh process itself may open in a
workspace someone else wrote (agent-instructions reads, the scripted model's marks, plugins)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dsh_core.paths import open_inside


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "rules.md").write_text("rules\n")
    (tmp_path / "secret").write_text("secret\n")
    (root / "in-link").symlink_to("docs/rules.md")
    (root / "out-link").symlink_to(tmp_path / "secret")
    (root / "out-dir").symlink_to(tmp_path)
    os.mkfifo(root / "fifo")
    return root


def _read(root, path):
    with os.fdopen(open_inside(root, path), "rb") as f:
        return f.read()


def test_a_file_and_a_link_that_stays_inside_are_read(ws):
    assert _read(ws, "docs/rules.md") == b"rules\n"
    assert _read(ws, "in-link") == b"rules\n"
    assert _read(ws, ws / "docs" / "rules.md") == b"rules\n"  # absolute, inside


@pytest.mark.parametrize("path", ["out-link", "../secret", "out-dir/secret", "/etc/passwd", "."])
def test_what_leads_out_is_refused(ws, path):
    with pytest.raises(PermissionError):
        open_inside(ws, path)


@pytest.mark.parametrize("path", ["fifo", "docs"])
def test_only_a_regular_file_is_opened_and_a_fifo_does_not_hang(ws, path):
    with pytest.raises(OSError) as err:
        open_inside(ws, path)
    assert err.value.errno == errno.EINVAL


def test_creating_stays_inside_too(ws, tmp_path):
    os.close(open_inside(ws, "docs/new.txt", os.O_WRONLY | os.O_CREAT))
    assert (ws / "docs" / "new.txt").is_file()
    with pytest.raises(PermissionError):
        open_inside(ws, "out-dir/created", os.O_WRONLY | os.O_CREAT)
    assert not (tmp_path / "created").exists()
    with pytest.raises(FileNotFoundError):
        open_inside(ws, "docs/missing.txt")


def test_real_dir_is_realpath_of_a_directory_resolved_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``real_dir``: what ``os.path.realpath`` gives for a directory (relative, through a symlink,
    one retargeted since), None for anything that is not a directory; and the same without /proc."""
    from dsh_core import paths
    from dsh_core.paths import real_dir

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "c").mkdir()
    (tmp_path / "file").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "a")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "name (deleted)").mkdir()

    def check() -> None:
        for p in ("a", "a/b", "link", "link/b", "link/../c", "c/../a", "name (deleted)", "."):
            assert real_dir(str(tmp_path / p)) == os.path.realpath(tmp_path / p), p
        for p in ("file", "link/nothing", "loop", "dangling", "nowhere"):
            assert real_dir(str(tmp_path / p)) is None, p
        monkeypatch.chdir(tmp_path / "a")
        assert real_dir("b") == str((tmp_path / "a" / "b").resolve())
        link.unlink()
        link.symlink_to(tmp_path / "c")  # retargeted: the next call sees it
        assert real_dir(str(link)) == str((tmp_path / "c").resolve())
        link.unlink()
        link.symlink_to(tmp_path / "a")

    check()
    real_readlink = os.readlink
    monkeypatch.setattr(paths.os, "readlink", lambda p: "" if str(p).startswith("/proc/") else real_readlink(p))
    check()  # no /proc: realpath and a stat
