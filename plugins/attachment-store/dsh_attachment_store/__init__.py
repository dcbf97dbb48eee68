"""dsh plugin ``attachment-store``: content-addressed (sha256), deduplicated image bytes.

Objects live under ``$DSH_HOME/attachments/`` (platformdirs' user data dir when
``DSH_HOME`` is unset). Durable events hold ``ImageBlock`` references, never bytes.
See README.md for the layout, limits and errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dsh_core import config_type_hook, hookimpl

from .images import (
    MIME_TYPES,
    Base64Error,
    ImageFormatError,
    decode_base64_strict,
    image_info,
    sniff,
)
from .store import PLUGIN, Limits, LocalAttachmentStore, StoreConfig, data_home

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


def store_for(config: StoreConfig) -> LocalAttachmentStore:
    root = Path(config.dir).expanduser().absolute() if config.dir else None
    return LocalAttachmentStore(root, config.limits())


dsh_config_type = config_type_hook(PLUGIN, StoreConfig)


@hookimpl
def dsh_attachment_store(host: Host) -> LocalAttachmentStore:
    return store_for(host.config_for(StoreConfig))
