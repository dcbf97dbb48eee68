"""dsh plugin ``jsonl-persistence``: durable session logs as one append-only JSONL file per session.

Files live at ``$DSH_HOME/sessions/<session-id>.jsonl`` (platformdirs' user data dir when
``DSH_HOME`` is unset). See README.md for the format.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig

from .store import (
    JsonlLog,
    JsonlStore,
    SessionContents,
    SessionRead,
    TornTail,
    data_home,
    parse_log,
    sessions_dir,
)

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import CommandRegistry, Host

__all__ = [
    "JsonlLog",
    "JsonlStore",
    "SessionContents",
    "SessionRead",
    "TornTail",
    "data_home",
    "parse_log",
    "sessions_dir",
]


class JsonlPersistenceConfig(PluginConfig):
    """``[config.jsonl-persistence]``: no options (the logs live under ``$DSH_HOME/sessions``)."""


dsh_config_type = config_type_hook("jsonl-persistence", JsonlPersistenceConfig)


@hookimpl
def dsh_session_store(host: Host) -> JsonlStore:
    return JsonlStore()


@asynccontextmanager
async def _flush_at_exit(host: Host) -> AsyncIterator[None]:
    try:
        yield
    finally:
        store = host.session_store
        if isinstance(store, JsonlStore):
            await store.flush()  # agents are disposed (logs closed) before lifespans end


@hookimpl
def dsh_lifespan(host: Host) -> Any:
    return _flush_at_exit(host)


@hookimpl
def dsh_register_commands(commands: CommandRegistry) -> None:
    from . import cli

    commands.add(
        "sessions",
        help="list and show recorded session logs (jsonl-persistence)",
        description="Read the JSONL session logs under $DSH_HOME/sessions/.",
        setup=cli.setup,
        run=cli.run,
    )
