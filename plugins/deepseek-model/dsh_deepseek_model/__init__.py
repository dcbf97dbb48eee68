"""dsh plugin ``deepseek-model``: the ``deepseek`` model provider.

Hooks only decide; the provider object (``DeepSeekProvider``) does the I/O. Configuration
comes from ``[config.deepseek-model]`` (see README.md); the API key from
``DEEPSEEK_API_KEY`` (environment, else ``.env``) and is looked up per request, so a
missing key fails the request, not start-up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from dsh_core import hookimpl

from ._catalogue import CATALOGUE, ModelCard
from ._config import PLUGIN, Settings, parse_settings
from ._provider import PROVIDER, DeepSeekProvider

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Host, ModelProvider

__all__ = ["CATALOGUE", "PLUGIN", "PROVIDER", "DeepSeekProvider", "ModelCard", "Settings", "parse_settings"]

# dsh_configure and dsh_register_models run back to back inside one Host's constructor;
# this carries the validated settings (and the host, for its attachment store) across.
_pending: dict[str, Any] = {}


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    _pending["settings"] = parse_settings(config.get(PLUGIN))
    _pending["host"] = host


@hookimpl
def dsh_register_models(register: Callable[[ModelProvider], None]) -> None:
    settings = _pending.pop("settings", None) or Settings()
    host = _pending.pop("host", None)
    register(DeepSeekProvider(settings, host=host))


@hookimpl
def dsh_lifespan(host: Host) -> Any:
    provider = host.models.get(PROVIDER)
    if not isinstance(provider, DeepSeekProvider):
        return None

    @asynccontextmanager
    async def pooled_client() -> AsyncIterator[None]:
        try:
            yield
        finally:
            await provider.aclose()

    return pooled_client()


@hookimpl
def dsh_register_doctor_checks(register: Callable[[Any], None], host: Host) -> None:
    from ._doctor import key_check

    register(key_check(host))
