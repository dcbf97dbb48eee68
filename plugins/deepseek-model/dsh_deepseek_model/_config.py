"""The plugin's configuration table (``[config.deepseek-model]``), credentials and endpoint."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from dsh_core.config import PluginConfig, convert_at, decode
from dsh_core.types import RetryPolicy

from ._catalogue import Price

PLUGIN = "deepseek-model"
DEFAULT_BASE_URL = "https://api.deepseek.com"
KEY_ENV = "DEEPSEEK_API_KEY"
BASE_URL_ENV = "DEEPSEEK_BASE_URL"

Seconds = Annotated[float, Meta(gt=0)]


class RetryConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    """``retry`` of [config.deepseek-model]: the provider's retry policy, run by the agent loop."""

    max_retries: Annotated[int, Meta(ge=0)] = 5
    base_delay: Annotated[float, Meta(ge=0)] = 0.5
    max_delay: Annotated[float, Meta(ge=0)] = 30.0
    jitter: Annotated[float, Meta(ge=0, lt=1, description="a fraction of the delay")] = 0.1


class ModelCaps(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    """``models.<id>`` of [config.deepseek-model]: capability overrides of one model id."""

    context_window: Annotated[int, Meta(gt=0)] | None = None
    max_output: Annotated[int, Meta(gt=0)] | None = None
    tools: bool | None = None
    thinking: bool | None = None
    image_input: bool | None = None


class PriceConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    """``prices.<id>`` of [config.deepseek-model]: per million tokens, off-peak (peak hours double it)."""

    hit: Annotated[float, Meta(ge=0)]
    miss: Annotated[float, Meta(ge=0)]
    output: Annotated[float, Meta(ge=0)]
    currency: Annotated[str, Meta(pattern="^[A-Z]{3}$")] = "USD"


class DeepSeekConfig(PluginConfig):
    """[config.deepseek-model]"""

    base_url: Annotated[str, Meta(pattern="^https?://", description="the endpoint (DEEPSEEK_BASE_URL wins)")] | None = None
    reasoning_effort: Annotated[Literal["off", "low", "high", "max"] | bool, Meta(
        description="off (or false) sends thinking disabled and no effort")] = "high"
    max_tokens: Annotated[int, Meta(gt=0, description="max_tokens per call, clamped to the model's max output")] = 256_000
    connect_timeout: Annotated[Seconds, Meta(description="seconds to connect")] = 10.0
    first_event_timeout: Annotated[Seconds, Meta(description="seconds from sending to the first data event")] = 600.0
    idle_timeout: Annotated[Seconds, Meta(description="seconds between data events")] = 300.0
    deadline: Annotated[Seconds, Meta(description="overall seconds for one call")] = 1800.0
    dotenv: Annotated[bool, Meta(description="also look for the key in .env files")] = True
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    models: Annotated[dict[str, dict[str, Any]], Meta(
        description="model id -> context-window, max-output, tools, thinking, image-input")] = (
        msgspec.field(default_factory=dict))
    prices: Annotated[dict[str, PriceConfig], Meta(
        description="model id -> hit, miss, output (per million tokens, off-peak) and currency, for usage_update's cost")] = (
        msgspec.field(default_factory=dict))

    def __post_init__(self) -> None:
        if self.reasoning_effort is True:
            raise ValueError("reasoning-effort: expected one of off, low, high, max (or false), found True")
        for model, caps in self.models.items():
            convert_at(f"models.{model}", ModelCaps, caps)  # the key is named in full when it is bad

    # The provider runs on this validated table itself; these give its values in the form it uses them.

    @property
    def effort(self) -> str:
        """The default reasoning effort as sent (``false`` is ``off``)."""
        return "off" if self.reasoning_effort is False else str(self.reasoning_effort)

    def endpoint(self) -> str:
        url = os.environ.get(BASE_URL_ENV) or self.base_url or DEFAULT_BASE_URL
        return url.rstrip("/")

    def retry_policy(self) -> RetryPolicy:
        r = self.retry
        return RetryPolicy(max_retries=r.max_retries, base_delay=r.base_delay, max_delay=r.max_delay, jitter=r.jitter)

    def model_overrides(self) -> dict[str, dict[str, Any]]:
        """``models`` as capability overrides by model id: snake_case names, only the keys set."""
        return {
            model: {name: value for name, value in msgspec.structs.asdict(convert_at(f"models.{model}", ModelCaps, caps)).items()
                    if value is not None}
            for model, caps in self.models.items()
        }

    def price_table(self) -> dict[str, Price]:
        """``prices`` by model id (over the catalogue's)."""
        return {m: Price(p.hit, p.miss, p.output, p.currency) for m, p in self.prices.items()}


Settings = DeepSeekConfig  # what the provider takes: the validated table


def parse_settings(table: Mapping[str, Any] | None) -> DeepSeekConfig:
    """Validate the plugin's table; every error names the key (``dsh_core.config``)."""
    return decode(PLUGIN, DeepSeekConfig, table, where="example")


# --------------------------------------------------------------------------- credentials


def _read_dotenv(path: Path, name: str) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        if not sep or key.strip() != name:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        return value or None
    return None


def repo_root() -> Path:
    import dsh_core

    return Path(dsh_core.__file__).resolve().parent.parent


def find_api_key(*, dotenv: bool = True, cwd: Path | None = None) -> str | None:
    """``DEEPSEEK_API_KEY`` from the environment, else a ``.env`` in the cwd, else in the repo root."""
    key = os.environ.get(KEY_ENV, "").strip()
    if key:
        return key
    if not dotenv:
        return None
    seen: set[Path] = set()
    for directory in (cwd or Path.cwd(), repo_root()):
        path = (directory / ".env").resolve()
        if path in seen:
            continue
        seen.add(path)
        value = _read_dotenv(path, KEY_ENV)
        if value:
            return value.strip()
    return None
