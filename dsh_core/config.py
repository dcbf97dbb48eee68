"""Typed plugin configuration: a plugin declares its ``[config.<plugin>]`` table as one msgspec
Struct, the host decodes every table once when the composition loads, and the plugin reads the
typed object (``host.config_for(MyConfig)``) instead of validating a raw dict by hand.

    class TodoConfig(PluginConfig):
        \"\"\"[config.todo]\"\"\"

        remind_every: Annotated[int, Meta(ge=1, description="tool calls between reminders")] = 10

    dsh_config_type = config_type_hook("todo", TodoConfig)  # the usual @hookimpl, in one line

Field names are snake_case in Python and kebab-case in TOML (``remind-every``); unknown keys,
wrong types and out-of-range values are one ``ConfigError`` naming the example file, the plugin,
the key path, what was expected and what was found. ``dsh config --example NAME`` prints every
mounted plugin's JSON Schema with the effective values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import msgspec

from .errors import ConfigError, shown

T = TypeVar("T", bound="PluginConfig")
S = TypeVar("S")


class PluginConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    """Base of every plugin's config Struct: kebab-case keys, unknown keys refused."""


class AgentConfig(PluginConfig, kw_only=True):
    """``[config.agent]``: the spine's agent loop (declared by its builtin defaults)."""

    wake: Annotated[bool, msgspec.Meta(description=(
        "an idle agent starts a turn on its own when a plugin's notice asks for it (a background job or "
        "subagent settled, a child reported, a goal round): an autonomous turn. false: notices wait for "
        "the next prompt, so a controller sees exactly one answer per prompt"))] = True


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]+)`")


def _key_path(path: str) -> str:
    """msgspec's ``$.a.b[0]`` as ``a.b[0]``."""
    return path[1:] if path.startswith(".") else path


def _found(table: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    """The value at msgspec's error path in ``table`` (False when the path does not resolve)."""
    value: Any = table
    for part in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        key, index = part
        try:
            value = value[key] if key else value[int(index)]
        except (KeyError, IndexError, TypeError, ValueError):
            return False, None
    return True, value


def explain(exc: msgspec.ValidationError, table: Mapping[str, Any], cls: type | None = None, *,
            prefix: str = "") -> str:
    """``key: expected …, found …`` from msgspec's message and the raw table (keys under ``prefix``)."""
    message = str(exc)
    at = _AT.search(message)
    path = at.group("path") if at else ""
    head = message[: at.start()] if at else message
    unknown = _UNKNOWN.match(head)
    if unknown:
        where = ".".join(p for p in (prefix, _key_path(path)) if p)
        key = f"{where}.{unknown.group('key')}" if where else unknown.group("key")
        known = ""
        if cls is not None and not _key_path(path):
            names = [f.encode_name for f in msgspec.structs.fields(cls)]
            known = f" (known keys: {', '.join(names)})" if names else " (it takes no options)"
        return f"unknown key {key!r}{known}"
    expected = head[0].lower() + head[1:] if head else "a valid value"
    expected = re.sub(r", got `[^`]*`$", "", expected)
    key = ".".join(p for p in (prefix, _key_path(path)) if p)
    if not key:  # a check across keys (the Struct's __post_init__): its message says it all
        return expected
    if expected.startswith("invalid enum value"):  # msgspec names the value, not the choices
        allowed = _allowed(cls, _key_path(path)) if cls is not None else []
        return f"{key}: {expected}" + (f"; expected one of {', '.join(map(str, allowed))}" if allowed else "")
    has, value = _found(table, path)
    return f"{key}: {expected}" + (f", found {shown(value)}" if has else "")


def _allowed(cls: type, key: str) -> list[Any]:
    """The values a top-level key of ``cls`` accepts when it is an enumeration (from its schema)."""
    doc = msgspec.json.schema(cls)
    ref = doc.get("$ref", "")
    own = doc.get("$defs", {}).get(ref.rsplit("/", 1)[-1], doc)
    prop = own.get("properties", {}).get(key, {})
    out: list[Any] = []
    for option in [prop, *prop.get("anyOf", [])]:
        out += option.get("enum", [])
        if option.get("type") == "boolean":
            out.append("true/false")
    return out


def convert_at(prefix: str, cls: type[S], value: Any) -> S:
    """``value`` as ``cls`` inside a config Struct's ``__post_init__`` (a table under a key the
    user chose, e.g. ``models.<id>``, whose name msgspec's error path would hide): a ValueError
    whose message names the full key, which ``decode`` turns into the ConfigError."""
    try:
        return msgspec.convert(value, type=cls, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ValueError(explain(exc, value if isinstance(value, Mapping) else {}, cls, prefix=prefix)) from None


def decode(plugin: str, cls: type[T], table: Mapping[str, Any] | None, *, where: str) -> T:
    """``table`` as ``cls``, or one ``ConfigError`` naming ``where`` (the example file), the plugin
    and the key."""
    raw = dict(table or {})
    try:
        return msgspec.convert(raw, type=cls, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: [config.{plugin}] {explain(exc, raw, cls)}") from None


def schema(cls: type[PluginConfig]) -> dict[str, Any]:
    """The JSON Schema of one config Struct (the Struct itself, not a ``$ref`` to it)."""
    doc = msgspec.json.schema(cls)
    defs = doc.get("$defs", {})
    ref = doc.get("$ref", "")
    own = defs.get(ref.rsplit("/", 1)[-1], doc) if ref else doc
    rest = {k: v for k, v in defs.items() if v is not own}
    return {**own, **({"$defs": rest} if rest else {})}


def values(config: PluginConfig) -> dict[str, Any]:
    """The effective values, keyed as in TOML (kebab-case)."""
    out: dict[str, Any] = msgspec.to_builtins(config)
    return out
