"""The agent loop: inbox, turns, tool dispatch, committed events, cancel, quiescence, dispose.

An agent is pinned to one cwd and one exact route. ``submit`` publishes a durable
``user/message`` and queues it; a driver task (owned by the host's task group)
claims the whole inbox as one turn and runs steps — model call, then the tool
calls it asked for, then the next model call — until a step asks for no tool.

Only *committed* things are events: an assistant message is committed when its
model call finishes (or, interrupted, when the call is cancelled with text
already produced); a failed or retried attempt leaves no ``assistant/message``.
History sent to the model is append-only, so provider prefix caches keep hitting.

This module is the concrete loop behind ``protocols.Agent``: it knows its host only as a
``protocols.Host`` (the host builds agents through ``dsh_make_agent`` and never imports this
module), and nothing outside ``dsh_core`` imports it.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from .diag import warn
from .errors import AgentDisposed, ModelError, SessionLogFailed, ToolError
from .interception import (
    BLOCKED_TOOL,
    HALTED_TOOL,
    BeforeStop,
    BeforeTool,
    PromptSubmit,
    SessionStart,
    fold_before_tool,
    reminder,
    settle,
)
from .protocols import AgentSpec, HistoryContext, Observer, ToolContext, new_id
from .schedule import ToolScheduler
from .spill import bound, spill_path_for
from .state import StateSlots
from .types import (
    AfterTool,
    AgentError,
    ApprovalRequest,
    AssistantMessage,
    AssistantMessageEvent,
    CompactionSummary,
    ContentBlock,
    DurableEvent,
    Finish,
    HistoryView,
    ImageBlock,
    ImageDelta,
    InboxClaimed,
    InboxDropped,
    ModelCallFailed,
    ModelInfo,
    ModelRequest,
    Note,
    ReasoningBlock,
    ReasoningDelta,
    RequestHeader,
    RetryEvent,
    SessionHeader,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    ToolCallEvent,
    ToolOutput,
    ToolResultEvent,
    ToolResultMessage,
    TurnEnd,
    TurnStart,
    Usage,
    UsageDelta,
    UserMessage,
    UserMessageEvent,
    now,
)

if TYPE_CHECKING:  # pragma: no cover
    from . import protocols
    from .protocols import Host, ModelProvider, SessionLog, Tool

T = TypeVar("T")


class _TurnFailed(Exception):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass
class _Text:
    """Consecutive text (or reasoning) deltas of one model call, joined when the call ends."""

    reasoning: bool
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass
class _ToolSlot:
    """One tool call as its deltas arrive: id and name may come late, arguments in pieces."""

    id: str
    name: str
    args: list[str] = field(default_factory=list)


class _Partial:
    """Accumulates one model call's deltas into content blocks in arrival order."""

    def __init__(self) -> None:
        self.blocks: list[_Text | _ToolSlot | ImageBlock] = []
        self.tool_slots: dict[int, _ToolSlot] = {}
        self.usage: Usage | None = None
        self.finish: str | None = None

    def _text(self, text: str, *, reasoning: bool) -> None:
        last = self.blocks[-1] if self.blocks else None
        if isinstance(last, _Text) and last.reasoning == reasoning:
            last.parts.append(text)
        else:
            self.blocks.append(_Text(reasoning, [text]))

    def apply(self, d: Any) -> None:
        if isinstance(d, TextDelta):
            self._text(d.text, reasoning=False)
        elif isinstance(d, ReasoningDelta):
            self._text(d.text, reasoning=True)
        elif isinstance(d, ToolCallDelta):
            slot = self.tool_slots.get(d.index)
            if slot is None:
                slot = self.tool_slots[d.index] = _ToolSlot(d.id or "", d.name or "")
                self.blocks.append(slot)
            if d.id:
                slot.id = d.id
            if d.name:
                slot.name = d.name
            if d.arguments:
                slot.args.append(d.arguments)
        elif isinstance(d, ImageDelta):
            self.blocks.append(d.image)
        elif isinstance(d, UsageDelta):
            self.usage = d.usage
        elif isinstance(d, Finish):
            self.finish = d.reason

    def content(self, *, keep_tools: bool) -> list[ContentBlock]:
        out: list[ContentBlock] = []
        for b in self.blocks:
            if isinstance(b, _Text):
                out.append(ReasoningBlock(text=b.text) if b.reasoning else TextBlock(text=b.text))
            elif isinstance(b, _ToolSlot):
                if keep_tools:
                    out.append(ToolCallBlock(id=b.id or new_id("call_"), name=b.name, arguments="".join(b.args)))
            else:
                out.append(b)
        return out

    @property
    def has_visible(self) -> bool:
        return any((isinstance(b, _Text) and not b.reasoning and b.text) or isinstance(b, ImageBlock)
                   for b in self.blocks)


@dataclass
class _Replay:
    """What ``Agent.restore`` rebuilds from a recorded log, one event at a time."""

    seq: int
    turn: int
    pending: dict[str, UserMessage] = field(default_factory=dict)  # recorded, not yet claimed
    history: list[UserMessage | AssistantMessage | ToolResultMessage] = field(default_factory=list)
    open_turn: int | None = None
    answered: set[str] = field(default_factory=set)  # call ids with a result in the open turn
    calls: list[tuple[int, int, ToolCallBlock]] = field(default_factory=list)  # (turn, step, call) of the open turn
    claimed: set[str] = field(default_factory=set)  # ids the last claim moved into the history

    def apply(self, ev: DurableEvent) -> None:
        self.seq = max(self.seq, ev.seq)
        if isinstance(ev, UserMessageEvent):
            if ev.message.source in IMMEDIATE_SOURCES:  # spliced by the loop itself: history at once
                self.history.append(ev.message)
            else:
                self.pending[ev.message.id] = ev.message
        elif isinstance(ev, InboxClaimed):
            self.claimed = set(ev.message_ids)
            self.history.extend(self.pending.pop(i) for i in ev.message_ids if i in self.pending)
            self.turn = max(self.turn, ev.turn)
        elif isinstance(ev, InboxDropped):
            for i in ev.message_ids:
                self.pending.pop(i, None)
        elif isinstance(ev, TurnStart):
            self.open_turn, self.answered, self.calls = ev.turn, set(), []
            self.turn = max(self.turn, ev.turn)
        elif isinstance(ev, TurnEnd):
            self._turn_end(ev)
        elif isinstance(ev, AssistantMessageEvent):
            if ev.message.content:  # as the loop did: an empty (cut) message never entered history
                self.history.append(ev.message)
            self.calls.extend((ev.turn, ev.step, b) for b in ev.message.content if isinstance(b, ToolCallBlock))
        elif isinstance(ev, ToolResultEvent):
            self.history.append(ev.result)
            self.answered.add(ev.result.call_id)
        elif isinstance(ev, CompactionSummary):  # replayed exactly as the policy rewrote it
            self.history = [*self.history[:ev.covered_from], ev.message, *self.history[ev.covered_to:]]

    def _turn_end(self, ev: TurnEnd) -> None:
        self.open_turn = None
        if ev.reason == "blocked":  # dsh_prompt_submit kept the claimed prompt out
            self.history = [m for m in self.history if not (isinstance(m, UserMessage) and m.id in self.claimed)]


class Agent:
    """The spine's agent. Front doors use only the ``protocols.Agent`` surface."""

    def __init__(self, spec: AgentSpec, host: Host) -> None:
        self.spec = spec
        self.host = host
        self.session_id = spec.session_id
        self.cwd = spec.cwd
        self.provider: ModelProvider = host.provider(spec.provider)
        self.route: ModelInfo = self.provider.resolve(spec.model)
        self.tools: dict[str, Tool] = dict(host.tools)
        self.system: str = host.system_prompt(spec)
        self.header = SessionHeader(
            id=spec.session_id,
            cwd=spec.cwd,
            provider=spec.provider,
            model=spec.model,
            parent_session=spec.parent.session_id if spec.parent else None,
            delegation_depth=spec.depth,
            origin=spec.origin,
        )
        self.log: SessionLog = host.session_store.open(self.header)
        self.children: list[protocols.Agent] = []
        self.log_error: Exception | None = None  # the first failure of the durable log, if any
        self._observers: list[Observer] = []
        self._seq = 0
        self._turn = 0
        self._inbox: list[UserMessage] = []
        self._history: list[UserMessage | AssistantMessage | ToolResultMessage] = []
        self._busy = False
        self._idle = anyio.Event()
        self._idle.set()
        self._scope: anyio.CancelScope | None = None
        self._abort_kind: str | None = None
        self._disposed = False
        self._wake: anyio.Event | None = None
        self._header_sent = False
        self._state = StateSlots()  # plugin state of this session (dsh_core.state)
        self._offered: list[str] | None = None  # None: every tool is offered to the model
        self._unknown_hint = ""
        self._spliced: list[UserMessage] = []
        self._metered: tuple[int, int] | None = None  # (reported prompt tokens, messages in that request)
        self._start_source: str | None = "startup"  # dsh_session_start is still due (None: done)
        self._halted: str | None = None  # the interception point that stopped the running turn
        if spec.parent is not None:
            spec.parent.children.append(self)
        self.history_policy = host.pm.hook.dsh_history_policy(session=self, host=host)

    # ------------------------------------------------------------------ events

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Call ``observer(agent, event)`` synchronously for each durable event, in order."""
        self._observers.append(observer)

        def unsubscribe() -> None:
            if observer in self._observers:
                self._observers.remove(observer)

        return unsubscribe

    def emit(self, event: DurableEvent) -> None:
        self._seq += 1
        event.seq = self._seq
        event.time = now()
        if self.log_error is None:
            try:
                self.log.append(event)
            except Exception as exc:  # e.g. disk full, no descriptor left
                # No work without a record: the running turn fails (LOG_FAILED), later prompts are
                # refused, and the log stops at the failure (no gaps). Other sessions are untouched.
                warn(f"session log of {self.session_id} failed; the session stops taking prompts: {exc}")
                self.log_error = exc
                if self._scope is not None and not self._scope.cancel_called:
                    self._scope.cancel()
        for obs in list(self._observers):
            try:
                obs(self, event)
            except Exception as exc:  # an observer must not break the loop
                warn(f"session observer failed: {exc!r}")
        self.host.observe(self, event)

    # ------------------------------------------------------------------ public surface

    @property
    def turn(self) -> int:
        """The number of the running (or last) turn; 0 before the first."""
        return self._turn

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def disposed(self) -> bool:
        return self._disposed

    def state(self, cls: type[T], factory: Callable[[], T] | None = None) -> T:
        """This session's ``cls`` slot, created by ``factory`` (default ``cls()``) on first use."""
        return self._state.get(cls, factory)

    def describe_state(self) -> dict[str, str]:
        """Every plugin state slot of this session, bounded reprs (debug dumps)."""
        return self._state.describe()

    def set_route(self, model: str) -> None:
        """Switch the exact model of this session (the next request uses it)."""
        self.route = self.provider.resolve(model)
        self._header_sent = False

    def offer(self, names: list[str], *, hint: str = "") -> None:
        """Offer only ``names`` (in this order) to the model. A direct call of any other tool is
        answered ``UNKNOWN_TOOL`` followed by ``hint``; every tool stays callable through
        ``call_tool`` (code mode offers only ``run_code`` and calls the others from programs)."""
        self._offered = [n for n in names if n in self.tools]
        self._unknown_hint = hint
        self._header_sent = False

    @property
    def offered(self) -> list[str]:
        return list(self.tools) if self._offered is None else list(self._offered)

    def splice(self, content: list[ContentBlock]) -> None:
        """Queue a user message (source ``tool``) for the history after the current step's tool results."""
        if content:
            self._spliced.append(UserMessage(id=new_id("msg_"), content=list(content), source="tool"))

    def submit(self, message: UserMessage) -> None:
        """Publish ``user/message`` and queue it for the next turn. Never blocks."""
        if self._disposed:
            raise AgentDisposed(f"agent {self.session_id} was disposed")
        if self.log_error is None:
            self.emit(UserMessageEvent(message=message))
        if self.log_error is not None:
            raise SessionLogFailed(self._log_failure())
        self._inbox.append(message)
        if not self._busy:
            self._busy = True
            self._idle = anyio.Event()
            if self._wake is None:  # the driver lives as long as the agent: no task per prompt
                self._wake = anyio.Event()
                self.host.task_group.start_soon(self._drive, name=f"agent {self.session_id[:8]}")
            else:
                self._wake.set()

    def cancel(self, kind: str = "user") -> None:
        """Abort the running turn and drop unclaimed messages. Idempotent; returns at once."""
        if self._inbox:
            dropped = [m.id for m in self._inbox]
            self._inbox.clear()
            self.emit(InboxDropped(message_ids=dropped, reason=kind))
        if self._scope is not None and not self._scope.cancel_called:
            self._abort_kind = kind
            self._scope.cancel()

    async def wait_idle(self) -> None:
        """Return when no turn runs and the inbox is empty (quiescence)."""
        while self._busy:
            await self._idle.wait()

    async def dispose(self) -> None:
        """Cancel, wait for quiescence, dispose children (child first), close the log."""
        if self._disposed:
            await self.wait_idle()
            return
        self._disposed = True
        self.cancel("disposed")
        await self.wait_idle()
        if self._wake is not None:
            self._wake.set()  # let the idle driver task end
        errors: list[Exception] = []
        for child in list(reversed(self.children)):
            try:
                await child.dispose()
            except Exception as exc:
                errors.append(exc)
        with anyio.CancelScope(shield=True):
            await self.log.close()
        forget = getattr(self.provider, "forget", None)  # optional: per-session provider state
        if forget is not None:
            try:
                forget(self.session_id)
            except Exception as exc:
                warn(f"provider {self.provider.name!r} failed to forget session {self.session_id}: {exc!r}")
        if self.spec.parent is not None and self in self.spec.parent.children:
            self.spec.parent.children.remove(self)
        if errors:
            raise ExceptionGroup(f"disposing children of {self.session_id} failed", errors)

    def _log_failure(self) -> str:
        return (f"the session log cannot be written ({self.log_error}); nothing more of this session is "
                "recorded, so it takes no more prompts — start a new session")

    # ------------------------------------------------------------------ resume

    def restore(self, events: list[DurableEvent]) -> None:
        """Rebuild this (fresh, idle) agent's conversation from a recorded log's events, so the
        session continues where it stopped. Nothing is re-run and nothing is re-published to
        observers; the log keeps growing after ``events``.

        The model's history gets exactly what the original loop had put there: claimed user
        messages, committed assistant messages (reasoning blocks included, so a provider that
        needs them replayed gets them), tool results and spliced messages. A turn the log
        shows started but not ended (the process died mid-turn) stays interrupted: each of its
        tool calls without a result gets an error result saying it was not re-run, and a
        ``turn/end`` (aborted, ``interrupted``) is recorded, so history stays a valid conversation."""
        if self._busy or self._seq or self._history:
            raise RuntimeError("restore() needs a fresh, idle agent")
        replay = _Replay(seq=self._seq, turn=self._turn)
        for ev in events:
            replay.apply(ev)
        self._seq, self._turn = replay.seq, replay.turn
        self._history = replay.history
        self._start_source = "resume"
        if replay.open_turn is not None:
            self._interrupt(replay.open_turn, [c for c in replay.calls if c[2].id not in replay.answered])

    def _interrupt(self, open_turn: int, unanswered: list[tuple[int, int, ToolCallBlock]]) -> None:
        """Close a restored turn the process died in: an error result for each call without one,
        then ``turn/end`` (aborted, ``interrupted``)."""
        for turn, step, call in unanswered:
            result = ToolResultMessage(
                call_id=call.id,
                name=call.name,
                content=[TextBlock(text="Error: interrupted (the agent process stopped during this call); "
                                        "it was not re-run")],
                is_error=True,
            )
            self._history.append(result)
            self.emit(ToolResultEvent(turn=turn, step=step, result=result, code="INTERRUPTED"))
        self.emit(TurnEnd(turn=open_turn, reason="aborted", abort_kind="interrupted"))

    # ------------------------------------------------------------------ the loop

    async def _drive(self) -> None:
        try:
            while True:
                while self._inbox and not self._disposed:
                    await self._run_turn()
                self._busy = False
                self._idle.set()
                if self._disposed:
                    return
                assert self._wake is not None
                self._wake = anyio.Event()
                await self._wake.wait()
        finally:
            self._wake = None
            self._busy = False
            self._idle.set()

    async def _run_turn(self) -> None:
        self._turn += 1
        turn = self._turn
        claimed, self._inbox = self._inbox, []
        self.emit(InboxClaimed(turn=turn, message_ids=[m.id for m in claimed]))
        self._history.extend(claimed)
        self.emit(TurnStart(turn=turn))
        self._abort_kind = None
        self._halted = None
        reason, error, code = "completed", None, None
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                if self.log_error is None:  # InboxClaimed/TurnStart already failed to record: do no work
                    reason = await self._turn_body(turn, claimed)
            except _TurnFailed as exc:
                reason, error, code = "error", exc.message, exc.code
            except Exception as exc:  # a plugin bug fails this turn, never the host's other sessions
                warn(f"turn {turn} of {self.session_id} crashed: {exc!r}")
                reason, error, code = "error", f"internal error: {type(exc).__name__}: {exc}", "INTERNAL"
        self._scope = None
        if self.log_error is not None:
            reason, error, code = "error", self._log_failure(), "LOG_FAILED"
        elif scope.cancelled_caught or (scope.cancel_called and reason == "completed"):
            reason = "aborted"
        if reason == "error":
            self.emit(AgentError(turn=turn, message=error or "unknown error", code=code or ""))
        self.emit(
            TurnEnd(
                turn=turn,
                reason=reason,  # type: ignore[arg-type]
                abort_kind=(self._abort_kind or "user") if reason == "aborted" else None,
                error=error,
                code=code,
            )
        )

    def _request(self) -> ModelRequest:
        tools = [self.tools[n].spec for n in self.offered] if self.route.tools else []
        if not self._header_sent:
            self._header_sent = True
            self.emit(
                RequestHeader(
                    provider=self.route.provider,
                    model=self.route.model,
                    system=self.system,
                    tools=[{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools],
                    route=self.route,
                )
            )
        return ModelRequest(
            route=self.route,
            system=self.system,
            messages=HistoryView(self._history),
            tools=tools,
            session_id=self.session_id,
            cwd=self.cwd,
        )

    def _append_context(self, texts: list[str]) -> None:
        """Append plugin context after what the model saw (one user message, source ``hook``)."""
        if texts:
            message = UserMessage(id=new_id("msg_"), content=[TextBlock(text=reminder(t)) for t in texts], source="hook")
            self._history.append(message)
            self.emit(UserMessageEvent(message=message))

    async def _intercept_prompt(self, turn: int, claimed: list[UserMessage]) -> bool:
        """Session start (once per agent object) and prompt submit. False: the prompt is blocked."""
        hook = self.host.pm.hook
        context: list[str] = []
        if self._start_source is not None:
            source, self._start_source = self._start_source, None
            started = [a for a in await settle(hook.dsh_session_start(session=self, source=source, turn=turn))
                       if isinstance(a, SessionStart)]
            context += [c for a in started for c in a.context if c]
            self._halt(turn, "session_start", started)
        answers: list[PromptSubmit] = []
        if not self._halted:  # a stop at session start: the prompt is not submitted
            answers = [a for a in await settle(hook.dsh_prompt_submit(session=self, messages=list(claimed), turn=turn))
                       if isinstance(a, PromptSubmit)]
            self._halt(turn, "prompt_submit", answers)
        blocks = [a.block for a in answers if a.block]
        if blocks or self._halted:  # a stop before the prompt was admitted keeps it out, as a block does
            ids = {m.id for m in claimed}
            self._history = [m for m in self._history if not (isinstance(m, UserMessage) and m.id in ids)]
            self.emit(Note(kind="prompt/blocked", data={"turn": turn, "messageIds": sorted(ids),
                                                         "reason": "\n\n".join(blocks) or "a hook stopped the turn"}))
            self._append_context(context)  # session context stays: it is not the prompt's
            return False
        self._append_context(context + [c for a in answers for c in a.context if c])
        return True

    async def _intercept_stop(self, turn: int, step: int, continued: int) -> bool:
        """True: a ``dsh_before_stop`` answer made the turn take another step."""
        answers = [a for a in await settle(self.host.pm.hook.dsh_before_stop(
            session=self, turn=turn, step=step, continued=continued)) if isinstance(a, BeforeStop)]
        blocks = [a.block for a in answers if a.block]
        if self._halt(turn, "before_stop", answers) or not blocks:  # a stop wins over a block
            return False
        message = UserMessage(id=new_id("msg_"), content=[TextBlock(text="\n\n".join(blocks))], source="hook")
        self._history.append(message)
        self.emit(UserMessageEvent(message=message))
        return True

    def _halt(self, turn: int, point: str, answers: list[Any]) -> bool:
        """Note the first interception answer of this turn that stops it (``halt``), with the reasons
        for the user; True when the turn is stopped."""
        halting = [a for a in answers if getattr(a, "halt", False)]
        if halting and self._halted is None:
            self._halted = point
            reasons = [a.halt_reason for a in halting if a.halt_reason]
            data: dict[str, Any] = {"turn": turn, "point": point}
            if reasons:
                data["reason"] = "\n\n".join(reasons)
            self.emit(Note(kind="turn/stopped", data=data))
        return self._halted is not None

    async def _turn_body(self, turn: int, claimed: list[UserMessage] | None = None) -> str:
        if claimed is not None and not await self._intercept_prompt(turn, claimed):
            return "blocked"
        step = 0
        continued = 0
        while True:
            step += 1
            if self.host.pm.hook.dsh_check_step(session=self, turn=turn, step=step) == "stop":
                return "max-steps"  # a step budget: everything so far is committed, every call answered
            partial = await self._call_model(turn, step)
            # Cut by max tokens: no tool call of this message runs or is committed, the one that was
            # still streaming included (its arguments are incomplete; the rest would need results).
            truncated = partial.finish == "max-tokens"
            content = partial.content(keep_tools=not truncated)
            message = AssistantMessage(
                id=new_id("msg_"), content=content, provider=self.route.provider, model=self.route.model
            )
            calls = [b for b in content if isinstance(b, ToolCallBlock)]
            if content:  # a cut that left nothing is logged (usage, finish) but is no turn of the conversation
                self._history.append(message)
            self.emit(
                AssistantMessageEvent(
                    turn=turn,
                    step=step,
                    message=message,
                    usage=partial.usage,
                    finish=partial.finish or ("tool-calls" if calls else "stop"),
                )
            )
            if truncated:
                return "max-tokens"
            if not calls:
                if await self._intercept_stop(turn, step, continued):
                    continued += 1
                    continue
                return "stopped" if self._halted else "completed"
            await self._run_tools(turn, step, calls)
            if self._halted:
                return "stopped"  # an interception point stopped the turn: every call is answered

    @property
    def history(self) -> HistoryView:
        """The model history as a read-only view (O(1))."""
        return HistoryView(self._history)

    def _history_context(self, turn: int, step: int, request: ModelRequest) -> HistoryContext:
        tokens, count = self._metered if self._metered is not None else (None, 0)
        return HistoryContext(
            agent=self, turn=turn, step=step, route=request.route, system=request.system, tools=request.tools,
            history=HistoryView(self._history), metered_tokens=tokens, metered_messages=count,
        )

    def _replace_history(self, messages: Any) -> None:
        # A new list, never an in-place edit: views handed to earlier calls stay what they were.
        self._history = list(messages)
        self._metered = None

    async def _call_model(self, turn: int, step: int) -> _Partial:
        policy = self.provider.retry_policy
        attempt = 0
        recovered = False
        if self.history_policy is not None:
            replacement = await self.history_policy.prepare(self._history_context(turn, step, self._request()))
            if replacement is not None:
                self._replace_history(replacement)
        while True:
            request = self._request()
            partial = _Partial()
            try:
                # aclosing: whatever ends the loop, the provider's stream (an HTTP response) closes now
                async with contextlib.aclosing(self.provider.stream(request)) as deltas:
                    async for delta in deltas:
                        partial.apply(delta)
                if partial.usage is not None and partial.usage.input_tokens:
                    self._metered = (partial.usage.input_tokens, len(request.messages))
                return partial
            except ModelError as exc:
                self.emit(
                    ModelCallFailed(
                        turn=turn, step=step, attempt=attempt, message=exc.message, code=exc.code,
                        retryable=exc.retryable, status=exc.status, retry_after=exc.retry_after,
                    )
                )
                if exc.code == "CONTEXT_WINDOW_EXCEEDED" and self.history_policy is not None and not recovered:
                    recovered = True  # one retry after a rewrite, never a loop
                    replacement = await self.history_policy.recover(self._history_context(turn, step, request), exc)
                    if replacement is not None:
                        self._replace_history(replacement)
                        continue
                if not exc.retryable or attempt >= policy.max_retries:
                    suffix = f" (after {attempt} retries)" if attempt else ""
                    raise _TurnFailed(exc.message + suffix, exc.code) from exc
                attempt += 1
                delay = min(policy.max_delay, policy.base_delay * 2 ** (attempt - 1))
                delay *= 1 + random.uniform(-policy.jitter, policy.jitter)
                if exc.retry_after is not None and exc.retry_after >= 0:
                    delay = min(policy.max_delay, max(delay, exc.retry_after))  # never sooner than asked
                self.emit(
                    RetryEvent(
                        turn=turn,
                        step=step,
                        provider=self.route.provider,
                        model=self.route.model,
                        retry=attempt,
                        max_retries=policy.max_retries,
                        delay_ms=int(delay * 1000),
                        failure=exc.message,
                        code=exc.code,
                    )
                )
                await anyio.sleep(delay)
            except anyio.get_cancelled_exc_class():
                if partial.has_visible:
                    message = AssistantMessage(
                        id=new_id("msg_"),
                        content=partial.content(keep_tools=False),
                        provider=self.route.provider,
                        model=self.route.model,
                    )
                    self._history.append(message)
                    self.emit(
                        AssistantMessageEvent(
                            turn=turn, step=step, message=message, usage=partial.usage, finish="aborted", interrupted=True
                        )
                    )
                raise

    def parallel_safe(self, name: str) -> bool:
        """Whether calls of ``name`` may overlap (unknown tools run nothing, so they may)."""
        tool = self.tools.get(name)
        return tool is None or bool(getattr(tool.spec, "parallel_safe", False))

    async def _run_tools(self, turn: int, step: int, calls: list[ToolCallBlock]) -> None:
        results: list[ToolOutput | None] = [None] * len(calls)
        for call in calls:
            self.emit(ToolCallEvent(turn=turn, step=step, call_id=call.id, name=call.name, arguments=call.arguments))
        # Calls start in the model's order; parallel-safe ones overlap, exclusive ones (writes,
        # commands) run alone, so two writes of one message never race.
        scheduler = ToolScheduler()
        tickets = [scheduler.ticket(self.parallel_safe(c.name) or c.name not in self.offered) for c in calls]

        async def run_one(i: int, call: ToolCallBlock) -> None:
            async with tickets[i]:
                results[i] = await self._run_tool(turn, step, call)

        try:
            async with anyio.create_task_group() as tg:
                for i, call in enumerate(calls):
                    tg.start_soon(run_one, i, call)
        finally:
            # Every call gets a result, so the history stays a valid conversation.
            for i, call in enumerate(calls):
                out = results[i] or ToolOutput.text("Error: tool call aborted", is_error=True, code="ABORTED")
                result = ToolResultMessage(call_id=call.id, name=call.name, content=out.content, is_error=out.is_error)
                self._history.append(result)
                self.emit(ToolResultEvent(turn=turn, step=step, result=result, code=out.code))
            spliced, self._spliced = self._spliced, []
            for message in spliced:
                self._history.append(message)
                self.emit(UserMessageEvent(message=message))

    async def _run_tool(self, turn: int, step: int, call: ToolCallBlock) -> ToolOutput:
        return await self._after_tool(call, self._bounded(call, await self._dispatch(turn, step, call)))

    def _bounded(self, call: ToolCallBlock, out: ToolOutput) -> ToolOutput:
        """Bound a result the model will see (one spill mechanism for every tool)."""
        if out.spill_path is not None:
            return out
        text = "\n".join(b.text for b in out.content if isinstance(b, TextBlock))
        if len(text.encode("utf-8", errors="replace")) <= self.host.spill_limit:
            return out
        path = spill_path_for(self.host.spill_root, self.session_id, call.id)
        spilled = False
        try:
            bounded, spilled = bound(text, self.host.spill_limit, path)
        except OSError as exc:  # no spill file: still never flood the model
            warn(f"spill of {call.name} result failed: {exc}")
            bounded = text[: self.host.spill_limit] + f"\n[… output truncated; the spill file failed: {exc}]"
        content: list[ContentBlock] = [TextBlock(text=bounded)] + [b for b in out.content if not isinstance(b, TextBlock)]
        return ToolOutput(content=content, is_error=out.is_error, code=out.code, structured=out.structured,
                          spill_path=str(path) if spilled else None)

    async def _after_tool(self, call: ToolCallBlock, out: ToolOutput, *, nested: bool = False) -> ToolOutput:
        """Fold the ``dsh_after_tool`` decisions: feedback that blocks replaces the content (and
        drops the structured result, so a program sees the error too); context is appended after
        the result, or for a program's nested call (which the model never reads) spliced after this
        step's results. Nothing runs once an interception point stopped the turn."""
        if self._halted:
            return out
        answers: list[AfterTool] = [
            a for a in await settle(self.host.pm.hook.dsh_after_tool(session=self, call=call, output=out))
            if isinstance(a, AfterTool)
        ]
        if not answers:
            return out
        self._halt(self._turn, "after_tool", answers)
        blocks = [a.block for a in answers if a.block]
        context: list[ContentBlock] = [TextBlock(text=reminder(c)) for a in answers for c in a.context if c]
        if not blocks and not context:
            return out
        content: list[ContentBlock] = [TextBlock(text="\n\n".join(blocks))] if blocks else list(out.content)
        if nested:
            self.splice(context)
        else:
            content += context
        return ToolOutput(
            content=content, is_error=out.is_error or bool(blocks), code="BLOCKED" if blocks else out.code,
            structured=None if blocks else out.structured, spill_path=out.spill_path,
        )

    async def _dispatch(self, turn: int, step: int, call: ToolCallBlock) -> ToolOutput:
        if call.name not in self.offered:
            known = ", ".join(self.offered) or "none"
            hint = f" {self._unknown_hint}" if self._unknown_hint and call.name in self.tools else ""
            return ToolOutput.text(
                f"Error: unknown tool {call.name!r}. Available tools: {known}.{hint}", is_error=True, code="UNKNOWN_TOOL"
            )
        return await self._call(call.name, call.arguments, call_id=call.id, turn=turn, step=step)

    async def call_tool(
        self, name: str, arguments: str | dict[str, Any], *, call_id: str, turn: int, step: int
    ) -> ToolOutput:
        """Run one tool call through the normal tool path: lookup among all of this agent's tools
        (offered or not), argument decoding, the ``dsh_before_tool`` interception, a ``ToolContext``
        (so approvals reach the approval seam with ``call_id``), errors mapped to error results,
        then the ``dsh_after_tool`` interception (the result is not bounded: a program reads it
        whole). Never raises for a tool's failure; cancellation propagates. Tools that call tools
        (code mode) use this."""
        out = await self._call(name, arguments, call_id=call_id, turn=turn, step=step)
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return await self._after_tool(ToolCallBlock(id=call_id, name=name, arguments=raw), out, nested=True)

    async def _call(
        self, name: str, arguments: str | dict[str, Any], *, call_id: str, turn: int, step: int
    ) -> ToolOutput:
        if self._halted:  # an interception point stopped the turn: nothing more runs in it
            return ToolOutput.text(f"Error: {HALTED_TOOL}", is_error=True, code="STOPPED")
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return ToolOutput.text(
                f"Error: unknown tool {name!r}. Available tools: {known}.", is_error=True, code="UNKNOWN_TOOL"
            )
        if isinstance(arguments, dict):
            args = arguments
        else:
            try:
                args = json.loads(arguments) if arguments.strip() else {}
                if not isinstance(args, dict):
                    raise ValueError("arguments must be a JSON object")
            except ValueError as exc:
                return ToolOutput.text(
                    f"Error: the arguments of {name} are not a JSON object ({exc}). Call it again with valid JSON.",
                    is_error=True,
                    code="INVALID_ARGUMENTS",
                )
        refused = await self._before_tool(tool, name, args, call_id, turn, step)
        if refused is not None:
            return refused
        ctx = ToolContext(agent=self, call_id=call_id, tool_name=name, turn=turn, step=step)
        try:
            return await tool.run(args, ctx)
        except ToolError as exc:
            return ToolOutput.text(f"Error: {exc.message}", is_error=True, code=exc.code)
        except Exception as exc:
            return ToolOutput.text(f"Error: tool {name} crashed: {exc!r}", is_error=True, code="TOOL_CRASHED")

    async def _before_tool(
        self, tool: Tool, name: str, args: dict[str, Any], call_id: str, turn: int, step: int
    ) -> ToolOutput | None:
        """Fold the ``dsh_before_tool`` answers (deny > ask > allow); an error result when the call
        must not run, None when it may."""
        answers = [a for a in await settle(self.host.pm.hook.dsh_before_tool(
            session=self, name=name, args=args, call_id=call_id, turn=turn, step=step)) if isinstance(a, BeforeTool)]
        if self._halt(turn, "before_tool", answers):  # a stop wins over any verdict: the call does not run
            return ToolOutput.text(f"Error: {HALTED_TOOL}", is_error=True, code="STOPPED")
        verdict = fold_before_tool(answers)
        if verdict.decision == "deny":
            return ToolOutput.text(f"Error: {verdict.reason or BLOCKED_TOOL}", is_error=True, code="BLOCKED")
        if verdict.decision == "ask":
            reason = verdict.reason or f"a hook asks before {name} runs"
            outcome = await self.host.approvals.request(ApprovalRequest(
                agent=self, tool_name=name, call_id=call_id, reason=reason,
                kind=tool.spec.kind, subject=_subject(args, reason), args=args,
            ))
            if outcome != "allowed-once":
                return ToolOutput.text(f"Error: the user rejected tool {name!r} ({reason})", is_error=True,
                                       code="REJECTED")
        return None


# Sources of user messages the loop itself puts into the history when it records them (not
# through the inbox): results spliced after tool calls, and interception context.
IMMEDIATE_SOURCES = frozenset({"tool", "hook"})


def _subject(args: dict[str, Any], reason: str) -> str:
    """What a person judging the call reads: what it acts on, then why it is asked."""
    for key in ("command", "path", "pattern", "description"):
        if isinstance(args.get(key), str):
            return f"{args[key]} — {reason}"
    return reason

if TYPE_CHECKING:  # pragma: no cover - mypy checks the concrete loop against the contract doors program to

    def _satisfies_the_contract(agent: Agent) -> protocols.Agent:
        return agent
