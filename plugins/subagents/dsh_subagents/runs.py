"""A started child and the places that keep it: ``InProcessRun`` (a child ``Agent`` of this
host, for the ``spawn`` and ``fork`` providers), ``Delegations`` (the children one session
started, its state slot: disposed with it) and ``Registry`` (every live child of the host, for
the cap on running ones, the lookup by agent and teardown). A child is named by its session id,
as in the original harness.

A run learns how each of its child's turns ended from the child's durable events (``turn/end``
and the assistant messages before it), synchronously, in the child's own task: no task of its
own, so 100 idle children cost 100 objects and nothing that runs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from dsh_core.protocols import Agent, SubagentRequest, SubagentRun, new_id
from dsh_core.types import (
    AssistantMessageEvent,
    DurableEvent,
    InboxClaimed,
    SubagentProgress,
    SubagentResult,
    TextBlock,
    TurnEnd,
    TurnStart,
    UserMessage,
)

log = logging.getLogger("dsh.subagents")

PROGRESS_CHARS = 2000  # of a child's latest text in a subagent/progress event

# turn/end reason → how the run stopped; anything else is an error with the reason said
STOPS = {"completed": "completed", "max-tokens": "max-tokens", "aborted": "aborted"}
WHY = {
    "max-steps": "the subagent reached its step limit",
    "blocked": "a hook blocked the subagent's prompt",
    "stopped": "a hook stopped the subagent's turn",
}

Settled = Callable[["SubagentRun", SubagentResult], None]


class InProcessRun:
    """A child ``Agent`` in this host: its turns end as its events say; ``follow_up`` submits."""

    def __init__(self, rid: str, provider: str, request: SubagentRequest, agent: Agent) -> None:
        self.id = rid
        self.provider = provider
        self.description = request.description
        self.parent = request.parent
        self.call_id = request.call_id
        self.continuable = request.continuable
        self.agent = agent
        self.session_id: str | None = agent.session_id
        self.turns = 0  # ended turns
        self._text = ""  # the child's latest committed text in the running turn
        self._done = anyio.Event()
        self._last: SubagentResult | None = None
        self._callbacks: list[Settled] = [request.on_settled] if request.on_settled is not None else []
        self._disposed = False
        self._queued: dict[str, str] = {}  # messages given to the child, not yet claimed by a turn
        self._unsubscribe = agent.subscribe(self._on_event)

    # ------------------------------------------------------------------ what the child does

    def _on_event(self, agent: Any, event: DurableEvent) -> None:
        if isinstance(event, InboxClaimed):
            for mid in event.message_ids:
                self._queued.pop(mid, None)
        elif isinstance(event, TurnStart):
            self._text = ""
            if self._done.is_set():
                self._done = anyio.Event()
        elif isinstance(event, AssistantMessageEvent):
            text = "".join(b.text for b in event.message.content if isinstance(b, TextBlock))
            if text:
                self._text = text
                if not self.parent.disposed:
                    self.parent.emit(SubagentProgress(id=self.id, call_id=self.call_id, text=text[-PROGRESS_CHARS:]))
        elif isinstance(event, TurnEnd):
            self.turns += 1
            stop = STOPS.get(event.reason, "error")
            diagnostic = event.error if stop == "error" else None
            if stop == "error" and not diagnostic:
                diagnostic = WHY.get(event.reason, f"the subagent's turn ended {event.reason}")
            if stop == "aborted":
                diagnostic = f"the subagent's turn was cancelled ({event.abort_kind or 'user'})"
            if stop == "max-tokens":
                diagnostic = "the subagent's answer was cut at its output limit"
            self._last = SubagentResult(stop=stop, text=self._text, diagnostic=diagnostic)
            self._done.set()
            for callback in list(self._callbacks):
                try:
                    callback(self, self._last)
                except Exception as exc:  # one observer's bug never stops the child's loop
                    log.warning(f"settling {self.id} failed: {exc!r}")

    # ------------------------------------------------------------------ the handle

    @property
    def status(self) -> Literal["running", "idle", "ready"]:
        """``running`` (a turn is under way), ``idle`` (between turns with a message still to take)
        or ``ready`` (it has done all it was given; send_message starts its next turn)."""
        if self._disposed or self.agent.disposed:
            return "ready"
        if self.agent.busy:
            return "running"
        return "idle" if self._queued else "ready"

    @property
    def pending(self) -> int:
        """Messages given to the child that no turn has taken yet (it goes on after this turn)."""
        return len(self._queued)

    def begin(self, prompt: str) -> None:
        message = UserMessage(id=new_id("msg_"), content=[TextBlock(text=prompt)], source="delegation")
        self._queued[message.id] = prompt
        self.agent.submit(message)

    async def result(self) -> SubagentResult:
        """How the child's current turn ends (the last one's, when it is idle)."""
        while not self._done.is_set():
            await self._done.wait()
        assert self._last is not None
        return self._last

    def follow_up(self, message: str) -> None:
        self.begin(message)

    def interrupt(self) -> bool:
        """Abort the running turn only: messages queued for later turns are given again after it."""
        if not self.agent.busy:
            return False
        queued = list(self._queued.values())
        self._queued.clear()
        self.agent.cancel("interrupt")  # drops the inbox with the turn
        for text in queued:
            self.begin(text)
        return True

    def cancel(self) -> None:
        self.agent.cancel("parent")

    async def dispose(self) -> None:
        if self._disposed:
            return
        self._disposed = True
        try:
            await self.agent.dispose()
        finally:
            self._unsubscribe()
            self.agent.host.forget(self.agent)
            self._callbacks.clear()


@dataclass(eq=False)
class Entry:
    """One delegation: the run and what the tools need to know of it."""

    run: Any  # a SubagentRun
    parent: Agent
    provider: str
    description: str
    call_id: str | None
    continuable: bool
    background: bool
    awaited: bool = False  # a tool call is waiting for this turn's result (no notice then)

    @property
    def agent(self) -> Agent | None:
        """The child's Agent, for an in-process run."""
        return getattr(self.run, "agent", None)


def tree_of(agent: Agent) -> Agent:
    """The top-level session a delegation belongs to: the root of its parents."""
    while agent.spec.parent is not None:
        agent = agent.spec.parent
    return agent


@dataclass(eq=False)
class Registry:
    """Every live child of one host (its state slot): the cap on running ones, teardown. An idle
    child costs nothing here: only children with a turn under way count against the cap, and
    only against their own session's (the top-level session's whole delegation tree): one
    session fanning out never refuses another's delegation (64 sessions delegating at once in
    one process went over a process-wide cap of 16)."""

    entries: set[Entry] = field(default_factory=set)  # live (started in this process)
    # starts under way per session tree (counted before their first await, for the cap)
    reserved: dict[Agent, int] = field(default_factory=dict)
    closed: bool = False

    def running(self, tree: Agent) -> int:
        """Children with a turn under way in ``tree`` (a top-level session), and starts under way."""
        busy = sum(1 for e in self.entries if e.run.status == "running" and tree_of(e.parent) is tree)
        return busy + self.reserved.get(tree, 0)

    def reserve(self, tree: Agent, n: int) -> None:
        left = self.reserved.get(tree, 0) + n
        if left:
            self.reserved[tree] = left
        else:
            self.reserved.pop(tree, None)

    async def aclose(self) -> None:
        self.closed = True
        for entry in list(self.entries):
            await _dispose(entry.run)
        self.entries.clear()

    def of_agent(self, agent: Any) -> Entry | None:
        """The delegation whose child is ``agent`` (object identity), if any."""
        for entry in self.entries:
            if entry.agent is agent:
                return entry
        return None


@dataclass(eq=False)
class Delegations:
    """The children one session started (its state slot): disposed when the session is."""

    registry: Registry
    runs: dict[str, Entry] = field(default_factory=dict)  # id -> entry, in start order
    loaded: bool = False  # the children a resumed log names are listed (``tools.recall``)

    async def aclose(self) -> None:
        for entry in reversed(list(self.runs.values())):
            await _dispose(entry.run)
            self.registry.entries.discard(entry)
        self.runs.clear()


class RecordedRun:
    """A continuable child a resumed parent's log names, not running in this process: ``ready``.
    ``send_message`` brings it back from its own log (``tools.resume``)."""

    def __init__(self, rid: str, description: str, session_id: str, last: SubagentResult | None) -> None:
        self.id = rid
        self.description = description
        self.session_id: str | None = session_id
        self._last = last or SubagentResult(stop="completed")

    @property
    def status(self) -> Literal["running", "idle", "ready"]:
        return "ready"

    async def result(self) -> SubagentResult:
        return self._last

    def cancel(self) -> None:
        pass

    async def dispose(self) -> None:
        pass


async def _dispose(run: Any) -> None:
    with anyio.CancelScope(shield=True):
        try:
            await run.dispose()
        except Exception as exc:
            log.warning(f"disposing subagent {getattr(run, 'id', '?')} failed: {exc!r}")
