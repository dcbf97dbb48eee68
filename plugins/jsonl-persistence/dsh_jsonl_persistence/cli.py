"""``dsh sessions list`` and ``dsh sessions show ID``; more actions come from installed distributions
(entry point group ``dsh.sessions``: session-query's ``dsh sessions search QUERY``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from importlib.metadata import entry_points
from typing import Any

import msgspec

from dsh_core.types import (
    AssistantMessageEvent,
    JobSettled,
    JobStarted,
    ModelCallFailed,
    ReasoningBlock,
    SessionHeader,
    TextBlock,
    ToolCallBlock,
    ToolResultEvent,
    UserMessageEvent,
)

from .store import JsonlStore


def setup(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="sessions_command", metavar="ACTION")
    ls = sub.add_parser("list", help="list recorded sessions, newest first",
                        description="List recorded sessions, newest first, as `dsh ask --session-list` does: "
                                    "id, updated (UTC), cwd, title (the first prompt's first line); each "
                                    "session's subagents indented below it.")
    ls.add_argument("--json", action="store_true",
                    help="print one JSON array (sessionId, cwd, updatedAt, title, and children: the subagents')")
    show = sub.add_parser("show", help="print one session's log", description="Print one session's log.")
    show.add_argument("id", metavar="ID", help="session id (a unique prefix is enough)")
    show.add_argument("--json", action="store_true", help="print the raw JSONL lines as stored")
    for name, action in _actions().items():  # e.g. `search`, from session-query when it is installed
        action.setup(sub.add_parser(name, help=action.HELP, description=action.DESCRIPTION))


ACTIONS_GROUP = "dsh.sessions"  # entry points: more `dsh sessions <name>` actions over the same logs


def _actions() -> dict[str, Any]:
    """Installed distributions' ``dsh sessions`` actions: modules with ``HELP``, ``DESCRIPTION``,
    ``setup(parser)`` and ``run(args) -> int`` (list and show are this plugin's own)."""
    found: dict[str, Any] = {}
    for ep in entry_points(group=ACTIONS_GROUP):
        if ep.name in ("list", "show") or ep.name in found:
            continue
        try:
            found[ep.name] = ep.load()
        except Exception as exc:  # a broken add-on must not take list and show with it
            print(f"dsh: `dsh sessions {ep.name}` ({ep.value}) did not load: {exc}", file=sys.stderr)
    return found


def run(args: argparse.Namespace) -> int:
    store = JsonlStore()
    if args.sessions_command == "list":
        return _list(store, args.json)
    if args.sessions_command == "show":
        return _show(store, args.id, args.json)
    action = _actions().get(args.sessions_command) if args.sessions_command else None
    if action is not None:
        return int(action.run(args))
    print("usage: dsh sessions {list,show ID," + ",".join(_actions()) + "} [--json]", file=sys.stderr)
    return 2


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _list(store: JsonlStore, as_json: bool) -> int:
    """The recorded top-level sessions as ACP ``session/list`` shows them (and so ``dsh ask
    --session-list``): newest first, the same four fields, the same line format; each one's
    subagents below it (indented; in JSON a ``children`` array), oldest first."""
    every = store.summaries_sync(children=True)
    known = {r.id for r in every}
    below: dict[str, list[Any]] = {}
    for r in sorted(every, key=lambda r: (r.created_at, r.id)):
        if r.parent is not None and r.parent in known:
            below.setdefault(r.parent, []).append(r)

    def row(r: Any, seen: frozenset[str]) -> dict[str, Any]:
        out = {"sessionId": r.id, "cwd": r.cwd, "updatedAt": _iso(r.updated_ns), **({"title": r.title} if r.title else {})}
        kids = [row(c, seen | {c.id}) for c in below.get(r.id, []) if c.id not in seen]  # a cycle in tampered logs ends
        return {**out, "children": kids} if kids else out

    rows = [row(r, frozenset({r.id})) for r in every if r.parent is None]
    out = sys.stdout
    if as_json:
        out.write(json.dumps(rows) + "\n")
        return 0
    if not rows:
        print(f"no sessions in {store.root}", file=sys.stderr)
        return 0

    def write(r: dict[str, Any], depth: int) -> None:
        title = r.get("title", "").replace("\t", " ")
        lead = "  " * (depth - 1) + "└ " if depth else ""
        out.write(f"{lead}{r['sessionId']}\t{r['updatedAt']}\t{r['cwd']}\t{title}\n")
        for child in r.get("children", []):
            write(child, depth + 1)

    for top in rows:
        write(top, 0)
    return 0


def _show(store: JsonlStore, session_id: str, as_json: bool) -> int:
    contents = store.read_contents(session_id)  # warns on stderr about a torn tail
    if as_json:
        raw = contents.path.read_bytes()
        # Print exactly the stored complete lines (a torn tail is reported, not printed).
        end = contents.torn.offset if contents.torn is not None else len(raw)
        sys.stdout.flush()  # anything already in the text layer goes first, not after the raw bytes
        sys.stdout.buffer.write(raw[:end])
        sys.stdout.flush()
        return 0
    print(_header_line(contents.header))
    for ev in contents.events:
        print(f"#{ev.seq:<4} {_stamp(ev.time)[11:]}  {type(ev).__struct_config__.tag:<20} {_summary(ev)}")
    if contents.torn is not None:
        print(f"(torn last line: {len(contents.torn.data)} bytes skipped)")
    if contents.skipped:
        print(f"({len(contents.skipped)} record(s) of unknown type skipped)")
    return 0


def _header_line(h: SessionHeader) -> str:
    parts = [f"session {h.id}", f"created {_stamp(h.created_at)}"]
    if h.provider or h.model:
        parts.append(f"route {h.provider}/{h.model}")
    if h.cwd:
        parts.append(f"cwd {h.cwd}")
    if h.parent_session:
        parts.append(f"parent {h.parent_session} depth {h.delegation_depth}")
    return "  ".join(parts)


def _text(blocks: list[Any]) -> str:
    parts = []
    for b in blocks:
        if isinstance(b, TextBlock):
            parts.append(b.text)
        elif isinstance(b, ReasoningBlock):
            parts.append(f"[reasoning: {b.text}]")
        elif isinstance(b, ToolCallBlock):
            parts.append(f"{b.name}({b.arguments}) [{b.id}]")
        else:
            parts.append(f"[{type(b).__struct_config__.tag}]")
    return " ".join(parts)


def _short(s: str, n: int = 120) -> str:
    s = s.replace("\n", "\\n")
    return s if len(s) <= n else s[: n - 1] + "…"


def _summary(ev: Any) -> str:
    if isinstance(ev, UserMessageEvent):
        return _short(_text(ev.message.content))
    if isinstance(ev, AssistantMessageEvent):
        # one model call: what it produced, why it stopped, what it cost
        tail = f"  · {ev.finish}" + (" (interrupted)" if ev.interrupted else "")
        if ev.usage is not None:
            u = ev.usage
            tail += f" · in {u.input_tokens} (cache {u.cache_hit_tokens}) out {u.output_tokens}"
        return _short(_text(ev.message.content), 200 - len(tail)) + tail
    if isinstance(ev, ModelCallFailed):
        status = f"HTTP {ev.status}, " if ev.status is not None else ""
        kind = "retryable" if ev.retryable else "not retryable"
        return _short(f"step {ev.step} attempt {ev.attempt}: {ev.code} ({status}{kind}): {ev.message}")
    if isinstance(ev, ToolResultEvent):
        return _short(f"{ev.result.name}: {_text(ev.result.content)}")
    if isinstance(ev, JobStarted):  # a background job: what runs, and the call that started it
        return _short(f"{ev.id} {ev.kind}: {ev.title}" + (f"  [{ev.call_id}]" if ev.call_id else ""))
    if isinstance(ev, JobSettled):
        how = {"completed": f"completed (exit {ev.exit_code})"}.get(ev.status, ev.status)
        why = f": {ev.detail}" if ev.detail else ""
        return _short(f"{ev.id} {how}{why} · {ev.output_bytes} bytes of output")
    fields = msgspec.to_builtins(ev)
    for k in ("type", "seq", "time"):
        fields.pop(k, None)
    return _short(json.dumps(fields, ensure_ascii=False, separators=(",", ":")))
