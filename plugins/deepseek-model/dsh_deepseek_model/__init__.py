"""dsh plugin ``deepseek-model``: the ``deepseek`` model provider.

Hooks only decide; the provider object (``DeepSeekProvider``) does the I/O. Configuration
comes from ``[config.deepseek-model]`` (see README.md); the API key from
``DEEPSEEK_API_KEY`` (environment, else ``.env``) and is looked up per request, so a
missing key fails the request, not start-up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dsh_core import hookimpl
from dsh_core.config import PluginConfig

from ._catalogue import CATALOGUE, ModelCard
from ._config import PLUGIN, DeepSeekConfig, Settings, parse_settings, settings_from
from ._provider import PROVIDER, DeepSeekProvider

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Host, ModelProvider

__all__ = ["CATALOGUE", "PLUGIN", "PROVIDER", "DeepSeekProvider", "ModelCard", "Settings", "parse_settings"]

@dataclass
class HostSettings:
    """The validated settings of one host (its state slot), from dsh_configure to dsh_register_models."""

    settings: Settings = field(default_factory=Settings)


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    host.state(HostSettings).settings = settings_from(host.config_for(DeepSeekConfig))


@hookimpl
def dsh_config_type() -> tuple[str, type[PluginConfig]]:
    return PLUGIN, DeepSeekConfig


@hookimpl
def dsh_register_models(register: Callable[[ModelProvider], None], host: Host) -> None:
    register(DeepSeekProvider(host.state(HostSettings).settings, host=host))


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
