"""A prompt from admission to its answer (ACP-5, ACP-7): one in flight per session, the turn's
facts gathered from the agent's events, settlement precedence; cancel (ACP-8) and permission
requests: one-shot (ACP-9), or remembered for a sandbox escalation with ``remember-approvals``
(``approvals.py``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from dsh_acp import wire
from dsh_acp.display import one_line
from dsh_acp.fdstream import TransportClosed
from dsh_acp.rpc import RpcFailure, decode_params, internal_error, invalid_params, shown

from dsh_core.contracts import new_id
from dsh_core.state import ByType
from dsh_core.types import (
    AgentError,
    ApprovalOutcome,
    ApprovalRequest,
    AssistantMessageEvent,
    ImageBlock,
    InboxClaimed,
    InboxDropped,
    LiveText,
    Note,
    SettingsChanged,
    TextBlock,
    ToolProgress,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
)

from .approvals import OPTION_OUTCOMES, ApprovalRules, options_for, rememberable
from .content import PromptContent
from .controls import COMMAND_TYPED, Controls
from .permission import buffered_text, tool_call_of
from .state import CLOSING, Session, Slot

log = logging.getLogger("dsh.acp")

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent


def _add_usage(total: Usage | None, u: Usage) -> Usage:
    if total is None:
        total = Usage()
    out = Usage(
        input_tokens=total.input_tokens + u.input_tokens,
        output_tokens=total.output_tokens + u.output_tokens,
        cache_hit_tokens=total.cache_hit_tokens + u.cache_hit_tokens,
        cache_miss_tokens=total.cache_miss_tokens + u.cache_miss_tokens,
        reasoning_tokens=total.reasoning_tokens + u.reasoning_tokens,
    )
    return out


def _usage_meta(u: Usage, calls: int) -> dict[str, int]:
    """The turn's usage as ``_meta.usage`` of the prompt response (camelCase, like the wire)."""
    return {
        "inputTokens": u.input_tokens,
        "outputTokens": u.output_tokens,
        "totalTokens": u.input_tokens + u.output_tokens,
        "cacheHitTokens": u.cache_hit_tokens,
        "cacheMissTokens": u.cache_miss_tokens,
        "reasoningTokens": u.reasoning_tokens,
        "modelCalls": calls,
    }


def observer(session: Session, usage_updates: bool,
             on_settings: Callable[[list[str]], None] | None = None,
             on_turn_end: Callable[[], None] | None = None) -> Callable[[Agent, Any], None]:
    """The agent's event observer for one session: committed output to the session's delivery
    chain, and the facts settlement reads (the turn, its end, errors, usage) to the prompt's slot."""
    return _Observer(session, usage_updates, on_settings, on_turn_end)


class _Observer:
    """``observer``'s callable: one small object a session; what each event type does is one
    table for the process (``_HANDLERS``), not closures made per session."""

    __slots__ = ("events", "on_settings", "on_turn_end", "present", "session", "usage_updates")

    def __init__(self, session: Session, usage_updates: bool, on_settings: Callable[[list[str]], None] | None,
                 on_turn_end: Callable[[], None] | None) -> None:
        self.session = session
        self.usage_updates = usage_updates
        self.on_settings = on_settings
        self.on_turn_end = on_turn_end
        hook = session.agent.host.pm.hook.dsh_present_event
        self.present = hook if hook.get_hookimpls() else None  # none mounted (acp-agent): not even the call
        # Nothing presents events: only the types handled below reach it (state.reads); else all do.
        self.events: tuple[type, ...] | None = tuple(_HANDLERS) if self.present is None else None

    def __call__(self, agent: Agent, event: Any) -> None:
        session = self.session
        if agent is not session.agent:
            return
        if self.present is not None:
            try:
                shown = [u for updates in self.present(session=agent, event=event) for u in updates or ()]
            except Exception as exc:  # a presentation plugin's bug costs its updates, never the answer
                log.warning(f"presenting {type(event).__name__} failed: {exc!r}")
                shown = []
            for update in shown:
                session.delivery.push_update(update)
        _HANDLERS[type(event)](self, event)

    def _started(self, event: TurnStart) -> None:  # turns are sequential: the last start says whose turn runs
        session = self.session
        session.autonomous_turn = event.turn if event.autonomous else None
        slot = session.slot
        if event.autonomous and slot is not None and slot.end is not None:
            slot.released.set()  # the prompt's turn is over and the agent works on its own now

    def _message(self, event: AssistantMessageEvent) -> None:
        _deliver(self.session, self.session.slot, event)

    def _ended(self, event: TurnEnd) -> None:
        session = self.session
        slot = session.slot
        session.streamed.clear()  # a call that failed and was retried never commits what it showed
        if self.on_turn_end is not None:
            self.on_turn_end()
        if slot is not None:
            _turn_ended(session, slot, event, self.usage_updates)

    def _settings(self, event: SettingsChanged) -> None:
        if self.on_settings is not None:
            self.on_settings(event.changed)

    def _ignore(self, event: Any) -> None:
        pass


def _tracked(track: Callable[[Session, Slot, Any], None]) -> Callable[[_Observer, Any], None]:
    """A handler for a fact of the prompt's slot (none while no prompt waits: nothing to track)."""
    def take(observer: _Observer, event: Any) -> None:
        slot = observer.session.slot
        if slot is not None:
            track(observer.session, slot, event)

    return take


def live_observer(session: Session) -> Callable[[Agent, LiveText], None]:
    """``stream = "live"``: the model's text down the delivery chain as it is written (the
    committed message then sends only what did not go out live: its images); its thinking to
    the presentation plugins (``dsh_present_live``)."""
    hook = session.agent.host.pm.hook.dsh_present_live
    present = hook if hook.get_hookimpls() else None

    def watch(agent: Agent, piece: LiveText) -> None:
        if agent is not session.agent or not piece.text:
            return
        if not piece.reasoning:
            session.streamed.add(piece.message_id)
            session.delivery.push(TextBlock(text=piece.text), piece.message_id)
        elif present is not None:
            _present(session, "live thinking", present, piece=piece)

    return watch


def progress_observer(session: Session) -> Callable[[Agent, ToolProgress], None] | None:
    """A running tool call's progress (the tail of a command's output) to the presentation
    plugins (``dsh_present_progress``) and down the delivery chain; None when no plugin presents
    it (acp-agent): then the door does not watch, and tools gather nothing."""
    hook = session.agent.host.pm.hook.dsh_present_progress
    if not hook.get_hookimpls():
        return None

    def watch(agent: Agent, piece: ToolProgress) -> None:
        if agent is not session.agent:
            return
        _present(session, "tool progress", hook, progress=piece)

    return watch


def _present(session: Session, what: str, hook: Any, **kw: Any) -> None:
    """Ask the presentation plugins (``hook``) for the updates of a live piece and push them down the
    delivery chain; a plugin that fails is logged (``what`` it presented) and nothing is shown."""
    try:
        shown = [u for updates in hook(session=session.agent, **kw) for u in updates or ()]
    except Exception as exc:
        log.warning(f"presenting {what} failed: {exc!r}")
        return
    for update in shown:
        session.delivery.push_update(update)


def _deliver(session: Session, slot: Slot | None, event: AssistantMessageEvent) -> None:
    """A committed assistant message: its visible blocks down the delivery chain (text that went
    out live is not sent again), its usage to the prompt's slot when the message belongs to the
    prompt's turn."""
    live = event.message.id in session.streamed
    session.streamed.discard(event.message.id)
    for block in event.message.content:
        if (isinstance(block, TextBlock) and block.text and not live) or isinstance(block, ImageBlock):
            session.delivery.push(block, event.message.id)
    if slot is not None and event.usage is not None and event.turn == slot.turn:
        slot.usage = _add_usage(slot.usage, event.usage)
        slot.calls += 1
        slot.context = event.usage.input_tokens + event.usage.output_tokens


# What settlement reads off the prompt's way through the agent (the prompt's slot): the turn that
# claimed it, that turn's end, an error while it waited in the inbox, its drop.

def _claimed(session: Session, slot: Slot, event: InboxClaimed) -> None:
    if slot.message_id in event.message_ids:
        slot.turn = event.turn


def _turn_ended(session: Session, slot: Slot, event: TurnEnd, usage_updates: bool) -> None:
    if slot.turn == event.turn:
        slot.end = event
        if usage_updates and slot.usage is not None:
            session.delivery.push_update(_usage_update(session, slot))


def _errored(session: Session, slot: Slot, event: AgentError) -> None:
    # an autonomous turn the prompt waited behind failed: that work was the agent's own (ACP-7)
    if (slot.in_inbox and event.turn != slot.turn and event.turn != session.autonomous_turn
            and slot.interval_error is None):
        slot.interval_error = event.message


def _dropped(session: Session, slot: Slot, event: InboxDropped) -> None:
    if slot.message_id in event.message_ids:
        slot.dropped = True


async def _interval_end(session: Session, slot: Slot) -> None:
    """The end of a prompt's interval (ACP-5, ACP-7): the agent is quiescent, or, after the
    prompt's own turn ended, it started an autonomous turn (a wake that arrived meanwhile, a
    goal's next round): that work is the agent's own, not this prompt's, and may go on for long.
    The observer sets ``slot.released`` for the second case; the wait ends on either flag, where
    a cancel scope cancelled by the observer costs a scope made, entered and left per prompt
    (and a task group with a waiter task ~30 µs, bench/startup_cpu.py)."""
    await session.agent.wait_idle(unless=slot.released)


def _usage_update(session: Session, slot: Slot) -> wire.UsageUpdate:
    """Context in use after the turn (the last call's prompt plus its answer) of the routed window."""
    return wire.UsageUpdate(used=slot.context, size=session.agent.route.context_window)


class Settlement(PromptContent, Controls):
    """``session/prompt``, ``session/cancel``, ``$/cancel_request`` and permission requests."""

    def _cancel_request(self, request_id: Any, method: str) -> bool:
        """``$/cancel_request`` for a ``session/prompt`` is a ``session/cancel`` of that prompt
        (ACP-8; client facts, 7). Its handler may not have started yet: then it finds the cancel
        when it does."""
        if method != "session/prompt":
            return False
        for session in self.sessions.values():
            if session.slot is not None and session.slot.request_id == request_id:
                self._cancel_session(session, queued=False)  # that prompt only: those in line go on
            for waiting in [w for w in session.queued if w.request_id == request_id]:
                session.queued.remove(waiting)  # a prompt in line leaves it, unrun
                self._drop_queued(waiting)
        return True

    def _cancelled_before_start(self, rid: Any, session: Session) -> bool:
        """A cancel read after this prompt but handled before its handler started (one write)."""
        entry = self.peer.inbound(rid)
        return entry is not None and (entry.cancel_requested or session.cancel_seq > entry.seq)

    # ------------------------------------------------------------------ prompt: admission, one in flight, settlement (ACP-4/5/7)

    async def prompt(self, rid: Any, params: msgspec.Raw | None) -> Any:
        p = decode_params(params, wire.PromptParams)
        if self.closed:
            raise internal_error(CLOSING + "the prompt was not run")
        session = self.sessions.get(p.session_id)
        if session is None:
            raise invalid_params(f"unknown session: {shown(p.session_id)}")
        if self._cancelled_before_start(rid, session):
            return wire.PromptResult(stop_reason="cancelled")  # nothing was submitted
        admitted = None
        if session.slot is not None:
            if not self.settings.prompt_queue:
                raise invalid_params("a prompt is already in flight for this session")
            admitted = self._admit(p.prompt)  # a prompt it would refuse is refused now, not after the wait
            slot = await self._wait_in_line(session, rid)
            if slot is None:
                return wire.PromptResult(stop_reason="cancelled")  # it never ran
        else:
            slot = session.slot = Slot()  # reserved before any await (ACP-5, ACP-8)
            slot.request_id = rid
        session.delivery.take_failure()
        try:
            content, images = admitted if admitted is not None else self._admit(p.prompt)
            if self.settings.commands:
                ran = await self.run_command(session, slot, content)
                if isinstance(ran, wire.PromptResult):
                    await session.delivery.drain()
                    return ran
                content = ran
            if images:  # the only awaited part of admission: cancel aborts it (ACP-8)
                with slot.admission:
                    await self._store_images(session, content, images)
            if slot.cancelled or self.closed:
                return wire.PromptResult(stop_reason="cancelled")
            content = [b for b in content if not (isinstance(b, TextBlock) and not b.text)]
            message = UserMessage(id=new_id("msg_"), content=content)
            slot.message_id = message.id
            if slot.typed is not None:  # a command's prompt: what the person typed, for session/load
                session.agent.emit(Note(kind=COMMAND_TYPED, data={"text": slot.typed, "messageId": message.id}))
            try:
                session.agent.submit(message)
            except Exception as exc:
                detail = "the agent was disposed outside the bridge" if session.agent.disposed else str(exc)
                raise internal_error(f"prompt was not queued: {detail}") from None
            slot.in_inbox = True
            await _interval_end(session, slot)
            await session.delivery.drain()
            result = self._settle(session, slot)
            if slot.usage is not None:
                result.meta = {"usage": _usage_meta(slot.usage, slot.calls)}
                if self.settings.prompt_usage:
                    u = slot.usage
                    result.usage = wire.TokenUsage(
                        total_tokens=u.input_tokens + u.output_tokens, input_tokens=u.input_tokens,
                        output_tokens=u.output_tokens, thought_tokens=u.reasoning_tokens,
                        cached_read_tokens=u.cache_hit_tokens)
            return result
        finally:
            self._hand_on(session, slot)  # to the next prompt in line, if one waits
            slot.settled.set()

    async def _wait_in_line(self, session: Session, rid: Any) -> Slot | None:
        """``prompt-queue``: a prompt that arrives while another is in flight waits behind it (at
        most ``prompt-queue`` of them) and takes the slot when the one before it has answered; it
        then runs as a prompt of its own: its message enters the agent's inbox then (behind any
        autonomous work, like any prompt), and its turn is its own. None: it was cancelled in line
        (``session/cancel``, ``$/cancel_request``, close, EOF), and never ran."""
        limit = self.settings.prompt_queue
        if len(session.queued) >= limit:
            raise invalid_params(f"{limit} prompts already wait behind the one running in this session; "
                                 "send this one when one of them has answered, or cancel")
        called = anyio.Event()
        slot = Slot(request_id=rid, called=called)
        session.queued.append(slot)
        try:
            await called.wait()
        except BaseException:  # its handler was cancelled in line (the connection ends)
            self._leave_line(session, slot)
            raise
        if slot.cancelled or session.slot is not slot:
            self._leave_line(session, slot)
            return None
        return slot

    def _leave_line(self, session: Session, slot: Slot) -> None:
        """A queued prompt that will not run: out of the line, and the slot handed on if it had it."""
        if slot in session.queued:
            session.queued.remove(slot)
        self._hand_on(session, slot)
        slot.settled.set()

    def _settle(self, session: Session, slot: Slot) -> wire.PromptResult:
        """Settlement precedence (ACP-7), first match wins."""
        if slot.cancelled:
            return wire.PromptResult(stop_reason="cancelled")
        failure = session.delivery.take_failure()
        if failure is not None:
            raise internal_error(f"assistant output delivery failed: {failure}")
        if slot.interval_error is not None:
            raise internal_error(f"turn failed: {slot.interval_error}")
        end = slot.end
        if end is None:
            return wire.PromptResult(stop_reason="cancelled")  # turnless slot
        if end.reason == "error" and end.code == "CONTENT_FILTER" and self.settings.content_filter == "refusal":
            return wire.PromptResult(stop_reason="refusal")  # an editor's choice: the provider declined to answer
        if end.reason == "error":
            raise internal_error(f"turn failed: {end.error}")
        if end.reason == "disposed" or (end.reason == "aborted" and end.abort_kind == "disposed"):
            return wire.PromptResult(stop_reason="cancelled")
        if end.reason == "max-steps":  # a step budget ran out; the answer so far is committed
            return wire.PromptResult(stop_reason="max_turn_requests")
        if end.reason == "max-tokens" and self.settings.max_tokens == "max_tokens":  # an editor's choice
            return wire.PromptResult(stop_reason="max_tokens")
        if end.reason == "max-tokens":  # still end_turn (ACP-7); _meta tells a client that reads it (a parent agent)
            return wire.PromptResult(stop_reason="end_turn", meta={"dsh": {"turnEnd": "max-tokens"}})
        return wire.PromptResult(stop_reason="end_turn")  # completed, hook-aborted, blocked

    # ------------------------------------------------------------------ cancel (ACP-8)

    def cancel(self, params: msgspec.Raw | None) -> None:
        try:
            p = decode_params(params, wire.CancelParams)
        except RpcFailure:
            return  # never answer a notification
        session = self.sessions.get(p.session_id)
        if session is None:
            log.debug(f"session/cancel for unknown session {shown(p.session_id)!r} ignored")
            return
        session.cancel_seq = self.peer.read_seq  # also for prompts read before it whose handler has not run
        self._cancel_session(session)

    # ------------------------------------------------------------------ permission requests (ACP-9)

    def _owned(self, agent: Any) -> Session | None:
        session = self.sessions.get(getattr(agent, "session_id", ""))
        return session if session is not None and session.agent is agent else None

    async def answer(self, request: ApprovalRequest) -> ApprovalOutcome | None:
        session = self._owned(request.agent)
        if session is None or not request.call_id:
            return None  # foreign or call-less: the next answerer decides
        if self.closed:
            return "unavailable"
        remembering = self.settings.remember_approvals and rememberable(request)
        if remembering:
            ruled = session.agent.state(ApprovalRules).decide(request)
            if ruled is not None:
                return ruled  # the person's "always" for this tool and tier: not asked again
            options = options_for(request)
        elif request.choices is None:
            options = wire.PERMISSION_OPTIONS
        else:
            options = [
                wire.PermissionOption(option_id="allow-once", name=one_line(request.choices[0], 120), kind="allow_once"),
                wire.PermissionOption(option_id="reject-once", name=one_line(request.choices[1], 120), kind="reject_once"),
            ]
        params = wire.PermissionParams(
            session_id=session.id,
            tool_call=tool_call_of(request, await buffered_text(request)),
            options=options,
        )
        with anyio.move_on_after(self.settings.permission_timeout):
            await session.delivery.drain()  # what is queued (the call's card) reaches the client before the question
        try:
            raw = await self.peer.request("session/request_permission", params, timeout=self.settings.permission_timeout)
        except (RpcFailure, TransportClosed, TimeoutError) as exc:
            log.warning(f"permission request failed closed: {exc!r}")
            return "unavailable"
        try:
            result = msgspec.json.decode(raw, type=wire.PermissionResult)
        except msgspec.ValidationError:
            return "rejected"
        if result.outcome.outcome == "cancelled":
            return "cancelled"
        picked = result.outcome.option_id if result.outcome.outcome == "selected" else None
        offered = {o.option_id for o in options}
        if picked in offered and picked in OPTION_OUTCOMES:
            outcome, rule = OPTION_OUTCOMES[picked]
            if rule is not None and request.tier:  # only offered when remembering
                session.agent.state(ApprovalRules).remember(session.agent, request.tool_name, request.tier, rule)
            return outcome
        return "rejected"  # an option we did not offer, anything else


# What each event type does, looked up by the event's type (state.ByType: one dict subscript
# where an isinstance chain asked up to six times per event; ~16 calls a tool turn,
# bench/profile_prompt.py --bash); one table for the process (closures per session cost 1.9 KiB
# a session, bench/profile_session_memory.py).
_HANDLERS: ByType[Callable[[_Observer, Any], None]] = ByType({
    TurnStart: _Observer._started,
    AssistantMessageEvent: _Observer._message,
    TurnEnd: _Observer._ended,
    InboxClaimed: _tracked(_claimed),
    AgentError: _tracked(_errored),
    InboxDropped: _tracked(_dropped),
    SettingsChanged: _Observer._settings,
}, _Observer._ignore)
