"""``dsh doctor``'s DeepSeek line: is an API key there (never what it is), and where requests go."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ._config import BASE_URL_ENV, KEY_ENV, DeepSeekConfig, find_api_key
from ._provider import PROVIDER

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.doctor import Finding


class KeyCheck:
    name = "deepseek key"

    def __init__(self, settings: DeepSeekConfig, route_provider: str | None, route_model: str | None) -> None:
        self.settings = settings
        self.route = (route_provider, route_model)

    async def run(self) -> Finding:
        from dsh_core.doctor import Finding

        endpoint = self.settings.endpoint()
        via = f" (base URL from {BASE_URL_ENV})" if os.environ.get(BASE_URL_ENV) else ""
        if os.environ.get(KEY_ENV, "").strip():
            return Finding(self.name, "ok", f"{KEY_ENV} is set; requests go to {endpoint}{via}")
        stored = _stored_where()
        if stored:
            return Finding(self.name, "ok", f"a key stored by `dsh auth login` is in {stored}; requests go to "
                                            f"{endpoint}{via}")
        if self.settings.dotenv and find_api_key(dotenv=True):
            return Finding(self.name, "ok", f"{KEY_ENV} found in a .env file; requests go to {endpoint}{via}")
        provider, model = self.route
        if provider != PROVIDER:
            return Finding(self.name, "ok", f"{KEY_ENV} is not set (not needed: the route is {provider} / {model})")
        return Finding(
            self.name, "warn",
            f"{KEY_ENV} is not set: the example serves, but every prompt on its route {provider} / {model} fails",
            f"dsh auth login (or export {KEY_ENV}=…; keyless demo: dsh ask --provider scripted --model demo.json ping)",
        )


def key_check(host: Any) -> KeyCheck:
    provider = host.models.get(PROVIDER)
    settings = getattr(provider, "settings", None) or DeepSeekConfig()
    return KeyCheck(settings, host.default_provider, host.default_model)


def _stored_where() -> str:
    """Where ``dsh auth login`` stored a key ("" when it did not): never the key itself."""
    from ._login import stored_key

    key, where = stored_key()
    return where if key else ""
