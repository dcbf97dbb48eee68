"""The DeepSeek model catalogue (as DeepSeek documented its models, Oct–Nov 2026).

Capabilities are declared truthfully: only the flash routes that DeepSeek documents as
vision-capable say ``image_input``. Unlisted ids pass through as text-only routes (with a
warning on stderr); the retired ``deepseek-chat``/``deepseek-reasoner`` aliases are refused
with the replacement named.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

CONTEXT_WINDOW = 1_048_576
MAX_OUTPUT = 393_216


@dataclass(frozen=True)
class ModelCard:
    id: str
    served_by: str
    context_window: int = CONTEXT_WINDOW
    max_output: int = MAX_OUTPUT
    tools: bool = True
    thinking: bool = True
    image_input: bool = False

    def with_overrides(self, overrides: dict[str, object]) -> ModelCard:
        return replace(self, **overrides)  # type: ignore[arg-type]

    def declared(self) -> dict[str, Any]:
        """What the card says the route can do, as ``ModelInfo`` fields: all of it but its id and who serves it."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("id", "served_by")}


CATALOGUE: dict[str, ModelCard] = {
    card.id: card
    for card in (
        ModelCard("deepseek-flash", "DeepSeek-V4.1-Flash", image_input=True),
        ModelCard("deepseek-v4-pro", "DeepSeek-V4-Pro"),
        # Legacy ids, still accepted and served by V4.1-Flash at Flash price.
        ModelCard("deepseek-v4-flash", "DeepSeek-V4.1-Flash (legacy id deepseek-v4-flash)"),
        ModelCard(
            "deepseek-v4-flash-vision-exp",
            "DeepSeek-V4.1-Flash (legacy id deepseek-v4-flash-vision-exp)",
            image_input=True,
        ),
    )
}

# The route a model picker offers (the legacy ids stay accepted, not offered).
OFFERED = ("deepseek-flash", "deepseek-v4-pro")
EFFORTS = ("off", "low", "high", "max")  # DeepSeek's thinking switched off, or its reasoning effort


class Price(NamedTuple):
    """USD per million tokens, off-peak, as DeepSeek's pricing page gave them (2026-11):
    input served from the prefix cache (hit), input not cached (miss), output (reasoning
    included). Peak hours cost ``PEAK_FACTOR`` times as much."""

    hit: float
    miss: float
    output: float
    currency: str = "USD"


PRICES: dict[str, Price] = {
    "deepseek-flash": Price(0.003, 0.15, 0.60),
    "deepseek-v4-flash": Price(0.003, 0.15, 0.60),
    "deepseek-v4-flash-vision-exp": Price(0.003, 0.15, 0.60),
    "deepseek-v4-pro": Price(0.022, 0.66, 1.98),
}
PEAK_FACTOR = 2.0
PEAK_HOURS_UTC = ((1, 4), (6, 10))  # Monday to Friday, [start, end) hours


def peak(at: float) -> bool:
    """Whether epoch time ``at`` falls in DeepSeek's peak pricing hours (UTC, weekdays)."""
    import time

    t = time.gmtime(at)
    return t.tm_wday < 5 and any(a <= t.tm_hour < b for a, b in PEAK_HOURS_UTC)


RETIRED: dict[str, str] = {
    "deepseek-chat": "it was retired on 2026-07-24; use deepseek-flash with reasoning-effort = \"off\"",
    "deepseek-reasoner": "it was retired on 2026-07-24; use deepseek-flash (thinking is on by default)",
}


def unlisted(model: str) -> ModelCard:
    """An id the catalogue does not know: passed through, text-only, thinking assumed (the V4 default)."""
    return ModelCard(model, "unknown (passed through)", image_input=False)
