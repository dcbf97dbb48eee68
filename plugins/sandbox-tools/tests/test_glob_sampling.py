"""glob over its cap answers a sample across the top-level entries, not whatever came first."""

from __future__ import annotations

from pathlib import Path

import pytest
from dsh_sandbox_tools import search
from sandbox_helpers import Session, running_host, text

pytestmark = pytest.mark.anyio


async def test_glob_over_the_cap_samples_every_top_level_entry(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "GLOB_MAX", 10)
    for name, count in (("big", 40), ("mid", 5), ("one", 1)):
        (root / "tree" / name).mkdir(parents=True)
        for i in range(count):
            (root / "tree" / name / f"f{i:02d}.txt").write_text("x")
    (root / "tree" / "top.txt").write_text("x")
    async with running_host() as host:
        s = Session(host, root)
        out = await s.call("glob", pattern="**/*.txt", path="tree")
    lines = text(out).splitlines()
    assert lines[-1].startswith("[more than 10 matches: a sample across the top-level entries")
    shown = lines[:-1]
    assert len(shown) == 10 and shown == sorted(shown) and out.structured["truncated"] is True
    # Round robin over big/, mid/, one/ and top.txt: the small entries are all there.
    assert "tree/one/f00.txt" in shown and "tree/top.txt" in shown
    assert [p for p in shown if p.startswith("tree/mid/")] == [f"tree/mid/f{i:02d}.txt" for i in range(4)]
    assert [p for p in shown if p.startswith("tree/big/")] == [f"tree/big/f{i:02d}.txt" for i in range(4)]
