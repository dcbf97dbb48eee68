"""replay-model: play back the model calls of a recorded session log, keyless.

``--provider replay --model path/to/session.jsonl`` serves each model call of the run from
the recording, call by call, while the real tools run again. What a call produced is read
from the log's durable events (``assistant/message``: text, reasoning, tool calls, finish,
usage; ``llm/error``: a failed call with its error class; an interrupted message: a call that
was cancelled; ``compaction/summary``/``compaction/failed``: the compactor's summary calls).
Sibling logs ``session.1.jsonl``, ``session.2.jsonl``, … (subagents, second sessions) are
loaded too; a live session binds to the first unclaimed recording whose first prompt it
sends. ``replay.override.json`` beside the log patches what a recording cannot hold (an
injected error, a hang until cancelled, another answer for one call).

It fails loudly — a non-retryable ``ModelError`` with code ``REPLAY_EXHAUSTED`` or
``REPLAY_DIVERGED``, also on stderr — naming the call number, when the run asks for more
calls than were recorded or when the tool results (or the prompt) the live run sends differ
from the recorded ones. Formats: this plugin's README.md.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec

from dsh_core import ModelError, RouteError, config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.paths import exists_inside, open_inside
from dsh_core.types import (
    AssistantMessage,
    AssistantMessageEvent,
    CompactionFailed,
    CompactionSummary,
    Finish,
    ImageBlock,
    ImageDelta,
    InboxClaimed,
    ModelCallFailed,
    ModelDelta,
    ModelInfo,
    ModelRequest,
    ReasoningBlock,
    ReasoningDelta,
    RequestHeader,
    RetryEvent,
    RetryPolicy,
    SessionHeader,
    SessionTitled,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    ToolResultEvent,
    ToolResultMessage,
    TurnEnd,
    Usage,
    UsageDelta,
    UserMessage,
    UserMessageEvent,
    log_decoder,
)

log = logging.getLogger("dsh.replay")

PROVIDER = "replay"
OVERRIDE_FILE = "replay.override.json"
_HEX = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")
_ISO_TIME = re.compile(r"(?<![0-9])\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z")
_NUMBERED = re.compile(r"\{\{id:\d+\}\}")  # a committed scenario's numbered id placeholder
_TITLE = ":title"  # session-controls' title call (its session id's suffix); replayed from session/titled
_COMPACTION = ":compaction"


# ----------------------------------------------------------------------------- what a call was


class ErrorEntry(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    message: str
    code: str = "SERVER"
    retryable: bool = False
    status: int | None = None
    retry_after: float | None = None


class ToolCallEntry(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    name: str
    arguments: str = "{}"
    id: str | None = None


class Entry(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    """One model call's answer, as an override writes it (the recorded ones are derived)."""

    text: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallEntry] = msgspec.field(default_factory=list)
    finish: str | None = None  # stop | tool-calls | max-tokens (default: from the tool calls)
    usage: Usage | None = None
    error: ErrorEntry | None = None
    hang: bool = False  # after the text (if any), wait until the call is cancelled


class Patch(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    call: int  # 1-based call number in the session's recording
    session: int = 0  # 0: session.jsonl, n: session.n.jsonl
    replace: Entry | None = None
    insert: Entry | None = None  # played before recorded call ``call`` (call = recorded + 1: after the last)
    # Ordering sessions that run side by side (a background subagent and its parent): before it
    # answers, the call creates ``mark`` in the cwd, then waits for ``wait_for`` to exist there.
    mark: str | None = None
    wait_for: str | None = None


class Overrides(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    patches: list[Patch] = msgspec.field(default_factory=list)


@dataclass
class Expect:
    """What the recording's request for a call carried after the previous answer."""

    prompt: list[str] | None = None  # the texts of the prompt a turn's first call answers
    results: list[tuple[str, str, bool]] = field(default_factory=list)  # (call id, tool, is error)
    texts: list[str] = field(default_factory=list)  # the results' texts as recorded ({{id:N}} kept)


@dataclass
class Call:
    where: str  # "turn 2 step 1" (for messages)
    blocks: list[Any] = field(default_factory=list)  # TextBlock | ReasoningBlock | ToolCallBlock | ImageBlock
    finish: str = "stop"
    usage: Usage | None = None
    error: ErrorEntry | None = None
    crash: str | None = None  # a provider bug (compaction INTERNAL): raise a plain exception
    hang: bool = False
    expect: Expect | None = None  # None: not checked (inserted by an override)
    mark: str | None = None  # created in the cwd before the call answers (an override's ordering)
    wait_for: str | None = None  # waited for in the cwd (at most WAIT_FOR_S) before the call answers


@dataclass
class Recording:
    path: Path
    header: SessionHeader
    route: ModelInfo
    calls: list[Call]
    summaries: list[Call]  # the compactor's calls (session id "<id>:compaction")
    max_retries: int
    title: str | None = None  # what the title call answered (session id "<id>:title"), when a model wrote it


def _entry_call(entry: Entry, where: str) -> Call:
    blocks: list[Any] = []
    if entry.reasoning:
        blocks.append(ReasoningBlock(text=entry.reasoning))
    if entry.text:
        blocks.append(TextBlock(text=entry.text))
    for i, tc in enumerate(entry.tool_calls):
        blocks.append(ToolCallBlock(id=tc.id or f"call_override_{i + 1}", name=tc.name, arguments=tc.arguments))
    finish = entry.finish or ("tool-calls" if entry.tool_calls else "stop")
    return Call(where=where, blocks=blocks, finish=finish, usage=entry.usage, error=entry.error, hang=entry.hang)


def _text(blocks: list[Any]) -> str:
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


SummaryText = Callable[[UserMessage], str | None]  # the host's ``dsh_compaction_summary`` hook


def _summary_text(message: UserMessage, summary: SummaryText | None) -> str:
    """The summary call's own output: the compactor frames it before committing it, and says
    through the ``dsh_compaction_summary`` seam what the call answered (no compactor answering:
    the whole text)."""
    found = summary(message) if summary is not None else None
    return found if found is not None else _text(message.content)


def derive(path: Path, summary: SummaryText | None = None) -> Recording:
    """Read one session log into its model calls, in order (``summary``: the host's
    ``dsh_compaction_summary``, which tells a compaction summary's own text from its framing)."""
    header, events = _read_log(path)
    d = _Derivation(summary=summary)
    for ev in events:
        d.apply(ev)
    # The same retry budget as the recording, so the same failures are retried (or not).
    max_retries = max(d.retries) if d.retries else (max(d.final_attempts) if d.final_attempts else 5)
    route = d.route or ModelInfo(provider=header.provider, model=header.model)
    return Recording(path=path, header=header, route=route, calls=d.calls, summaries=d.summaries,
                     max_retries=max_retries, title=d.title)


def _read_log(path: Path) -> tuple[SessionHeader, list[Any]]:
    """The log's header and its events."""
    try:
        lines = [ln for ln in path.read_bytes().splitlines() if ln.strip()]
    except OSError as exc:
        raise RouteError(f"replay: cannot read the recording {path}: {exc}") from None
    # A committed scenario fixture pins its header once per class ("tools": "{{tools}}"); replay
    # needs only the header's route, so such a fixture replays as it is.
    lines = [ln.replace(b'"tools": "{{tools}}"', b'"tools": []').replace(b'"tools":"{{tools}}"', b'"tools":[]')
             if b'"request/header"' in ln else ln for ln in lines]
    records = []
    for number, ln in enumerate(lines, 1):
        try:
            records.append(log_decoder.decode(ln))
        except RecursionError:  # a crafted line nested deeper than any recording: one clear line
            raise RouteError(f"replay: {path}:{number}: a record nested too deeply to read; "
                             "this is not a dsh session log") from None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise RouteError(f"replay: {path}:{number} is not a dsh session log record: {str(exc)[:200]}") from None
    if not records or not isinstance(records[0], SessionHeader):
        raise RouteError(f"replay: {path} does not start with a session header")
    return records[0], records[1:]


@dataclass
class _Derivation:
    """The model calls ``derive`` reads off a log, one event at a time."""

    route: ModelInfo | None = None
    calls: list[Call] = field(default_factory=list)
    summaries: list[Call] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)
    expect: Expect = field(default_factory=Expect)
    retries: list[int] = field(default_factory=list)
    final_attempts: list[int] = field(default_factory=list)
    # Whether a model call may be in flight, unrecorded: a call cancelled before it produced any
    # text leaves nothing in the log (nothing was committed), but the turn's end says "aborted".
    in_flight: bool = False
    aborted_tool: bool = False
    where: str = ""
    title: str | None = None
    summary: SummaryText | None = None

    def apply(self, ev: Any) -> None:
        if isinstance(ev, RequestHeader) and self.route is None:
            self.route = ev.route or ModelInfo(provider=ev.provider, model=ev.model)
        elif isinstance(ev, UserMessageEvent):
            if ev.message.source not in _NOT_PROMPTS:  # a notice that woke the agent is no prompt (live: the same)
                self.texts[ev.message.id] = _NUMBERED.sub("{{id}}", _text(ev.message.content))
        elif isinstance(ev, InboxClaimed):
            self.expect = Expect(prompt=[self.texts[i] for i in ev.message_ids if i in self.texts])
            self.in_flight, self.where = True, f"turn {ev.turn} step 1"
        elif isinstance(ev, ToolResultEvent):
            self.expect.results.append((ev.result.call_id, ev.result.name, ev.result.is_error))
            self.expect.texts.append(_text(ev.result.content))
            self.aborted_tool = self.aborted_tool or ev.code == "ABORTED"
            self.in_flight = not self.aborted_tool  # the next call starts once every result is in, unless cancelled
            self.where = f"turn {ev.turn} step {ev.step + 1}"
        elif isinstance(ev, TurnEnd):
            if ev.reason == "aborted" and self.in_flight:
                self.calls.append(Call(where=self.where, hang=True, expect=self.expect))  # cancelled before any output
                self.expect = Expect()
            self.in_flight = False
        elif isinstance(ev, AssistantMessageEvent):
            self._answered(ev)
        elif isinstance(ev, ModelCallFailed):
            self._failed(ev)
        elif isinstance(ev, RetryEvent):
            self.retries.append(ev.max_retries)
        elif isinstance(ev, CompactionSummary):
            self.summaries.append(Call(where=f"compaction at turn {ev.turn} step {ev.step}",
                                       blocks=[TextBlock(text=_summary_text(ev.message, self.summary))], usage=ev.usage))
        elif isinstance(ev, CompactionFailed):
            self._compaction_failed(ev)
        elif isinstance(ev, SessionTitled) and ev.by == "model":
            self.title = ev.title

    def _answered(self, ev: AssistantMessageEvent) -> None:
        self.in_flight = self.aborted_tool = False
        self.calls.append(Call(
            where=f"turn {ev.turn} step {ev.step}", blocks=list(ev.message.content),
            finish="stop" if ev.finish == "aborted" else ev.finish, usage=ev.usage, hang=ev.interrupted,
            expect=self.expect,
        ))
        self.expect = Expect()

    def _failed(self, ev: ModelCallFailed) -> None:
        error = ErrorEntry(message=ev.message, code=ev.code, retryable=ev.retryable, status=ev.status,
                           retry_after=ev.retry_after)
        self.calls.append(Call(where=f"turn {ev.turn} step {ev.step}", error=error, expect=self.expect))
        self.in_flight, self.where = True, f"turn {ev.turn} step {ev.step}"  # a retry (or a recovery) may follow
        if ev.retryable:
            self.final_attempts.append(ev.attempt)

    def _compaction_failed(self, ev: CompactionFailed) -> None:
        at = f"compaction at turn {ev.turn} step {ev.step}"
        if ev.code == "NOTHING_TO_COMPACT":
            return  # no call was made
        if ev.code == "ABORTED":
            self.summaries.append(Call(where=at, hang=True))
            self.in_flight = False  # cancelled while compacting: the step's own call never started
        elif ev.code == "EMPTY_RESPONSE":
            self.summaries.append(Call(where=at))
        elif ev.code == "INTERNAL":
            self.summaries.append(Call(where=at, crash=ev.error))
        else:
            message = ev.error.removeprefix("the summary call failed: ")
            self.summaries.append(Call(where=at, error=ErrorEntry(message=message, code=ev.code)))


def _apply(rec: Recording, patches: list[Patch], source: Path) -> None:
    inserts: dict[int, list[Call]] = {}
    ordering = [p for p in patches if p.replace is None and p.insert is None and (p.mark or p.wait_for)]
    for p in patches:
        if p in ordering:
            continue
        if (p.replace is None) == (p.insert is None):
            raise RouteError(f"replay: {source}: a patch needs exactly one of replace/insert, or mark/waitFor "
                             f"(call {p.call})")
        where = f"override of call {p.call}"
        if p.replace is not None:
            if not 1 <= p.call <= len(rec.calls):
                raise RouteError(f"replay: {source}: call {p.call} is not recorded in {rec.path.name} "
                                 f"({len(rec.calls)} calls)")
            call = _entry_call(p.replace, where)
            call.expect = rec.calls[p.call - 1].expect
            rec.calls[p.call - 1] = call
        else:
            assert p.insert is not None
            if not 1 <= p.call <= len(rec.calls) + 1:
                raise RouteError(f"replay: {source}: cannot insert before call {p.call} of {rec.path.name} "
                                 f"({len(rec.calls)} calls)")
            inserts.setdefault(p.call, []).append(_entry_call(p.insert, where))
    for at in sorted(inserts, reverse=True):
        rec.calls[at - 1:at - 1] = inserts[at]
    for p in ordering:  # on the calls as played (after inserts)
        if not 1 <= p.call <= len(rec.calls):
            raise RouteError(f"replay: {source}: call {p.call} is not recorded in {rec.path.name} "
                             f"({len(rec.calls)} calls)")
        rec.calls[p.call - 1].mark = p.mark
        rec.calls[p.call - 1].wait_for = p.wait_for


def load(primary: Path, summary: SummaryText | None = None) -> list[Recording]:
    """``session.jsonl`` and its siblings ``session.<n>.jsonl``, with the overrides applied
    (``summary``: as for ``derive``)."""
    if not primary.is_file():
        raise RouteError(f"replay: no recorded session log at {str(primary)!r}; pass --model PATH/session.jsonl")
    recs = [derive(primary, summary)]
    n = 1
    while (sibling := primary.with_name(f"{primary.stem}.{n}{primary.suffix}")).is_file():
        recs.append(derive(sibling, summary))
        n += 1
    override = primary.with_name(OVERRIDE_FILE)
    if override.is_file():
        try:
            doc = msgspec.json.decode(override.read_bytes(), type=Overrides)
        except RecursionError:
            raise RouteError(f"replay: {override}: invalid overrides: nested too deeply to read") from None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise RouteError(f"replay: {override}: invalid overrides: {exc}") from None
        for index in sorted({p.session for p in doc.patches}):
            if not 0 <= index < len(recs):
                raise RouteError(f"replay: {override}: no session {index} (recordings: {len(recs)})")
            _apply(recs[index], [p for p in doc.patches if p.session == index], override)
    return recs


# ----------------------------------------------------------------------------- the provider

WAIT_FOR_S = 30.0  # the longest a call waits for an override's ``waitFor`` file


def _touch(cwd: str, name: str) -> None:
    """Create ``name`` inside ``cwd`` (never outside it: ``open_inside``)."""
    try:
        os.close(open_inside(cwd or ".", name, os.O_WRONLY | os.O_CREAT, 0o644))
    except OSError as exc:
        raise ModelError(f"replay: mark {name!r} is not a path inside the session's cwd ({exc.strerror})",
                         code="REPLAY_DIVERGED", retryable=False) from None





@dataclass
class _Bound:
    rec: Recording
    cursor: int = 0
    summaries: int = 0
    # A committed recording's numbered ids (``{{id:3}}``, ``{{session1}}``) and the live ids they
    # stand for, learnt from the tool results: a result recorded as ``started subagent {{session1}}``
    # that comes back live as ``started subagent 5f0c…`` makes a later recorded call's argument
    # ``send_message {"subagent_id": "{{session1}}"}`` the live id. Ids minted anew every run (a
    # child's session id) replay as the run's own.
    ids: dict[str, str] = field(default_factory=dict)


_PLACEHOLDER = re.compile(r"\{\{(id:\d+|[a-z0-9_]+)\}\}")
_LEARNT = re.compile(r"\{\{(?:id:\d+|session\d+)\}\}")  # what a live id can stand in for
LEARN_CHARS = 20_000  # a longer recorded result is not searched for ids


def _learn(ids: dict[str, str], recorded: str, live: str) -> None:
    """Bind the numbered ids of ``recorded`` to what stands in their place in ``live``."""
    if not _LEARNT.search(recorded) or len(recorded) > LEARN_CHARS or len(live) > LEARN_CHARS:
        return
    pattern, groups, at = [], {}, 0
    for m in _PLACEHOLDER.finditer(recorded):
        pattern.append(re.escape(recorded[at:m.start()]))
        name = m.group(1)
        if _LEARNT.fullmatch(m.group(0)):
            group = name.replace(":", "")
            pattern.append(f"(?P={group})" if group in groups else f"(?P<{group}>[0-9a-f]{{32}})")
            groups[group] = m.group(0)
        else:
            pattern.append(".*?")  # a path, an unnumbered id
        at = m.end()
    pattern.append(re.escape(recorded[at:]))
    found = re.fullmatch("".join(pattern), live, re.DOTALL)
    if found is not None:
        for group, placeholder in groups.items():
            ids.setdefault(placeholder, found.group(group))


def _bound_ids(text: str, ids: dict[str, str] | None) -> str:
    """``text`` with each placeholder replay has bound put back to the run's own id."""
    if not ids:
        return text
    return _LEARNT.sub(lambda m: ids.get(m.group(0), m.group(0)), text)


def _live_texts(request: ModelRequest) -> list[str]:
    """The texts of the tool results the request carries after the model's last answer."""
    msgs = list(request.messages)
    last = max((i for i, m in enumerate(msgs) if isinstance(m, AssistantMessage)), default=-1)
    return [_text(m.content) for m in msgs[last + 1:] if isinstance(m, ToolResultMessage)]


# User messages the run itself produces again on replay (tool output spliced in, a compaction
# summary, interception context from hooks that run again, a subagent's settlement notice):
# never part of the recorded prompt.
_NOT_PROMPTS = frozenset({"tool", "compaction", "hook", "notice"})


def _live_tail(request: ModelRequest) -> tuple[list[str], list[tuple[str, str, bool]]]:
    """The prompt texts and tool results the request carries after the model's last answer."""
    msgs = list(request.messages)
    last = max((i for i, m in enumerate(msgs) if isinstance(m, AssistantMessage)), default=-1)
    prompt: list[str] = []
    results: list[tuple[str, str, bool]] = []
    for m in msgs[last + 1:]:
        if isinstance(m, ToolResultMessage):
            results.append((m.call_id, m.name, m.is_error))
        elif isinstance(m, UserMessage) and m.source not in _NOT_PROMPTS:
            prompt.append(_text(m.content))
    return prompt, results


class ReplayProvider:
    name = PROVIDER

    def __init__(self, summary: SummaryText | None = None) -> None:
        self._summary = summary  # the host's dsh_compaction_summary (None: a summary's whole text)
        self.retry_policy = RetryPolicy(max_retries=5, base_delay=0.001, max_delay=0.01, jitter=0.0)
        self._loaded: dict[str, list[Recording]] = {}
        self._bound: dict[str, _Bound] = {}
        self._claimed: set[int] = set()  # ids of claimed recordings
        self._paths: dict[int, str] = {}  # id(route served by resolve) -> the --model path it came from

    def _recordings(self, model: str) -> list[Recording]:
        recs = self._loaded.get(model)
        if recs is None:
            recs = self._loaded[model] = load(Path(model).expanduser(), self._summary)
            self.retry_policy = msgspec.structs.replace(self.retry_policy, max_retries=recs[0].max_retries)
        return recs

    def resolve(self, model: str) -> ModelInfo:
        """The recorded route (provider, model, what it declared), served from the recording. The
        recorded model id resolves too (the agent re-resolves ``route.model`` to check it)."""
        for recs in self._loaded.values():
            if model == recs[0].route.model and model not in self._loaded:
                return recs[0].route
        route = self._recordings(model)[0].route
        self._paths[id(route)] = model
        return route

    def _norm(self, text: str, cwd: str) -> str:
        if cwd:
            text = text.replace(cwd, "{{cwd}}")
        text = _ISO_TIME.sub("{{time}}", text)  # a recording says {{time}} for the run's clock (a reminder's target)
        return _NUMBERED.sub("{{id}}", _HEX.sub("{{id}}", text))

    def _fail(self, code: str, message: str) -> ModelError:
        log.warning(message.removeprefix("replay: "))
        return ModelError(message, code=code, retryable=False)

    def _bind(self, request: ModelRequest, sid: str) -> _Bound:
        bound = self._bound.get(sid)
        if bound is not None:
            return bound
        model = self._paths.get(id(request.route))
        if model is None:  # a route built elsewhere (a test's request): the only recording loaded
            if len(self._loaded) != 1:
                raise self._fail("REPLAY_DIVERGED", "replay: a request on a route this provider did not resolve")
            model = next(iter(self._loaded))
        recs = self._recordings(model)
        prompt = [self._norm(t, request.cwd) for t in _live_tail(request)[0]]
        free = [r for r in recs if id(r) not in self._claimed and r.calls]
        for rec in free:
            first = rec.calls[0].expect
            if first is None or first.prompt is None or prompt[-len(first.prompt):] == first.prompt:
                break
        else:
            starts = "; ".join(f"{r.path.name} starts with {r.calls[0].expect.prompt!r}" for r in free
                               if r.calls[0].expect is not None) or "every recording is claimed"
            raise self._fail("REPLAY_DIVERGED", f"replay: call 1 of session {sid[:8]} diverged: no unclaimed "
                             f"recording starts with the prompt {prompt!r} ({starts})")
        self._claimed.add(id(rec))
        bound = self._bound[sid] = _Bound(rec)
        return bound

    def _check(self, rec: Recording, n: int, call: Call, request: ModelRequest) -> None:
        expect = call.expect
        if expect is None:
            return
        prompt, results = _live_tail(request)
        live = [(cid, name, err) for cid, name, err in results]
        if live != expect.results:
            def show(rs: list[tuple[str, str, bool]]) -> str:
                return ", ".join(f"{name}[{cid}]{' error' if err else ''}" for cid, name, err in rs) or "none"
            raise self._fail("REPLAY_DIVERGED", (
                f"replay: {rec.path.name} call {n} ({call.where}) diverged: the recorded request carried tool "
                f"results {show(expect.results)}, the live one carries {show(live)}"))
        if expect.prompt is not None:
            norm = [self._norm(t, request.cwd) for t in prompt]
            if norm[-len(expect.prompt):] != expect.prompt:
                raise self._fail("REPLAY_DIVERGED", (
                    f"replay: {rec.path.name} call {n} ({call.where}) diverged: the recorded call answered the "
                    f"prompt {expect.prompt!r}, the live request sends {norm!r}"))
        elif any(prompt):
            raise self._fail("REPLAY_DIVERGED", (
                f"replay: {rec.path.name} call {n} ({call.where}) diverged: the recorded call continued a turn, "
                f"the live request starts a new prompt {prompt!r}"))

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelDelta, None]:
        sid = request.session_id
        if sid.endswith(_TITLE):  # the title call: its answer is the title the recording's model wrote
            title = self._bind(request, sid.removesuffix(_TITLE)).rec.title
            if title is None:
                raise ModelError("replay: the recording's title was not written by a model call",
                                 code="REPLAY_UNRECORDED")
            yield TextDelta(text=title)
            yield Finish(reason="stop")
            return
        compaction = sid.endswith(_COMPACTION)
        base = sid.removesuffix(_COMPACTION) if compaction else sid
        if compaction and base not in self._bound:
            raise self._fail("REPLAY_DIVERGED", f"replay: a compaction call for session {base[:8]} before any "
                             "model call of it")
        bound = self._bind(request, base)
        rec = bound.rec
        if compaction:  # the summary calls have a cursor of their own
            bound.summaries += 1
            n, calls, what, many = bound.summaries, rec.summaries, "compaction call", "summary calls"
        else:
            bound.cursor += 1
            n, calls, what, many = bound.cursor, rec.calls, "call", "model calls"
        if n > len(calls):
            raise self._fail("REPLAY_EXHAUSTED", (
                f"replay: {rec.path.name} {what} {n}: the run asked for more {many} than the "
                f"{len(calls)} recorded"))
        call = calls[n - 1]
        if not compaction:
            self._check(rec, n, call, request)
            if call.expect is not None and call.expect.texts:
                for recorded, live in zip(call.expect.texts, _live_texts(request), strict=False):
                    _learn(bound.ids, recorded, live)
        async for delta in self._play(call, request.cwd, bound.ids):
            yield delta

    async def _play(self, call: Call, cwd: str, ids: dict[str, str] | None = None) -> AsyncIterator[ModelDelta]:
        def sub(text: str) -> str:
            return text.replace("{{cwd}}", cwd) if cwd else text

        if call.mark is not None:
            _touch(cwd, call.mark)
        if call.wait_for is not None:
            with anyio.move_on_after(WAIT_FOR_S):
                while not exists_inside(cwd or ".", call.wait_for):
                    await anyio.sleep(0.005)
        if call.error is not None:
            e = call.error
            raise ModelError(sub(e.message), code=e.code, retryable=e.retryable, status=e.status,
                             retry_after=e.retry_after)
        if call.crash is not None:
            raise RuntimeError(f"replayed provider failure: {call.crash}")
        index = 0
        for b in call.blocks:
            if isinstance(b, TextBlock):
                yield TextDelta(text=sub(b.text))
            elif isinstance(b, ReasoningBlock):
                yield ReasoningDelta(text=sub(b.text))
            elif isinstance(b, ToolCallBlock):
                yield ToolCallDelta(index=index, id=b.id, name=b.name, arguments=sub(_bound_ids(b.arguments, ids)))
                index += 1
            elif isinstance(b, ImageBlock):
                yield ImageDelta(image=b)
        if call.hang:
            await anyio.sleep_forever()
        if call.usage is not None:
            yield UsageDelta(usage=call.usage)
        yield Finish(reason=call.finish)  # type: ignore[arg-type]

    def forget(self, session_id: str) -> None:
        self._bound.pop(session_id, None)


class ReplayModelConfig(PluginConfig):
    """``[config.replay-model]``: no options (the recording is the route's model: ``--model PATH``)."""


dsh_config_type = config_type_hook("replay-model", ReplayModelConfig)


@hookimpl
def dsh_register_models(register: Any, host: Any) -> None:
    register(ReplayProvider(lambda message: host.pm.hook.dsh_compaction_summary(message=message)))


__all__ = ["OVERRIDE_FILE", "Entry", "Overrides", "Patch", "Recording", "ReplayProvider", "derive", "load"]
