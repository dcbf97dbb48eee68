"""dsh plugin ``guards``: nudges and limits for long turns; advisory, never a block.

- Repeat-call reminder (``dsh_after_tool``): when the model makes the same tool call (same
  name, same arguments — compared as canonical JSON) for the n-th time in one session and n
  is one of ``repeat-thresholds`` (default 3, 5, 8), a reminder is appended after that result.
- Step budget (``dsh_check_step``): a turn makes at most ``max-steps`` model calls (default
  200); the next one is not made and the turn ends ``max-steps`` (ACP ``max_turn_requests``)
  with everything answered so far committed.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from msgspec import Meta

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.errors import ConfigError
from dsh_core.types import AfterTool

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent, Host
    from dsh_core.types import ToolCallBlock, ToolOutput

PLUGIN = "guards"
DEFAULT_THRESHOLDS = (3, 5, 8)
DEFAULT_MAX_STEPS = 200
ENV_MAX_STEPS = "DSH_MAX_STEPS"  # overrides max-steps (a client that spawns dsh sets it)

class RepeatCounts(Counter[tuple[str, str | bytes]]):
    """How often each (tool, arguments) was called in a session (the session's state slot)."""


class GuardsConfig(PluginConfig):
    """[config.guards]"""

    repeat_thresholds: Annotated[list[Annotated[int, Meta(ge=2)]], Meta(
        description="after the n-th identical call of a session, for each n here, a reminder is appended")] = (
        msgspec.field(default_factory=lambda: list(DEFAULT_THRESHOLDS)))
    max_steps: Annotated[int, Meta(ge=1, description=f"model calls per turn ({ENV_MAX_STEPS} overrides it)")] = (
        DEFAULT_MAX_STEPS)


dsh_config_type = config_type_hook(PLUGIN, GuardsConfig)


def _env_max_steps() -> int | None:
    raw = os.environ.get(ENV_MAX_STEPS)
    if not raw:
        return None
    try:
        steps = int(raw)
    except ValueError:
        steps = 0
    if steps < 1:
        raise ConfigError(f"{ENV_MAX_STEPS} must be an integer >= 1, got {raw!r}")
    return steps


class _Settings(tuple[frozenset[int], int]):
    """A host's (repeat thresholds, max steps), its config and ``DSH_MAX_STEPS`` read once (the
    host's state slot): every model call and tool call asks (~7 calls each when read anew,
    bench/profile_prompt.py --bash)."""


def _settings(host: Host) -> _Settings:
    def read() -> _Settings:
        config = host.config_for(GuardsConfig)
        return _Settings((frozenset(config.repeat_thresholds), _env_max_steps() or config.max_steps))

    return host.state(_Settings, read)


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    _env_max_steps()  # a bad DSH_MAX_STEPS fails at start-up, like a bad table


def call_key(name: str, arguments: str) -> tuple[str, str | bytes]:
    """(name, canonical arguments): key order and whitespace do not make two calls different.
    (msgspec's decode and sorted encode: two calls, where the stdlib's loads and dumps made ~16 on
    every tool call, bench/profile_prompt.py --bash; the key is only counted, never shown.)"""
    try:
        canon: str | bytes = _encode(_decode(arguments or "{}"))
    except ValueError:  # msgspec.DecodeError is one
        canon = arguments
    return name, canon


_decode = msgspec.json.decode
_encode = msgspec.json.Encoder(order="sorted").encode


def reminder(name: str, n: int) -> str:
    return (
        f"You have now called {name} with exactly these arguments {n} times in this session. "
        "Repeating it will return the same kind of result. If it did not give you what you need, "
        "change the arguments, try a different tool or approach, or say what is blocking you."
    )


@hookimpl
def dsh_after_tool(session: Agent, call: ToolCallBlock, output: ToolOutput) -> AfterTool | None:
    thresholds, _ = _settings(session.host)
    counts = session.state(RepeatCounts)
    key = call_key(call.name, call.arguments)
    counts[key] += 1
    n = counts[key]
    return AfterTool(context=[reminder(call.name, n)]) if n in thresholds else None


@hookimpl
def dsh_check_step(session: Agent, turn: int, step: int) -> Literal["stop"] | None:
    _, max_steps = _settings(session.host)
    return "stop" if step > max_steps else None
