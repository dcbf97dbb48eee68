"""docs/tool-catalog.md is generated from the live schemas (``dsh_testing.catalog``): the committed
file must be what the tools say now."""

from __future__ import annotations

import difflib

from dsh_testing import catalog


def test_the_committed_tool_catalog_is_current():
    text = catalog.generate()
    committed = catalog.CATALOG.read_text(encoding="utf-8") if catalog.CATALOG.is_file() else ""
    if committed != text:
        diff = "".join(difflib.unified_diff(committed.splitlines(True), text.splitlines(True),
                                            "docs/tool-catalog.md (committed)", "(generated now)", n=1))
        raise AssertionError(f"docs/tool-catalog.md is stale: regenerate it with `{catalog.COMMAND}` "
                             f"and review the diff\n{diff[:4000]}")


def test_check_mode_fails_on_a_stale_file_and_says_how_to_fix_it(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "tool-catalog.md"
    stale.write_text("# Tool catalog\n\nold\n")
    monkeypatch.setattr(catalog, "CATALOG", stale)
    assert catalog.main(["--check"]) == 1
    assert "python -m dsh_testing.catalog" in capsys.readouterr().err
    assert catalog.main([]) == 0 and catalog.main(["--check"]) == 0  # regenerated: current


def test_the_catalog_shows_session_tools_guidance_and_argument_shapes():
    text = catalog.CATALOG.read_text(encoding="utf-8")
    assert "`report` (a continuable subagent only)" in text
    assert "Guidance `tool:report` (order 118):" in text and "Guidance `tool:jobs` (order 106):" in text
    schema = {"type": "array", "maxItems": 2,
              "items": {"type": "object", "required": ["a"],
                        "properties": {"a": {"type": "string"}, "b": {"enum": ["x", "y"]}}}}
    assert catalog.type_of(schema) == 'array of object {a*: string, b: enum: "x", "y"} (max items 2)'
