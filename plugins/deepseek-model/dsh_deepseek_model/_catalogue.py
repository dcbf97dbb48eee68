"""The DeepSeek model catalogue (as DeepSeek documented its models, Oct–Nov 2026).

Capabilities are declared truthfully: only the flash routes that DeepSeek documents as
vision-capable say ``image_input``. Unlisted ids pass through as text-only routes (with a
warning on stderr); the retired ``deepseek-chat``/``deepseek-reasoner`` aliases are refused
with the replacement named.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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

RETIRED: dict[str, str] = {
    "deepseek-chat": "it was retired on 2026-07-24; use deepseek-flash with reasoning-effort = \"off\"",
    "deepseek-reasoner": "it was retired on 2026-07-24; use deepseek-flash (thinking is on by default)",
}


def unlisted(model: str) -> ModelCard:
    """An id the catalogue does not know: passed through, text-only, thinking assumed (the V4 default)."""
    return ModelCard(model, "unknown (passed through)", image_input=False)
