"""The token meter: how full a route's context window a request would be, before it is sent.

Reading = the provider's reported prompt tokens for the previous call of this history (exact,
when the provider reports usage) + an estimate of what was appended since. With no report (a
provider without usage, or just after a compaction) the whole request is estimated.

The estimator is UTF-8 bytes / 4 (rounded up) over the text a provider would render — message
text, reasoning, tool-call names and arguments, tool results — plus a small per-message
overhead for the role markers, and a flat charge per image. It is deliberately simple (no
tokenizer download, O(size of the new messages)); its error is measured against the fake
DeepSeek server's counts in tests/test_meter.py and reported in the README.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from dsh_core.types import (
    ImageBlock,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
    ToolSpec,
)

BYTES_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4  # role marker and separators, per message
IMAGE_TOKENS = 1_000  # a flat charge: providers bill images by size, we only need "roughly"


def text_tokens(text: str) -> int:
    n = len(text.encode("utf-8"))
    return -(-n // BYTES_PER_TOKEN)


def message_tokens(message: Any) -> int:
    """Estimated prompt tokens of one history message: ``text_tokens`` of each of its texts."""
    total = MESSAGE_OVERHEAD
    if isinstance(message, ToolResultMessage):
        total += text_tokens(message.call_id)
    for block in getattr(message, "content", ()):
        if isinstance(block, (TextBlock, ReasoningBlock)):
            total += text_tokens(block.text)
        elif isinstance(block, ToolCallBlock):
            total += text_tokens(block.id) + text_tokens(block.name) + text_tokens(block.arguments) + 6
        elif isinstance(block, ImageBlock):
            total += IMAGE_TOKENS
    return total


def prefix_tokens(system: str, tools: Iterable[ToolSpec]) -> int:
    """Estimated tokens of the stable prefix: the system prompt and the tool schemas as the model
    sees them (name, description, parameters; a ToolSpec's other declarations never reach it)."""
    import msgspec

    total = text_tokens(system) + MESSAGE_OVERHEAD
    for tool in tools:
        seen = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
        total += text_tokens(msgspec.json.encode(seen).decode())
    return total


def history_tokens(messages: Iterable[Any]) -> int:
    return sum(message_tokens(m) for m in messages)


def reading(
    *,
    system: str,
    tools: Sequence[ToolSpec],
    history: Sequence[Any],
    metered_tokens: int | None,
    metered_messages: int,
) -> int:
    """Tokens the next request would carry: the provider's last count + an estimate of the rest.

    O(messages appended since the last reported call) when a count is known."""
    if metered_tokens is not None and 0 < metered_messages <= len(history):
        return metered_tokens + history_tokens(history[metered_messages:])
    return prefix_tokens(system, tools) + history_tokens(history)


class Meter:
    """``reading`` with memory, for one session: the estimate of the history is kept as a running
    total, so a provider that reports no usage (the scripted model) still costs O(new messages)
    per call, not O(history). A rewrite of the history (compaction) is noticed by identity and
    recounted once."""

    def __init__(self) -> None:
        self._prefix_key: tuple[str, tuple[str, ...]] | None = None
        self._prefix = 0
        self._seen_system: str | None = None
        self._seen_tools: list[ToolSpec] = []
        self._first: Any = None
        self._last: Any = None
        self._count = 0
        self._total = 0

    def prefix(self, system: str, tools: Sequence[ToolSpec]) -> int:
        if system is self._seen_system and tools == self._seen_tools:  # the same objects as last time: one C loop
            return self._prefix
        key = (system, tuple(t.name for t in tools))
        if key != self._prefix_key:
            self._prefix_key, self._prefix = key, prefix_tokens(system, tools)
        self._seen_system, self._seen_tools = system, list(tools)
        return self._prefix

    def history(self, history: Sequence[Any]) -> int:
        # Two lookups of ``history`` (a HistoryView: each a Python call), where three were made (and
        # five before that): its first message, and in one slice the last message metered before
        # with everything after it; the new messages summed in this loop (no generator).
        n = len(history)
        first = history[0] if n else None
        count = self._count
        new = None
        if count and n >= count and first is self._first:
            seen = history[count - 1 :]
            if seen[0] is self._last:
                new = seen[1:]
        if new is None:  # another history (a compaction rewrote it), or the first call: recount
            self._total = 0
            new = history[:]
        for message in new:
            self._total += message_tokens(message)
        if new:
            self._last = new[-1]
        elif not n:
            self._last = None
        self._count, self._first = n, first
        return self._total

    def reading(
        self, *, system: str, tools: Sequence[ToolSpec], history: Sequence[Any],
        metered_tokens: int | None, metered_messages: int,
    ) -> int:
        """Same figure as the module's ``reading``."""
        if metered_tokens is not None and 0 < metered_messages <= len(history):
            return metered_tokens + history_tokens(history[metered_messages:])
        return self.prefix(system, tools) + self.history(history)
