"""The turn loop: a driver claims the whole inbox as one turn and runs steps — model call, then
the tool calls it asked for, then the next model call — until a step asks for no tool; the
interception points at prompt submit and before stop; committing what a model call produced
(an interrupted call commits the text it already had)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from .agent_base import AgentBase
from .diag import warn
from .errors import ModelError
from .interception import (
    BeforeStop,
    PromptSubmit,
    SessionStart,
    reminder,
    settle,
)
from .protocols import new_id
from .state import ByType, Flag
from .types import (
    AgentError,
    AssistantMessage,
    AssistantMessageEvent,
    ContentBlock,
    Finish,
    HistoryView,
    ImageBlock,
    ImageDelta,
    InboxClaimed,
    LiveText,
    ModelCallFailed,
    ModelRequest,
    Note,
    ReasoningBlock,
    ReasoningDelta,
    RequestHeader,
    RetryEvent,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    TurnEnd,
    TurnStart,
    Usage,
    UsageDelta,
    UserMessage,
    UserMessageEvent,
)

if TYPE_CHECKING:  # pragma: no cover
    pass

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
        self.id = new_id("msg_")  # the committed message's id, known while it streams (live text)
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
        _APPLY[type(d)](self, d)

    def _text_delta(self, d: TextDelta) -> None:
        self._text(d.text, reasoning=False)

    def _reasoning_delta(self, d: ReasoningDelta) -> None:
        self._text(d.text, reasoning=True)

    def _tool_delta(self, d: ToolCallDelta) -> None:
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

    def _image_delta(self, d: ImageDelta) -> None:
        self.blocks.append(d.image)

    def _usage_delta(self, d: UsageDelta) -> None:
        self.usage = d.usage

    def _finish(self, d: Finish) -> None:
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


def _ignore(partial: _Partial, delta: Any) -> None:
    pass


# How _Partial takes a delta, by its type: one dict subscript per delta where an isinstance chain
# asked up to six times (a tool step's deltas are its last three kinds: ~12 calls a tool turn,
# bench/profile_prompt.py --bash); a subclass is taken as its base is, any other type ignored.
_APPLY: ByType[Callable[[_Partial, Any], None]] = ByType({
    TextDelta: _Partial._text_delta,
    ReasoningDelta: _Partial._reasoning_delta,
    ToolCallDelta: _Partial._tool_delta,
    ImageDelta: _Partial._image_delta,
    UsageDelta: _Partial._usage_delta,
    Finish: _Partial._finish,
}, _ignore)


PARKED_DRIVERS = 128  # idle agents of a host whose driver task waits for their next prompt


class ParkedDrivers:
    """A host's idle agents whose driver task waits for their next prompt, longest idle first.

    An agent's driver task outlives its turn, so a session prompted again reuses it (no task per
    prompt); but a waiting task costs ~4 KiB, most of what an idle session would hold. Past
    ``PARKED_DRIVERS`` the longest-idle driver ends, and that session's next prompt starts one
    again: 10,000 idle sessions hold at most that many tasks."""

    __slots__ = ("idle",)

    def __init__(self) -> None:
        self.idle: dict[AgentBase, None] = {}  # insertion order: longest idle first

    def park(self, agent: AgentBase) -> None:
        agent._retired = False
        self.idle[agent] = None
        if len(self.idle) > PARKED_DRIVERS:
            oldest = next(iter(self.idle))
            del self.idle[oldest]
            oldest._retired = True
            if oldest._wake is not None:
                oldest._wake.set()


class TurnLoop(AgentBase):
    """The turn-loop part of the agent (see ``agent_base``)."""

    __slots__ = ()

    # ------------------------------------------------------------------ the loop

    async def _drive(self) -> None:
        parked = self.host.state(ParkedDrivers)
        try:
            while True:
                while not self._disposed and (self._inbox or self._claim_wake()):
                    await self._run_turn()
                self._busy = False
                self._idle.set()
                if self._disposed:
                    return
                assert self._wake is not None
                self._wake = Flag()
                parked.park(self)
                await self._wake.wait()
                parked.idle.pop(self, None)
                if self._retired and not self._busy:  # no prompt since: the next one starts a driver again
                    return
        finally:
            self._wake = None
            self._retired = False
            self._busy = False
            self._idle.set()
            parked.idle.pop(self, None)

    async def _run_turn(self) -> None:
        self._turn += 1
        turn = self._turn
        claimed, self._inbox = self._inbox, []
        ids = [m.id for m in claimed]
        self._claimed_ids = frozenset(ids)
        # Autonomous: nothing the client sent is in it, only notices that woke the agent (no prompt
        # interception runs for it; a front door tells its output from a prompt's by this flag)
        autonomous = bool(ids) and bool(self._woken) and self._woken.issuperset(ids)
        if self._woken:
            self._woken = set()
        self.emit(InboxClaimed(turn=turn, message_ids=ids))
        self._history.extend(claimed)
        self.emit(TurnStart(turn=turn, autonomous=autonomous))
        self._abort_kind = None
        self._halted = None
        reason, error, code = "completed", None, None
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                if self.log_error is None:  # InboxClaimed/TurnStart already failed to record: do no work
                    if not self._sources_ready.is_set():  # the session's own tools (MCP servers) are listed
                        await self._sources_ready.wait()
                    reason = await self._turn_body(turn, claimed, autonomous=autonomous)
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
        if self._pending_context:  # a settings change the model is told of: appended, the prefix stays
            texts, self._pending_context = self._pending_context, []
            self._append_context(texts)
        if self._notices:  # what happened meanwhile (a subagent settled): after what the model saw
            notices, self._notices = self._notices, []
            for message, unless in notices:
                if unless is not None and unless():
                    continue  # already told (a tool result showed it since)
                self._history.append(message)
                self.emit(UserMessageEvent(message=message))
        tools = self._tool_specs() if self.route.tools else []
        if not self._header_sent:
            self._header_sent = True
            self.emit(
                RequestHeader(
                    provider=self.route.provider,
                    model=self.route.model,
                    system=self.system,
                    tools=[{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools],
                    route=self.route,
                    reason=self._header_reason,
                )
            )
            self._header_reason = "initial"
        return ModelRequest(
            route=self.route,
            system=self.system,
            messages=HistoryView(self._history),
            tools=tools,
            session_id=self.session_id,
            cwd=self.cwd,
            effort=self.settings.effort,
        )

    def _append_context(self, texts: list[str]) -> None:
        """Append plugin context after what the model saw (one user message, source ``hook``)."""
        if texts:
            message = UserMessage(id=new_id("msg_"), content=[TextBlock(text=reminder(t)) for t in texts], source="hook")
            self._history.append(message)
            self.emit(UserMessageEvent(message=message))

    async def _intercept_prompt(self, turn: int, claimed: list[UserMessage], *, autonomous: bool = False) -> bool:
        """Session start (once per agent object) and prompt submit (not for an autonomous turn: no
        prompt is in it). False: the prompt is blocked."""
        hook = self.host.direct
        context: list[str] = []
        if self._start_source is not None:
            source, self._start_source = self._start_source, None
            started = [a for a in await settle(hook.dsh_session_start(session=self, source=source, turn=turn))
                       if isinstance(a, SessionStart)]
            context += [c for a in started for c in a.context if c]
            self._halt(turn, "session_start", started)
        answers: list[PromptSubmit] = []
        if not self._halted and not autonomous:  # a stop at session start: the prompt is not submitted
            raw = hook.dsh_prompt_submit(session=self, messages=list(claimed), turn=turn)
            if raw:  # most prompts: no plugin answers (none of the helpers below is called for nothing)
                answers = [a for a in await settle(raw) if isinstance(a, PromptSubmit)]
                self._halt(turn, "prompt_submit", answers)
        if not answers and not context and not self._halted:
            return True
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
        raw = self.host.direct.dsh_before_stop(session=self, turn=turn, step=step, continued=continued)
        if not raw:  # no plugin answers: nothing blocks, and nothing stops the turn here
            return False
        answers = [a for a in await settle(raw) if isinstance(a, BeforeStop)]
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

    async def _turn_body(self, turn: int, claimed: list[UserMessage] | None = None, *, autonomous: bool = False) -> str:
        if claimed is not None and not await self._intercept_prompt(turn, claimed, autonomous=autonomous):
            return "blocked"
        step = 0
        continued = 0
        while True:
            step += 1
            if self.host.direct.dsh_check_step(session=self, turn=turn, step=step) == "stop":
                return "max-steps"  # a step budget: everything so far is committed, every call answered
            partial = await self._call_model(turn, step)
            # Cut by max tokens: no tool call of this message runs or is committed, the one that was
            # still streaming included (its arguments are incomplete; the rest would need results).
            truncated = partial.finish == "max-tokens"
            content = partial.content(keep_tools=not truncated)
            message = AssistantMessage(
                id=partial.id, content=content, provider=self.route.provider, model=self.route.model
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
                # Whatever ends the loop, the provider's stream (an HTTP response) closes now (as
                # contextlib.aclosing would, without its three calls a model call)
                deltas = self.provider.stream(request)
                try:
                    async for delta in deltas:
                        _APPLY[type(delta)](partial, delta)  # partial.apply, one call less a delta
                        if self._watchers and isinstance(delta, (TextDelta, ReasoningDelta)):
                            self._live(LiveText(turn=turn, step=step, message_id=partial.id, text=delta.text,
                                                reasoning=isinstance(delta, ReasoningDelta)))
                finally:
                    await deltas.aclose()
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
                        id=partial.id,
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

