"""The search index over the JSONL session logs: SQLite FTS5, derived from the logs and nothing else.

The logs (``<sessions>/<id>.jsonl``, jsonl-persistence) stay the source of truth. The index is a
cache of them that every query first brings up to date (``SessionIndex.refresh``): each log's
size, mtime and inode are compared with what was indexed; a log that grew is read from where the
index stopped (its complete lines only: a torn tail waits for the writer), a log that shrank or
was replaced is indexed again from its start, a log that is gone is dropped. A missing,
unreadable or older-schema index file is rebuilt from the logs. So the index can lag the logs by
nothing that a query sees, and it can never say what the logs do not.

Exact reads (``read_lines``) never go through the index: they parse the log itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1  # PRAGMA user_version of an index this code writes; any other is rebuilt
SUFFIX = ".jsonl"
TEXT_MAX = 100_000  # characters of one event's text that are searchable
TITLE_MAX = 100  # as jsonl-persistence's session/list titles
MESSAGE_TYPES = ("user/message", "assistant/message", "tool/result")
# ids, and the route every model message repeats (a request header's own route stays searchable)
_SKIP_KEYS = frozenset({"type", "id", "callId", "messageIds", "seq", "time", "provider", "model", "source"})
TITLE_SOURCES = ("user", "delegation")  # a client's prompt, or the task a parent gave its subagent


@dataclass(frozen=True)
class LogRow:
    """One indexed log: its header fields and title."""

    id: str
    cwd: str
    parent: str | None
    created_at: float
    version: int
    title: str | None


def _leaves(value: Any, out: list[str], budget: list[int]) -> None:
    if budget[0] <= 0:
        return
    if isinstance(value, str):
        if value:
            out.append(value)
            budget[0] -= len(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k not in _SKIP_KEYS:
                _leaves(v, out, budget)
    elif isinstance(value, list):
        for v in value:
            _leaves(v, out, budget)


def event_text(record: dict[str, Any]) -> str:
    """The searchable text of one logged event: every string in it (a message's text, reasoning,
    tool calls with their arguments, tool results, errors, notes) but ids and the route a model
    message repeats; of a request header only its route (provider, model, reason)."""
    if record.get("type") == "request/header":  # its system prompt and tool schemas repeat in every session
        return f"{record.get('provider', '')} {record.get('model', '')} {record.get('reason', '')}".strip()
    out: list[str] = []
    _leaves(record, out, [TEXT_MAX])
    return "\n".join(out)[:TEXT_MAX]


def prompt_title(record: dict[str, Any]) -> str | None:
    """The first line of a client's prompt, or of a subagent's task (``TITLE_SOURCES``)."""
    message = record.get("message")
    if not isinstance(message, dict) or message.get("source", "user") not in TITLE_SOURCES:
        return None
    for block in message.get("content") or ():
        text = block.get("text") if isinstance(block, dict) else None
        if isinstance(text, str) and text.strip():
            first = text.strip().splitlines()[0].strip()
            return first if len(first) <= TITLE_MAX else first[: TITLE_MAX - 1] + "…"
    return None


_DDL = (
    "CREATE TABLE logs(id TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ino INTEGER NOT NULL, "
    "done INTEGER NOT NULL, cwd TEXT NOT NULL, parent TEXT, created_at REAL NOT NULL, version INTEGER NOT NULL, "
    "first_prompt TEXT, titled TEXT, history TEXT NOT NULL)",
    "CREATE INDEX logs_cwd ON logs(cwd)",
    "CREATE INDEX logs_parent ON logs(parent)",
    "CREATE TABLE events(rowid INTEGER PRIMARY KEY, session TEXT NOT NULL, seq INTEGER NOT NULL, "
    "type TEXT NOT NULL, time REAL NOT NULL, surface TEXT NOT NULL)",
    "CREATE INDEX events_session ON events(session, seq)",
    "CREATE VIRTUAL TABLE events_fts USING fts5(text, tokenize='unicode61 remove_diacritics 2')",
)


@dataclass
class _Walk:
    """What reading a log's lines in order keeps: the model history as seqs (to tell current from
    shadowed), the first prompt's line and the last written title; carried across appends."""

    history: list[int]
    first: str | None
    titled: str | None
    shadowed: list[int] = field(default_factory=list)

    def surface(self, kind: str, seq: int, rec: dict[str, Any]) -> str:
        if kind in MESSAGE_TYPES:
            self.history.append(seq)
            return "current"
        if kind == "compaction/summary":
            lo, hi = rec.get("coveredFrom"), rec.get("coveredTo")
            if isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= len(self.history):
                self.shadowed.extend(self.history[lo:hi])
                self.history[lo:hi] = [seq]
                return "current"
        return "log-only"

    def lines(self, data: bytes, pos: int) -> tuple[list[tuple[int, str, float, str]], list[str], int]:
        """The events of the complete lines of ``data`` from ``pos``, their texts, and where the
        complete lines end."""
        events, texts = [], []
        while (nl := data.find(b"\n", pos)) >= 0:
            line, pos = data[pos:nl], nl + 1
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # not JSON (a torn line cut by a later writer): jsonl-persistence reports it
            if not isinstance(rec, dict) or not isinstance(rec.get("seq"), int) or not isinstance(rec.get("type"), str):
                continue
            kind, seq = rec["type"], rec["seq"]
            surface = self.surface(kind, seq, rec)
            if kind == "user/message" and self.first is None:
                self.first = prompt_title(rec)
            elif kind == "session/titled" and isinstance(rec.get("title"), str) and rec["title"].strip():
                self.titled = rec["title"]
            t = rec.get("time")
            events.append((seq, kind, float(t) if isinstance(t, (int, float)) else 0.0, surface))
            texts.append(event_text(rec))
        return events, texts, pos


class IndexUnavailable(Exception):
    """The index file cannot be opened or written (and could not be rebuilt)."""


class SessionIndex:
    """``SessionIndex(sessions_root, db_path)``: one connection, used by one thread at a time
    (``connect``), so it is safe from worker threads; several dsh processes share the file through
    SQLite's locks (WAL)."""

    def __init__(self, sessions_root: Path, db_path: Path) -> None:
        self.root = sessions_root
        self.db_path = db_path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ connection and schema

    def _open(self) -> sqlite3.Connection:
        self.db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        conn = sqlite3.connect(self.db_path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA secure_delete=ON")  # a deleted session's text is overwritten, not left in free pages
            if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA:
                self._create(conn)
            with contextlib.suppress(OSError):
                os.chmod(self.db_path, 0o600)
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _create(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA:  # another process made it
                conn.execute("COMMIT")
                return
            for (name, kind) in conn.execute("SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
                                             "AND name NOT LIKE 'sqlite_%' AND name NOT LIKE 'events_fts_%'").fetchall():
                conn.execute(f'DROP {"VIEW" if kind == "view" else "TABLE"} IF EXISTS "{name}"')
            for statement in _DDL:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version={SCHEMA}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """The index's connection, up to date with the logs (rebuilt if it was unusable), held
        exclusively for the ``with`` block. One connection is kept open between queries: closing
        the last one checkpoints the WAL with an fsync (~10-30 ms here), more than a query costs."""
        with self._lock:
            try:
                conn = self._ensure()
                try:
                    self.refresh(conn)
                except sqlite3.DatabaseError as exc:
                    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                        raise IndexUnavailable(f"{self.db_path}: {exc}") from None
                    self._drop_connection()
                    self._discard()  # a corrupt index: rebuilt from the logs
                    conn = self._ensure()
                    self.refresh(conn)
            except (sqlite3.DatabaseError, OSError) as exc:
                self._drop_connection()
                raise IndexUnavailable(f"{self.db_path}: {exc}") from None
            try:
                yield conn
            except sqlite3.DatabaseError:
                self._drop_connection()
                raise

    def _ensure(self) -> sqlite3.Connection:
        if self._conn is not None and self.db_path.exists():
            if self._conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA:  # another dsh changed it
                self._create(self._conn)
            return self._conn
        self._drop_connection()  # the file was removed under it: start over
        try:
            self._conn = self._open()
        except sqlite3.DatabaseError:
            self._discard()
            self._conn = self._open()
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._drop_connection()

    def _discard(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(self.db_path) + suffix)

    # ------------------------------------------------------------------ bringing it up to date

    def _logs_on_disk(self) -> dict[str, os.stat_result]:
        out: dict[str, os.stat_result] = {}
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return out
        for entry in entries:
            if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry.is_file(follow_symlinks=False):
                    out[entry.name[: -len(SUFFIX)]] = st
        return out

    def refresh(self, conn: sqlite3.Connection) -> int:
        """Bring the index up to date with the logs; returns how many logs were (re)read."""
        disk = self._logs_on_disk()
        known = {row[0]: row[1:] for row in conn.execute("SELECT id, size, mtime_ns, ino, done FROM logs")}
        stale = [sid for sid, st in disk.items()
                 if known.get(sid, (None,))[:3] != (st.st_size, st.st_mtime_ns, st.st_ino)]
        gone = [sid for sid in known if sid not in disk]
        if not stale and not gone:
            return 0
        conn.execute("BEGIN IMMEDIATE")
        try:
            for sid in gone:
                self._drop(conn, sid)
            for sid in stale:
                self._index_log(conn, sid, disk[sid], known.get(sid))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if gone:  # a deleted session (session/delete): its words leave the index's segments and the WAL too
            conn.execute("INSERT INTO events_fts(events_fts) VALUES ('optimize')")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return len(stale)

    @staticmethod
    def _drop(conn: sqlite3.Connection, sid: str) -> None:
        conn.execute("DELETE FROM events_fts WHERE rowid IN (SELECT rowid FROM events WHERE session = ?)", (sid,))
        conn.execute("DELETE FROM events WHERE session = ?", (sid,))
        conn.execute("DELETE FROM logs WHERE id = ?", (sid,))

    def _index_log(self, conn: sqlite3.Connection, sid: str, st: os.stat_result, known: tuple[Any, ...] | None) -> None:
        row = conn.execute("SELECT done, history, first_prompt, titled FROM logs WHERE id = ?", (sid,)).fetchone()
        # Appended to since it was indexed (the same file, grown): read on from where the index stopped.
        grown = row is not None and known is not None and known[2] == st.st_ino and st.st_size >= row[0]
        start = row[0] if grown else 0
        try:
            with open(self.root / (sid + SUFFIX), "rb") as f:
                f.seek(start)
                data = f.read(max(0, st.st_size - start))
        except OSError:
            return
        if grown:
            walk, pos = _Walk(json.loads(row[1]), row[2], row[3]), 0
        else:
            self._drop(conn, sid)
            header_end = self._add_header(conn, sid, st, data)
            if header_end is None:
                return  # no whole header yet: looked at again when the file changes
            walk, pos = _Walk([], None, None), header_end
        events, texts, pos = walk.lines(data, pos)
        for (seq, kind, t, surface), text in zip(events, texts, strict=True):
            cur = conn.execute("INSERT INTO events(session, seq, type, time, surface) VALUES (?, ?, ?, ?, ?)",
                               (sid, seq, kind, t, surface))
            conn.execute("INSERT INTO events_fts(rowid, text) VALUES (?, ?)", (cur.lastrowid, text))
        if walk.shadowed:
            conn.executemany("UPDATE events SET surface = 'shadowed' WHERE session = ? AND seq = ?",
                             [(sid, s) for s in walk.shadowed])
        conn.execute("UPDATE logs SET size = ?, mtime_ns = ?, ino = ?, done = ?, first_prompt = ?, titled = ?, "
                     "history = ? WHERE id = ?",
                     (st.st_size, st.st_mtime_ns, st.st_ino, start + pos, walk.first, walk.titled,
                      json.dumps(walk.history), sid))

    @staticmethod
    def _add_header(conn: sqlite3.Connection, sid: str, st: os.stat_result, data: bytes) -> int | None:
        """Index a log's header line; where its events begin (None: no whole header of this id)."""
        end = data.find(b"\n")
        if end < 0:
            return None
        try:
            header = json.loads(data[:end])
        except ValueError:
            return None
        if not isinstance(header, dict) or header.get("type") != "session" or header.get("id") != sid:
            return None
        conn.execute(
            "INSERT INTO logs(id, size, mtime_ns, ino, done, cwd, parent, created_at, version, first_prompt, "
            "titled, history) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, '[]')",
            (sid, st.st_size, st.st_mtime_ns, st.st_ino, end + 1, str(header.get("cwd") or ""),
             header.get("parentSession"), float(header.get("createdAt") or 0), int(header.get("version") or 1)))
        return end + 1

    # ------------------------------------------------------------------ questions

    @staticmethod
    def log_rows(conn: sqlite3.Connection, where: str = "", params: tuple[Any, ...] = ()) -> list[LogRow]:
        sql = "SELECT id, cwd, parent, created_at, version, COALESCE(titled, first_prompt) FROM logs"
        return [LogRow(*r) for r in conn.execute(sql + (f" WHERE {where}" if where else ""), params)]

    def read_lines(self, sid: str) -> list[dict[str, Any]]:
        """Every complete record of one log, the header first, as stored (key order kept)."""
        path = self.root / (sid + SUFFIX)
        out: list[dict[str, Any]] = []
        with open(path, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    break
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
        return out
