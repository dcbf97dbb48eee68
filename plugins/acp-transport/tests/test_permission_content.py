"""What a permission request shows a person besides its title: the model's justification as
content, and for write/edit a whole-file diff (Toad, Zed open their review view for it)."""

from __future__ import annotations

import os
from types import SimpleNamespace

from dsh_acp import wire
from dsh_acp_transport.permission import DIFF_MAX, content_of, tool_call_of

from dsh_core.types import ApprovalRequest


def _request(tmp_path, tool, args, justification="the tests need it", reason="needs danger-full-access"):
    return ApprovalRequest(agent=SimpleNamespace(cwd=str(tmp_path)), tool_name=tool, call_id="call_1", reason=reason,
                           kind="edit", subject=args.get("file_path"), args=args, tier="danger-full-access",
                           justification=justification)


def test_a_write_shows_its_justification_and_the_whole_file_as_a_diff(tmp_path):
    (tmp_path / "notes.txt").write_text("old line\n")
    call = tool_call_of(_request(tmp_path, "write", {"file_path": "notes.txt", "content": "new line\n"}))
    frame = wire.encoder.encode(call)
    assert b'"content":[{"type":"content","content":{"type":"text","text":"the tests need it"}},' in frame
    assert call.content[1] == wire.DiffOut(path=str(tmp_path / "notes.txt"), old_text="old line\n", new_text="new line\n")


def test_a_new_file_is_a_diff_from_null(tmp_path):
    (diff,) = [c for c in content_of(_request(tmp_path, "write", {"file_path": "sub/new.txt", "content": "x"}))
               if isinstance(c, wire.DiffOut)]
    assert diff.old_text is None and b'"oldText":null' in wire.encoder.encode(diff)


def test_an_edit_is_shown_applied_to_the_file(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\ny = 1\n")
    edit = {"file_path": str(tmp_path / "a.py"), "old_string": "y = 1", "new_string": "y = 2"}
    (_, diff) = content_of(_request(tmp_path, "edit", edit))
    assert (diff.old_text, diff.new_text) == ("x = 1\ny = 1\n", "x = 1\ny = 2\n")
    everywhere = {"file_path": "a.py", "old_string": "1", "new_string": "3", "replace_all": True}
    assert content_of(_request(tmp_path, "edit", everywhere))[1].new_text == "x = 3\ny = 3\n"


def test_no_diff_when_it_cannot_be_shown_honestly(tmp_path):
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "big").write_text("x" * (DIFF_MAX + 1))
    os.mkfifo(tmp_path / "fifo")  # must not hang the door
    for tool, args in [("write", {"file_path": "bin", "content": "t"}), ("write", {"file_path": "big", "content": "t"}),
                       ("write", {"file_path": "fifo", "content": "t"}), ("write", {"file_path": "x", "content": "y" * (DIFF_MAX + 1)}),
                       ("edit", {"file_path": "big", "old_string": "q", "new_string": "r"}),
                       ("edit", {"file_path": "missing", "old_string": "q", "new_string": "r"}),
                       ("bash", {"command": "rm -rf /"})]:  # fmt: skip
        content = content_of(_request(tmp_path, tool, args))
        assert [type(c).__name__ for c in content] == ["ContentOut"], (tool, args)


def test_the_reason_stands_in_for_a_missing_justification_and_controls_are_dropped(tmp_path):
    (only,) = content_of(_request(tmp_path, "bash", {"command": "x"}, justification=None, reason="a hook asks\x1b[2J"))
    assert only.content.text == "a hook asks[2J"
