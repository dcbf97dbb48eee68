"""dsh plugin ``attachment-store``: content-addressed (sha256), deduplicated image bytes.

Objects live under ``$DSH_HOME/attachments/`` (platformdirs' user data dir when
``DSH_HOME`` is unset). Durable events hold ``ImageBlock`` references, never bytes.
See README.md for the layout, limits and errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsh_core import hookimpl
from dsh_core.errors import ConfigError

from .images import (
    MIME_TYPES,
    Base64Error,
    ImageFormatError,
    decode_base64_strict,
    image_info,
    sniff,
)
from .store import PLUGIN, Limits, LocalAttachmentStore, data_home

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Host

__all__ = [
    "MIME_TYPES",
    "Base64Error",
    "ImageFormatError",
    "Limits",
    "LocalAttachmentStore",
    "data_home",
    "decode_base64_strict",
    "image_info",
    "sniff",
]


def _table(config: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    table = config.get(PLUGIN) or {}
    if not isinstance(table, Mapping):
        raise ConfigError(f"[config.{PLUGIN}] must be a table")
    return table


def store_from_config(table: Mapping[str, Any]) -> LocalAttachmentStore:
    limits = Limits.from_config(table)
    root = table.get("dir")
    if root is not None and not isinstance(root, str):
        raise ConfigError(f"[config.{PLUGIN}] dir must be a path string, not {root!r}")
    return LocalAttachmentStore(Path(root).expanduser().absolute() if root else None, limits)


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    store_from_config(_table(config))  # validate early: a bad table fails start-up, naming the key


@hookimpl
def dsh_attachment_store(host: Host) -> LocalAttachmentStore:
    return store_from_config(_table(host.config))
