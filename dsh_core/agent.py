"""The agent loop: inbox, turns, tool dispatch, committed events, cancel, quiescence, dispose.

An agent is pinned to one cwd and one exact route. ``submit`` publishes a durable
``user/message`` and queues it; a driver task (owned by the host's task group)
claims the whole inbox as one turn and runs steps — model call, then the tool
calls it asked for, then the next model call — until a step asks for no tool.

Only *committed* things are events: an assistant message is committed when its
model call finishes (or, interrupted, when the call is cancelled with text
already produced); a failed or retried attempt leaves no ``assistant/message``.
History sent to the model is append-only, so provider prefix caches keep hitting.

The loop is split by responsibility (``agent_base`` names the parts): this module builds the
agent and owns its events, its public surface, cancel, quiescence and dispose; ``history``,
``turn`` and ``dispatch`` hold the rest. It is the concrete loop behind ``protocols.Agent``: it knows its host only as a
``protocols.Host`` (the host builds agents through ``dsh_make_agent`` and never imports this
module), and nothing outside ``dsh_core`` imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from time import time as _time
from typing import TYPE_CHECKING, Any

import anyio

from .config import AgentConfig
from .diag import warn
from .dispatch import ToolDispatch
from .errors import AgentDisposed, SessionLogFailed
from .history import History
from .protocols import AgentSpec, Observer, new_id
from .state import ByEventType, Flag, StateOwner, StateSlots, registered, wait_either
from .turn import TurnLoop
from .types import (
    AssistantMessage,
    ContentBlock,
    DurableEvent,
    HistoryForked,
    InboxDropped,
    LiveText,
    ModelInfo,
    SessionHeader,
    SessionSettings,
    SettingsChanged,
    TextBlock,
    ToolCallBlock,
    ToolProgress,
    ToolResultMessage,
    UserMessage,
    UserMessageEvent,
)

if TYPE_CHECKING:  # pragma: no cover
    from . import protocols
    from .protocols import Host, ModelProvider, SessionLog, Tool



class Agent(TurnLoop, ToolDispatch, History, StateOwner):
    """The spine's agent. Front doors use only the ``protocols.Agent`` surface."""

    # The state is in AgentBase's slots; ``__dict__`` stays for what a plugin or test sets beyond
    # them (made on first use).
    __slots__ = ("__dict__", "__weakref__")

    def __init__(self, spec: AgentSpec, host: Host) -> None:
        self.spec = spec
        self.host = host
        self.session_id = spec.session_id
        self.cwd = spec.cwd
        self.provider: ModelProvider = host.provider(spec.provider)
        self.route: ModelInfo = self.provider.resolve(spec.model)
        self.tools: Mapping[str, Tool] = host.tools  # the host's until a tool source publishes (then a copy)
        self.system: str = host.system_prompt(spec)
        if spec.persona:
            self.system = f"{self.system}\n\n{spec.persona}" if self.system else spec.persona
        self.header = SessionHeader(
            id=spec.session_id,
            cwd=spec.cwd,
            provider=spec.provider,
            model=spec.model,
            parent_session=spec.parent.session_id if spec.parent else None,
            parent_call=spec.parent_call,
            delegation_depth=spec.depth,
            origin=spec.origin,
            forked_from=spec.forked_from,
            additional_directories=spec.additional_directories,
        )
        self.log: SessionLog = host.session_store.open(self.header)
        self.children: list[protocols.Agent] = []
        self.log_error: Exception | None = None  # the first failure of the durable log, if any
        self._observers = ByEventType()  # subscribe(): each event goes to the observers that read its type
        self._watchers: list[Callable[[Any, LiveText], None]] = []
        self._progress_watchers: list[Callable[[Any, ToolProgress], None]] = []
        self._seq = 0
        self._turn = 0
        self._inbox: list[UserMessage] = []
        self._history: list[UserMessage | AssistantMessage | ToolResultMessage] = []
        self._busy = False
        self._idle = Flag(True)
        self._scope: anyio.CancelScope | None = None
        self._abort_kind: str | None = None
        self._disposed = False
        self._wake: Flag | None = None
        self._retired = False  # the idle driver was told to end (turn.ParkedDrivers)
        self._header_sent = False
        self._header_reason = "initial"
        self.settings = SessionSettings()
        self._pending_context: list[str] = []  # told to the model before its next request (a settings change)
        # user-role messages for the next request (``notify``), each with its "already told" check
        self._notices: list[tuple[UserMessage, Callable[[], bool] | None]] = []
        self._woken: set[str] = set()  # ids of the notices a wake moved into the inbox
        self._wake_due = False  # a waking notice waits: the driver starts an autonomous turn for it
        self._wakes: bool = host.config_for(AgentConfig).wake  # false: notices wait for the next prompt
        self._claimed_ids: frozenset[str] = frozenset()  # the running turn's prompt messages
        self._state = StateSlots()  # plugin state of this session (dsh_core.state)
        self._offered: list[str] | None = None  # None: every tool is offered to the model
        self._specs: tuple[Any, Any, list[Any]] | None = None  # (tools, offered, their specs): see _tool_specs
        self._unknown_hint = ""
        self._spliced: list[UserMessage] = []
        self._metered: tuple[int, int] | None = None  # (reported prompt tokens, messages in that request)
        self._start_source: str | None = "startup"  # dsh_session_start is still due (None: done)
        self._halted: str | None = None  # the interception point that stopped the running turn
        if spec.parent is not None:
            spec.parent.children.append(self)
        if spec.fork and spec.parent is not None:
            self._fork_from(spec.parent)
        self.history_policy = host.pm.hook.dsh_history_policy(session=self, host=host)
        self._published: dict[str, list[str]] = {}  # tool source -> the names it holds in self.tools
        # A fork calls the parent's tools (its session's too): it serves no sources of its own.
        sources = [] if spec.fork else [s for s in host.pm.hook.dsh_session_tools(session=self, host=host) if s is not None]
        self._sources_ready = Flag(not sources)  # every source published its first set (or failed)
        self._sources_done = Flag(not sources)
        self._sources_scope: anyio.CancelScope | None = None
        if sources:
            self._sources_scope = anyio.CancelScope()
            host.task_group.start_soon(self._serve_sources, sources, name=f"tool sources {self.session_id[:8]}")

    # ------------------------------------------------------------------ events

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Call ``observer(agent, event)`` synchronously for each durable event, in order (only
        the types it declares with ``state.reads``, when it does)."""
        return self._observers.add(observer)

    def watch(self, listener: Callable[[Any, LiveText], None]) -> Callable[[], None]:
        """Call ``listener(agent, piece)`` for each piece of text the model writes, as it writes
        it (``LiveText``, never durable); returns the unwatch function."""
        return registered(self._watchers, listener)

    def _live(self, piece: LiveText) -> None:
        self._tell(self._watchers, piece, "live-text")

    def _tell(self, listeners: Sequence[Callable[[Any, Any], None]], piece: Any, kind: str) -> None:
        """Hand ``piece`` to each of ``listeners``: a watcher's bug costs its view, never the turn or the call."""
        for listener in list(listeners):
            try:
                listener(self, piece)
            except Exception as exc:
                warn(f"a {kind} watcher of session {self.session_id} failed: {exc!r}")

    def watch_progress(self, listener: Callable[[Any, ToolProgress], None]) -> Callable[[], None]:
        """Call ``listener(agent, piece)`` for each ``ToolProgress`` a running tool call of this
        agent reports (never durable); returns the unwatch function."""
        return registered(self._progress_watchers, listener)

    @property
    def progress_watched(self) -> bool:
        """Whether anyone watches tool progress (``watch_progress``): a tool gathers none when not."""
        return bool(self._progress_watchers)

    def progress(self, piece: ToolProgress) -> None:
        """Hand a running call's progress to the watchers; nothing is recorded."""
        self._tell(self._progress_watchers, piece, "tool-progress")

    def emit(self, event: DurableEvent) -> None:
        self._seq += 1
        event.seq = self._seq
        event.time = _time()  # types.now(), without a call of its own (five events a prompt)
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
        for obs in self._observers[type(event)]:
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

    def set_route(self, model: str) -> None:
        """Switch the exact model of this session (the next request uses it)."""
        self.route = self.provider.resolve(model)
        self._header_sent = False
        self._header_reason = "model"

    def configure(self, *, model: str | None = None, effort: str | None = None, mode: str | None = None,
                  auto_compact: bool | None = None, by: str = "client", tell_model: str = "") -> list[str]:
        """Change this session's settings (None: unchanged); returns the names that changed.

        ``model`` must resolve on the session's provider (``RouteError`` otherwise) and ``effort``
        be one of the (new) route's ``efforts`` (``ValueError``); ``mode`` is the permission
        mode's name, checked by the caller (the plugin that defines modes); ``auto_compact``
        switches the history policy's own compaction on or off. A change is recorded
        (``settings/changed``, with whether the prefix cache survives) and applies from the next
        model request; ``tell_model`` is added to the history before that request (appended:
        the prefix stays as it was)."""
        route = self.provider.resolve(model) if model is not None and model != self.route.model else self.route
        new = SessionSettings(model=model if model is not None else self.settings.model,
                              effort=effort if effort is not None else self.settings.effort,
                              mode=mode if mode is not None else self.settings.mode,
                              auto_compact=auto_compact if auto_compact is not None else self.settings.auto_compact)
        if new.effort is not None and new.effort not in route.efforts:
            if effort is not None:
                shown = ", ".join(route.efforts) or "none: it has no reasoning effort"
                raise ValueError(f"effort {effort!r} is not one of {route.model}'s ({shown})")
            new.effort = None  # the new model has no such effort: its own default
        changed = [k for k in ("model", "effort", "mode", "auto_compact") if getattr(new, k) != getattr(self.settings, k)]
        if not changed:
            return []
        thinking_before = self._thinking(self.route, self.settings.effort)
        broken = route.model != self.route.model or self._thinking(route, new.effort) != thinking_before
        self._apply(new, route)  # first: an observer of the event sees the new state
        self.emit(SettingsChanged(settings=new, changed=changed, by=by, cache="broken" if broken else "kept"))
        if tell_model:
            self._pending_context.append(tell_model)
        return changed

    @staticmethod
    def _thinking(route: ModelInfo, effort: str | None) -> bool:
        return route.thinking and (effort or route.effort) != "off"

    def _apply(self, settings: SessionSettings, route: ModelInfo) -> None:
        if route.model != self.route.model:
            self.route = route
            self._header_sent = False
            self._header_reason = "model"
        self.settings = settings

    def offer(self, names: list[str], *, hint: str = "") -> None:
        """Offer only ``names`` (in this order) to the model. A direct call of any other tool is
        answered ``UNKNOWN_TOOL`` followed by ``hint``; every tool stays callable through
        ``call_tool`` (code mode offers only ``run_code`` and calls the others from programs)."""
        self._offered = [n for n in names if n in self.tools]
        self._specs = None
        self._unknown_hint = hint
        self._header_sent = False

    def publish_tools(self, source: str, tools: Sequence[Tool]) -> list[str]:
        """Replace ``source``'s tools in this session (see ``protocols.Agent.publish_tools``)."""
        before = self._published.get(source, [])
        if [self.tools.get(n) for n in before] == list(tools):
            return list(before)  # the same set: the request (and the prefix cache) stays as it was
        # the first set this session publishes: its own catalog from now on (the host's until then)
        own = self.tools if isinstance(self.tools, dict) and self.tools is not self.host.tools else dict(self.tools)
        self.tools = own
        self._specs = None  # changed in place below
        for name in before:
            own.pop(name, None)
        taken: list[str] = []
        for tool in tools:
            name = tool.spec.name
            if name in own:
                warn(f"tool {name!r} of {source} is not added to session {self.session_id}: the name is taken")
                continue
            own[name] = tool
            taken.append(name)
        self._published[source] = taken
        self._header_sent = False
        return list(taken)

    async def _serve_sources(self, sources: list[protocols.ToolSource]) -> None:
        """Run the session's tool sources until it is disposed; ready once each said so (or ended)."""
        waiting = {id(s) for s in sources}

        def ready_of(source: protocols.ToolSource) -> Callable[[], None]:
            def ready() -> None:
                waiting.discard(id(source))
                if not waiting:
                    self._sources_ready.set()
            return ready

        async def serve(source: protocols.ToolSource) -> None:
            ready = ready_of(source)
            try:
                await source.serve(self, ready)
            except Exception as exc:  # a source's failure ends the source, never the session
                warn(f"tool source {source.name!r} of session {self.session_id} failed: {exc!r}")
            finally:
                ready()

        assert self._sources_scope is not None
        try:
            with self._sources_scope:
                async with anyio.create_task_group() as tg:
                    for source in sources:
                        tg.start_soon(serve, source)
        finally:
            self._sources_ready.set()
            self._sources_done.set()

    @property
    def offered(self) -> list[str]:
        return list(self.tools) if self._offered is None else list(self._offered)

    def _tool_specs(self) -> list[Any]:
        """The specs of the offered tools, in order (a new list each time): kept while neither the
        catalog nor the offer changed (``offer``/``publish_tools`` drop it; a catalog or offer
        replaced from outside is a different object), not rebuilt over every tool per request."""
        cached = self._specs
        if cached is not None and cached[0] is self.tools and cached[1] is self._offered:
            return list(cached[2])
        specs = [self.tools[n].spec for n in self.offered]
        self._specs = (self.tools, self._offered, specs)
        return list(specs)

    def _fork_from(self, parent: protocols.Agent) -> None:
        """Start where the parent's last completed turn ended, with its system prompt, tools and
        settings, so this child's first request is the parent's cached prefix plus its prompt."""
        self.system = getattr(parent, "system", self.system)
        self.tools = dict(parent.tools)
        offered = getattr(parent, "_offered", None)
        self._offered = None if offered is None else list(offered)
        self.settings = parent.settings
        self.route = parent.route
        self._history = list(parent.completed_history())
        self.emit(HistoryForked.of(parent.session_id, list(self._history)))

    def completed_history(self) -> list[UserMessage | AssistantMessage | ToolResultMessage]:
        """The history up to the last completed turn: while a turn runs, what came before its prompt."""
        history = list(self._history)
        if not self._busy or not self._claimed_ids:
            return history
        for i, message in enumerate(history):
            if isinstance(message, UserMessage) and message.id in self._claimed_ids:
                return history[:i]
        # The running turn's prompt was compacted away: cut before the message whose calls run now.
        for i in range(len(history) - 1, -1, -1):
            message = history[i]
            if isinstance(message, AssistantMessage) and any(isinstance(b, ToolCallBlock) for b in message.content):
                return history[:i]
        return history

    def notify(self, text: str, *, source: str = "notice", unless: Callable[[], bool] | None = None,
               wake: bool = False) -> None:
        """Queue ``text`` as a user-role message for the next model request; dropped if ``unless()``
        is true by then (the news reached the model another way). ``wake``: an idle agent starts
        a turn on its own for it (an autonomous turn, the original's ``followup``); a busy one reads
        it at its next request, or in a new autonomous turn if its turn ends first. Wakes are off
        when the composition says so (``[config.agent] wake = false``) and once teardown began."""
        if not text or self._disposed:
            return
        self._notices.append((UserMessage(id=new_id("msg_"), content=[TextBlock(text=text)], source=source),
                              unless))
        if wake and self._wakes:
            self._wake_due = True
            if not self._busy:
                self._start_driver()

    def _claim_wake(self) -> bool:
        """Move the waiting notices into the inbox for an autonomous turn (the driver, between turns):
        False when no wake is due or every notice was already told another way."""
        if not self._wake_due or self._disposed:
            self._wake_due = False
            return False
        self._wake_due = False
        notices, self._notices = self._notices, []
        for message, unless in notices:
            if unless is not None and unless():
                continue
            self.emit(UserMessageEvent(message=message))
            self._inbox.append(message)
            self._woken.add(message.id)
        return bool(self._inbox)

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
            self._start_driver()

    def _start_driver(self) -> None:
        self._busy = True
        self._idle = Flag()
        if self._wake is None:  # the driver outlives its turn (turn.ParkedDrivers): no task per prompt
            self._wake = Flag()
            self.host.task_group.start_soon(self._drive, name=f"agent {self.session_id[:8]}")
        else:
            self._wake.set()

    def cancel(self, kind: str = "user") -> None:
        """Abort the running turn and drop unclaimed messages. Idempotent; returns at once. A due
        wake is dropped too (its notices wait for the next request); after a ``disposed`` cancel
        (teardown began) nothing wakes the agent again."""
        self._wake_due = False
        if kind == "disposed":
            self._wakes = False
        if self._inbox:
            dropped = [m.id for m in self._inbox]
            self._inbox.clear()
            self.emit(InboxDropped(message_ids=dropped, reason=kind))
        if self._scope is not None and not self._scope.cancel_called:
            self._abort_kind = kind
            self._scope.cancel()

    async def wait_idle(self, unless: Flag | None = None) -> None:
        """Return when no turn runs and the inbox is empty (quiescence), or once ``unless`` is set."""
        if unless is None:
            while self._busy:
                await self._idle.wait()
            return
        while self._busy and not unless.is_set():
            await wait_either(self._idle, unless)

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
        if not self._sources_done.is_set():  # its tool sources end (an MCP server's process with them)
            assert self._sources_scope is not None
            self._sources_scope.cancel()
            with anyio.CancelScope(shield=True):
                await self._sources_done.wait()
        await self._state.aclose()  # the session's resources (a warm process…) before its log closes
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



if TYPE_CHECKING:  # pragma: no cover - mypy checks the concrete loop against the contract doors program to

    def _satisfies_the_contract(agent: Agent) -> protocols.Agent:
        return agent
