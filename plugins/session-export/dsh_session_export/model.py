"""A recorded session (and its subagents' sessions) as plain data for a page: rows in log order
(turn heads, prompts, thoughts, answers, model calls, tool calls with their results, approvals,
diffs and children, and marks where a compaction, a cancel or an error happened) and the totals.

Both renderers read this one shape: the HTML page carries it as a JSON island its script draws
lazily, the Markdown template walks it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dsh_core.types import (
    AgentError,
    ApprovalAsked,
    ApprovalDecided,
    AssistantMessageEvent,
    CodeDispatch,
    CompactionFailed,
    CompactionStart,
    CompactionSummary,
    ContentBlock,
    HistoryForked,
    HookResult,
    ImageBlock,
    InboxDropped,
    JobSettled,
    JobStarted,
    McpFailed,
    ModelCallFailed,
    ReasoningBlock,
    RetryEvent,
    SessionHeader,
    SessionTitled,
    SettingsChanged,
    SubagentStarted,
    TextBlock,
    ToolCallBlock,
    ToolCallEvent,
    ToolResultEvent,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessageEvent,
)

from .diffs import FileTexts, change_of
from .pricing import Prices

MAX_DEPTH = 8  # subagents of subagents…: a tampered log's cycle ends here


@dataclass
class Totals:
    turns: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    input: int = 0
    output: int = 0
    cached: int = 0
    cost: dict[str, float] = field(default_factory=dict)  # currency → amount
    unpriced: int = 0  # model calls with usage the provider could not price

    def add_usage(self, usage: Usage | None, cost: Any) -> None:
        if usage is None:
            return
        self.input += usage.input_tokens
        self.output += usage.output_tokens
        self.cached += usage.cache_hit_tokens
        if cost is None:
            self.unpriced += 1
        else:
            self.cost[cost.currency] = self.cost.get(cost.currency, 0.0) + cost.amount

    def absorb(self, other: Totals) -> None:
        for name in ("model_calls", "tool_calls", "errors", "input", "output", "cached", "unpriced"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for cur, amount in other.cost.items():
            self.cost[cur] = self.cost.get(cur, 0.0) + amount

    def data(self) -> dict[str, Any]:
        return {"turns": self.turns, "modelCalls": self.model_calls, "toolCalls": self.tool_calls,
                "errors": self.errors, "seconds": round(self.seconds, 3), "input": self.input,
                "output": self.output, "cached": self.cached, "cost": money(self.cost),
                "unpriced": self.unpriced}


def money(cost: dict[str, float]) -> str:
    if not cost:
        return ""
    return " + ".join(f"{amount:.6f} {cur}" for cur, amount in sorted(cost.items()))


def text_of(blocks: list[ContentBlock]) -> str:
    parts = []
    for b in blocks:
        if isinstance(b, TextBlock):
            parts.append(b.text)
        elif isinstance(b, ImageBlock):
            parts.append(f"[image {b.mime} {b.size} bytes {b.digest}]")
        elif isinstance(b, ToolCallBlock):
            parts.append(f"[tool call {b.name} {b.id}]")
    return "\n".join(parts)


def _pretty(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


class Loader:
    """Reads sessions from a ``JsonlStore`` (children by id and by their headers' parent)."""

    def __init__(self, store: Any, prices: Prices) -> None:
        self.store = store
        self.prices = prices
        self._children: dict[str, list[SessionHeader]] | None = None

    def children_of(self, session_id: str) -> list[SessionHeader]:
        if self._children is None:
            self._children = {}
            for h in self.store.list_sessions_sync():
                if h.parent_session:
                    self._children.setdefault(h.parent_session, []).append(h)
        return sorted(self._children.get(session_id, []), key=lambda h: (h.created_at, h.id))

    def session(self, session_id: str, *, depth: int = 0, seen: frozenset[str] = frozenset()) -> dict[str, Any]:
        contents = self.store.read_contents(session_id)
        return Builder(self, contents.header, contents.events, depth, seen | {contents.header.id}).build()


class Builder:
    def __init__(self, loader: Loader, header: SessionHeader, events: list[Any], depth: int, seen: frozenset[str]):
        self.loader, self.header, self.events, self.depth, self.seen = loader, header, events, depth, seen
        self.rows: list[dict[str, Any]] = []
        self.totals = Totals()
        self.calls: dict[str, dict[str, Any]] = {}
        self.approvals: dict[str, dict[str, Any]] = {}
        self.files = FileTexts(header.cwd)
        self.turn: dict[str, Any] | None = None
        self.turn_totals = Totals()
        self.prev_time = header.created_at
        self.title = ""
        self.child_sessions: list[dict[str, Any]] = []

    # -------------------------------------------------------------------- rows

    def row(self, k: str, ev: Any, **fields: Any) -> dict[str, Any]:
        r = {"k": k, "seq": getattr(ev, "seq", 0), **fields}
        self.rows.append(r)
        return r

    def mark(self, kind: str, ev: Any, text: str) -> None:
        self.row("mark", ev, kind=kind, text=text, turn=self.turn["n"] if self.turn else None)

    def build(self) -> dict[str, Any]:
        for ev in self.events:
            self.one(ev)
            if ev.time:
                self.prev_time = ev.time
        self.close_turn(None)
        for call in self.calls.values():
            if call["status"] == "pending":
                call["status"] = "no result"
        # children started by a call but not announced (an older log): nest them by their header
        announced = {c["id"] for c in self.child_sessions}
        for h in self.loader.children_of(self.header.id):
            if h.id not in announced:
                self.attach_child(h.id, h.parent_call)
        h = self.header
        own = self.totals.data()
        totals = self.totals
        for child in self.child_sessions:
            totals.absorb(_totals_of(child))
        return {
            "id": h.id, "title": self.title, "cwd": h.cwd, "created": h.created_at, "provider": h.provider,
            "model": h.model, "parent": h.parent_session, "parentCall": h.parent_call, "depth": h.delegation_depth,
            "rows": self.rows, "children": self.child_sessions, "ownTotals": own,
            "totals": totals.data(), "costRaw": dict(totals.cost),
        }

    def attach_child(self, session_id: str | None, call_id: str | None) -> None:
        if not session_id or session_id in self.seen or self.depth >= MAX_DEPTH:
            return
        try:
            child = self.loader.session(session_id, depth=self.depth + 1, seen=self.seen)
        except Exception as exc:
            child = {"id": session_id, "missing": str(exc), "title": "", "cwd": "", "created": 0, "provider": "",
                     "model": "", "parent": self.header.id, "parentCall": call_id, "depth": self.depth + 1, "rows": [],
                     "children": [], "ownTotals": Totals().data(), "totals": Totals().data(), "costRaw": {}}
        self.child_sessions.append(child)
        call = self.calls.get(call_id or "")
        if call is not None:
            call["children"].append(session_id)
        else:
            self.row("child", None, session=session_id)

    def close_turn(self, end: TurnEnd | None) -> None:
        if self.turn is None:
            return
        t = self.turn
        if end is not None:
            t["reason"] = end.reason
            t["seconds"] = round(max(0.0, end.time - t["start"]), 3) if end.time and t["start"] else 0.0
            self.totals.seconds += t["seconds"]
            if end.error:
                t["error"] = end.error
            if end.abort_kind:
                t["abort"] = end.abort_kind
        t["tokens"] = {"input": self.turn_totals.input, "output": self.turn_totals.output,
                       "cached": self.turn_totals.cached}
        t["cost"] = money(self.turn_totals.cost)
        self.turn = None

    def one(self, ev: Any) -> None:  # noqa: C901 - one branch per event type, in the log's words
        if isinstance(ev, TurnStart):
            self.close_turn(None)
            self.totals.turns += 1
            self.turn_totals = Totals()
            # the prompts the turn claimed were logged just before it: they belong to it
            waiting = 0
            while waiting < len(self.rows) and self.rows[-1 - waiting]["k"] == "prompt":
                waiting += 1
            prompts = self.rows[len(self.rows) - waiting:]
            del self.rows[len(self.rows) - waiting:]
            self.turn = self.row("turn", ev, n=ev.turn, start=ev.time, autonomous=ev.autonomous,
                                 reason="", seconds=0.0)
            self.rows.extend(prompts)
        elif isinstance(ev, TurnEnd):
            if ev.reason == "aborted":
                self.mark("cancel", ev, f"turn {ev.turn} cancelled" + (f" (by {ev.abort_kind})" if ev.abort_kind else ""))
            elif ev.reason not in ("completed",):
                self.mark("error" if ev.reason == "error" else "stop", ev,
                          f"turn {ev.turn} ended: {ev.reason}" + (f": {ev.error}" if ev.error else ""))
            self.close_turn(ev)
        elif isinstance(ev, UserMessageEvent):
            text = text_of(ev.message.content)
            if not self.title and ev.message.source == "user":
                self.title = text.strip().split("\n", 1)[0][:200]
            self.row("prompt", ev, text=text, source=ev.message.source)
        elif isinstance(ev, SessionTitled):
            self.title = ev.title
        elif isinstance(ev, AssistantMessageEvent):
            self.assistant(ev)
        elif isinstance(ev, ToolCallEvent):
            if ev.call_id not in self.calls:
                self.new_call(ev, ev.call_id, ev.name, ev.arguments)
        elif isinstance(ev, ToolResultEvent):
            self.result(ev)
        elif isinstance(ev, CodeDispatch):
            parent = self.calls.get(ev.parent_call_id)
            sub = {"id": ev.call_id, "name": ev.name, "args": _pretty(ev.arguments), "result": text_of(ev.result),
                   "status": "error" if ev.is_error else "ok", "code": ev.code}
            if parent is not None:
                parent["program"].append(sub)
            else:
                self.row("call", ev, **sub, diff=None, note="", approvals=[], children=[], program=[])
        elif isinstance(ev, ApprovalAsked):
            a: dict[str, Any] = {"id": ev.id, "reason": ev.reason, "tool": ev.tool_name, "outcome": "asked", "by": None}
            self.approvals[ev.id] = a
            call = self.calls.get(ev.call_id or "")
            if call is not None:
                call["approvals"].append(a)
            else:
                self.row("approval", ev, approval=a)
        elif isinstance(ev, ApprovalDecided):
            asked = self.approvals.get(ev.id)
            if asked is not None:
                asked["outcome"], asked["by"] = ev.outcome, ev.answered_by
        elif isinstance(ev, SubagentStarted):
            self.attach_child(ev.session, ev.call_id)
        elif isinstance(ev, CompactionStart):
            self.mark("compaction", ev, f"compaction started ({ev.reason}): about {ev.estimated_tokens} tokens "
                                        f"of {ev.context_window}, {ev.messages} messages")
        elif isinstance(ev, CompactionSummary):
            cost = self.price(ev.usage, self.header.provider, self.header.model, ev.time)
            self.mark("compaction", ev, f"history compacted ({ev.reason}): messages {ev.covered_from}–{ev.covered_to} "
                                        f"replaced by a summary, {ev.retained} kept; about {ev.tokens_before} → "
                                        f"{ev.tokens_after} tokens")
            self.rows[-1]["summary"] = text_of(ev.message.content)
            if ev.usage is not None:
                self.count_model_call(ev.usage, cost)
        elif isinstance(ev, CompactionFailed):
            self.mark("error", ev, f"compaction failed ({ev.reason}): {ev.error}")
        elif isinstance(ev, ModelCallFailed):
            self.totals.errors += 1
            status = f"HTTP {ev.status}, " if ev.status is not None else ""
            self.mark("error", ev, f"model call of step {ev.step} failed (attempt {ev.attempt}): {ev.code} "
                                   f"({status}{'retryable' if ev.retryable else 'not retryable'}): {ev.message}")
        elif isinstance(ev, RetryEvent):
            self.mark("retry", ev, f"retry {ev.retry}/{ev.max_retries} of step {ev.step} in {ev.delay_ms} ms: {ev.failure}")
        elif isinstance(ev, AgentError):
            self.totals.errors += 1
            self.mark("error", ev, f"error{f' {ev.code}' if ev.code else ''}: {ev.message}")
        elif isinstance(ev, InboxDropped):
            self.mark("cancel", ev, f"{len(ev.message_ids)} queued prompt(s) dropped ({ev.reason})")
        elif isinstance(ev, HookResult):
            if ev.decision != "pass":
                self.mark("hook", ev, f"hook {ev.point}: {ev.decision}" + (f" ({ev.stop_reason})" if ev.stop_reason else ""))
        elif isinstance(ev, JobStarted):
            self.mark("job", ev, f"background job {ev.id} ({ev.kind}) started: {ev.title}")
        elif isinstance(ev, JobSettled):
            how = f"completed (exit {ev.exit_code})" if ev.status == "completed" else ev.status
            self.mark("job", ev, f"background job {ev.id} {how}" + (f": {ev.detail}" if ev.detail else ""))
        elif isinstance(ev, SettingsChanged):
            s = msgspec.to_builtins(ev.settings)
            self.mark("info", ev, f"settings changed by {ev.by}: " + ", ".join(f"{k} {s.get(k)}" for k in ev.changed))
        elif isinstance(ev, McpFailed):
            self.mark("error", ev, f"MCP server {ev.server}: {ev.error}")
        elif isinstance(ev, HistoryForked):
            self.mark("info", ev, f"forked from session {ev.parent_session} with {len(ev.messages)} messages")

    def price(self, usage: Usage | None, provider: str, model: str, at: float) -> Any:
        return self.loader.prices.cost(provider, model, usage, at)

    def count_model_call(self, usage: Usage | None, cost: Any) -> None:
        self.totals.model_calls += 1
        self.totals.add_usage(usage, cost)
        self.turn_totals.add_usage(usage, cost)

    def assistant(self, ev: AssistantMessageEvent) -> None:
        m = ev.message
        provider, model = m.provider or self.header.provider, m.model or self.header.model
        cost = self.price(ev.usage, provider, model, ev.time)
        self.count_model_call(ev.usage, cost)
        u = ev.usage
        self.row("model", ev, step=ev.step, provider=provider, model=model, finish=ev.finish,
                 interrupted=ev.interrupted, seconds=round(max(0.0, ev.time - self.prev_time), 3) if ev.time else 0.0,
                 tokens={"input": u.input_tokens, "output": u.output_tokens, "cached": u.cache_hit_tokens}
                 if u is not None else None, cost=money({cost.currency: cost.amount}) if cost is not None else "")
        for b in m.content:
            if isinstance(b, ReasoningBlock) and b.text:
                self.row("thought", ev, text=b.text)
            elif isinstance(b, TextBlock) and b.text:
                self.row("answer", ev, text=b.text)
            elif isinstance(b, ToolCallBlock):
                self.new_call(ev, b.id, b.name, b.arguments)
        if ev.interrupted:
            self.mark("cancel", ev, f"the answer of step {ev.step} was cut off ({ev.finish})")

    def new_call(self, ev: Any, call_id: str, name: str, arguments: str) -> None:
        self.totals.tool_calls += 1
        self.calls[call_id] = self.row("call", ev, id=call_id, name=name, args=_pretty(arguments), raw=arguments,
                                       result=None, status="pending", code=None, diff=None, note="",
                                       approvals=[], children=[], program=[])

    def result(self, ev: ToolResultEvent) -> None:
        r = ev.result
        call = self.calls.get(r.call_id)
        if call is None:
            call = self.row("call", ev, id=r.call_id, name=r.name, args="", raw="", diff=None, note="",
                            approvals=[], children=[], program=[])
            self.calls[r.call_id] = call
        text = text_of(r.content)
        call["result"] = text
        call["status"] = "error" if r.is_error else "ok"
        call["code"] = ev.code
        if r.is_error:
            self.totals.errors += 1
        change = change_of(self.files, r.name, call.get("raw") or "", not r.is_error, text)
        if change is not None:
            call["diff"], call["note"] = change


def _totals_of(doc: dict[str, Any]) -> Totals:
    t = doc.get("totals") or {}
    out = Totals(model_calls=t.get("modelCalls", 0), tool_calls=t.get("toolCalls", 0), errors=t.get("errors", 0),
                 input=t.get("input", 0), output=t.get("output", 0), cached=t.get("cached", 0),
                 unpriced=t.get("unpriced", 0))
    out.cost = dict(doc.get("costRaw", {}))
    return out
