"""``docs/tool-catalog.md``: every model-facing tool of every example in ``examples/``, generated
from the live schemas, never written by hand.

``python -m dsh_testing.catalog`` rewrites the file; ``python -m dsh_testing.catalog --check``
exits 1 when the committed file differs from what the tools say now (``tests/test_tool_catalog.py``
runs the same check). Each example is composed as ``dsh doctor`` composes it (its installed plugins
loaded, configured and registered, nothing started), keylessly: the schemas depend on no model.
Beside the host's tools (every session has them) it lists the session tools two kinds of agent
get from their plugins' ``dsh_session_tools`` sources: a session whose front door can ask its
person, and a continuable subagent. Tools a source discovers at run time (MCP servers') are not
listed. Each tool's guidance section (``dsh_register_guidance``) is shown with it.

The environment is fixed while the examples are composed, so the file does not depend on the
machine: no ``DSH_*`` or credential-shaped variable is seen except ``DSH_PERMISSION_MODE=
workspace-write``, and a placeholder search key makes ``web_search`` exist (it exists only where
a search provider is configured).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio

from dsh_core.compose import Composition, load_composition
from dsh_core.contracts import AgentSpec
from dsh_core.host import Host, installed_plugins, load_plugins, make_plugin_manager
from dsh_core.state import StateSlots
from dsh_core.types import Guidance

from .harness import REPO

CATALOG = REPO / "docs" / "tool-catalog.md"
COMMAND = "python -m dsh_testing.catalog"
ENV = {"DSH_PERMISSION_MODE": "workspace-write", "BRAVE_SEARCH_API_KEY": "catalog-placeholder"}
_HIDDEN = re.compile(r"^DSH_|KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
CONTINUABLE = "subagents.continuable"  # the AgentSpec.extra key the subagents plugin marks its continuable children with

HOST = "every session"
ASKING = "a session whose front door can ask its person"
CHILD = "a continuable subagent"


@dataclass
class Offer:
    """One tool as one example offers it."""

    example: str
    where: str  # HOST, ASKING or CHILD
    schema: dict[str, Any]  # name, description, parameters
    guidance: list[Guidance] = field(default_factory=list)


@contextlib.contextmanager
def fixed_environment() -> Iterator[None]:
    saved = dict(os.environ)
    try:
        for name in [n for n in os.environ if _HIDDEN.search(n)]:
            del os.environ[name]
        os.environ.update(ENV)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def examples() -> list[Path]:
    return sorted((REPO / "examples").glob("*/example.toml"))


class _NoQuestions:
    """A front door that can ask its person (``AgentSpec.questions``); never asked here."""

    async def ask(self, message: str, schema: dict[str, Any], *, call_id: str | None = None) -> tuple[str, dict[str, Any]]:
        return "cancel", {}  # pragma: no cover - the catalog runs no tool


class _Probe:
    """Stands in for a session while its sources publish their first set."""

    def __init__(self, spec: AgentSpec, host: Host) -> None:
        self.spec, self.host, self.cwd, self.session_id = spec, host, spec.cwd, spec.session_id
        self.children: list[Any] = []
        self.published: dict[str, list[Any]] = {}
        # no tools yet: a source that only acts for a session holding some tool (code-mode's warm
        # start, which publishes none) stays out of the catalog
        self.tools: dict[str, Any] = {}
        self._state = StateSlots()
        self.disposed = False

    def state(self, cls: type[Any], factory: Any = None) -> Any:
        return self._state.get(cls, factory)

    def publish_tools(self, source: str, tools: list[Any]) -> list[str]:
        self.published[source] = list(tools)
        return [t.spec.name for t in tools]


async def _session_tools(host: Host, spec: AgentSpec) -> list[Any]:
    """The tools the sources of an agent built from ``spec`` publish first."""
    probe = _Probe(spec, host)
    sources = [s for s in host.pm.hook.dsh_session_tools(session=probe, host=host) if s is not None]
    for source in sources:
        ready = anyio.Event()
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(source.serve, probe, ready.set)
                await ready.wait()
                tg.cancel_scope.cancel()
    return [tool for tools in probe.published.values() for tool in tools]


def _schema(tool: Any) -> dict[str, Any]:
    spec = tool.spec
    return {"name": spec.name, "description": spec.description, "parameters": spec.parameters}


async def offers(path: Path) -> list[Offer]:
    """Every tool the example at ``path`` offers (its installed plugins: one that is not installed
    is left out, as ``dsh doctor`` does), with where and the guidance that comes with it."""
    comp: Composition = load_composition(str(path))
    installed = set(installed_plugins())
    comp = replace(comp, plugins=tuple(p for p in comp.plugins if p in installed))
    pm = make_plugin_manager(trace=False)
    load_plugins(pm, comp)
    host = Host(pm, comp)
    cwd = tempfile.gettempdir()
    root = AgentSpec(cwd=cwd, provider="catalog", model="catalog", session_id="catalog-root", questions=_NoQuestions())
    parent = _Probe(root, host)
    child = AgentSpec(cwd=cwd, provider="catalog", model="catalog", session_id="catalog-child", parent=parent,  # type: ignore[arg-type]
                      origin="subagent:spawn", extra={CONTINUABLE: True})
    found = [(HOST, t) for t in host.tools.values()]
    for where, spec in ((ASKING, root), (CHILD, child)):
        known = {t.spec.name for _, t in found}
        found += [(where, t) for t in await _session_tools(host, spec) if t.spec.name not in known]
    out = []
    for where, tool in found:
        name = tool.spec.name
        out.append(Offer(comp.name, where, _schema(tool), [g for g in host.guidance if name in g.tools]))
    return out


async def collect() -> list[Offer]:
    with fixed_environment():
        return [offer for path in examples() for offer in await offers(path)]


# --------------------------------------------------------------------------- rendering


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def _limits(p: dict[str, Any]) -> str:
    parts = []
    for key, word in (("minimum", "min"), ("maximum", "max"), ("minItems", "min items"), ("maxItems", "max items"),
                      ("minLength", "min length"), ("maxLength", "max length"), ("default", "default")):
        if key in p:
            parts.append(f"{word} {json.dumps(p[key])}")
    return f" ({', '.join(parts)})" if parts else ""


def type_of(p: dict[str, Any]) -> str:
    """A JSON Schema property as one short line: ``string``, ``enum: "a", "b"``, ``array of
    object {content*: string, …}`` (``*``: required)."""
    if "enum" in p:
        return "enum: " + ", ".join(json.dumps(v) for v in p["enum"]) + _limits(p)
    for union in ("anyOf", "oneOf"):
        if union in p:
            return " or ".join(type_of(q) for q in p[union]) + _limits(p)
    kind = p.get("type")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind) + _limits(p)
    if kind == "array":
        return f"array of {type_of(p.get('items', {}))}" + _limits(p)
    if kind == "object" and p.get("properties"):
        required = set(p.get("required", ()))
        inner = ", ".join(f"{k}{'*' if k in required else ''}: {type_of(v)}" for k, v in p["properties"].items())
        return f"object {{{inner}}}" + _limits(p)
    return (kind or "any") + _limits(p)


def _arguments(parameters: dict[str, Any]) -> list[str]:
    props = parameters.get("properties") or {}
    if not props:
        return ["No arguments."]
    required = set(parameters.get("required", ()))
    rows = ["| argument | type | required | description |", "|---|---|---|---|"]
    for name, p in props.items():
        rows.append(f"| `{name}` | {_cell(type_of(p))} | {'yes' if name in required else 'no'} | "
                    f"{_cell(str(p.get('description', '')))} |")
    return rows


def _quote(text: str) -> list[str]:
    return ["> " + line if line else ">" for line in text.splitlines()]


def _where(offers: list[Offer], all_examples: list[str]) -> str:
    by_where: dict[str, list[str]] = {}
    for o in offers:
        by_where.setdefault(o.where, []).append(o.example)
    parts = []
    for where, names in by_where.items():
        shown = "every example" if names == all_examples else ", ".join(names)
        parts.append(shown if where == HOST else f"{shown} ({where} only)")
    return "; ".join(parts)


def render(found: list[Offer]) -> str:
    all_examples = sorted({o.example for o in found})
    lines = [
        "# Tool catalog",
        "",
        f"Generated by `{COMMAND}` from the live tool schemas of the examples in `examples/`: do not",
        "edit it by hand (a test fails when it is stale). For each tool: which examples offer it, its",
        "description and arguments exactly as the model gets them, and the system-prompt guidance",
        "section that comes with it (`dsh_register_guidance`). A tool whose schema differs between",
        "examples is listed once per variant. Tools an MCP server brings (`mcp__<server>__<tool>`)",
        "are not listed: they are discovered at run time. In code mode's `code` mode the model is",
        "offered only `run_code` and reaches the other tools from its programs.",
        "",
        "## Examples",
        "",
        "| example | tools |",
        "|---|---|",
    ]
    for example in all_examples:
        names = [f"`{o.schema['name']}`" + ("" if o.where == HOST else f" ({o.where} only)")
                 for o in found if o.example == example]
        lines.append(f"| {example} | {', '.join(names) or '(none)'} |")
    lines += ["", "## Tools", ""]
    by_name: dict[str, list[Offer]] = {}
    for o in found:
        by_name.setdefault(o.schema["name"], []).append(o)
    for name in sorted(by_name):
        lines += [f"### `{name}`", ""]
        variants: dict[str, list[Offer]] = {}
        for o in by_name[name]:
            key = json.dumps([o.schema, [(g.name, g.order, g.text) for g in o.guidance]], sort_keys=True)
            variants.setdefault(key, []).append(o)
        for n, group in enumerate(variants.values(), 1):
            first = group[0]
            if len(variants) > 1:
                lines += [f"#### Variant {n}", ""]
            lines += [f"Offered by: {_where(group, all_examples)}.", ""]
            lines += [*_quote(first.schema["description"]), ""]
            lines += [*_arguments(first.schema["parameters"]), ""]
            for g in first.guidance:
                lines += [f"Guidance `{g.name}` (order {g.order}):", "", *_quote(g.text), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def generate() -> str:
    return render(anyio.run(collect))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed catalog is stale")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = CATALOG.read_text(encoding="utf-8") if CATALOG.is_file() else ""
        if current != text:
            print(f"{CATALOG} is stale: regenerate it with `{COMMAND}` and review the diff", file=sys.stderr)
            return 1
        return 0
    CATALOG.write_text(text, encoding="utf-8")
    print(f"wrote {CATALOG}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
