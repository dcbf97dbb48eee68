"""The typed Python API of ``tools``, rendered from each tool's argument and output schemas.

For every tool: one ``async def`` on a ``Tools`` Protocol with keyword-only parameters typed
from the argument schema (required ones first, optional ones ``= ...``), its description and
parameter descriptions as the docstring, and a ``<Name>Result`` TypedDict from the tool's
declared output schema (``ToolSpec.output_schema``); a tool without one returns its text
(``str``). Deterministic: the same tools give the same text (the prompt prefix stays cached).
"""

from __future__ import annotations

import keyword
import textwrap
from typing import Any

HEADER = '''from typing import Any, Literal, NotRequired, Protocol, TypedDict


class ToolCallError(Exception):
    """Raised by `await tools.<name>(...)` when the call fails (bad arguments, denied, not found, ...)."""

    tool_name: str  # the tool that failed
    code: str | None  # its error code, e.g. "NOT_FOUND", "SANDBOX_DENIED"
    message: str  # what went wrong and what to do next (also str(error))
'''


def callable_name(name: str) -> bool:
    """Tools reachable as ``tools.<name>``: Python identifiers that are not keywords."""
    return name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.replace("-", "_").split("_") if part)


class _Renderer:
    def __init__(self) -> None:
        self.classes: list[str] = []

    def type_of(self, schema: Any, owner: str) -> str:
        if not isinstance(schema, dict) or not schema:
            return "Any"
        if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
            return "Literal[" + ", ".join(repr(v) for v in schema["enum"]) + "]"
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                return self._union([self.type_of(s, owner) for s in schema[key]])
        kind = schema.get("type")
        if isinstance(kind, list):
            return self._union([self.type_of({**schema, "type": k}, owner) for k in kind])
        if kind == "string":
            return "str"
        if kind == "integer":
            return "int"
        if kind == "number":
            return "float"
        if kind == "boolean":
            return "bool"
        if kind == "null":
            return "None"
        if kind == "array":
            return f"list[{self.type_of(schema.get('items'), owner + 'Item')}]"
        if kind == "object":
            props = schema.get("properties")
            if isinstance(props, dict) and props:
                return self.typed_dict(owner, schema)
            return "dict[str, Any]"
        return "Any"

    @staticmethod
    def _union(parts: list[str]) -> str:
        out: list[str] = []
        for p in parts:
            if p not in out:
                out.append(p)
        if "None" in out:  # None last, as people write it
            out.remove("None")
            out.append("None")
        return " | ".join(out) if out else "Any"

    def typed_dict(self, name: str, schema: dict[str, Any]) -> str:
        props: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        lines = [f"class {name}(TypedDict):"]
        for prop, sub in props.items():
            t = self.type_of(sub, name + _camel(prop))
            if prop not in required:
                t = f"NotRequired[{t}]"
            desc = sub.get("description") if isinstance(sub, dict) else None
            lines.append(f"    {prop}: {t}" + (f"  # {desc}" if desc else ""))
        self.classes.append("\n".join(lines))
        return name


def render(specs: list[Any]) -> str:
    """The API of ``tools`` for these tool specs, as Python source."""
    r = _Renderer()
    methods: list[str] = []
    for spec in specs:
        if not callable_name(spec.name):
            continue
        base = _camel(spec.name)
        params = spec.parameters if isinstance(spec.parameters, dict) else {}
        props: dict[str, Any] = params.get("properties", {}) or {}
        required = [p for p in params.get("required", []) if p in props]
        optional = [p for p in props if p not in required]
        args = [f"{p}: {r.type_of(props[p], base + _camel(p))}" for p in required if callable_name(p)]
        args += [f"{p}: {r.type_of(props[p], base + _camel(p))} = ..." for p in optional if callable_name(p)]
        schema = getattr(spec, "output_schema", None)
        returns = r.type_of(schema, base + "Result") if schema else "str"
        doc = [spec.description.strip()]
        described = [(p, props[p].get("description")) for p in required + optional
                     if isinstance(props[p], dict) and props[p].get("description")]
        if described:
            doc.append("")
            doc += [f"{p}: {d}" for p, d in described]
        if not schema:
            doc += ["", "Returns the tool's text result."]
        sig = ", ".join(["self", "*", *args]) if args else "self"
        body = textwrap.indent('"""' + "\n".join(doc).replace('"""', "'''") + '\n"""', "        ")
        methods.append(f"    async def {spec.name}({sig}) -> {returns}:\n{body}")
    tools = "class Tools(Protocol):\n" + ("\n\n".join(methods) if methods else "    pass")
    return "\n\n\n".join([HEADER.rstrip("\n"), *r.classes, tools]) + "\n"
