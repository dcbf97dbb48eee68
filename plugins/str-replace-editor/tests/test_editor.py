"""str_replace_editor's behaviour and texts, on real files through a real host: the original's
results word for word, read-before-edit on the records sandbox-tools' read/write/edit share, and
every refused call leaving the file as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import Session, running_host, text
from dsh_core import ConfigError
from dsh_core.contracts import AgentSpec

pytestmark = pytest.mark.anyio


async def test_the_schema_is_the_originals(editor_session) -> None:
    async with editor_session() as s:
        spec = s.host.tools["str_replace_editor"].spec
    params = spec.parameters
    assert params["required"] == ["command", "path"]
    assert params["properties"]["command"]["enum"] == ["view", "create", "str_replace", "insert"]
    assert {k: v["type"] for k, v in params["properties"].items()} == {
        "command": "string", "path": "string", "file_text": "string", "insert_line": "integer",
        "new_str": "string", "old_str": "string", "view_range": "array"}
    assert params["properties"]["view_range"]["items"] == {"type": "integer"}
    assert params["additionalProperties"] is False  # no sandbox_permissions: the original has none
    assert spec.kind == "edit"


async def test_create_view_replace_insert_with_the_original_texts(editor_session, root: Path) -> None:
    sample = str(root / "sample.txt")
    async with editor_session() as s:
        assert text(await s.edit(command="create", path=sample, file_text="one\ntwo\nthree\n")) == \
            f"New file created successfully at: {sample}"
        assert text(await s.edit(command="view", path=sample, view_range=[2, -1])) == "\n".join([
            f"Here's the content of {sample} with line numbers (which has a total of 4 lines) with view_range=[2, -1]:",
            "     2  two", "     3  three", "     4  ", ""])
        done = f"The file {sample} has been edited successfully."
        assert text(await s.edit(command="str_replace", path=sample, old_str="two", new_str="TWO")) == done
        assert text(await s.edit(command="str_replace", path=sample, old_str="TWO")) == done  # no new_str: deleted
        assert text(await s.edit(command="insert", path=sample, insert_line=1, new_str="between")) == done
    assert Path(sample).read_text() == "one\nbetween\n\nthree\n"


async def test_empty_lines_ranges_and_inserting_at_the_end(editor_session, root: Path) -> None:
    (root / "empty.txt").write_text("")
    (root / "newline.txt").write_text("\n")
    (root / "plain.txt").write_text("one\ntwo")
    async with editor_session() as s:
        assert "(which has a total of 1 lines):\n     1  \n" in text(await s.edit(command="view", path=str(root / "empty.txt")))
        assert "(which has a total of 2 lines):\n     1  \n     2  \n" in text(
            await s.edit(command="view", path=str(root / "newline.txt")))
        assert "     2  two" in text(await s.edit(command="view", path=str(root / "plain.txt"), view_range=[1, 2]))
        await s.edit(command="insert", path=str(root / "plain.txt"), insert_line=2, new_str="three")
        assert (root / "plain.txt").read_text() == "one\ntwo\nthree"  # no newline added
        (root / "newline.txt").write_text("one\n")
        await s.edit(command="view", path=str(root / "newline.txt"))
        await s.edit(command="insert", path=str(root / "newline.txt"), insert_line=2, new_str="three")
        assert (root / "newline.txt").read_text() == "one\n\nthree"


async def test_tabs_and_replacement_text_are_literal(editor_session, root: Path) -> None:
    make = root / "Makefile"
    make.write_text("target:\n\told\nremove\n")
    lit = root / "literal.txt"
    lit.write_text("before OLD after")
    async with editor_session() as s:
        assert "     2  \told" in text(await s.edit(command="view", path=str(make)))
        await s.edit(command="str_replace", path=str(make), old_str="\told", new_str="\tnew")
        await s.edit(command="str_replace", path=str(make), old_str="remove\n")
        await s.edit(command="insert", path=str(make), insert_line=1, new_str="\tkept")
        await s.edit(command="view", path=str(lit))
        await s.edit(command="str_replace", path=str(lit), old_str="OLD", new_str=r"$&|\1|\g<0>")
    assert make.read_text() == "target:\n\tkept\n\tnew\n"
    assert lit.read_text() == r"before $&|\1|\g<0> after"


async def test_match_failures_speak_of_old_str_and_name_the_lines(editor_session, root: Path) -> None:
    f = root / "ambiguous.txt"
    f.write_text("same\nother\nsame")
    async with editor_session() as s:
        await s.edit(command="view", path=str(f))
        missing = await s.edit(command="str_replace", path=str(f), old_str="absent", new_str="x")
        assert missing.is_error and missing.code == "NO_MATCH"
        assert text(missing) == f"Error: No replacement was performed, old_str `absent` did not appear verbatim in {f}."
        repeated = await s.edit(command="str_replace", path=str(f), old_str="same", new_str="x")
        assert text(repeated) == ("Error: No replacement was performed. Multiple occurrences of old_str `same` in "
                                  "lines [1, 3]. Please ensure it is unique")
        f.write_text("alpha\nbeta\nmiddle\nalpha\nbeta")
        await s.edit(command="view", path=str(f))
        multi = await s.edit(command="str_replace", path=str(f), old_str="alpha\nbeta", new_str="x")
        assert "Multiple occurrences of old_str `alpha\nbeta` in lines [1, 4]" in text(multi)
        mixed = root / "mixed-eol.txt"
        mixed.write_text("alpha\r\nbeta\nmiddle\nalpha\nbeta")
        await s.edit(command="view", path=str(mixed))
        assert not (await s.edit(command="str_replace", path=str(mixed), old_str="alpha\r\nbeta",
                                 new_str="replaced")).is_error
    assert f.read_text() == "alpha\nbeta\nmiddle\nalpha\nbeta"
    assert mixed.read_bytes() == b"replaced\nmiddle\nalpha\nbeta"


async def test_relative_paths_are_refused_with_the_workspace_path_suggested(editor_session, root: Path) -> None:
    (root / "a.txt").write_text("x")
    async with editor_session() as s:
        out = await s.edit(command="view", path="a.txt")
    assert out.is_error
    assert text(out) == (f"Error: The path a.txt is not an absolute path, it should start with `/`. "
                         f"Maybe you meant {root / 'a.txt'}?")


async def test_invalid_calls_change_nothing(editor_session, root: Path) -> None:
    amb = root / "ambiguous.txt"
    amb.write_text("same same")
    (root / "empty.txt").write_text("")
    three = root / "three.txt"
    three.write_text("one\ntwo\nthree")
    (root / "directory").mkdir()
    cases = [
        ({"command": "view", "path": ""}, "path must be a non-empty string"),
        ({"command": "view", "path": str(root / "missing.txt")},
         f"The path {root / 'missing.txt'} does not exist. Please provide a valid path."),
        ({"command": "view", "path": str(amb), "view_range": [1]},
         "Invalid `view_range`. It should be a list of two integers."),
        ({"command": "view", "path": str(amb), "view_range": [0, 1]},
         "Invalid `view_range`: [0, 1]. Its first element `0` should be within the range of lines of the file: [1, 1]"),
        ({"command": "view", "path": str(amb), "view_range": [1.5, 2]},
         "Invalid `view_range`. It should be a list of two integers."),
        ({"command": "view", "path": str(three), "view_range": [1, 99]},
         "Invalid `view_range`: [1, 99]. Its second element `99` should be smaller than the number of lines in the "
         "file: `3`"),
        ({"command": "view", "path": str(three), "view_range": [2, 1]},
         "Invalid `view_range`: [2, 1]. Its second element `1` should be larger or equal than its first `2`"),
        ({"command": "view", "path": str(root / "directory"), "view_range": [1, 1]},
         "The `view_range` parameter is not allowed when `path` points to a directory."),
        ({"command": "create", "path": str(root / "new.txt")}, "Parameter `file_text` is required for command: create"),
        ({"command": "create", "path": str(amb), "file_text": "overwrite"},
         f"File already exists at: {amb}. Cannot overwrite files using command `create`."),
        ({"command": "str_replace", "path": str(amb), "new_str": "x"},
         "Parameter `old_str` is required for command: str_replace"),
        ({"command": "str_replace", "path": str(amb), "old_str": "", "new_str": "x"},
         "Parameter `old_str` is empty for command: str_replace"),
        ({"command": "insert", "path": str(amb), "new_str": "x"}, "Parameter `insert_line` is required for command: insert"),
        ({"command": "insert", "path": str(amb), "insert_line": 0}, "Parameter `new_str` is required for command: insert"),
        ({"command": "insert", "path": str(amb), "insert_line": -1, "new_str": "x"},
         "Invalid `insert_line` parameter: -1. It should be within the range of lines of the file: [0, 1]"),
        ({"command": "insert", "path": str(amb), "insert_line": 99, "new_str": "x"},
         "Invalid `insert_line` parameter: 99. It should be within the range of lines of the file: [0, 1]"),
        ({"command": "insert", "path": str(root / "empty.txt"), "insert_line": 2, "new_str": "x"},
         "Invalid `insert_line` parameter: 2. It should be within the range of lines of the file: [0, 1]"),
        ({"command": "insert", "path": str(root / "directory"), "insert_line": 0, "new_str": "x"},
         f"The path {root / 'directory'} is a directory and only the `view` command can be used on directories"),
        ({"command": "undo_edit", "path": str(amb)},
         "Unrecognized command 'undo_edit'. The allowed commands for the str_replace_editor tool are: view, create, "
         "str_replace, insert"),
    ]
    async with editor_session() as s:
        for path in (amb, root / "empty.txt"):
            await s.edit(command="view", path=str(path))
        for args, message in cases:
            out = await s.edit(**args)
            assert out.is_error, args
            assert text(out) == f"Error: {message}", args
        spine = await s.edit(command="insert", path=str(amb), insert_line=1.5, new_str="x")  # not an integer
        assert spine.is_error and spine.code == "INVALID_ARGUMENTS"
        fifo = root / "fifo"
        os.mkfifo(fifo)
        special = await s.edit(command="view", path=str(fifo))
        assert special.code == "NOT_REGULAR_FILE"
        assert text(special) == f'Error: cannot view "{fifo}": not a regular file or directory'
    assert amb.read_text() == "same same"
    assert not (root / "new.txt").exists()


async def test_str_replace_and_insert_need_a_read_of_the_unchanged_file(editor_session, root: Path) -> None:
    f = root / "existing.txt"
    f.write_text("before")
    async with editor_session() as s:
        blind = await s.edit(command="str_replace", path=str(f), old_str="before", new_str="after")
        assert blind.code == "NOT_READ"
        assert text(blind) == f'Error: edit requires reading "{f}" first — view the file, then retry'
        assert (await s.edit(command="insert", path=str(f), insert_line=0, new_str="x")).code == "NOT_READ"
        assert f.read_text() == "before"

        await s.call("read", file_path=str(f))  # sandbox-tools' read counts: one set of read records
        assert not (await s.edit(command="str_replace", path=str(f), old_str="before", new_str="after")).is_error
        assert not (await s.edit(command="insert", path=str(f), insert_line=1, new_str="tail")).is_error
        assert f.read_text() == "after\ntail"
        assert not (await s.call("edit", file_path=str(f), old_string="tail", new_string="end")).is_error  # and back

        f.write_text("changed behind the session's back")
        os.utime(f, ns=(1, 1))
        stale = await s.edit(command="str_replace", path=str(f), old_str="changed", new_str="x")
        assert stale.code == "STALE_READ"
        assert text(stale) == (f'Error: cannot write "{f}": file changed since it was read — view the file again, '
                               "then retry")
        await s.edit(command="view", path=str(f))
        assert not (await s.edit(command="str_replace", path=str(f), old_str="changed", new_str="x")).is_error

        created = root / "created.txt"
        await s.edit(command="create", path=str(created), file_text="new")  # a create counts as a read
        assert not (await s.edit(command="str_replace", path=str(created), old_str="new", new_str="newer")).is_error
        assert created.read_text() == "newer"

        (root / "gone.txt").write_text("x")
        await s.edit(command="view", path=str(root / "gone.txt"))
        (root / "gone.txt").unlink()
        gone = await s.edit(command="str_replace", path=str(root / "gone.txt"), old_str="x", new_str="y")
        assert gone.code == "NOT_FOUND"
        assert not (await s.edit(command="create", path=str(root / "gone.txt"), file_text="fresh")).is_error
    assert (root / "gone.txt").read_text() == "fresh"


async def test_create_makes_missing_parent_directories(editor_session, root: Path) -> None:
    deep = root / "a" / "b" / "c.txt"
    async with editor_session() as s:
        assert not (await s.edit(command="create", path=str(deep), file_text="")).is_error
    assert deep.read_text() == ""


async def test_directory_listing_two_levels_deep_without_hidden_or_cache_entries(editor_session, root: Path) -> None:
    d = root / "dir"
    (d / "nested" / "third").mkdir(parents=True)
    (d / "node_modules" / "pkg").mkdir(parents=True)
    (d / "node_modules_old").mkdir()
    (d / "__pycache__").mkdir()
    (d / "visible.txt").write_text("ok")
    (d / ".hidden").write_text("hidden")
    (d / "nested" / "child.txt").write_text("child")
    (d / "nested" / "third" / "too-deep.txt").write_text("deep")
    (d / "node_modules" / "pkg" / "index.js").write_text("dep")
    (d / "node_modules_old" / "kept.js").write_text("kept")
    (d / "__pycache__" / "m.pyc").write_text("cache")
    os.symlink("/etc", d / "link")
    async with editor_session() as s:
        listing = text(await s.edit(command="view", path=str(d)))
    assert listing == "\n".join([
        f"Here're the files and directories up to 2 levels deep in {d}, excluding hidden items, node_modules, "
        "and Python cache directories:",
        f"d\t{d}", f"?\t{d}/link", f"d\t{d}/nested", f"f\t{d}/nested/child.txt", f"d\t{d}/nested/third",
        f"d\t{d}/node_modules_old", f"f\t{d}/node_modules_old/kept.js", f"f\t{d}/visible.txt", "", ""])


async def test_long_views_are_clipped_with_the_original_note(editor_session, root: Path) -> None:
    (root / "large.txt").write_text("x" * 100)
    async with editor_session(editor={"max-output-chars": 10}) as s:
        out = text(await s.edit(command="view", path=str(root / "large.txt")))
        listing = text(await s.edit(command="view", path=str(root)))
    assert out == ("Here's the<response clipped><NOTE>To save on context only part of this file has been shown to "
                   "you. You should retry this tool after you have searched inside the file with `grep -n` in order "
                   "to find the line numbers of what you are looking for.</NOTE>")
    assert "excluding hidden items, node_modules, and Python cache directories:\nd\t" in listing
    assert "<response clipped>" in listing


async def test_binary_files_are_refused(editor_session, root: Path) -> None:
    (root / "blob.bin").write_bytes(b"\x00\x01\x02")
    async with editor_session() as s:
        out = await s.edit(command="view", path=str(root / "blob.bin"))
    assert out.code == "BINARY_FILE"


async def test_the_description_is_configurable_and_never_blank(editor_session) -> None:
    async with editor_session(editor={"description": "custom editor description"}) as s:
        assert s.host.tools["str_replace_editor"].spec.description == "custom editor description"
    with pytest.raises(ConfigError):
        async with editor_session(editor={"description": "   "}):
            pass
    with pytest.raises(ConfigError):
        async with editor_session(editor={"max-output-chars": 0}):
            pass


class Buffers:
    """An editor holding ``open`` files with unsaved text (the EditorBuffers seam), recording writes."""

    def __init__(self, open_files: dict[str, str]) -> None:
        self.open = open_files
        self.wrote_to: list[tuple[str, str]] = []

    async def read(self, path: str) -> str | None:
        return self.open.get(path)

    async def wrote(self, path: str, text: str) -> None:
        self.wrote_to.append((path, text))


async def test_the_editors_unsaved_text_is_viewed_and_edited(root: Path) -> None:
    f = root / "open.py"
    f.write_text("on disk\n")
    buffers = Buffers({str(f): "unsaved\n"})
    async with running_host() as host:
        s = Session(host, root)
        s.agent = host.create_agent(AgentSpec(cwd=str(root), provider="fake", model="m", buffers=buffers))
        assert "     1  unsaved" in text(await s.edit(command="view", path=str(f)))
        assert not (await s.edit(command="str_replace", path=str(f), old_str="unsaved", new_str="saved")).is_error
        await s.edit(command="create", path=str(root / "new.py"), file_text="x\n")
    assert f.read_text() == "saved\n"
    assert buffers.wrote_to == [(str(f), "saved\n"), (str(root / "new.py"), "x\n")]


def test_loading_never_waits_on_a_fifo(root: Path) -> None:
    """``_load`` (in a worker thread) opens without waiting: a FIFO that took the file's place
    after the type check is refused at once, not waited on until a writer comes."""
    import threading

    from dsh_str_replace_editor.editor import _load

    from dsh_core import ToolError

    fifo = root / "swapped"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            _load(str(fifo))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "the open waited on the FIFO"
    (exc,) = outcome
    assert isinstance(exc, ToolError) and exc.code == "NOT_REGULAR_FILE"
