"""What a task's session did, read from its dsh session log: turns, tool calls, model calls,
token usage, and what those calls cost as their provider prices them.

ACP v1 carries no per-turn usage, so the session log (``$DSH_HOME/sessions/<id>.jsonl`` on
the node that ran the agent, written when the example mounts jsonl-persistence) is where
dsh keeps it. The runner reads it when a task ends (on the agent's node, so Ray runs are
covered) and records the numbers in the result line; ``dsh batch report`` reads it again
for result lines written before these numbers were recorded.

Cost is not computed here: each ``assistant/message`` event names the provider and model
of its call, and the provider's own ``cost(model, usage, at)`` (``ModelProvider.cost``, the
function acp-presentation's ``usage_update`` uses) prices it — with the example's
``[config.<provider>]`` overrides and the provider's time-of-day rules, at the call's time.
A task whose calls include one its provider does not price has no cost (shown "—"):
a partial sum would read as the whole.
"""

from __future__ import annotations

import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dsh_core.paths import data_home
from dsh_core.types import Usage

from .records import CostInfo

_SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")


class _Message(msgspec.Struct):
    provider: str = ""
    model: str = ""
    content: Any = None


class _LogLine(msgspec.Struct, rename="camel"):
    """The fields of a dsh session-log line these numbers need (the rest is ignored)."""

    type: str = ""
    time: float = 0.0
    usage: Usage | None = None
    message: _Message | None = None


_log_line = msgspec.json.Decoder(_LogLine)
_KEEP = (b'"assistant/message"', b'"turn/start"', b'"tool/call"', b'"user/message"')


@dataclass
class Call:
    """One model call: its route, usage and when it finished (epoch seconds)."""

    provider: str
    model: str
    usage: Usage
    time: float


@dataclass
class LogStats:
    turns: int = 0
    tool_calls: int = 0
    model_calls: int = 0
    usage: dict[str, int] | None = None  # summed over the calls that reported usage
    calls: list[Call] = field(default_factory=list)
    first_prompt: str | None = None


def log_path(session_id: str | None) -> Any:
    if not session_id or not _SAFE_ID.fullmatch(session_id):
        return None
    return data_home() / "sessions" / f"{session_id}.jsonl"


def read_log(session_id: str | None) -> LogStats | None:
    """The numbers of one session log of this node; None without a log."""
    path = log_path(session_id)
    if path is None:
        return None
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    stats = LogStats()
    total: dict[str, int] = {}
    for line in raw.splitlines():
        if not any(key in line for key in _KEEP):
            continue
        try:
            entry = _log_line.decode(line)
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue  # a torn last line
        if entry.type == "turn/start":
            stats.turns += 1
        elif entry.type == "tool/call":
            stats.tool_calls += 1
        elif entry.type == "user/message" and stats.first_prompt is None:
            stats.first_prompt = _text_of(entry.message.content if entry.message else None) or None
        elif entry.type == "assistant/message":
            stats.model_calls += 1
            if entry.usage is not None:
                for key, value in msgspec.to_builtins(entry.usage).items():
                    total[key] = total.get(key, 0) + value
                msg = entry.message or _Message()
                stats.calls.append(Call(msg.provider, msg.model, entry.usage, entry.time))
    stats.usage = total or None
    return stats


def _text_of(content: Any) -> str:
    """The text blocks of a logged message's content, joined."""
    blocks = content if isinstance(content, list) else []
    return "".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")


class Pricer:
    """Prices model calls with the providers an example registers (built once per example,
    without starting it: plugins loaded and configured, no lifespan, no session)."""

    def __init__(self) -> None:
        self._providers: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def providers(self, example: str) -> dict[str, Any]:
        with self._lock:
            if example not in self._providers:
                self._providers[example] = _load_providers(example)
            return self._providers[example]

    def price(self, example: str, calls: list[Call]) -> CostInfo | None:
        """The sum of ``calls`` in one currency; None when one is unpriced (or currencies differ)."""
        if not calls:
            return None
        providers = self.providers(example)
        amount, currency = 0.0, None
        for call in calls:
            provider = providers.get(call.provider)
            price = getattr(provider, "cost", None)
            if price is None:
                return None
            try:
                cost = price(call.model, call.usage, call.time)
            except Exception:  # a provider's bug costs its price, never the batch
                return None
            if cost is None or (currency is not None and cost.currency != currency):
                return None
            amount += cost.amount
            currency = cost.currency
        return CostInfo(amount=round(amount, 9), currency=currency or "")


def _load_providers(example: str) -> dict[str, Any]:
    from dsh_core.compose import load_composition
    from dsh_core.host import Host, load_plugins, make_plugin_manager
    from dsh_core.stdio import stdout_to_stderr

    try:  # a plugin's print while it loads must not reach stdout (`dsh batch --json` prints there)
        with stdout_to_stderr():
            composition = load_composition(example)
            pm = make_plugin_manager()
            load_plugins(pm, composition)
            return dict(Host(pm, composition).models)
    except Exception as exc:  # cannot load the example here: its calls stay unpriced
        print(f"dsh batch: cannot price the calls of example {example!r}: {exc}", file=sys.stderr)
        return {}
