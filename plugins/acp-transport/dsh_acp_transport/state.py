"""What the bridge's topics share: one connection's sessions, their prompt slots, the settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from dsh_acp.rpc import Peer

from dsh_core.state import Flag
from dsh_core.types import TurnEnd, Usage

from .config import TransportConfig
from .delivery import Delivery

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent, Host

CLOSING = "the connection is closing (the client closed stdin, or the agent was signalled to stop); "


@dataclass(eq=False)
class Slot:
    """One admitted prompt: the interval it is responsible for (ACP-7, settlement)."""

    request_id: Any = None
    cancelled: bool = False
    _admission: anyio.CancelScope | None = None  # made on first use (`admission`): most prompts need none
    message_id: str | None = None
    typed: str | None = None  # the slash command as the person typed it, when it became this prompt
    in_inbox: bool = False
    turn: int | None = None
    end: TurnEnd | None = None
    interval_error: str | None = None
    dropped: bool = False
    usage: Usage | None = None  # summed over the turn's committed model calls that reported usage
    calls: int = 0  # model calls of the turn that reported usage
    context: int = 0  # tokens in context after the last such call: its prompt plus its answer
    settled: Flag = field(default_factory=Flag)  # the prompt handler is done with it (an event only for a waiter)
    released: Flag = field(default_factory=Flag)  # set: autonomous work began after its turn (the interval ended)
    called: anyio.Event | None = None  # a queued prompt's: set when it takes the slot, or is cancelled in line

    @property
    def admission(self) -> anyio.CancelScope:
        """The scope of the prompt's admission (a command, saving images): a cancel before inbox
        receipt cancels it, entered or not yet."""
        if self._admission is None:
            self._admission = anyio.CancelScope()
        return self._admission

    @admission.setter
    def admission(self, scope: anyio.CancelScope) -> None:
        self._admission = scope


@dataclass(eq=False)
class Session:
    id: str
    agent: Agent
    delivery: Delivery
    slot: Slot | None = None
    unsubscribe: Any = None
    permissions: set[int] = field(default_factory=set)
    cancel_seq: int = 0  # read order of the last session/cancel: it applies to every prompt read before it
    closed: anyio.Event | None = None  # set by session/close; fires when the session is disposed
    streamed: set[str] = field(default_factory=set)  # messages whose text went out live (stream = "live")
    commands_sent: list[Any] = field(default_factory=list)  # the slash commands the client was last told of
    autonomous_turn: int | None = None  # the running turn, when the agent started it on its own (a wake)
    queued: list[Slot] = field(default_factory=list)  # prompts waiting for the slot (prompt-queue > 0), in order


class BridgeState:
    """One connection's sessions and settings, and what every topic of the bridge uses."""

    def __init__(self, host: Host, peer: Peer, settings: TransportConfig | None = None) -> None:
        self.host = host
        self.peer = peer
        self.settings = settings or TransportConfig()
        self.client_capabilities: dict[str, Any] = {}
        self.sessions: dict[str, Session] = {}
        self.closing: dict[str, Session] = {}  # closed by the client, still being disposed
        self.initialized = False
        self.closed = False

    def image_capable(self) -> bool:
        """Truthful: a store is mounted and the configured exact route declares image input."""
        if self.host.attachment_store is None:
            return False
        try:
            provider, model = self.host.check_route()
            return bool(self.host.provider(provider).resolve(model).image_input)
        except Exception:
            return False

    def durable_store(self) -> Any:
        """The mounted session store if its logs outlive the process (jsonl-persistence), else None."""
        store = self.host.session_store
        return store if getattr(store, "durable", False) else None

    def _cancel_session(self, session: Session, kind: str = "user", *, queued: bool = True) -> None:
        """Cancel the prompt in flight (or the autonomous work) and, unless ``queued`` is false,
        every prompt waiting behind it: they answer ``cancelled`` without running."""
        if queued:
            for waiting in session.queued:
                self._drop_queued(waiting)
            session.queued.clear()
        slot = session.slot
        if slot is None:
            session.agent.cancel(kind)  # autonomous work
            return
        slot.cancelled = True
        if not slot.in_inbox:
            slot.admission.cancel()  # before inbox receipt: abort admission only
        else:
            session.agent.cancel(kind)

    @staticmethod
    def _drop_queued(slot: Slot) -> None:
        """A queued prompt leaves the line unrun: it answers ``cancelled``."""
        slot.cancelled = True
        if slot.called is not None:
            slot.called.set()

    @staticmethod
    def _hand_on(session: Session, slot: Slot) -> None:
        """The prompt in flight is done: the slot goes to the first prompt waiting in line, in the
        same step (no racing prompt can take it meanwhile, ACP-5), or is freed."""
        if session.slot is slot:
            session.slot = session.queued.pop(0) if session.queued else None
            if session.slot is not None and session.slot.called is not None:
                session.slot.called.set()
