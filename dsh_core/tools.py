"""A small helper for plugin authors: a tool from an async function."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .types import ToolOutput, ToolSpec

if TYPE_CHECKING:  # pragma: no cover
    from .contracts import ToolContext


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}  # fmt: skip


def argument_problems(parameters: dict[str, Any], args: dict[str, Any]) -> list[str]:
    """What is wrong with ``args`` against a tool's input schema, checked before the tool runs:
    every ``required`` key present, no key the schema does not declare, and each top-level
    property of a declared JSON type.

    An undeclared key is refused (naming it and the ones the tool takes) when the schema lists
    ``properties`` and does not open itself with ``additionalProperties`` (``true`` or a schema):
    a misspelt or another harness's argument name would otherwise be dropped in silence and the
    call run without it. A schema without ``properties`` says nothing about names and is not checked.

    A subset of JSON Schema on purpose: the two mistakes models make (a missing argument, a
    number sent as a string) in ~3 µs a call, where a full validator (jsonschema) would add a dependency
    and 70-100 ms of import to every start (measured here); deeper shapes stay the tool's to check."""
    problems = [f"missing required argument {key!r}" for key in parameters.get("required", ()) if key not in args]
    properties = parameters.get("properties") or {}
    extra = parameters.get("additionalProperties", False)
    if isinstance(parameters.get("properties"), dict) and (extra is False or extra is None):
        unknown = [key for key in args if key not in properties]
        if unknown:
            takes = ", ".join(properties) or "no arguments"
            problems.append(f"unknown argument{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(repr(k) for k in unknown)} (it takes: {takes})")
    for key, value in args.items():
        declared = properties.get(key, {}).get("type") if isinstance(properties.get(key), dict) else None
        names = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else []
        kinds = tuple(t for n in names for t in _JSON_TYPES.get(n, ()))
        if not kinds:
            continue
        wrong = not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
        if wrong:
            problems.append(f"argument {key!r} must be {' or '.join(names)}, not {type(value).__name__}")
    return problems


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
        kind: str | None = None,
    ) -> None:
        self.spec = ToolSpec(name=name, description=description, parameters=parameters,
                             parallel_safe=parallel_safe, output_schema=output_schema, kind=kind)
        self._fn = fn

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        out = await self._fn(args, ctx)
        return ToolOutput.text(out) if isinstance(out, str) else out
