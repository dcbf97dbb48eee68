"""compaction: a token meter and cache-aware compaction of long histories.

Before each model call the meter reads how full the routed model's context window the request
would be (``_meter.reading``). Past ``threshold-ratio`` of the window — or when the provider
answers a context-length error — the older part of the history is summarised by a dedicated
model call and replaced by one summary message; the most recent ``retain-ratio`` of the window
stays verbatim, and the turn goes on. Nothing else ever rewrites the history, so between
compactions it stays append-only and the provider's prefix cache keeps hitting.

Config (``[config.compaction]``): ``threshold-ratio`` (0.8), ``retain-ratio`` (0.08),
``max-tokens`` (8192, the summary call's output budget). See README.md.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import anyio
from msgspec import Meta

from dsh_core import ModelError, config_type_hook, hookimpl
from dsh_core.config import PluginConfig, decode
from dsh_core.contracts import HistoryContext, new_id
from dsh_core.protocols import CommandResult, SlashCommand
from dsh_core.types import (
    AssistantMessage,
    CompactionFailed,
    CompactionStart,
    CompactionSummary,
    ModelRequest,
    ReasoningBlock,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolResultMessage,
    Usage,
    UsageDelta,
    UserMessage,
)

from ._meter import Meter, history_tokens, message_tokens, prefix_tokens, reading, text_tokens

log = logging.getLogger("dsh.compaction")

__all__ = ["Compactor", "Meter", "Settings", "reading", "render_transcript", "split_point"]

SOURCE = "compaction"  # UserMessage.source of a summary message
SUMMARY_PREFIX = "[Earlier conversation, compacted. Summary of what happened before the messages that follow:]\n\n"
SUMMARY_SYSTEM = (
    "You compact the history of a coding agent's session so the agent can continue its task "
    "without the full transcript. Write a faithful, dense summary in plain text: the user's goals "
    "and constraints in their own words where it matters; decisions taken and why; files, "
    "commands and tools used and what they showed (exact paths, names, numbers, error messages); "
    "what is done and what remains; the very next step. Do not invent anything, do not address "
    "the user, do not call tools."
)
SUMMARY_ASK = "Summarise the conversation in the transcript above, as instructed, so the work can continue."


Ratio = Annotated[float, Meta(gt=0, lt=1)]


class Settings(PluginConfig):
    """[config.compaction]"""

    threshold_ratio: Annotated[Ratio, Meta(description="compact when a request would pass this share of the window")] = 0.8
    retain_ratio: Annotated[Ratio, Meta(description="keep this share of the window verbatim (below threshold-ratio)")] = 0.08
    max_tokens: Annotated[int, Meta(ge=1, description="output budget of the summary call")] = 8192

    def __post_init__(self) -> None:
        if self.retain_ratio >= self.threshold_ratio:
            raise ValueError("retain-ratio must be below threshold-ratio")


dsh_config_type = config_type_hook("compaction", Settings)


def parse_settings(config: Mapping[str, Mapping[str, Any]], *, where: str = "example") -> Settings:
    """The ``[config.compaction]`` table of ``config`` as Settings (ConfigError when it is bad)."""
    return decode("compaction", Settings, config.get("compaction"), where=where)


def split_point(history: Sequence[Any], retain_tokens: int) -> int:
    """Index of the first message kept verbatim: the longest tail within ``retain_tokens``
    (estimated), moved forward past tool results so the tail never starts with a result whose
    call was summarised away. ``0`` means nothing older could be summarised."""
    kept, i = 0, len(history)
    while i > 0:
        cost = message_tokens(history[i - 1])
        if kept + cost > retain_tokens:
            break
        kept += cost
        i -= 1
    while i < len(history) and isinstance(history[i], ToolResultMessage):
        i += 1
    return i


def _render(message: Any) -> str:
    parts: list[str] = []
    if isinstance(message, UserMessage):
        label = "summary of earlier conversation" if message.source == SOURCE else f"user ({message.source})"
        parts.append(f"[{label}]")
    elif isinstance(message, AssistantMessage):
        parts.append("[assistant]")
    elif isinstance(message, ToolResultMessage):
        parts.append(f"[tool result {message.name}{' (error)' if message.is_error else ''}]")
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolCallBlock):
            parts.append(f"-> {block.name}({block.arguments})")
        elif isinstance(block, ReasoningBlock):
            continue  # the model's private reasoning is not carried over
        else:
            parts.append(f"<{getattr(block, 'mime', 'attachment')}>")
    return "\n".join(parts)


def render_transcript(messages: Sequence[Any], budget_tokens: int) -> str:
    """The covered range as plain text (no tool-call pairing rules to satisfy), middle cut when
    it would not fit the summary call's window."""
    text = "\n\n".join(_render(m) for m in messages)
    limit = max(1_000, budget_tokens * 4)  # bytes, the meter's ratio
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    head = raw[: limit // 2].decode("utf-8", "ignore")
    tail = raw[len(raw) - limit // 2 :].decode("utf-8", "ignore")
    return f"{head}\n\n[... {len(raw) - limit} bytes of the transcript omitted ...]\n\n{tail}"


class LastFailure:
    """Why the session's last compaction failed (its state slot), for ``/compact`` to tell the person."""

    def __init__(self) -> None:
        self.error: str | None = None


class Compactor:
    """One agent's history policy (see ``dsh_core.protocols.HistoryPolicy``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._failed_at: tuple[int, int] | None = None
        self._meter = Meter()

    def meter(self, ctx: HistoryContext) -> int:
        return self._meter.reading(system=ctx.system, tools=ctx.tools, history=ctx.history,
                                   metered_tokens=ctx.metered_tokens, metered_messages=ctx.metered_messages)

    async def prepare(self, ctx: HistoryContext) -> list[Any] | None:
        if ctx.agent.settings.auto_compact is False:
            return None  # the person switched automatic compaction off: only /compact compacts
        window = ctx.route.context_window
        tokens = self.meter(ctx)
        if tokens <= self.settings.threshold_ratio * window:
            return None
        if split_point(ctx.history, self._retain(window)) == 0:
            return None  # one message fills the retained share: nothing older to summarise
        return await self._compact(ctx, "pressure", tokens)

    async def recover(self, ctx: HistoryContext, error: Exception) -> list[Any] | None:
        if self._failed_at == (ctx.turn, ctx.step) or ctx.agent.settings.auto_compact is False:
            return None  # already failed for this call, or switched off: fail with the provider's error
        return await self._compact(ctx, "overflow", self.meter(ctx))

    async def compact(self, ctx: HistoryContext) -> list[Any] | None:
        """Compact because a person asked (``/compact``): whatever the pressure."""
        return await self._compact(ctx, "manual", self.meter(ctx))

    def _retain(self, window: int) -> int:
        return int(self.settings.retain_ratio * window)

    async def _compact(self, ctx: HistoryContext, reason: str, tokens: int) -> list[Any] | None:
        agent, history, window = ctx.agent, ctx.history, ctx.route.context_window
        agent.emit(CompactionStart(turn=ctx.turn, step=ctx.step, reason=reason, estimated_tokens=tokens,
                                   context_window=window, messages=len(history)))

        def failed(error: str, code: str = "") -> None:
            self._failed_at = (ctx.turn, ctx.step)
            agent.state(LastFailure).error = error
            agent.emit(CompactionFailed(turn=ctx.turn, step=ctx.step, reason=reason, error=error, code=code))

        cut = split_point(history, self._retain(window))
        if cut == 0:
            failed("nothing older than the retained messages to summarise", "NOTHING_TO_COMPACT")
            return None
        covered, tail = history[:cut], history[cut:]
        max_out = max(1, min(self.settings.max_tokens, ctx.route.max_output))
        budget = int(window * 0.9) - max_out - text_tokens(SUMMARY_SYSTEM) - 64
        ask = UserMessage(id=new_id("msg_"),
                          content=[TextBlock(text=f"<transcript>\n{render_transcript(covered, budget)}\n</transcript>\n\n{SUMMARY_ASK}")])
        request = ModelRequest(route=ctx.route, system=SUMMARY_SYSTEM, messages=[ask], tools=[],
                               session_id=f"{agent.session_id}:compaction", cwd=agent.cwd, max_output=max_out)
        pieces: list[str] = []
        usage: Usage | None = None
        try:
            async with contextlib.aclosing(agent.provider.stream(request)) as deltas:
                async for delta in deltas:
                    if isinstance(delta, TextDelta):
                        pieces.append(delta.text)
                    elif isinstance(delta, UsageDelta):
                        usage = delta.usage
        except ModelError as exc:
            failed(f"the summary call failed: {exc.message}", exc.code)
            return None
        except anyio.get_cancelled_exc_class():
            failed("the summary call was cancelled", "ABORTED")
            raise
        except Exception as exc:  # a provider bug must not lose the history
            log.warning(f"summarising session {agent.session_id} crashed: {exc!r}")
            failed(f"the summary call crashed: {type(exc).__name__}: {exc}", "INTERNAL")
            return None
        summary = "".join(pieces).strip()
        if not summary:
            failed("the summary call returned no text", "EMPTY_RESPONSE")
            return None
        message = UserMessage(id=new_id("msg_"), source=SOURCE, content=[TextBlock(text=SUMMARY_PREFIX + summary)])
        compacted = [message, *tail]
        after = prefix_tokens(ctx.system, ctx.tools) + history_tokens(compacted)
        agent.emit(CompactionSummary(turn=ctx.turn, step=ctx.step, reason=reason, covered_from=0, covered_to=cut,
                                     retained=len(tail), message=message, tokens_before=tokens, tokens_after=after,
                                     usage=usage))
        return compacted


async def _compact_command(session: Any, text: str) -> CommandResult:
    before = len(session.history)
    if before == 0:
        return CommandResult(reply="Nothing to compact: the conversation is empty.")
    session.state(LastFailure).error = None
    if await session.compact_history():
        return CommandResult(reply=f"Compacted: {before} messages are now {len(session.history)} "
                                   "(a summary of the older ones, then the most recent).")
    why = session.state(LastFailure).error
    return CommandResult(reply=f"Nothing was compacted: {why}." if why else "Nothing was compacted.")


@hookimpl
def dsh_slash_commands(session: Any, host: Any) -> list[SlashCommand]:
    return [SlashCommand(name="compact", description="Summarise the older part of the conversation now, to free context",
                         run=_compact_command)]


@hookimpl
def dsh_history_policy(session: Any, host: Any) -> Compactor:
    return Compactor(host.config_for(Settings))


@hookimpl
def dsh_compaction_summary(message: UserMessage) -> str | None:
    """The summary call's own answer inside a summary this plugin committed (its framing,
    ``SUMMARY_PREFIX``, taken off); None for any other message."""
    if message.source != SOURCE:
        return None
    text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
    return text[len(SUMMARY_PREFIX):] if text.startswith(SUMMARY_PREFIX) else None
