"""What every sandbox tool shares: the base class that builds its ``ToolSpec``, the JSON-schema
pieces, and argument checking."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, ClassVar, Literal, overload

from dsh_core import ToolError
from dsh_core.types import ToolOutput, ToolSpec

from .policy import Settings
from .sandbox import Sandbox

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext


def schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An argument schema: exactly these properties, ``required`` among them."""
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def out_schema(props: dict[str, Any]) -> dict[str, Any]:
    """An output schema: every listed property is always present."""
    return {"type": "object", "properties": props, "required": list(props)}


INT = {"type": "integer"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
OPT_INT = {"type": ["integer", "null"]}
OPT_STR = {"type": ["string", "null"]}


class SandboxTool:
    """A tool over one host's ``Sandbox``.

    A subclass says what the model sees (``name``, ``description`` or ``describe``,
    ``properties`` or ``arguments``, ``required``) and what programs get back
    (``output_schema``: the structured result code mode sees; the model's text result is
    separate) and what a call does (``kind``: the ACP ToolKind a person asked about the call
    reads). The constructor builds the ``ToolSpec`` from these the same way for every tool;
    with ``escalates`` the one-shot escalation arguments (``sandbox_permissions``,
    ``justification``) follow the tool's own, when the tier has a wider one to offer.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    properties: ClassVar[dict[str, Any]] = {}
    required: ClassVar[tuple[str, ...]] = ()
    output_schema: ClassVar[dict[str, Any]]
    parallel_safe: ClassVar[bool] = False
    escalates: ClassVar[bool] = False
    kind: ClassVar[str | None] = None  # ACP ToolKind words: what a person asked about a call reads

    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        props = self.arguments(sb.settings)
        if self.escalates:
            props = {**props, **sb.escalation_params()}
        self.spec = ToolSpec(
            name=self.name,
            description=self.describe(sb.settings),
            parameters=schema(props, list(self.required)),
            output_schema=self.output_schema,
            parallel_safe=self.parallel_safe,
            kind=self.kind,
        )

    def describe(self, settings: Settings) -> str:
        """The description the model reads (override when it depends on the settings)."""
        return self.description

    def arguments(self, settings: Settings) -> dict[str, Any]:
        """The argument properties (override when they depend on the settings)."""
        return dict(self.properties)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raise NotImplementedError


@overload
def str_arg(args: dict[str, Any], key: str, *, required: Literal[True] = True, allow_empty: bool = False) -> str: ...


@overload
def str_arg(args: dict[str, Any], key: str, *, required: bool, allow_empty: bool = False) -> str | None: ...


def str_arg(args: dict[str, Any], key: str, *, required: bool = True, allow_empty: bool = False) -> str | None:
    """A string argument: a required one (the default) is a ``str`` or a ``ToolError``, so callers
    need no ``None`` check; ``required=False`` lets it be absent (``None``)."""
    v = args.get(key)
    if v is None:
        if required:
            raise ToolError(f"missing required argument {key!r}", code="INVALID_ARGUMENTS")
        return None
    if not isinstance(v, str) or (not allow_empty and not v):
        raise ToolError(f"argument {key!r} must be a non-empty string", code="INVALID_ARGUMENTS")
    return v


def positive_ms(args: dict[str, Any], key: str, default: int) -> int:
    """A JSON ``number`` of milliseconds, > 0 (a fraction is rounded up to a whole ms)."""
    v = args.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ToolError(f"invalid {key}: expected a positive number, got {v!r}", code="INVALID_ARGUMENTS")
    return math.ceil(v)


def whole_number(args: dict[str, Any], key: str, default: int, *, minimum: int = 1) -> int:
    """A JSON ``number`` that must be a whole number ≥ ``minimum`` (``5`` or ``5.0``)."""
    v = args.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer() or v < minimum:
        raise ToolError(f"{key} must be a {'positive' if minimum == 1 else f'≥ {minimum}'} integer",
                        code="INVALID_ARGUMENTS")
    return int(v)


def display(path: str, cwd: str) -> str:
    """``path`` relative to ``cwd`` when inside it, else as given."""
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
