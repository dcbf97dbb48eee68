"""The plugin's configuration table (``[config.deepseek-model]``), credentials and endpoint."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsh_core import ConfigError
from dsh_core.types import RetryPolicy

PLUGIN = "deepseek-model"
DEFAULT_BASE_URL = "https://api.deepseek.com"
KEY_ENV = "DEEPSEEK_API_KEY"
BASE_URL_ENV = "DEEPSEEK_BASE_URL"
EFFORTS = ("off", "low", "high", "max")

_MODEL_KEYS = {
    "context-window": ("context_window", int),
    "max-output": ("max_output", int),
    "tools": ("tools", bool),
    "thinking": ("thinking", bool),
    "image-input": ("image_input", bool),
}
_RETRY_KEYS = {
    "max-retries": ("max_retries", int),
    "base-delay": ("base_delay", float),
    "max-delay": ("max_delay", float),
    "jitter": ("jitter", float),
}


@dataclass(frozen=True)
class Settings:
    base_url: str | None = None  # None: DEEPSEEK_BASE_URL, else the public endpoint
    reasoning_effort: str = "high"
    max_tokens: int = 256_000
    connect_timeout: float = 10.0
    first_event_timeout: float = 600.0
    idle_timeout: float = 300.0
    deadline: float = 1800.0
    dotenv: bool = True
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(max_retries=5, base_delay=0.5, max_delay=30.0, jitter=0.1))
    models: dict[str, dict[str, Any]] = field(default_factory=dict)

    def endpoint(self) -> str:
        url = os.environ.get(BASE_URL_ENV) or self.base_url or DEFAULT_BASE_URL
        return url.rstrip("/")


def _where(key: str) -> str:
    return f"[config.{PLUGIN}] {key}"


def _number(table: Mapping[str, Any], key: str, kind: type, *, minimum: float = 0.0, strict: bool = True) -> Any:
    value = table[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or value < minimum or (strict and value == minimum):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise ConfigError(f"{_where(key)} must be a {kind.__name__} {bound}, not {value!r}")
    return kind(value)


def parse_settings(table: Mapping[str, Any] | None) -> Settings:
    """Validate the plugin's table; every error names the key and the fix."""
    table = dict(table or {})
    known = {
        "base-url", "reasoning-effort", "max-tokens", "connect-timeout", "first-event-timeout",
        "idle-timeout", "deadline", "dotenv", "retry", "models",
    }
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{_where(unknown[0])}: unknown key; known keys: {', '.join(sorted(known))}")
    kw: dict[str, Any] = {}
    if "base-url" in table:
        kw["base_url"] = _base_url(table["base-url"])
    if "reasoning-effort" in table:
        kw["reasoning_effort"] = _effort(table["reasoning-effort"])
    if "max-tokens" in table:
        kw["max_tokens"] = _number(table, "max-tokens", int)
    for key in ("connect-timeout", "first-event-timeout", "idle-timeout", "deadline"):
        if key in table:
            kw[key.replace("-", "_")] = _number(table, key, float)
    if "dotenv" in table:
        if not isinstance(table["dotenv"], bool):
            raise ConfigError(f"{_where('dotenv')} must be true or false")
        kw["dotenv"] = table["dotenv"]
    if "retry" in table:
        kw["retry"] = _retry(table["retry"])
    if "models" in table:
        kw["models"] = _models(table["models"])
    return Settings(**kw)


def _base_url(url: Any) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"{_where('base-url')} must be an http(s) URL, not {url!r}")
    return url


def _effort(effort: Any) -> str:
    if effort is False:
        effort = "off"
    if effort not in EFFORTS:
        raise ConfigError(f"{_where('reasoning-effort')} must be one of {', '.join(EFFORTS)}, not {effort!r}")
    return str(effort)


def _retry(retry: Any) -> RetryPolicy:
    """The ``retry`` table over the default policy."""
    if not isinstance(retry, Mapping):
        raise ConfigError(f"{_where('retry')} must be a table with {', '.join(_RETRY_KEYS)}")
    fields: dict[str, Any] = {}
    for key in retry:
        if key not in _RETRY_KEYS:
            raise ConfigError(f"{_where('retry.' + key)}: unknown key; known: {', '.join(_RETRY_KEYS)}")
        name, kind = _RETRY_KEYS[key]
        fields[name] = _number(retry, key, kind, strict=False)
    policy = RetryPolicy(**{**_policy_dict(Settings().retry), **fields})
    if policy.jitter >= 1:
        raise ConfigError(f"{_where('retry.jitter')} must be below 1 (a fraction of the delay)")
    return policy


def _models(models: Any) -> dict[str, dict[str, Any]]:
    """The ``models`` table: model id → capability overrides."""
    if not isinstance(models, Mapping):
        raise ConfigError(f"{_where('models')} must be a table of model id → capability table")
    return {model: _capabilities(model, caps) for model, caps in models.items()}


def _capabilities(model: str, caps: Any) -> dict[str, Any]:
    if not isinstance(caps, Mapping):
        raise ConfigError(f"{_where('models.' + model)} must be a table")
    out: dict[str, Any] = {}
    for key, value in caps.items():
        if key not in _MODEL_KEYS:
            raise ConfigError(f"{_where(f'models.{model}.{key}')}: unknown key; known: {', '.join(_MODEL_KEYS)}")
        name, kind = _MODEL_KEYS[key]
        if kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{_where(f'models.{model}.{key}')} must be true or false")
            out[name] = value
        else:
            out[name] = _number(caps, key, int)
    return out


def _policy_dict(policy: RetryPolicy) -> dict[str, Any]:
    return {f: getattr(policy, f) for f in policy.__struct_fields__}


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
