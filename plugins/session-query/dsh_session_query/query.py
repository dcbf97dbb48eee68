"""The five questions, answered from the index (searches, lineage) and the logs (exact reads), with
the isolation of ``session/list`` and ``session/resume``: a caller reads only what its client could
resume — sessions recorded in the caller's cwd (the exact path, as resume compares it), in a log
format this dsh reads — and the subagent sessions below them. Everything here is synchronous
(it runs in a worker thread) and returns plain text, the original's wording.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from os import path as osp
from typing import Any

from dsh_core.errors import ToolError
from dsh_core.types import SessionHeader

from .index import MESSAGE_TYPES, LogRow, SessionIndex, event_text

LOG_FORMAT = SessionHeader(id="-").version  # the newest log format this dsh reads (as session/resume)
MAX_LINEAGE = 64  # parent links followed before a lineage is called broken
SNIPPET_TOKENS = 24
SURFACES = ("current", "shadowed", "log-only")
AVAILABILITIES = ("live", "persisted")
CAP_NOTE = "Result cap reached. Narrow the query or add filters to find additional matches."


def unauthorized() -> ToolError:
    # a missing session and another workspace's answer alike: a guess learns nothing
    return ToolError("session target is outside the caller workspace", code="SESSION_QUERY_TOOL_UNAUTHORIZED")


def invalid_filter(message: str) -> ToolError:
    return ToolError(message, code="SESSION_QUERY_INVALID_FILTER")


@dataclass
class Caller:
    """Who asks: the calling session, its workspace, and the sessions live in this process."""

    id: str
    cwd: str
    live: frozenset[str] = frozenset()
    turn: int = 0  # the calling step: a search of the caller's own session stops before it
    step: int = 0


# --------------------------------------------------------------------------- arguments


_ISO = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?(Z|[+-]\d{2}:\d{2})$")


def parse_time(name: str, value: Any) -> float:
    """A timezone-qualified ISO 8601 timestamp as epoch seconds (the logs' unit)."""
    if not isinstance(value, str) or (m := _ISO.match(value)) is None:
        raise invalid_filter(f"session {name} range must be an ISO 8601 timestamp with Z or a numeric offset")
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    frac = m.group(7)
    if frac is not None and len(frac) > 6:  # fromisoformat takes microseconds at most
        text = text.replace("." + frac, "." + frac[:6])
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise invalid_filter(f"session {name} range must be a valid ISO 8601 timestamp") from None


def time_range(name: str, lo: Any, hi: Any) -> tuple[float | None, float | None]:
    a = parse_time(f"{name}_from", lo) if lo is not None else None
    b = parse_time(f"{name}_to", hi) if hi is not None else None
    if a is not None and b is not None and a > b:
        raise invalid_filter(f"session {name} range from must be less than or equal to to")
    return a, b


def non_negative(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value > 2**53 - 1:
        raise invalid_filter(f"{name} must be a non-negative safe integer")
    return value


def seq_range(lo: Any, hi: Any) -> tuple[int | None, int | None]:
    a = non_negative("sequence lower bound", lo) if lo is not None else None
    b = non_negative("sequence upper bound", hi) if hi is not None else None
    if a is not None and b is not None and a > b:
        raise invalid_filter("session sequence range from must be less than or equal to to")
    return a, b


def non_empty_list(name: str, value: Any, allowed: tuple[str, ...] | None = None) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise invalid_filter(f"{name} must contain at least one value when supplied")
    if not all(isinstance(v, str) for v in value):
        raise invalid_filter(f"{name} must be an array of strings")
    if allowed is not None:
        bad = [v for v in value if v not in allowed]
        if bad:
            raise invalid_filter(f"{name} accepts only {', '.join(allowed)} (not {', '.join(map(str, bad))})")
    return list(dict.fromkeys(value))


def normalize_query(value: Any) -> str:
    query = " ".join(value.split()) if isinstance(value, str) else ""
    if not query:
        raise ToolError("session-search query must contain non-whitespace text", code="SESSION_QUERY_INVALID_QUERY")
    if "\0" in query:
        raise ToolError("session-search query must not contain NUL", code="SESSION_QUERY_INVALID_QUERY")
    return query


def fts_phrase(query: str) -> str:
    """The literal query as one FTS5 phrase (no operators, no column filters)."""
    return '"' + query.replace('"', '""') + '"'


@dataclass
class EventFilters:
    seq: tuple[int | None, int | None] = (None, None)
    time: tuple[float | None, float | None] = (None, None)
    types: list[str] | None = None
    surfaces: list[str] | None = None

    def sql(self, alias: str = "e") -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for col, (lo, hi) in (("seq", self.seq), ("time", self.time)):
            if lo is not None:
                clauses.append(f"{alias}.{col} >= ?")
                params.append(lo)
            if hi is not None:
                clauses.append(f"{alias}.{col} <= ?")
                params.append(hi)
        for col, values in (("type", self.types), ("surface", self.surfaces)):
            if values is not None:
                clauses.append(f"{alias}.{col} IN ({', '.join('?' * len(values))})")
                params.extend(values)
        return "".join(f" AND {c}" for c in clauses), params


# --------------------------------------------------------------------------- formatting


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _title(row: LogRow | None) -> str:
    return row.title if row is not None and row.title else "untitled"


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------- the workspace


@dataclass
class Workspace:
    """The index's logs as one caller may see them."""

    caller: Caller
    rows: dict[str, LogRow]
    _ok: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def load(cls, conn: sqlite3.Connection, caller: Caller) -> Workspace:
        return cls(caller, {r.id: r for r in SessionIndex.log_rows(conn)})

    def readable(self, sid: str) -> bool:
        """The caller itself; else a session of the caller's cwd, in a log format this dsh reads,
        that is top-level (its client could resume it) or below such a session."""
        if sid in self._ok:
            return self._ok[sid]
        row = self.rows.get(sid)
        ok = False
        if sid == self.caller.id:
            ok = True  # its own log, whatever it says
        elif row is not None and osp.normpath(row.cwd or "/") == self.caller.cwd and row.version <= LOG_FORMAT:
            ok = self._root_resumable(row)
        self._ok[sid] = ok
        return ok

    def _root_resumable(self, row: LogRow) -> bool:
        seen = {row.id}
        while row.parent is not None:
            parent = self.rows.get(row.parent)
            if parent is None or parent.id in seen or len(seen) > MAX_LINEAGE:
                return False
            if osp.normpath(parent.cwd or "/") != self.caller.cwd or parent.version > LOG_FORMAT:
                return False
            seen.add(parent.id)
            row = parent
        return True

    def target(self, session_id: Any) -> str:
        if session_id is None:
            return self.caller.id
        if not isinstance(session_id, str) or not self.readable(session_id):
            raise unauthorized()
        if session_id not in self.rows and session_id != self.caller.id:
            raise unauthorized()
        return session_id

    def availability(self, sid: str) -> str:
        parts = [p for p, on in (("live", sid in self.caller.live), ("persisted", sid in self.rows)) if on]
        return ", ".join(parts) or "unavailable"

    def children(self, sid: str) -> list[LogRow]:
        return sorted((r for r in self.rows.values() if r.parent == sid), key=lambda r: (r.created_at, r.id))

    def header(self, sid: str) -> str:
        return f"Session {sid} — {_title(self.rows.get(sid))}"


# --------------------------------------------------------------------------- the five questions


@dataclass
class SessionFilters:
    """session_search's session-level filters, checked as the original checks them."""

    ids: list[str] | None
    created: tuple[float | None, float | None]
    parents: list[str] | None
    roots: bool
    availability: list[str] | None

    @classmethod
    def parse(cls, args: dict[str, Any]) -> SessionFilters:
        roots = args.get("include_root_sessions")
        if roots is not None and not isinstance(roots, bool):
            raise invalid_filter("include_root_sessions must be true or false")
        return cls(ids=non_empty_list("session_ids", args.get("session_ids")),
                   created=time_range("created_at", args.get("created_at_from"), args.get("created_at_to")),
                   parents=non_empty_list("parent_session_ids", args.get("parent_session_ids")),
                   roots=roots is True,
                   availability=non_empty_list("availability", args.get("availability"), AVAILABILITIES))

    def sql(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if self.ids is not None:
            clauses.append(f"e.session IN ({', '.join('?' * len(self.ids))})")
            params += self.ids
        for op, bound in ((">=", self.created[0]), ("<=", self.created[1])):
            if bound is not None:
                clauses.append(f"l.created_at {op} ?")
                params.append(bound)
        return "".join(f" AND {c}" for c in clauses), params

    def allowed_parents(self, ws: Workspace) -> set[str | None] | None:
        """The parents a hit may have (None: any); unreadable ids drop out as missing ones do."""
        if self.parents is None and not self.roots:
            return None
        allowed: set[str | None] = {p for p in self.parents or () if ws.readable(p) and p in ws.rows}
        if self.roots:
            allowed.add(None)
        return allowed

    def keep(self, ws: Workspace, sid: str, parents: set[str | None] | None) -> bool:
        if parents is not None and ws.rows[sid].parent not in parents:
            return False
        return self.availability is None or any(a in ws.availability(sid) for a in self.availability)


def session_search(conn: sqlite3.Connection, caller: Caller, args: dict[str, Any], cap: int,
                   deadline: Callable[[], None]) -> str:
    query = normalize_query(args.get("query"))
    sessions = SessionFilters.parse(args)
    filters = EventFilters(
        seq=seq_range(args.get("event_seq_from"), args.get("event_seq_to")),
        time=time_range("time", args.get("event_time_from"), args.get("event_time_to")),
        types=non_empty_list("event_types", args.get("event_types")),
        surfaces=non_empty_list("event_surfaces", args.get("event_surfaces"), SURFACES),
    )
    ws = Workspace.load(conn, caller)
    parents = sessions.allowed_parents(ws)
    if parents is not None and not parents:
        return "No prior session matches found."
    where, params = filters.sql()
    session_where, session_params = sessions.sql()
    sql = ("SELECT e.session, e.seq, e.type, e.surface, e.time, "
           f"snippet(events_fts, 0, '', '', '…', {SNIPPET_TOKENS}) "
           "FROM events_fts JOIN events e ON e.rowid = events_fts.rowid JOIN logs l ON l.id = e.session "
           "WHERE events_fts MATCH ? AND l.cwd = ? AND e.session != ?" + where + session_where
           + " ORDER BY bm25(events_fts), e.session, e.seq")
    sql_params: list[Any] = [fts_phrase(query), caller.cwd, caller.id, *params, *session_params]
    best: dict[str, tuple[Any, ...]] = {}
    capped = False
    for n, hit in enumerate(conn.execute(sql, sql_params)):
        if n % 512 == 0:
            deadline()
        sid = hit[0]
        if sid in best or not ws.readable(sid) or not sessions.keep(ws, sid, parents):
            continue
        if len(best) == cap:
            capped = True
            break
        best[sid] = hit
    if not best:
        return "No prior session matches found."
    lines = [f"Session search results ({len(best)}):"]
    for i, (sid, hit) in enumerate(best.items(), 1):
        row = ws.rows[sid]
        parent = "root" if row.parent is None else row.parent if ws.readable(row.parent) else "[outside workspace]"
        lines += [
            "",
            f"{i}. {ws.header(sid)}",
            f"   Created: {iso(row.created_at)}",
            f"   Parent: {parent}",
            f"   Availability: {ws.availability(sid)}",
            f"   Best match: seq {hit[1]} | {hit[2]} | {hit[3]} | {iso(hit[4])}",
            f"   Snippet: {_one_line(hit[5])}",
        ]
    if capped:
        lines += ["", CAP_NOTE]
    return "\n".join(lines)


def _step_start(index: SessionIndex, caller: Caller) -> int | None:
    """The seq of the calling step's assistant message (its request and what came before stay)."""
    for rec in index.read_lines(caller.id)[1:]:
        if rec.get("type") == "assistant/message" and rec.get("turn") == caller.turn and rec.get("step") == caller.step:
            return rec.get("seq") if isinstance(rec.get("seq"), int) else None
    return None


def event_search(conn: sqlite3.Connection, index: SessionIndex, caller: Caller, args: dict[str, Any], cap: int,
                 deadline: Callable[[], None]) -> str:
    ws = Workspace.load(conn, caller)
    sid = ws.target(args.get("session_id"))
    query = normalize_query(args.get("query"))
    lo, hi = seq_range(args.get("seq_from"), args.get("seq_to"))
    if sid == caller.id:  # never the step that is asking (its own call cannot match itself)
        step_from = _step_start(index, caller)
        if step_from is not None:
            hi = step_from - 1 if hi is None else min(hi, step_from - 1)
    filters = EventFilters(
        seq=(lo, hi),
        time=time_range("time", args.get("time_from"), args.get("time_to")),
        types=non_empty_list("event_types", args.get("event_types")),
        surfaces=non_empty_list("surfaces", args.get("surfaces"), SURFACES),
    )
    lines = [ws.header(sid)]
    if lo is not None and hi is not None and lo > hi:
        return "\n".join([*lines, "", "No prior event matches found."])
    where, params = filters.sql()
    rows = conn.execute(
        "SELECT e.seq, e.type, e.surface, e.time, "
        f"snippet(events_fts, 0, '', '', '…', {SNIPPET_TOKENS}) "
        "FROM events_fts JOIN events e ON e.rowid = events_fts.rowid "
        "WHERE events_fts MATCH ? AND e.session = ?" + where + " ORDER BY bm25(events_fts), e.seq LIMIT ?",
        [fts_phrase(query), sid, *params, cap + 1]).fetchall()
    deadline()
    if not rows:
        return "\n".join([*lines, "", "No prior event matches found."])
    shown = rows[:cap]
    lines += ["", f"Event search results ({len(shown)}):"]
    for i, (seq, kind, surface, t, snippet) in enumerate(shown, 1):
        lines += [f"{i}. seq {seq} | {kind} | {surface} | {iso(t)}", f"   Snippet: {_one_line(snippet)}"]
    if len(rows) > cap:
        lines += ["", CAP_NOTE]
    return "\n".join(lines)


def session_trace(conn: sqlite3.Connection, caller: Caller, args: dict[str, Any]) -> str:
    ws = Workspace.load(conn, caller)
    sid = ws.target(args.get("session_id"))
    row = ws.rows.get(sid)
    lines = [ws.header(sid), f"Created: {iso(row.created_at) if row else '(not yet logged)'}",
             f"Availability: {ws.availability(sid)}", "", "Ancestors (nearest first):"]
    ancestors, boundary, seen = [], False, {sid}
    parent = row.parent if row else None
    while parent is not None:
        p = ws.rows.get(parent)
        if p is None or parent in seen or not ws.readable(parent) or len(seen) > MAX_LINEAGE:
            boundary = True
            break
        ancestors.append(p)
        seen.add(parent)
        parent = p.parent
    if not ancestors and not boundary:
        lines.append("- none (target is a root session)")
    for a in ancestors:
        lines.append(f"- {a.id} — {_title(a)} | {iso(a.created_at)} | {ws.availability(a.id)}")
    if boundary:
        lines.append("- [outside workspace boundary]")
    lines += ["", "Descendants:"]
    below: list[str] = []

    def walk(of: str, depth: int) -> None:
        for child in ws.children(of):
            indent = "  " * depth
            if child.id in seen:
                continue
            seen.add(child.id)
            if not ws.readable(child.id):
                below.append(f"{indent}- [outside workspace subtree]")
                continue
            below.append(f"{indent}- {child.id} — {_title(child)} | {iso(child.created_at)} | "
                         f"{ws.availability(child.id)}")
            walk(child.id, depth + 1)

    walk(sid, 0)
    lines += below or ["- none"]
    return "\n".join(lines)


def shown_record(rec: dict[str, Any]) -> dict[str, Any]:
    """A logged record as the model reads it: every field as stored, in the stored order, but its
    time (epoch seconds, a float whose printed length varies) as ISO 8601 UTC to the millisecond."""
    t = rec.get("time")
    return {**rec, "time": iso(float(t))} if isinstance(t, (int, float)) and not isinstance(t, bool) else rec


def _records(index: SessionIndex, sid: str) -> list[dict[str, Any]]:
    try:
        return index.read_lines(sid)[1:]
    except FileNotFoundError:
        raise ToolError("session was not found", code="SESSION_QUERY_SESSION_NOT_FOUND") from None


def _find(records: list[dict[str, Any]], seq: int) -> int:
    for i, rec in enumerate(records):
        if rec.get("seq") == seq:
            return i
    raise ToolError("session event was not found", code="SESSION_QUERY_EVENT_NOT_FOUND")


def _surface(conn: sqlite3.Connection, sid: str, seq: int) -> str:
    row = conn.execute("SELECT surface FROM events WHERE session = ? AND seq = ?", (sid, seq)).fetchone()
    return row[0] if row else "log-only"


def event_read(conn: sqlite3.Connection, index: SessionIndex, caller: Caller, args: dict[str, Any]) -> str:
    seq = non_negative("seq", args.get("seq"))
    before = non_negative("before", args["before"]) if args.get("before") is not None else 0
    after = non_negative("after", args["after"]) if args.get("after") is not None else 0
    ws = Workspace.load(conn, caller)
    sid = ws.target(args.get("session_id"))
    records = _records(index, sid)
    at = _find(records, seq)
    lines = [ws.header(sid), f"Target event seq {seq}:", "```json",
             json.dumps(shown_record(records[at]), indent=2, ensure_ascii=False), "```"]
    for title, window in (("Before:", records[max(0, at - before):at]), ("After:", records[at + 1:at + 1 + after])):
        if not window:
            continue
        lines += ["", title]
        for rec in window:
            text = event_text(rec)
            head = f"- seq {rec.get('seq')} | {rec.get('type')} | {iso(float(rec.get('time') or 0))}"
            lines.append(head + (" | (no semantic text)" if not text else "\n  " + text.replace("\n", "\n  ")))
    return "\n".join(lines)


@dataclass
class _Links:
    """The ids a log links events by, gathered in log order."""

    by_call: dict[str, int] = field(default_factory=dict)  # call id -> its tool/call event
    call_msg: dict[str, int] = field(default_factory=dict)  # call id -> the assistant/message that made it
    by_msg_id: dict[str, int] = field(default_factory=dict)  # message id -> its user/message event
    jobs: dict[str, int] = field(default_factory=dict)  # job id -> its job/started event

    def sources(self, rec: dict[str, Any], seq: int) -> set[int]:
        """What ``rec`` cites (and, as a side effect, what later events may cite it by)."""
        kind = rec.get("type")
        message = rec.get("message")
        msg: dict[str, Any] = message if isinstance(message, dict) else {}
        call = rec.get("callId")
        if kind == "user/message" and isinstance(msg.get("id"), str):
            self.by_msg_id[msg["id"]] = seq
        elif kind == "assistant/message":
            for block in msg.get("content") or ():
                if isinstance(block, dict) and block.get("type") == "tool-call" and isinstance(block.get("id"), str):
                    self.call_msg[block["id"]] = seq
        elif kind == "agent/inbox/claimed":
            return {self.by_msg_id[m] for m in rec.get("messageIds") or () if m in self.by_msg_id}
        elif kind == "tool/call" and isinstance(call, str):
            self.by_call[call] = seq
            return {self.call_msg[call]} if call in self.call_msg else set()
        elif kind == "tool/result":
            result_call = (rec.get("result") or {}).get("callId")
            return {self.by_call[result_call]} if result_call in self.by_call else set()
        elif kind == "job/started" and isinstance(rec.get("id"), str):
            self.jobs[rec["id"]] = seq
            return {self.by_call[call]} if call in self.by_call else set()
        elif kind == "job/settled" and rec.get("id") in self.jobs:
            return {self.jobs[rec["id"]]}
        return set()


def _relations(records: list[dict[str, Any]]) -> tuple[dict[int, set[int]], dict[int, int], dict[int, list[int]]]:
    """Which events cite which (a tool call its assistant message, a result its call, a claim its
    prompts, a settled job its start), and which a compaction replaced."""
    sources: dict[int, set[int]] = {}
    replaced_by: dict[int, int] = {}
    replaced: dict[int, list[int]] = {}
    links = _Links()
    history: list[int] = []
    for rec in records:
        seq, kind = rec.get("seq"), rec.get("type")
        if not isinstance(seq, int):
            continue
        cited = links.sources(rec, seq)
        if cited:
            sources[seq] = cited
        if kind in MESSAGE_TYPES:
            history.append(seq)
        elif kind == "compaction/summary":
            lo, hi = rec.get("coveredFrom"), rec.get("coveredTo")
            if isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= len(history):
                replaced[seq] = history[lo:hi]
                for s in history[lo:hi]:
                    replaced_by[s] = seq
                history[lo:hi] = [seq]
    return sources, replaced_by, replaced


def event_trace(conn: sqlite3.Connection, index: SessionIndex, caller: Caller, args: dict[str, Any]) -> str:
    seq = non_negative("seq", args.get("seq"))
    ws = Workspace.load(conn, caller)
    sid = ws.target(args.get("session_id"))
    records = _records(index, sid)
    target = records[_find(records, seq)]
    sources, replaced_by, replaced = _relations(records)
    chain: list[int] = []
    at = seq
    while at in replaced_by and len(chain) < len(records):
        at = replaced_by[at]
        chain.append(at)

    def seqs(values: Any) -> str:
        values = sorted(values)
        return ", ".join(map(str, values)) if values else "none"

    derived = [s for s, src in sources.items() if seq in src]
    return "\n".join([
        ws.header(sid),
        f"Target: seq {seq} | {target.get('type')} | {_surface(conn, sid, seq)} | {iso(float(target.get('time') or 0))}",
        f"Replaced by: {replaced_by.get(seq, 'none')}",
        f"Replacement chain: {seqs(chain)}",
        f"Events replaced by target: {seqs(replaced.get(seq, []))}",
        f"Events cited directly as sources: {seqs(sources.get(seq, set()))}",
        f"Direct derived events: {seqs(derived)}",
    ])


def people_search(conn: sqlite3.Connection, text: str, *, cwd: str | None, limit: int) -> list[dict[str, Any]]:
    """``dsh sessions search``: a person's own logs, every workspace (or one ``cwd``), subagents'
    sessions too, the best-matching event of each session, best first."""
    sql = ("SELECT e.session, e.seq, e.type, e.time, l.cwd, l.parent, l.created_at, COALESCE(l.titled, l.first_prompt), "
           f"snippet(events_fts, 0, '', '', '…', {SNIPPET_TOKENS}) "
           "FROM events_fts JOIN events e ON e.rowid = events_fts.rowid JOIN logs l ON l.id = e.session "
           "WHERE events_fts MATCH ?")
    params: list[Any] = [fts_phrase(normalize_query(text))]
    if cwd is not None:
        sql += " AND l.cwd = ?"
        params.append(cwd)
    out: dict[str, dict[str, Any]] = {}
    for sid, seq, kind, t, where, parent, created, title, snippet in conn.execute(
            sql + " ORDER BY bm25(events_fts), e.session, e.seq", params):
        if sid in out:
            continue
        out[sid] = {"sessionId": sid, "cwd": where, "createdAt": iso(created), "title": title, "parent": parent,
                    "seq": seq, "type": kind, "time": iso(t), "snippet": _one_line(snippet)}
        if len(out) >= limit:
            break
    return list(out.values())
