"""A small helper for plugin authors: a tool from an async function."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .types import ToolOutput, ToolSpec

if TYPE_CHECKING:  # pragma: no cover
    from .contracts import ToolContext


class FunctionTool:
    """``FunctionTool(name, description, parameters, fn)`` where ``fn(args, ctx)`` returns a
    ToolOutput or a str (a plain-text result). ``parallel_safe=True`` lets calls overlap (reads);
    ``output_schema`` declares the shape of ``ToolOutput.structured`` (see ``ToolSpec``)."""

    def __init__(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any],
        fn: Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutput | str]],
        *,
        parallel_safe: bool = False,
        output_schema: dict[str, Any] | None = None,
    ) -> None:
        self.spec = ToolSpec(
            name=name,
            description=description,
            parameters=parameters,
            parallel_safe=parallel_safe,
            output_schema=output_schema,
        )
        self._fn = fn

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        out = await self._fn(args, ctx)
        return ToolOutput.text(out) if isinstance(out, str) else out
