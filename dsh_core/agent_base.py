"""What every part of the agent holds, and the calls between the parts.

The agent is split by responsibility into parts that one class, ``dsh_core.agent.Agent``,
puts together: ``history`` (the append-only history, the prefix, rebuilding from a log),
``turn`` (the turn loop: claiming the inbox, model calls, interception, the turn's end),
``dispatch`` (tool calls: ordering, approval, bounding results, after-tool decisions), and
``agent`` itself (construction, events and the public surface, cancel, quiescence, dispose).
This base declares the state ``Agent.__init__`` sets and the methods one part calls on
another, so each part type-checks on its own; it holds no behaviour.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import anyio

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Mapping

    from . import protocols
    from .protocols import AgentSpec, HistoryContext, Host, ModelProvider, SessionLog, Tool
    from .state import ByEventType, Flag, StateSlots
    from .types import (
        AssistantMessage,
        ContentBlock,
        DurableEvent,
        HistoryView,
        ModelInfo,
        ModelRequest,
        SessionHeader,
        SessionSettings,
        ToolCallBlock,
        ToolResultMessage,
        UserMessage,
    )


class AgentBase:
    """The agent's state (set in ``Agent.__init__``) and the parts' shared calls."""

    # Slots: a session's agent is most of what an open session costs (a dict for ~45 attributes
    # is 1.6 KiB); the parts add none.
    __slots__ = (
        "_abort_kind",
        "_busy",
        "_claimed_ids",
        "_disposed",
        "_halted",
        "_header_reason",
        "_header_sent",
        "_history",
        "_idle",
        "_inbox",
        "_metered",
        "_notices",
        "_observers",
        "_offered",
        "_pending_context",
        "_progress_watchers",
        "_published",
        "_retired",
        "_scope",
        "_seq",
        "_sources_done",
        "_sources_ready",
        "_sources_scope",
        "_specs",
        "_spliced",
        "_start_source",
        "_state",
        "_turn",
        "_unknown_hint",
        "_wake",
        "_wake_due",
        "_wakes",
        "_watchers",
        "_woken",
        "children",
        "cwd",
        "header",
        "history_policy",
        "host",
        "log",
        "log_error",
        "provider",
        "route",
        "session_id",
        "settings",
        "spec",
        "system",
        "tools",
    )

    spec: AgentSpec
    host: Host
    session_id: str
    cwd: str
    provider: ModelProvider
    route: ModelInfo
    tools: Mapping[str, Tool]
    system: str
    header: SessionHeader
    log: SessionLog
    children: list[protocols.Agent]
    log_error: Exception | None
    history_policy: Any
    _observers: ByEventType
    _watchers: list[Any]
    _seq: int
    _turn: int
    _inbox: list[UserMessage]
    _history: list[UserMessage | AssistantMessage | ToolResultMessage]
    _busy: bool
    _idle: Flag
    _scope: anyio.CancelScope | None
    _abort_kind: str | None
    _disposed: bool
    _wake: Flag | None
    _retired: bool
    _header_sent: bool
    _header_reason: str
    _pending_context: list[str]
    _notices: list[tuple[UserMessage, Callable[[], bool] | None]]
    _wake_due: bool
    _woken: set[str]
    _wakes: bool
    _claimed_ids: frozenset[str]
    settings: SessionSettings
    _sources_ready: Flag
    _sources_done: Flag
    _sources_scope: anyio.CancelScope | None
    _state: StateSlots
    _offered: list[str] | None
    _specs: tuple[Any, Any, list[Any]] | None
    _unknown_hint: str
    _spliced: list[UserMessage]
    _metered: tuple[int, int] | None
    _start_source: str | None
    _halted: str | None

    # ------------------------------------------------------------------ calls between the parts
    # (each is implemented by exactly one part; these stubs only give the others its signature)

    def emit(self, event: DurableEvent) -> None:  # agent
        raise NotImplementedError

    def _live(self, piece: Any) -> None:  # agent
        raise NotImplementedError

    def _log_failure(self) -> str:  # agent
        raise NotImplementedError

    def _claim_wake(self) -> bool:  # agent
        raise NotImplementedError

    def _tool_specs(self) -> list[Any]:  # agent
        raise NotImplementedError

    @property
    def offered(self) -> list[str]:  # agent
        raise NotImplementedError

    def splice(self, content: list[ContentBlock]) -> None:  # agent
        raise NotImplementedError

    def _apply(self, settings: SessionSettings, route: ModelInfo) -> None:  # agent
        raise NotImplementedError

    @property
    def history(self) -> HistoryView:  # history
        raise NotImplementedError

    def _history_context(self, turn: int, step: int, request: ModelRequest) -> HistoryContext:  # history
        raise NotImplementedError

    def _replace_history(self, messages: Any) -> None:  # history
        raise NotImplementedError

    def _halt(self, turn: int, point: str, answers: list[Any]) -> bool:  # turn
        raise NotImplementedError

    async def _run_tools(self, turn: int, step: int, calls: list[ToolCallBlock]) -> None:  # dispatch
        raise NotImplementedError

    def as_agent(self) -> protocols.Agent:
        """This object as the ``protocols.Agent`` it is once assembled (``dsh_core.agent.Agent``)."""
        return cast("protocols.Agent", self)
