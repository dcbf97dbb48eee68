"""Durable and in-process data types of the spine, as msgspec Structs.

Everything that is written to a session log or crosses a plugin boundary is a
Struct here. Field names are snake_case in Python and camelCase on disk
(``rename="camel"``). New fields always get defaults (house rule 6).

Content blocks and durable events are tagged unions keyed by ``type``, so a
JSONL line decodes straight back into the right class.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any, Literal

import msgspec


class _Base(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    pass


# --------------------------------------------------------------------------- content


class TextBlock(_Base, tag="text", tag_field="type", kw_only=True):
    text: str


class ImageBlock(_Base, tag="image", tag_field="type", kw_only=True):
    """A reference to bytes in the attachment store; never the bytes themselves."""

    digest: str  # "sha256:<hex>"
    mime: str
    size: int
    width: int | None = None
    height: int | None = None


class ReasoningBlock(_Base, tag="reasoning", tag_field="type", kw_only=True):
    text: str
    # provider-specific replay data (e.g. DeepSeek's reasoning_content is the text itself)
    signature: str | None = None


class ToolCallBlock(_Base, tag="tool-call", tag_field="type", kw_only=True):
    id: str
    name: str
    arguments: str  # raw JSON text as the model produced it


ContentBlock = TextBlock | ImageBlock | ReasoningBlock | ToolCallBlock


class Usage(_Base, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_hit_tokens: int = 0
    cache_miss_tokens: int = 0
    reasoning_tokens: int = 0


class Cost(_Base, kw_only=True):
    """What a model call cost, as its provider prices it (``ModelProvider.cost``)."""

    amount: float
    currency: str  # ISO 4217, e.g. USD


class UserMessage(_Base, kw_only=True):
    id: str
    content: list[ContentBlock]
    source: str = "user"  # user | plugin | tool | subagent …


class AssistantMessage(_Base, kw_only=True):
    id: str
    content: list[ContentBlock]
    provider: str = ""
    model: str = ""


class ToolResultMessage(_Base, kw_only=True):
    call_id: str
    name: str
    content: list[ContentBlock]
    is_error: bool = False


# --------------------------------------------------------------------------- session log


class SessionHeader(_Base, tag="session", tag_field="type", kw_only=True):
    """Line 0 of every session log."""

    id: str
    version: int = 1
    created_at: float = msgspec.field(default_factory=time.time)
    cwd: str = ""
    provider: str = ""
    model: str = ""
    parent_session: str | None = None
    parent_call: str | None = None  # the parent's tool call that started this session (a subagent)
    delegation_depth: int = 0
    origin: str | None = None
    forked_from: str | None = None  # the recorded session this one was forked from (ACP session/fork)
    additional_directories: tuple[str, ...] = ()  # sandbox roots beside cwd, in the session's tier


class Event(_Base, tag_field="type", kw_only=True):
    """Base of every durable event. ``seq`` and ``time`` are set by the agent on append."""

    seq: int = 0
    time: float = 0.0


class UserMessageEvent(Event, tag="user/message", kw_only=True):
    message: UserMessage


class InboxClaimed(Event, tag="agent/inbox/claimed", kw_only=True):
    turn: int
    message_ids: list[str]


class InboxDropped(Event, tag="agent/inbox/dropped", kw_only=True):
    message_ids: list[str]
    reason: str = "cancelled"


class TurnStart(Event, tag="turn/start", kw_only=True):
    turn: int
    # True: the agent started this turn on its own (a plugin's notice woke it while idle: a job or a
    # background subagent settled, a goal round); no prompt of the client's is in it
    autonomous: bool = False


TurnEndReason = Literal["completed", "max-tokens", "max-steps", "aborted", "error", "blocked", "stopped", "disposed"]


class TurnEnd(Event, tag="turn/end", kw_only=True):
    turn: int
    reason: TurnEndReason
    abort_kind: str | None = None  # user | parent | hook | disposed
    error: str | None = None
    code: str | None = None


class RequestHeader(Event, tag="request/header", kw_only=True):
    """Recorded when the stable request prefix (route, system prompt, tools) is set or changes."""

    provider: str
    model: str
    system: str
    tools: list[dict[str, Any]]
    reason: str = "initial"
    # what the route declared (context window, image input, …): a replay serves the same route
    route: ModelInfo | None = None


class AssistantMessageEvent(Event, tag="assistant/message", kw_only=True):
    turn: int
    step: int
    message: AssistantMessage
    usage: Usage | None = None
    finish: str = "stop"  # stop | tool-calls | max-tokens | aborted
    interrupted: bool = False


class ModelCallFailed(Event, tag="llm/error", kw_only=True):
    """One model call of step ``step`` failed with a provider error. ``attempt`` counts from 0 (the
    first try); ``retryable``/``status``/``retry_after`` are the error's class as the provider
    classified it, so a replay raises the same error. A retried failure is followed by ``llm/retry``;
    the last one by the turn's ``agent/error``."""

    turn: int
    step: int
    attempt: int = 0
    message: str
    code: str
    retryable: bool = False
    status: int | None = None
    retry_after: float | None = None


class ToolCallEvent(Event, tag="tool/call", kw_only=True):
    turn: int
    step: int
    call_id: str
    name: str
    arguments: str


class ToolResultEvent(Event, tag="tool/result", kw_only=True):
    turn: int
    step: int
    result: ToolResultMessage
    code: str | None = None  # e.g. ABORTED, UNKNOWN_TOOL, INVALID_ARGUMENTS


class RetryEvent(Event, tag="llm/retry", kw_only=True):
    turn: int
    step: int
    provider: str
    model: str
    retry: int
    max_retries: int
    delay_ms: int
    failure: str
    code: str = ""


class AgentError(Event, tag="agent/error", kw_only=True):
    message: str
    turn: int | None = None
    code: str = ""


class ApprovalAsked(Event, tag="approval/asked", kw_only=True):
    id: str
    tool_name: str
    call_id: str | None
    reason: str


ApprovalOutcome = Literal["allowed-once", "rejected", "cancelled", "unavailable"]


class ApprovalDecided(Event, tag="approval/decided", kw_only=True):
    id: str
    outcome: ApprovalOutcome
    answered_by: str | None = None


class CodeDispatchStart(Event, tag="tool/code-dispatch-start", kw_only=True):
    """A tool call made by a program (code mode) is about to start; ``call_id`` is ``<parent>:code:<n>``."""

    turn: int
    step: int
    call_id: str
    parent_call_id: str
    name: str
    arguments: str  # the JSON arguments, as the program passed them


class CodeDispatch(Event, tag="tool/code-dispatch", kw_only=True):
    """A program's tool call finished; ``result`` is the native result content (never the model's history)."""

    turn: int
    step: int
    call_id: str
    parent_call_id: str
    name: str
    arguments: str
    is_error: bool = False
    result: list[ContentBlock] = msgspec.field(default_factory=list)
    code: str | None = None


class Note(Event, tag="note", kw_only=True):
    """Free-form plugin event (tracing, indexes). ``kind`` names the producer's vocabulary."""

    kind: str
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class CompactionStart(Event, tag="compaction/start", kw_only=True):
    """A history policy began rewriting the history before model call ``step`` of ``turn``.

    ``reason`` is ``pressure`` (the request would pass the threshold) or ``overflow`` (the provider
    answered a context-length error); ``estimated_tokens`` is the meter's reading then."""

    turn: int
    step: int
    reason: str
    estimated_tokens: int = 0
    context_window: int = 0
    messages: int = 0  # history length before the rewrite


class CompactionSummary(Event, tag="compaction/summary", kw_only=True):
    """The history was rewritten: messages ``[covered_from, covered_to)`` of the history as it stood
    (after replaying every earlier event) were replaced by ``message``; the rest (``retained``
    messages) follows verbatim. Enough to rebuild the compacted history from the log alone:
    ``history = history[:covered_from] + [message] + history[covered_to:]``."""

    turn: int
    step: int
    reason: str
    covered_from: int
    covered_to: int
    retained: int
    message: UserMessage
    tokens_before: int = 0  # meter estimates of the whole request, before and after
    tokens_after: int = 0
    usage: Usage | None = None  # what the summary call itself cost


class CompactionFailed(Event, tag="compaction/failed", kw_only=True):
    """A compaction was abandoned (the summary call failed or was cancelled, or nothing could be
    summarised); the history is untouched."""

    turn: int
    step: int
    reason: str
    error: str
    code: str = ""


class HookInvoked(Event, tag="hook/invoked", kw_only=True):
    """A hook bridge started one command hook at an interception point (log only, never on the
    wire). ``dialect`` is the bridge (``claude-code``, ``codex``), ``point`` the hook event
    (``PreToolUse``…), ``matcher`` the group pattern that selected it (None: match-all), ``source``
    the hook file; ``handler_id`` pairs it with its ``hook/result``."""

    turn: int
    point: str
    dialect: str
    handler_id: str
    matcher: str | None = None
    source: str | None = None


class HookResult(Event, tag="hook/result", kw_only=True):
    """The outcome of one command hook: ``decision`` (``stop`` for ``continue: false``, which takes
    precedence; else ``block``, ``deny``, ``ask``, ``allow``, ``approve``, or ``pass``), the hook's
    ``stopReason`` (for the user, never shown to the model), its exit code (None: it did not exit
    by itself — killed at its timeout, cancelled, or it could not start), a bounded stderr summary
    and its wall-clock duration."""

    turn: int
    point: str
    handler_id: str
    decision: str
    exit_code: int | None = None
    stderr_summary: str | None = None
    duration_ms: int = 0
    timed_out: bool = False
    stop_reason: str | None = None


class McpServer(_Base, kw_only=True):
    """An MCP server a client handed a session (ACP ``session/new`` ``mcpServers``), as the door
    read it: ``transport`` ``stdio`` (``command``, ``args``, ``env``) or ``http``/``sse``
    (``url``, ``headers``). ``env`` and ``headers`` may hold secrets: never logged, never shown."""

    name: str
    transport: Literal["stdio", "http", "sse"] = "stdio"
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:  # what a debug dump may show: arguments, URLs (tokens in a query), env and headers may hold secrets
        return f"McpServer({self.name!r}, {self.transport})"


class McpConnected(Event, tag="mcp/connected", kw_only=True):
    """A session's MCP server is connected and its tools listed (again, after a reconnect or a
    ``list_changed``): ``tools`` is how many it offers now, ``attempt`` the connection attempt
    (1 for the first), ``source`` where the server came from (``config`` or ``client``),
    ``confinement`` the tier its process runs in."""

    server: str
    transport: str
    tools: int
    attempt: int = 1
    source: str = "config"
    protocol_version: str | None = None
    # a stdio server's sandbox tier as the confinement seam started it ("workspace-write"; danger-full-access
    # and "none" run unconfined); None for a remote (http) server
    confinement: str | None = None


class McpFailed(Event, tag="mcp/failed", kw_only=True):
    """A session's MCP server could not be reached, or went away: ``error`` says why (never a
    secret: no header or environment value), ``retry_in`` the seconds until the next attempt
    (None: no more attempts; its tools are gone until the session ends)."""

    server: str
    transport: str
    error: str
    attempt: int = 1
    retry_in: float | None = None


class SessionSettings(_Base, kw_only=True):
    """A session's own choices, made after it started (by its client, or a tool a person
    approved): ``model`` (an exact model of the session's provider), ``effort`` (the reasoning
    effort, one of the route's ``efforts``), ``mode`` (the permission mode, as the plugin that
    defines modes names it), ``auto_compact`` (whether the history policy compacts on its own:
    False, it never rewrites the history unasked, while a compaction a person asks for, such as
    ``/compact``, still runs). None: the composition's default."""

    model: str | None = None
    effort: str | None = None
    mode: str | None = None
    auto_compact: bool | None = None


class SettingsChanged(Event, tag="settings/changed", kw_only=True):
    """Some of a session's settings changed (``changed``: the names). ``settings`` is the
    whole set now; ``by`` who changed it (``client``, or a tool such as ``exit_plan_mode``);
    ``cache`` whether the provider's prefix cache survives (``kept``) or starts over
    (``broken``: another model, or thinking switched on or off)."""

    settings: SessionSettings
    changed: list[str]
    by: str = "client"
    cache: Literal["kept", "broken"] = "kept"


class SessionTitled(Event, tag="session/titled", kw_only=True):
    """The session's title, as lists show it: written by a short model call on the session's
    route (``by: model``) or taken from the first prompt's first line (``by: prompt``)."""

    title: str
    by: Literal["model", "prompt"] = "model"


class _ForkedUser(_Base, tag="user", tag_field="role", kw_only=True):
    message: UserMessage


class _ForkedAssistant(_Base, tag="assistant", tag_field="role", kw_only=True):
    message: AssistantMessage


class _ForkedResult(_Base, tag="tool", tag_field="role", kw_only=True):
    message: ToolResultMessage


class HistoryForked(Event, tag="history/forked", kw_only=True):
    """A forked session's history at birth: the parent's committed history up to its last
    completed turn, so its first request shares the parent's cached prefix. ``messages`` holds
    each one with its role (``HistoryForked.of`` / ``.history``)."""

    parent_session: str
    messages: list[_ForkedUser | _ForkedAssistant | _ForkedResult]

    @classmethod
    def of(cls, parent_session: str, history: list[UserMessage | AssistantMessage | ToolResultMessage]) -> HistoryForked:
        wrap = {UserMessage: _ForkedUser, AssistantMessage: _ForkedAssistant, ToolResultMessage: _ForkedResult}
        return cls(parent_session=parent_session, messages=[wrap[type(m)](message=m) for m in history])

    def history(self) -> list[UserMessage | AssistantMessage | ToolResultMessage]:
        return [m.message for m in self.messages]


class SubagentStarted(Event, tag="subagent/started", kw_only=True):
    """A child agent this session started (in the parent's log): ``id`` the handle the model
    uses, ``provider`` the subagent provider, ``session`` the child's own session id (None for
    a child that keeps no log here), ``background`` whether the call returned at once."""

    id: str
    provider: str
    description: str
    call_id: str | None = None
    session: str | None = None
    background: bool = False


class SubagentProgress(Event, tag="subagent/progress", kw_only=True):
    """What a child has said so far (bounded, its latest committed text), for a door that
    shows the delegation as it works."""

    id: str
    call_id: str | None = None
    text: str


class SubagentSettled(Event, tag="subagent/settled", kw_only=True):
    """A child's turn ended: ``stop`` (completed, max-tokens, aborted, error, refusal), its
    final text (bounded) and why it failed, if it did."""

    id: str
    call_id: str | None = None
    stop: str
    text: str = ""
    diagnostic: str | None = None


class JobStarted(Event, tag="job/started", kw_only=True):
    """A background job this session started (``host.jobs``): ``id`` the handle the model uses,
    ``kind`` what runs (``bash``…), ``title`` what it is (the command line), ``call_id`` the
    tool call that started it."""

    id: str
    kind: str
    title: str
    call_id: str | None = None


class JobSettled(Event, tag="job/settled", kw_only=True):
    """A background job ended: ``status`` completed (``exit_code``, zero or not), failed (it
    could not run, or died of a signal it was not sent: ``detail`` says why) or killed (by
    ``job_kill``, ``reason``, or with its session); ``output_bytes`` how much it wrote."""

    id: str
    status: str
    exit_code: int | None = None
    detail: str | None = None
    output_bytes: int = 0


DurableEvent = (
    UserMessageEvent
    | InboxClaimed
    | InboxDropped
    | TurnStart
    | TurnEnd
    | RequestHeader
    | AssistantMessageEvent
    | ModelCallFailed
    | ToolCallEvent
    | ToolResultEvent
    | RetryEvent
    | AgentError
    | ApprovalAsked
    | ApprovalDecided
    | CodeDispatchStart
    | CodeDispatch
    | CompactionStart
    | CompactionSummary
    | CompactionFailed
    | HookInvoked
    | HookResult
    | McpConnected
    | McpFailed
    | SettingsChanged
    | SessionTitled
    | HistoryForked
    | SubagentStarted
    | SubagentProgress
    | SubagentSettled
    | JobStarted
    | JobSettled
    | Note
)

LogLine = SessionHeader | DurableEvent

# --------------------------------------------------------------------------- model seam


class ModelInfo(_Base, kw_only=True):
    """What an exact route (provider, model) declares it can do."""

    provider: str
    model: str
    context_window: int = 128_000
    max_output: int = 8_192
    tools: bool = True
    thinking: bool = False
    image_input: bool = False
    known: bool = True  # False when the provider passed an unlisted id through
    efforts: tuple[str, ...] = ()  # the reasoning efforts a session may pick ("off" first when thinking can be off)
    effort: str | None = None  # the effort used when the session picked none


class ToolSpec(_Base, kw_only=True):
    """What the model sees (``name``, ``description``, ``parameters``) plus declarations it does not:

    - ``output_schema``: a JSON schema of the tool's structured result (``ToolOutput.structured``),
      for callers that consume results as data (code mode); None means "the result's text".
    - ``parallel_safe``: True when calls may overlap with other parallel-safe calls (reads);
      False (the default) makes each call run alone, after the calls before it (writes, commands).
    - ``kind``: what a call does, in ACP ToolKind words (``execute``, ``edit``, ``read``,
      ``search``, ``fetch``, …), for a person asked to approve a call the spine raises for the tool
      (an interception ``ask``); None: ``other``. Never sent to the model.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    parallel_safe: bool = False
    kind: str | None = None


class HistoryView(Sequence[Any]):
    """The first ``n`` messages of an append-only history, as a read-only sequence.

    Taking one is O(1): the agent hands each model call a view instead of a copy, so a long
    session does not pay O(history) per call for the copy (and its deallocation) on top of
    what the provider itself does with the messages. Since the history only ever grows, the
    view is a snapshot in effect. Slices return plain lists.
    """

    __slots__ = ("_items", "_n")

    def __init__(self, items: list[Any], n: int | None = None) -> None:
        self._items = items
        self._n = len(items) if n is None else n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._n)
            if step == 1:  # the usual slice: the list's own, in C (bounds already within the view)
                return self._items[start:stop]
            return [self._items[i] for i in range(start, stop, step)]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("history index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[Any]:
        return islice(self._items, self._n)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (HistoryView, list, tuple)):
            return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"HistoryView({list(self)!r})"


class ModelRequest(_Base, kw_only=True):
    """One model call. ``messages`` grows append-only across the calls of a session; the agent
    passes a ``HistoryView`` (read-only, O(1)), tests and tools may pass a plain list."""

    route: ModelInfo
    system: str
    messages: Sequence[UserMessage | AssistantMessage | ToolResultMessage]
    tools: list[ToolSpec]
    session_id: str = ""
    cwd: str = ""
    max_output: int | None = None
    effort: str | None = None  # the session's reasoning effort (None: the route's ``effort``)


class LiveText(_Base, kw_only=True):
    """A piece of an assistant message while the model writes it (``Agent.watch``): not durable,
    not yet committed — the message may still be cut, cancelled or retried. ``message_id`` is the
    id the message has once committed; ``reasoning`` marks the model's thinking."""

    turn: int
    step: int
    message_id: str
    text: str
    reasoning: bool = False


class ToolProgress(_Base, kw_only=True):
    """What a running tool call shows of itself so far (``ToolContext.progress``): the tail of a
    command's output. Not durable: never in the session log nor the model's history; each piece
    replaces the one before (it is the whole of what to show now, not a delta), and the call's
    result replaces the last."""

    call_id: str
    tool_name: str
    text: str


# Streamed deltas a provider yields while answering.
class TextDelta(_Base, tag="text", tag_field="kind", kw_only=True):
    text: str


class ReasoningDelta(_Base, tag="reasoning", tag_field="kind", kw_only=True):
    text: str


class ToolCallDelta(_Base, tag="tool-call", tag_field="kind", kw_only=True):
    """A fragment of tool call ``index``; ``id``/``name`` arrive at least once, arguments in pieces."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class ImageDelta(_Base, tag="image", tag_field="kind", kw_only=True):
    image: ImageBlock


class UsageDelta(_Base, tag="usage", tag_field="kind", kw_only=True):
    usage: Usage


FinishReason = Literal["stop", "tool-calls", "max-tokens"]


class Finish(_Base, tag="finish", tag_field="kind", kw_only=True):
    reason: FinishReason


ModelDelta = TextDelta | ReasoningDelta | ToolCallDelta | ImageDelta | UsageDelta | Finish


class RetryPolicy(_Base, kw_only=True):
    """Bounded exponential backoff with jitter; ``Retry-After`` wins when it is at most ``max_delay``."""

    max_retries: int = 5
    base_delay: float = 0.5
    max_delay: float = 10.0
    jitter: float = 0.1


# --------------------------------------------------------------------------- tools & approval


class ToolOutput(_Base, kw_only=True):
    """A tool's result. ``content`` goes to the model; ``structured`` (optional, JSON-compatible, shaped
    by ``ToolSpec.output_schema``) is the same result as data for programs (code mode) and never
    reaches the model's history."""

    content: list[ContentBlock]
    is_error: bool = False
    code: str | None = None
    structured: Any = None
    spill_path: str | None = None  # set when the tool already bounded its text through dsh_core.spill

    @classmethod
    def text(cls, text: str, *, is_error: bool = False, code: str | None = None) -> ToolOutput:
        return cls(content=[TextBlock(text=text)], is_error=is_error, code=code)


class AfterTool(_Base, kw_only=True):
    """One plugin's decision about a tool result the model is about to see (``dsh_after_tool``).

    ``context``: texts appended after the result, in order (advisory: reminders, discovered
    instructions); the loop wraps each in a ``<system-reminder>`` block. ``block``: replace the
    result with this feedback, marked an error (for hooks that veto a result; several blocks are
    joined). ``halt``: the turn stops once this step's calls are answered (the result is still
    committed as decided). None of it ever rewrites earlier history: the result is only decided here, and the agent
    loop applies the folded decisions once, before the result is committed."""

    context: list[str] = []
    block: str | None = None
    halt: bool = False  # stop the turn after this step (see ``dsh_core.interception``)
    halt_reason: str | None = None  # for the user, never the model


class FileChange(msgspec.Struct, frozen=True, kw_only=True):
    """What a file tool does to one file, as one pair of texts: the text it starts from (the
    editor's unsaved buffer when the front door lends one, else the disk; None: the file does not
    exist yet) and the whole text it writes. Not durable. The tool computes it once, and the same
    pair is what a person approves (``ApprovalRequest.change``), what the tool writes, and what a
    card shows afterwards (``FileChanges``)."""

    path: str  # absolute
    before: str | None
    after: str


class FileChanges:
    """A session's file changes by tool call id, between the tool that made one and whoever shows
    it when the call's result is committed (a session state slot: ``agent.state(FileChanges)``).
    ``take`` removes what it returns; only the last ``KEEP`` calls are kept, so a composition that
    shows none holds little."""

    KEEP = 32

    def __init__(self) -> None:
        self._by_call: dict[str, FileChange] = {}

    def record(self, call_id: str, change: FileChange) -> None:
        self._by_call.pop(call_id, None)
        self._by_call[call_id] = change
        while len(self._by_call) > self.KEEP:
            del self._by_call[next(iter(self._by_call))]

    def take(self, call_id: str) -> FileChange | None:
        return self._by_call.pop(call_id, None)

    def peek(self, call_id: str) -> FileChange | None:
        """The change recorded for ``call_id``, left in place (for a plugin that records it)."""
        return self._by_call.get(call_id)


class ApprovalRequest(msgspec.Struct, kw_only=True):
    """Asked by a tool that needs more than its tier allows. Not durable: ``agent`` is live.

    The optional fields describe the call for a person who must judge it; an answerer
    shows them as it can (the ACP door: ``toolCall.kind``/``title``/``rawInput``), bounded."""

    agent: Any  # the exact Agent object (answerers check identity)
    tool_name: str
    call_id: str | None
    reason: str
    id: str = ""
    kind: str | None = None  # what the call does, in ACP ToolKind words: execute, edit, read, search, fetch, …
    subject: str | None = None  # what it acts on, as a person reads it: the command line, the path
    args: dict[str, Any] | None = None  # the call's arguments (answerers bound what they show)
    tier: str | None = None  # the sandbox tier asked for, e.g. "danger-full-access"
    justification: str | None = None  # the model's reason for asking, in its words
    choices: tuple[str, str] | None = None  # what the answers mean, as a person reads them: (allow, reject) labels
    delegate: str | None = None  # asked for a subagent: its description (the agent above asks its person)
    change: FileChange | None = None  # a file tool's change, from the text it will write over (show this, not the disk)
    decided_by: str | None = None  # set by the seam as it answers: "policy" (a dsh_check_approval verdict) or the answerer's name


class CodeRunError(_Base, kw_only=True):
    """Why a program failed: ``kind`` is exception | timeout | abort | worker-exit | invalid-output | output-limit."""

    kind: Literal["exception", "timeout", "abort", "worker-exit", "invalid-output", "output-limit"]
    message: str


class CodeRunResult(_Base, kw_only=True):
    """What a code runtime returns: the program's captured output lines, its return value (None: none)
    and, on failure, the error."""

    logs: list[str] = msgspec.field(default_factory=list)
    value: Any = None
    error: CodeRunError | None = None


def now() -> float:
    return time.time()


log_encoder = msgspec.json.Encoder()
log_decoder = msgspec.json.Decoder(LogLine)


# --------------------------------------------------------------------------- subagents


class SubagentResult(msgspec.Struct, frozen=True, kw_only=True):
    """How a child's turn ended. ``stop``: ``completed`` | ``max-tokens`` | ``aborted`` |
    ``error`` | ``refusal``; ``text`` its final message (``completed``) or what it had said
    (otherwise: the partial text); ``diagnostic`` why it failed, in words for the model."""

    stop: str
    text: str = ""
    diagnostic: str | None = None

    @property
    def completed(self) -> bool:
        return self.stop == "completed"


# --------------------------------------------------------------------------- system-prompt guidance


class Guidance(msgspec.Struct, frozen=True, kw_only=True):
    """One section of usage guidance for some tools, in the system prompt of every agent that has
    at least one of them (``dsh_register_guidance``).

    ``name`` is unique per host (``tool:<tool>`` by convention); ``order`` places it among the
    others (then ``name``), so an agent's prompt is the same text every time it is built and the
    provider's prefix cache keeps hitting; ``tools`` names the tools it is about (an agent with
    none of them gets no section); ``text`` is the section, written for the model."""

    name: str
    order: int
    tools: tuple[str, ...]
    text: str
