"""The index against real JSONL logs (written by jsonl-persistence's store) and real SQLite: it
follows the logs (appends, torn tails, rewrites, deletions), is rebuilt when it is missing, corrupt
or of another schema, and the workspace rule decides what a caller may read."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from dsh_jsonl_persistence import JsonlStore
from dsh_session_query import index_for, query
from dsh_session_query.index import SCHEMA

from dsh_core.errors import ToolError
from dsh_core.types import (
    AssistantMessage,
    AssistantMessageEvent,
    CompactionSummary,
    SessionHeader,
    TextBlock,
    UserMessage,
    UserMessageEvent,
)

pytestmark = pytest.mark.anyio


def _prompt(seq: int, text: str) -> UserMessageEvent:
    return UserMessageEvent(seq=seq, time=1_700_000_000.0 + seq, message=UserMessage(id=f"m{seq}", content=[TextBlock(text=text)]))


def _answer(seq: int, text: str) -> AssistantMessageEvent:
    return AssistantMessageEvent(seq=seq, time=1_700_000_000.0 + seq, turn=1, step=1,
                                 message=AssistantMessage(id=f"a{seq}", content=[TextBlock(text=text)]))


async def _write(store: JsonlStore, sid: str, cwd: str, *events, parent: str | None = None, version: int = 1) -> None:
    log = store.open(SessionHeader(id=sid, cwd=cwd, parent_session=parent, version=version))
    for ev in events:
        log.append(ev)
    await log.close()


def _ask(index, caller, fn, args, cap=100):
    with index.connect() as conn:
        if fn in (query.session_search,):
            return fn(conn, caller, args, cap, lambda: None)
        if fn is query.event_search:
            return fn(conn, index, caller, args, cap, lambda: None)
        if fn is query.session_trace:
            return fn(conn, caller, args)
        return fn(conn, index, caller, args)


@pytest.fixture
def store(tmp_path: Path) -> JsonlStore:
    return JsonlStore(tmp_path / "sessions")


async def test_the_index_follows_appends_torn_tails_rewrites_and_deletions(store, tmp_path):
    ws = str(tmp_path / "ws")
    await _write(store, "s1", ws, _prompt(1, "alpha beta"))
    index = index_for(store.root)
    me = query.Caller(id="asker", cwd=ws)
    assert "Session s1" in _ask(index, me, query.session_search, {"query": "alpha"})
    # appended by another writer: read on from where the index stopped
    path = store.path_for("s1")
    done = sqlite3.connect(index.db_path).execute("SELECT done FROM logs WHERE id='s1'").fetchone()[0]
    assert done == path.stat().st_size
    await _write(store, "s1", ws, _answer(2, "gamma delta"))
    assert "seq 2 | assistant/message" in _ask(index, me, query.session_search, {"query": "gamma"})
    # a torn last line (a writer mid-record) is not indexed until it is whole
    with open(path, "ab") as f:
        f.write(b'{"type":"user/message","seq":3,"time":1,"message":{"id":"x","content":[{"type":"text","text":"torn epsilon"}]}}')
    assert _ask(index, me, query.session_search, {"query": "epsilon"}) == "No prior session matches found."
    with open(path, "ab") as f:
        f.write(b"\n")
    assert "seq 3 | user/message" in _ask(index, me, query.session_search, {"query": "epsilon"})
    # rewritten shorter (not an append): indexed again from the start, the old text is gone
    path.unlink()
    await _write(store, "s1", ws, _prompt(1, "zeta only"))
    assert _ask(index, me, query.session_search, {"query": "alpha"}) == "No prior session matches found."
    assert "zeta only" in _ask(index, me, query.session_search, {"query": "zeta"})
    path.unlink()  # deleted: gone from the index, and its words from the index's files
    assert _ask(index, me, query.session_search, {"query": "zeta"}) == "No prior session matches found."
    assert sqlite3.connect(index.db_path).execute("SELECT count(*) FROM events").fetchone()[0] == 0
    for f in index.db_path.parent.glob(index.db_path.name + "*"):
        assert b"zeta" not in f.read_bytes(), f


@pytest.mark.parametrize("damage", ["garbage", "old-schema", "missing"])
async def test_an_unusable_index_is_rebuilt_from_the_logs(store, tmp_path, damage):
    ws = str(tmp_path / "ws")
    await _write(store, "s1", ws, _prompt(1, "the needle"))
    index = index_for(store.root)
    me = query.Caller(id="asker", cwd=ws)
    assert "Session s1" in _ask(index, me, query.session_search, {"query": "needle"})
    if damage == "garbage":
        for suffix in ("-wal", "-shm"):
            Path(str(index.db_path) + suffix).unlink(missing_ok=True)
        index.db_path.write_bytes(b"this is not a database" * 100)
    elif damage == "old-schema":
        conn = sqlite3.connect(index.db_path)
        conn.execute(f"PRAGMA user_version={SCHEMA + 1}")
        conn.execute("DELETE FROM events_fts")  # what it says is wrong: it must not be believed
        conn.commit()
        conn.close()
    else:
        index.db_path.unlink()
    assert "Session s1" in _ask(index, me, query.session_search, {"query": "needle"})


async def test_a_caller_reads_its_workspace_and_the_children_below_it_only(store, tmp_path):
    ws, other = str(tmp_path / "ws"), str(tmp_path / "other")
    await _write(store, "top", ws, _prompt(1, "needle top"))
    await _write(store, "kid", ws, _prompt(1, "needle kid"), parent="top")
    await _write(store, "grandkid", ws, _prompt(1, "needle grandkid"), parent="kid")
    await _write(store, "foreign", other, _prompt(1, "needle foreign"))
    await _write(store, "foreign-kid", ws, _prompt(1, "needle foreign kid"), parent="foreign")  # its root: elsewhere
    await _write(store, "orphan", ws, _prompt(1, "needle orphan"), parent="deleted")  # no resumable root
    await _write(store, "sub", ws + "/sub", _prompt(1, "needle subdirectory"))  # a cwd is compared exactly
    await _write(store, "future", ws, _prompt(1, "needle future"), version=99)  # a newer log format
    index = index_for(store.root)
    me = query.Caller(id="top", cwd=ws)
    found = _ask(index, me, query.session_search, {"query": "needle"})
    assert found.startswith("Session search results (2):")
    assert "Session kid" in found and "Session grandkid" in found and "Parent: kid" in found
    for hidden in ("foreign", "orphan", "sub", "future"):
        assert f"Session {hidden} " not in found
        with pytest.raises(ToolError) as err:
            _ask(index, me, query.event_read, {"session_id": hidden, "seq": 1})
        assert err.value.code == "SESSION_QUERY_TOOL_UNAUTHORIZED"
    trace = _ask(index, query.Caller(id="kid", cwd=ws), query.session_trace, {})
    assert "Ancestors (nearest first):\n- top — needle top |" in trace
    assert "Descendants:\n- grandkid — needle grandkid |" in trace
    # the parent filter, and the root marker beside it
    only_kids = _ask(index, me, query.session_search, {"query": "needle", "parent_session_ids": ["kid", "foreign"]})
    assert only_kids.startswith("Session search results (1):") and "Session grandkid" in only_kids
    roots = _ask(index, query.Caller(id="x", cwd=ws), query.session_search, {"query": "needle", "include_root_sessions": True})
    assert roots.startswith("Session search results (1):") and "Session top" in roots


async def test_compaction_shadows_what_it_replaced_and_the_trace_says_so(store, tmp_path):
    ws = str(tmp_path / "ws")
    summary = CompactionSummary(seq=3, time=1_700_000_003.0, turn=2, step=1, reason="pressure", covered_from=0,
                                covered_to=2, retained=0,
                                message=UserMessage(id="c", source="compaction", content=[TextBlock(text="summary kiwi")]))
    await _write(store, "s", ws, _prompt(1, "kiwi asked"), _answer(2, "kiwi answered"), summary, _prompt(4, "kiwi again"))
    index = index_for(store.root)
    me = query.Caller(id="s", cwd=ws, turn=9, step=9)
    found = _ask(index, me, query.event_search, {"query": "kiwi", "surfaces": ["shadowed"]})
    assert "Event search results (2):" in found and "seq 1 | user/message | shadowed" in found
    current = _ask(index, me, query.event_search, {"query": "kiwi", "surfaces": ["current"]})
    assert "seq 3 | compaction/summary | current" in current and "seq 4 | user/message | current" in current
    trace = _ask(index, me, query.event_trace, {"seq": 1})
    assert "Replaced by: 3\nReplacement chain: 3\n" in trace
    assert _ask(index, me, query.event_trace, {"seq": 3}).splitlines()[4] == "Events replaced by target: 1, 2"


async def test_arguments_are_checked_with_the_originals_messages(store, tmp_path):
    ws = str(tmp_path / "ws")
    await _write(store, "s", ws, _prompt(1, "x"))
    index = index_for(store.root)
    me = query.Caller(id="s", cwd=ws)
    cases = [
        (query.session_search, {"query": "  "}, "SESSION_QUERY_INVALID_QUERY", "must contain non-whitespace text"),
        (query.session_search, {"query": "x", "event_seq_from": 5, "event_seq_to": 1}, "SESSION_QUERY_INVALID_FILTER",
         "session sequence range from must be less than or equal to to"),
        (query.session_search, {"query": "x", "created_at_from": "2026-01-01T00:00:00"}, "SESSION_QUERY_INVALID_FILTER",
         "ISO 8601 timestamp with Z or a numeric offset"),
        (query.session_search, {"query": "x", "session_ids": []}, "SESSION_QUERY_INVALID_FILTER",
         "session_ids must contain at least one value when supplied"),
        (query.event_read, {"seq": -1}, "SESSION_QUERY_INVALID_FILTER", "seq must be a non-negative safe integer"),
        (query.event_read, {"seq": 99}, "SESSION_QUERY_EVENT_NOT_FOUND", "session event was not found"),
    ]
    for fn, args, code, text in cases:
        with pytest.raises(ToolError) as err:
            _ask(index, me, fn, args)
        assert err.value.code == code and text in err.value.message
    ok = _ask(index, query.Caller(id="o", cwd=ws), query.session_search,
              {"query": "x", "created_at_from": "2000-01-01T00:00:00+02:00", "created_at_to": "2100-01-01T00:00:00Z"})
    assert ok.startswith("Session search results (1):")
