"""A small helper for plugin authors: a tool from an async function."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .types import ToolOutput, ToolSpec

if TYPE_CHECKING:  # pragma: no cover
    from .agent import ToolContext


class FunctionTool:
    """``FunctionTool(name, description, parameters, fn)`` where ``fn(args, ctx)`` returns a
    ToolOutput or a str (a plain-text result)."""

    def __init__(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any],
        fn: Callable[[dict[str, Any], "ToolContext"], Awaitable[ToolOutput | str]],
    ) -> None:
        self.spec = ToolSpec(name=name, description=description, parameters=parameters)
        self._fn = fn

    async def run(self, args: dict[str, Any], ctx: "ToolContext") -> ToolOutput:
        out = await self._fn(args, ctx)
        return ToolOutput.text(out) if isinstance(out, str) else out
