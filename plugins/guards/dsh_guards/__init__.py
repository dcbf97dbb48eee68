"""dsh plugin ``guards``: nudges and limits for long turns; advisory, never a block.

- Repeat-call reminder (``dsh_after_tool``): when the model makes the same tool call (same
  name, same arguments — compared as canonical JSON) for the n-th time in one session and n
  is one of ``repeat-thresholds`` (default 3, 5, 8), a reminder is appended after that result.
- Step budget (``dsh_check_step``): a turn makes at most ``max-steps`` model calls (default
  200); the next one is not made and the turn ends ``max-steps`` (ACP ``max_turn_requests``)
  with everything answered so far committed.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from dsh_core import hookimpl
from dsh_core.errors import ConfigError
from dsh_core.types import AfterTool

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent, Host
    from dsh_core.types import ToolCallBlock, ToolOutput

PLUGIN = "guards"
DEFAULT_THRESHOLDS = (3, 5, 8)
DEFAULT_MAX_STEPS = 200
ENV_MAX_STEPS = "DSH_MAX_STEPS"  # overrides max-steps (a client that spawns dsh sets it)

class RepeatCounts(Counter[tuple[str, str]]):
    """How often each (tool, arguments) was called in a session (the session's state slot)."""


def _settings(host: Host) -> tuple[tuple[int, ...], int]:
    table = host.config.get(PLUGIN, {})
    steps = os.environ.get(ENV_MAX_STEPS) or table.get("max-steps", DEFAULT_MAX_STEPS)
    return tuple(table.get("repeat-thresholds", DEFAULT_THRESHOLDS)), int(steps)


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    table = config.get(PLUGIN, {})
    unknown = set(table) - {"repeat-thresholds", "max-steps"}
    if unknown:
        raise ConfigError(f"[config.{PLUGIN}]: unknown key(s) {sorted(unknown)}; known: repeat-thresholds, max-steps")
    th = table.get("repeat-thresholds", list(DEFAULT_THRESHOLDS))
    if not isinstance(th, list | tuple) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 2 for n in th):
        raise ConfigError(f"[config.{PLUGIN}] repeat-thresholds must be a list of integers >= 2, got {th!r}")
    steps = table.get("max-steps", DEFAULT_MAX_STEPS)
    if os.environ.get(ENV_MAX_STEPS):
        try:
            steps = int(os.environ[ENV_MAX_STEPS])
        except ValueError:
            raise ConfigError(f"{ENV_MAX_STEPS} must be an integer >= 1, got {os.environ[ENV_MAX_STEPS]!r}") from None
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError(f"[config.{PLUGIN}] max-steps must be an integer >= 1 (model calls per turn), got {steps!r}")


def call_key(name: str, arguments: str) -> tuple[str, str]:
    """(name, canonical arguments): key order and whitespace do not make two calls different."""
    try:
        canon = json.dumps(json.loads(arguments or "{}"), sort_keys=True, separators=(",", ":"))
    except ValueError:
        canon = arguments
    return name, canon


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
