"""The architecture of the spine, checked from the source and from live objects.

1. Front doors, tools and policies program against the contract: no module outside
   ``dsh_core`` (the plugins with their tests, the test plugins, the examples, the benches)
   imports the concrete agent loop ``dsh_core.agent`` (nor its class by the package's name,
   ``from dsh_core import Agent``).
2. The concrete classes satisfy the Protocols plugins hold: ``dsh_core.agent.Agent`` is a
   ``protocols.Agent`` and ``dsh_core.host.Host`` a ``protocols.Host`` — every member exists,
   with the same kind (property or attribute, method, async method) and a signature that
   accepts every call the Protocol allows; and ``isinstance`` holds on live instances.
3. No import circle inside ``dsh_core``: the spine reads bottom-up — ``types``/``errors``,
   ``protocols`` (and ``contracts``, which re-exports from it), ``hookspecs``, then the agent
   loop and the host, then the CLI.

What counts as an import (1 and 3): every ``import``/``from … import`` statement anywhere in a
module, read with ``ast`` — at top level, inside functions (a lazy import that dodges a circle
at run time *is* that circle: the two modules still need each other), and under
``if TYPE_CHECKING:``, which counts too: a type-only import is still a dependency of the
importing module on the imported one (a contract module may not know the concrete loop even
by name, and the type checker has to load it). Not counted: the implicit import of a
package's ``__init__`` that Python performs before any of its submodules (otherwise every
module would depend on ``dsh_core/__init__.py``, the facade that imports the top);
``from . import x`` with ``x`` a submodule is an import of ``x`` alone. A package's
``__init__`` is a module like the others, with its own explicit imports.
"""

from __future__ import annotations

import ast
import inspect
import tomllib
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from dsh_core import protocols
from dsh_core.agent import Agent as ConcreteAgent
from dsh_core.contracts import AgentSpec
from dsh_core.host import Host as ConcreteHost
from dsh_testing import memory_host

REPO = Path(__file__).resolve().parent.parent
SPINE = REPO / "dsh_core"
IGNORED_DIRS = {".venv", ".tox", "build", "dist", "__pycache__", ".git"}


def _python_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        if not IGNORED_DIRS.intersection(path.relative_to(root).parts):
            yield path


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    """``(dotted name, is a package __init__)`` of a file under ``root`` (the import root)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, str | None]]:
    """Every import in ``tree`` as ``(absolute module, imported name or None)``, wherever it is."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                yield target, alias.name


# --------------------------------------------------------------------------- 1. nobody outside imports the loop


def _outside_files() -> list[Path]:
    roots = [REPO / "plugins", REPO / "examples", REPO / "bench", REPO / "tests" / "testkit"]
    return [f for root in roots if root.is_dir() for f in _python_files(root)]


def _imports_the_loop(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for target, name in _imports(tree, "_outside_", False):  # modules outside use absolute imports of dsh_core
        if target == "dsh_core.agent" or target.startswith("dsh_core.agent."):
            found.append(f"from {target} import {name}" if name else f"import {target}")
        elif target == "dsh_core" and name in ("agent", "Agent"):
            found.append(f"from dsh_core import {name}")
    return found


def test_the_scan_sees_the_plugins_and_would_catch_an_import_of_the_loop(tmp_path):
    files = _outside_files()
    assert any(f.parts[-3:] == ("acp-transport", "dsh_acp_transport", "bridge.py") for f in files)
    assert any(f.parts[-2:] == ("dsh_sandbox_tools", "tools.py") for f in files)
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from dsh_core.agent import Agent\n"
        "def f():\n    import dsh_core.agent\n    from dsh_core import Agent\n"
    )
    assert len(_imports_the_loop(bad)) == 3


def test_no_module_outside_the_spine_imports_the_agent_loop():
    offenders = {str(f.relative_to(REPO)): hits for f in _outside_files() if (hits := _imports_the_loop(f))}
    assert not offenders, (
        "front doors, tools and policies program against dsh_core.protocols.Agent and "
        f"dsh_core.contracts, never the concrete loop: {offenders}"
    )


# --------------------------------------------------------------------------- 2. the concrete classes satisfy the Protocols


def _protocol_members(proto: type) -> dict[str, object]:
    """Name → what the Protocol declares: a function, a property, or ``None`` (an annotated attribute)."""
    members: dict[str, object] = {}
    for klass in reversed(proto.__mro__):
        if klass is object or klass.__module__ == "typing":  # Protocol, Generic
            continue
        for name in getattr(klass, "__annotations__", {}):
            members.setdefault(name, None)
        for name, value in vars(klass).items():
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                members[name] = value
    return members


def _accepts(concrete: inspect.Signature, declared: inspect.Signature) -> str | None:
    """Why ``concrete`` cannot be called the way ``declared`` allows, or None when it can."""
    params = dict(concrete.parameters)
    for p in declared.parameters.values():
        q = params.pop(p.name, None)
        if q is None:
            return f"has no parameter {p.name!r}"
        if q.kind != p.kind and not (q.kind is q.POSITIONAL_OR_KEYWORD and p.kind in (p.POSITIONAL_ONLY, p.KEYWORD_ONLY)):
            return f"parameter {p.name!r} is {q.kind.description}, the Protocol says {p.kind.description}"
        if p.default is not p.empty and q.default is q.empty:
            return f"parameter {p.name!r} has no default, the Protocol gives one"
    extra = [q.name for q in params.values() if q.default is q.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
    return f"requires parameters the Protocol does not pass: {extra}" if extra else None


def _mismatches(proto: type, concrete: type, instance: object) -> list[str]:
    problems = []
    for name, declared in _protocol_members(proto).items():
        found = inspect.getattr_static(concrete, name, None)
        if inspect.isfunction(declared):
            if not inspect.isfunction(found):
                problems.append(f"{name}: the Protocol declares a method, {concrete.__name__} has {found!r}")
                continue
            if inspect.iscoroutinefunction(declared) != inspect.iscoroutinefunction(found):
                kind = "async" if inspect.iscoroutinefunction(declared) else "sync"
                problems.append(f"{name}: the Protocol declares an {kind} method")
            why = _accepts(inspect.signature(found), inspect.signature(declared))
            if why:
                problems.append(f"{name}: {why}")
        else:  # a property or an annotated attribute: readable data on the instance, not a method
            if isinstance(found, property) or (found is None and name in vars(instance)):
                continue
            if found is not None and not callable(found):  # a class-level value (e.g. a constant)
                continue
            problems.append(f"{name}: the Protocol declares data, {concrete.__name__} has {found!r}")
    return problems


def test_the_member_check_would_catch_a_missing_or_wrong_member():
    class Broken:
        def __init__(self) -> None:
            self.session_id = "s"

        def submit(self) -> None:  # the message parameter is missing
            pass

        def cancel(self, kind: str = "user") -> None:
            pass

        def wait_idle(self) -> None:  # sync where the Protocol says async
            pass

    problems = "\n".join(_mismatches(protocols.Agent, Broken, Broken()))
    for expected in ("submit: has no parameter 'message'", "wait_idle: the Protocol declares an async method",
                     "route: the Protocol declares data", "dispose: the Protocol declares a method"):
        assert expected in problems
    assert "session_id" not in problems and "cancel" not in problems


@pytest.mark.anyio
async def test_the_concrete_agent_and_host_satisfy_the_protocols(scripted, tmp_path):
    script = scripted({"default": [{"text": "ok"}]})
    async with memory_host(script) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        assert type(agent) is ConcreteAgent and type(host) is ConcreteHost
        assert _mismatches(protocols.Agent, ConcreteAgent, agent) == []
        assert _mismatches(protocols.Host, ConcreteHost, host) == []
        assert isinstance(agent, protocols.Agent)
        assert isinstance(host, protocols.Host)
        assert isinstance(host.approvals, protocols.Approvals)
        assert isinstance(agent.spec, AgentSpec)
        await agent.dispose()


def test_the_agent_protocol_is_what_the_doors_use_and_no_more():
    """The surface is deliberate: widening it is a decision about every door, tool and policy."""
    assert set(_protocol_members(protocols.Agent)) == {
        "session_id", "cwd", "spec", "host", "provider", "route", "tools", "busy", "disposed", "children",
        "submit", "cancel", "subscribe", "emit", "splice", "offer", "publish_tools", "parallel_safe", "call_tool", "restore",
        "wait_idle", "dispose", "state", "describe_state",
        # a session's own settings (model, effort, mode) and history, for the plugins that let a person
        # change them (session-controls) and compact on request (/compact)
        "history", "settings", "configure", "compact_history",
        # the model's text as it is written, for a door that streams it live (stream = "live")
        "watch",
        # a running tool call's output so far, for a door that shows it (ToolContext.progress); tools
        # ask whether anyone watches, so that without a watcher they gather nothing
        "watch_progress", "progress_watched", "progress",
        # subagents: a child's settlement told to its parent in the next request, and the history a fork starts from
        "notify", "completed_history",
    }


@pytest.mark.anyio
async def test_state_slots_belong_to_their_owner_and_die_with_it(scripted, tmp_path):
    """``agent.state(T)`` / ``host.state(T)``: one object per type and owner, created on first use,
    gone with the owner (no registry to leak from), visible to debug dumps."""
    import gc
    import weakref
    from dataclasses import dataclass, field

    @dataclass
    class Notes:
        items: list[str] = field(default_factory=list)

    script = scripted({"default": [{"text": "ok"}]})
    async with memory_host(script) as host:
        spec = AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script))
        a, b = host.create_agent(spec), host.create_agent(spec)
        a.state(Notes).items.append("a")
        assert a.state(Notes) is a.state(Notes) and b.state(Notes).items == []
        assert host.state(Notes, lambda: Notes(["host"])).items == ["host"]
        assert host.state(Notes).items == ["host"]  # the factory runs once
        assert a.describe_state() == {f"{Notes.__module__}.{Notes.__qualname__}": "test_state_slots_belong_to_their_owner_and_die_with_it.<locals>.Notes(items=['a'])"}
        ref = weakref.ref(a.state(Notes))
        await a.dispose()
        await b.dispose()
        host.forget(a)
        host.forget(b)
        del a, b
        gc.collect()
        assert ref() is None


@pytest.mark.anyio
async def test_state_slots_holding_a_resource_are_closed_with_their_owner(scripted, tmp_path, capfd):
    """A slot with ``async aclose()`` is closed when its session is disposed (before the log
    closes) or its host closes (after the sessions), newest first (a ``CLOSES_FIRST`` type before
    the rest), even under cancellation; one
    that fails is reported on stderr and the others still close."""
    closed: list[str] = []

    class Resource:
        name = "resource"

        async def aclose(self) -> None:
            await anyio.sleep(0)  # a real await: the owner's shield lets it finish
            closed.append(self.name)

    class Other(Resource):
        name = "other"

    class Broken:
        async def aclose(self) -> None:
            raise OSError("cannot close")

    class Plain:  # no aclose: just dropped
        pass

    class Work(Resource):  # runs inside the others (a job in a command server): closes before them
        name = "work"
        CLOSES_FIRST = True

    script = scripted({"default": [{"text": "ok"}]})
    async with memory_host(script) as host:
        spec = AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script))
        agent = host.create_agent(spec)
        agent.state(Work)
        agent.state(Resource)
        agent.state(Broken)
        agent.state(Plain)
        agent.state(Other)
        host.state(Resource, lambda: Other())
        with anyio.CancelScope() as scope:
            scope.cancel()
            await agent.dispose()
        # the CLOSES_FIRST slot although it is the oldest, then newest first, the broken one in between reported
        assert closed == ["work", "other", "resource"]
        assert agent.describe_state() == {}
        assert closed == ["work", "other", "resource"]
    assert closed == ["work", "other", "resource", "other"]  # the host's slot, when the host closed
    assert "closing the state slot" in capfd.readouterr().err


# --------------------------------------------------------------------------- 3. no import circle in the spine


def _spine_graph() -> dict[str, set[str]]:
    files = {_module_name(f, REPO): f for f in _python_files(SPINE)}
    modules = {name for name, _ in files}
    graph: dict[str, set[str]] = {}
    for (module, is_package), path in files.items():
        deps: set[str] = set()
        for target, name in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path)), module, is_package):
            if name is not None and f"{target}.{name}" in modules:
                deps.add(f"{target}.{name}")  # `from . import hookspecs`: the submodule, not the package
            elif target in modules:
                deps.add(target)
            elif target.startswith("dsh_core."):
                raise AssertionError(f"{module} imports {target}, which is not a module of dsh_core")
        deps.discard(module)
        graph[module] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_counts_lazy_and_type_only_imports_and_finds_a_circle():
    graph = _spine_graph()
    assert "dsh_core.host" in graph["dsh_core.builtin.commands"]  # imported inside functions only
    assert "dsh_core.protocols" in graph["dsh_core.agent"]  # also imported under TYPE_CHECKING
    assert "dsh_core.hookspecs" in graph["dsh_core.host"]  # `from . import hookspecs`
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_inside_the_spine():
    assert _cycles(_spine_graph()) == []


def test_the_contract_imports_nothing_concrete():
    """The bottom of the spine: the contract modules import only each other (downwards)."""
    graph = _spine_graph()
    contract = {"dsh_core.types", "dsh_core.errors", "dsh_core.protocols", "dsh_core.contracts", "dsh_core.hookspecs",
                "dsh_core.interception", "dsh_core.config"}
    for module in sorted(contract):
        assert graph[module] <= contract, f"{module} imports {sorted(graph[module] - contract)}"


def test_hookimpl_lives_beside_the_hookspecs_and_the_old_names_still_work():
    import dsh_core
    from dsh_core import hookspecs, host

    assert dsh_core.hookimpl is host.hookimpl is hookspecs.hookimpl
    assert hookspecs.hookimpl.project_name == hookspecs.hookspec.project_name == "dsh"


# --------------------------------------------------------------------------- 5. plugin state lives on its owner

# Module-level mutable state a plugin may keep, each with its reason: process-wide facts about the
# machine, not per-session or per-host state.
MODULE_STATE_ALLOWED = {
    ("dsh_sandbox_tools/mechanisms.py", "_cache"): "the sandbox probe's result: a fact of this machine, probed once",
    ("dsh_sandbox_tools/mechanisms.py", "_lock"): "guards that probe",
    ("dsh_sandbox_tools/fspath.py", "_local_devices"): "each mounted device and whether its file system is a "
                                                       "local one: a fact of this machine's mount table",
}
_MUTABLE_CALLS = {"dict", "list", "set", "WeakKeyDictionary", "WeakValueDictionary", "OrderedDict", "defaultdict",
                  "Counter", "deque", "Lock"}


def test_plugins_keep_no_module_level_mutable_state():
    """Per-session and per-host state is a state slot (``agent.state(T)``, ``host.state(T)``):
    a module-level dict or WeakKeyDictionary keyed by sessions is the workaround it replaces."""
    found = []
    for path in sorted((REPO / "plugins").glob("*/dsh_*/**/*.py")):
        rel = "/".join(path.parts[-2:]) if path.parent.name.startswith("dsh_") else str(path)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets: list[ast.expr] = []
            value = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            # UPPER_CASE names are constant tables by convention (never mutated); state is lower case.
            names = [t.id for t in targets if isinstance(t, ast.Name) and not t.id.isupper() and t.id != "__all__"]
            if not names or value is None:
                continue
            mutable = isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp)
            if isinstance(value, ast.Call):
                func = value.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                mutable = called in _MUTABLE_CALLS
            for name in names:
                if mutable and (rel, name) not in MODULE_STATE_ALLOWED:
                    found.append(f"{rel}: {name}")
    assert found == []


def test_plugins_log_through_the_standard_library():
    """Plugins warn with ``logging.getLogger("dsh.<plugin>")``; ``dsh_core.diag`` is the spine's
    handler, not an API for plugins."""
    users = [str(p.relative_to(REPO)) for p in sorted((REPO / "plugins").glob("*/dsh_*/**/*.py"))
             if "dsh_core.diag" in p.read_text(encoding="utf-8")]
    assert users == []


# --------------------------------------------------------------------------- 6. plugins meet only through the spine

LIBRARIES = {"dsh_acp", "dsh_hooks", "dsh_testing"}  # distributions that register no plugin


def _plugin_packages() -> dict[str, Path]:
    """Each plugin distribution's package (an entry point in group "dsh"), by import name."""
    out = {}
    for pyproject in sorted((REPO / "plugins").glob("*/pyproject.toml")):
        meta = tomllib.loads(pyproject.read_text())
        if "dsh" not in meta["project"].get("entry-points", {}):
            continue
        for package in meta["tool"]["setuptools"]["packages"]:
            out[package] = pyproject.parent / package
    return out


def test_no_plugin_imports_another_plugins_package():
    """What two plugins share lives in a library that registers no plugin (dsh-acp, dsh-hooks) or
    in the spine (the Confinement seam: hooks and code mode ask ``host.confinement``, they do not
    import sandbox-tools)."""
    packages = _plugin_packages()
    assert {"dsh_sandbox_tools", "dsh_hooks_claude_code", "dsh_code_mode"} <= set(packages)
    assert not LIBRARIES & set(packages)
    found = []
    for name, root in packages.items():
        for path in sorted(root.rglob("*.py")):
            if path.name == "testing.py":  # opt-in pytest support, not the plugin
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                targets = []
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    targets = [node.module]
                for t in targets:
                    top = t.split(".")[0]
                    if top in packages and top != name:
                        found.append(f"{path.relative_to(REPO)} imports {t}")
    assert found == []
