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
    and 70-100 ms of import to every start (measured here); deeper shapes stay the tool's to check.

    The schema is read once per ``parameters`` object (``_Schema``: a tool's spec is built once,
    and a changed one is a new dict): a call's check is then a few C calls, where reading the
    schema again on every call was ~26 Python calls (bench/profile_prompt.py --bash)."""
    schema = _SCHEMAS.get(id(parameters))
    if schema is None or schema.parameters is not parameters:
        schema = _Schema.of(parameters)
    keys = args.keys()
    problems = [] if keys >= schema.required_set else [
        f"missing required argument {key!r}" for key in schema.required if key not in args]
    if schema.names is not None and not keys <= schema.names:
        unknown = [key for key in args if key not in schema.names]
        problems.append(f"unknown argument{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(repr(k) for k in unknown)} (it takes: {schema.takes})")
    kinds = schema.kinds
    for key, value in args.items():
        declared = kinds.get(key)
        if declared is not None and (not isinstance(value, declared[0]) or (value.__class__ is bool and declared[1])):
            problems.append(f"argument {key!r} must be {declared[2]}, not {type(value).__name__}")
    return problems


class _Schema:
    """A tool's input schema as ``argument_problems`` checks it: the required keys, the declared
    names (None: any name), and per property with a known JSON type: the Python types it takes,
    whether a bool is refused though it is an int, and the type's words for the message."""

    __slots__ = ("kinds", "names", "parameters", "required", "required_set", "takes")

    def __init__(self, parameters: dict[str, Any]) -> None:
        self.parameters = parameters  # held: its id keys _SCHEMAS, so it is not reused meanwhile
        self.required = tuple(parameters.get("required", ()))
        self.required_set = frozenset(self.required)
        properties = parameters.get("properties") or {}
        extra = parameters.get("additionalProperties", False)
        closed = isinstance(parameters.get("properties"), dict) and (extra is False or extra is None)
        self.names = frozenset(properties) if closed else None
        self.takes = ", ".join(properties) or "no arguments"
        self.kinds: dict[str, tuple[tuple[type, ...], bool, str]] = {}
        for key, prop in properties.items():
            declared = prop.get("type") if isinstance(prop, dict) else None
            names = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else []
            kinds = tuple(t for n in names for t in _JSON_TYPES.get(n, ()))
            if kinds:
                self.kinds[key] = (kinds, bool not in kinds, " or ".join(names))

    @classmethod
    def of(cls, parameters: dict[str, Any]) -> _Schema:
        if len(_SCHEMAS) >= _MAX_SCHEMAS:  # tools made per session (MCP, rosters): never an unbounded table
            _SCHEMAS.clear()
        schema = _SCHEMAS[id(parameters)] = cls(parameters)
        return schema


_MAX_SCHEMAS = 1024
_SCHEMAS: dict[int, _Schema] = {}  # id(parameters) -> its _Schema


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
