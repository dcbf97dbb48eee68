"""str_replace_editor writes only where sandbox-tools' write and edit may: every attempt to write
outside the writable roots fails (absolute path, ``..``, a symlinked directory or file, a hard link,
``/proc/self/root``, a dotfile in HOME), once per confinement mechanism the machine has; read-only
writes nowhere; the same calls succeed inside the root and in the temp directory."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

import pytest
from dsh_sandbox_tools.testing import MECHANISMS

from conftest import text

pytestmark = pytest.mark.anyio


def _escapes(root: Path, out: Path, home: Path) -> dict[str, tuple[str, Path]]:
    """name -> (the path the editor is given, the file that must not change or appear)."""
    rel = os.path.relpath(out, root)
    os.symlink(out, root / "dirlink")
    os.symlink(out / "victim", root / "filelink")
    with contextlib.suppress(OSError):  # /var/tmp and /tmp on different filesystems: no hard link to try
        os.link(out / "victim", root / "hardlink")
    return {
        "absolute": (str(out / "a"), out / "a"),
        "dotdot": (str(root / rel / "a"), out / "a"),
        "dir-symlink": (str(root / "dirlink" / "a"), out / "a"),
        "file-symlink": (str(root / "filelink"), out / "victim"),
        "hard-link": (str(root / "hardlink"), out / "victim"),
        "proc-self-root": (f"/proc/self/root{out}/a", out / "a"),
        "home-dotfile": (str(home / f".dsh-escape-{secrets.token_hex(3)}"), home / ".dsh-escape"),
    }


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_no_write_outside_the_roots(mechanism: str, editor_session, root: Path, outside: Path,
                                          _home: Path) -> None:
    escapes = _escapes(root, outside, _home)
    async with editor_session(mechanism=mechanism) as s:
        for name, (path, _) in escapes.items():
            if name == "hard-link" and not os.path.exists(path):
                continue
            created = await s.edit(command="create", path=path, file_text="pwned\n")
            if os.path.lexists(path) and name != "proc-self-root":
                assert created.is_error, name  # exists already: create refuses before writing
            else:
                assert created.code == "SANDBOX_DENIED", (name, text(created))
                assert text(created).startswith("Error: [sandbox: file access denied under workspace-write mode] "
                                                f'cannot write "{os.path.normpath(path)}"'), text(created)
            if os.path.isfile(path):  # an existing target: the edits are refused at the write, after a view
                assert not (await s.edit(command="view", path=path)).is_error, name
                replaced = await s.edit(command="str_replace", path=path, old_str="original", new_str="pwned")
                assert replaced.code == "SANDBOX_DENIED", (name, text(replaced))
                inserted = await s.edit(command="insert", path=path, insert_line=0, new_str="pwned")
                assert inserted.code == "SANDBOX_DENIED", (name, text(inserted))
    assert (outside / "victim").read_text() == "original\n"
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert not [p for p in _home.iterdir() if p.name.startswith(".dsh-escape")]


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_inside_the_root_and_the_temp_dir_it_writes(mechanism: str, editor_session, root: Path) -> None:
    tmp_file = Path("/tmp") / f"dsh-editor-{secrets.token_hex(4)}.txt"
    try:
        async with editor_session(mechanism=mechanism) as s:
            for path in (root / "sub" / "in.txt", tmp_file):
                assert not (await s.edit(command="create", path=str(path), file_text="a\n")).is_error
                assert not (await s.edit(command="str_replace", path=str(path), old_str="a", new_str="b")).is_error
                assert not (await s.edit(command="insert", path=str(path), insert_line=0, new_str="top")).is_error
                assert path.read_text() == "top\nb\n"
    finally:
        tmp_file.unlink(missing_ok=True)


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_read_only_writes_nowhere(mechanism: str, editor_session, root: Path) -> None:
    f = root / "kept.txt"
    f.write_text("original\n")
    async with editor_session(mode="read-only", mechanism=mechanism) as s:
        created = await s.edit(command="create", path=str(root / "new.txt"), file_text="x")
        assert created.code == "SANDBOX_DENIED"
        assert text(created).startswith("Error: [sandbox: file access denied under read-only mode] ")
        assert not (await s.edit(command="view", path=str(f))).is_error  # reads are allowed
        assert (await s.edit(command="str_replace", path=str(f), old_str="original", new_str="x")).code == \
            "SANDBOX_DENIED"
        assert (await s.edit(command="insert", path=str(f), insert_line=1, new_str="x")).code == "SANDBOX_DENIED"
    assert f.read_text() == "original\n"
    assert not (root / "new.txt").exists()


async def test_danger_full_access_writes_anywhere_the_user_can(editor_session, root: Path, outside: Path) -> None:
    async with editor_session(mode="danger-full-access") as s:
        assert not (await s.edit(command="create", path=str(outside / "a"), file_text="ok")).is_error
    assert (outside / "a").read_text() == "ok"


async def test_without_a_confinement_provider_nothing_is_written(editor_session, root: Path) -> None:
    (root / "kept.txt").write_text("original\n")
    async with editor_session(sandbox=False) as s:
        assert s.host.confinement is None
        created = await s.edit(command="create", path=str(root / "new.txt"), file_text="x")
        assert created.code == "SANDBOX_UNAVAILABLE"
        assert text(created) == (f'Error: cannot write "{root / "new.txt"}": no plugin provides confinement in this '
                                 "composition (mount sandbox-tools), and nothing is written unconfined")
        assert "original" in text(await s.edit(command="view", path=str(root / "kept.txt")))  # reads work
        assert (await s.edit(command="str_replace", path=str(root / "kept.txt"), old_str="original",
                             new_str="x")).code == "SANDBOX_UNAVAILABLE"
    assert not (root / "new.txt").exists()
    assert (root / "kept.txt").read_text() == "original\n"
