"""The agent's history: the append-only list sent to the model (so provider prefix caches keep
hitting), what a history policy sees and may replace, and rebuilding a session from its log
(``restore``: ``session/resume``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .agent_base import AgentBase
from .diag import debug, warn
from .protocols import HistoryContext
from .types import (
    AssistantMessage,
    AssistantMessageEvent,
    CompactionSummary,
    DurableEvent,
    HistoryForked,
    HistoryView,
    InboxClaimed,
    InboxDropped,
    ModelRequest,
    SessionSettings,
    SettingsChanged,
    TextBlock,
    ToolCallBlock,
    ToolResultEvent,
    ToolResultMessage,
    TurnEnd,
    TurnStart,
    UserMessage,
    UserMessageEvent,
)

if TYPE_CHECKING:  # pragma: no cover
    from .protocols import Agent

# Sources of user messages the loop itself puts into the history when it records them (not
# through the inbox): results spliced after tool calls, and interception context.
IMMEDIATE_SOURCES = frozenset({"tool", "hook", "notice"})
# Modes that lift the sandbox: never taken from a log (a file), a person picks them again.
UNRESTORED_MODES = frozenset({"full-access", "danger-full-access"})


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
    settings: SessionSettings | None = None  # the last recorded settings/changed

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
        elif isinstance(ev, SettingsChanged):
            self.settings = ev.settings
        elif isinstance(ev, HistoryForked):  # a fork's inherited history, as it was at birth
            self.history = ev.history()
        elif isinstance(ev, CompactionSummary):  # replayed exactly as the policy rewrote it
            self.history = [*self.history[:ev.covered_from], ev.message, *self.history[ev.covered_to:]]

    def _turn_end(self, ev: TurnEnd) -> None:
        self.open_turn = None
        if ev.reason == "blocked":  # dsh_prompt_submit kept the claimed prompt out
            self.history = [m for m in self.history if not (isinstance(m, UserMessage) and m.id in self.claimed)]



def _committed(events: list[DurableEvent]) -> list[DurableEvent]:
    """``events`` up to the last ended turn: a turn still open (running, or its process died) is
    cut from its first event (the claim of its prompt, else its start)."""
    starts: dict[int, int] = {}
    ended: set[int] = set()
    for i, ev in enumerate(events):
        if isinstance(ev, (InboxClaimed, TurnStart)):
            starts.setdefault(ev.turn, i)
        elif isinstance(ev, TurnEnd):
            ended.add(ev.turn)
    open_at = [i for turn, i in starts.items() if turn not in ended]
    return list(events[:min(open_at)] if open_at else events)


async def recorded_events(session: Agent) -> list[DurableEvent]:
    """What ``session``'s log holds so far, as its store reads it back; ``[]`` when the store cannot
    (nothing written yet, or a store without read-back). For plugins that rebuild their state from
    the log of a resumed session."""
    try:
        _, events = await session.host.session_store.read(session.session_id)
    except Exception as exc:  # the session goes on with what it has
        debug(f"session {session.session_id}: its log could not be read back: {exc!r}")
        return []
    return events


class History(AgentBase):
    """The history part of the agent (see ``agent_base``)."""

    __slots__ = ()

    # ------------------------------------------------------------------ resume

    def restore(self, events: list[DurableEvent], *, fork_of: str | None = None) -> None:
        """Rebuild this (fresh, idle) agent's conversation from a recorded log's events, so the
        session continues where it stopped. Nothing is re-run and nothing is re-published to
        observers; the log keeps growing after ``events``.

        The model's history gets exactly what the original loop had put there: claimed user
        messages, committed assistant messages (reasoning blocks included, so a provider that
        needs them replayed gets them), tool results and spliced messages. A turn the log
        shows started but not ended (the process died mid-turn) stays interrupted: each of its
        tool calls without a result gets an error result saying it was not re-run, and a
        ``turn/end`` (aborted, ``interrupted``) is recorded, so history stays a valid conversation.

        ``fork_of`` (the recorded session's id): this agent is a new session that starts from
        that log's committed history — up to its last ended turn (a turn running there, or one
        its process died in, is left out) — and its settings (taken as resume takes them). Both
        are recorded in this session's own log (``history/forked``, ``settings/changed`` by
        ``fork``), so it resumes by itself; the recorded log is only read."""
        if self._busy or self._seq or self._history:
            raise RuntimeError("restore() needs a fresh, idle agent")
        if fork_of is not None:
            self._fork_log(fork_of, events)
            return
        replay = _Replay(seq=self._seq, turn=self._turn)
        for ev in events:
            replay.apply(ev)
        self._seq, self._turn = replay.seq, replay.turn
        self._history = replay.history
        self._start_source = "resume"
        if replay.settings is not None:
            self._restore_settings(replay.settings)
        if replay.open_turn is not None:
            self._interrupt(replay.open_turn, [c for c in replay.calls if c[2].id not in replay.answered])

    def _fork_log(self, source: str, events: list[DurableEvent]) -> None:
        replay = _Replay(seq=0, turn=0)
        for ev in _committed(events):
            replay.apply(ev)
        self._history = replay.history
        self.emit(HistoryForked.of(source, list(self._history)))
        if replay.settings is not None:
            self._restore_settings(replay.settings)
            taken = self.settings
            changed = [k for k in ("model", "effort", "mode") if getattr(taken, k) is not None]
            if changed:
                self.emit(SettingsChanged(settings=taken, changed=changed, by="fork"))

    def _restore_settings(self, recorded: SessionSettings) -> None:
        """The recorded settings, where they are still safe to take from a file: a model this
        provider lists (``models()``; an id it would pass through is not taken from a log), an
        effort that model offers, and any mode but one that lifts the sandbox (a person chooses
        that again, in this process)."""
        listed = getattr(self.provider, "models", None)
        route = self.route
        model = None
        if recorded.model is not None and listed is not None and recorded.model in {m.model for m in listed()}:
            route, model = self.provider.resolve(recorded.model), recorded.model
        elif recorded.model is not None:
            warn(f"session {self.session_id}: recorded model {recorded.model!r} is not one "
                 f"{self.provider.name} lists; it resumes on {self.route.model}")
        effort = recorded.effort if recorded.effort in route.efforts else None
        mode = recorded.mode
        if mode in UNRESTORED_MODES:
            warn(f"session {self.session_id}: its recorded mode {mode!r} lifts the sandbox; it resumes in the "
                 "default mode (choose it again to run unconfined)")
            mode = None
        self._apply(SessionSettings(model=model, effort=effort, mode=mode, auto_compact=recorded.auto_compact), route)

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

    @property
    def history(self) -> HistoryView:
        """The model history as a read-only view (O(1))."""
        return HistoryView(self._history)

    def _history_context(self, turn: int, step: int, request: ModelRequest) -> HistoryContext:
        tokens, count = self._metered if self._metered is not None else (None, 0)
        return HistoryContext(
            agent=self.as_agent(), turn=turn, step=step, route=request.route, system=request.system, tools=request.tools,
            history=HistoryView(self._history), metered_tokens=tokens, metered_messages=count,
        )

    async def compact_history(self) -> bool:
        """Ask the history policy to compact now (``HistoryPolicy.compact``, optional), between
        turns: True when it rewrote the history. ``ValueError`` when a turn runs or no mounted
        policy compacts on request."""
        forced = getattr(self.history_policy, "compact", None)
        if forced is None:
            raise ValueError("no history policy that compacts on request is mounted")
        if self._busy:
            raise ValueError("a turn is running; compact when it has ended")
        tools = [self.tools[n].spec for n in self.offered] if self.route.tools else []
        tokens, count = self._metered if self._metered is not None else (None, 0)
        ctx = HistoryContext(agent=self.as_agent(), turn=self._turn, step=0, route=self.route, system=self.system,
                             tools=tools, history=HistoryView(self._history), metered_tokens=tokens,
                             metered_messages=count)
        replacement = await forced(ctx)
        if replacement is None or self._busy:
            return False
        self._replace_history(replacement)
        return True

    def _replace_history(self, messages: Any) -> None:
        # A new list, never an in-place edit: views handed to earlier calls stay what they were.
        self._history = list(messages)
        self._metered = None

