"""What a model call cost: the provider's own price table (``ModelProvider.cost``), the same
call the ACP door makes for its running total (acp-presentation). The installed plugins that
register model providers are composed once into a host (no task group, nothing runs), so each
call is priced by the provider that served it, at the time it was made (peak hours count)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from dsh_core.types import Cost, Usage


class Prices:
    def __init__(self, providers: dict[str, Any]) -> None:
        self.providers = providers

    @classmethod
    def installed(cls) -> Prices:
        from dsh_core.compose import Composition
        from dsh_core.host import Host, installed_plugins, load_plugins, make_plugin_manager
        from dsh_core.stdio import stdout_to_stderr

        names = []
        with stdout_to_stderr():  # an import-time print must not reach a page written to stdout
            for name, ep in installed_plugins().items():
                try:
                    module = ep.load()
                except Exception:
                    continue
                if hasattr(module, "dsh_register_models"):
                    names.append(name)
            try:
                comp = Composition(name="sessions-export", path=Path.cwd() / "example.toml", plugins=tuple(names))
                pm = make_plugin_manager()
                load_plugins(pm, comp)
                return cls(dict(Host(pm, comp).models))
            except Exception as exc:
                print(f"dsh: sessions export: no prices ({exc}); costs are left out", file=sys.stderr)
                return cls({})

    def cost(self, provider: str, model: str, usage: Usage | None, at: float) -> Cost | None:
        if usage is None:
            return None
        price = getattr(self.providers.get(provider), "cost", None)
        if price is None:
            return None
        try:
            result = price(model, usage, at)
        except Exception:
            return None
        return result if isinstance(result, Cost) else None
