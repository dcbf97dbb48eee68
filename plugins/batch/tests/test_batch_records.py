"""The results file on its own (real files, in-process): what a re-run keeps, drops and locks."""

from __future__ import annotations

import json

import pytest
from dsh_batch.records import Result, ResultsLocked, encode_result, open_results


def line(rid: str, status: str, text: str = "") -> bytes:
    stop = {"ok": "end_turn", "failed": "error", "interrupted": "cancelled"}[status]
    return encode_result(Result(id=rid, status=status, stop_reason=stop, text=text))


def test_rerun_rewrites_without_superseded_torn_or_duplicate_lines(tmp_path):
    out = tmp_path / "results.jsonl"
    out.write_bytes(
        line("a", "failed", "first") + line("b", "interrupted") + line("c", "failed") + line("a", "ok", "second")
        + b'{"id": "d", "status": "ok", "stopRea'  # kill -9 mid-write
    )  # fmt: skip
    results = open_results(out, rerun={"interrupted"})
    try:
        assert {k: v.text for k, v in results.kept.items()} == {"a": "second", "c": ""}
        assert [n for n, _ in results.dropped_lines] == [5]
        assert [json.loads(x)["id"] for x in out.read_bytes().splitlines()] == ["c", "a"]
        results.append(Result(id="b", status="ok", stop_reason="end_turn", text="again"))
        assert [json.loads(x)["id"] for x in out.read_bytes().splitlines()] == ["c", "a", "b"]
        with pytest.raises(ResultsLocked):  # a second batch on the same --out is refused
            open_results(out)
    finally:
        results.close()
    again = open_results(out, rerun={"interrupted", "failed"})
    try:
        assert sorted(again.kept) == ["a", "b"]
    finally:
        again.close()


def test_an_intact_file_is_not_rewritten(tmp_path):
    out = tmp_path / "results.jsonl"
    out.write_bytes(line("a", "ok") + line("b", "failed"))
    inode = out.stat().st_ino
    results = open_results(out, rerun={"interrupted"})
    results.close()
    assert out.stat().st_ino == inode and sorted(results.kept) == ["a", "b"]
