"""Each distribution declares exactly the third-party packages its code imports.

Read from the sources with ``ast`` (every import, also those inside functions), mapped to
distributions through the installed metadata, and compared with the ``pyproject.toml``
that builds the wheel: a plugin that imports something it does not declare breaks a
wheel install; a declared package nobody imports is weight every user carries.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DISTRIBUTIONS = [REPO, *sorted(p.parent for p in (REPO / "plugins").glob("*/pyproject.toml"))]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    assert match, req
    return _norm(match.group(1))


def _imported_top_levels(files: list[Path]) -> set[str]:
    names: set[str] = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def _imported_modules(files: list[Path]) -> set[str]:
    """Every dotted name an import may name a module by (``from a.b import c``: ``a.b.c`` and ``a.b``)."""
    names: set[str] = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _namespace_owners(top: str, dists: list[str], modules: set[str]) -> set[str]:
    """The distributions sharing namespace package ``top`` (opentelemetry-api, -sdk, …) that ship
    one of ``modules``: each dotted name resolved to the distribution whose files hold it."""
    from importlib.metadata import distribution

    files = {d: [f.as_posix() for f in (distribution(d).files or ())] for d in dists}
    owners = set()
    for m in (m for m in modules if m.startswith(top + ".")):
        path = m.replace(".", "/")
        for d, paths in files.items():
            if any(p == path + ".py" or p.startswith(path + "/") for p in paths):
                owners.add(_norm(d))
    return owners


def _third_party(modules: set[str], own: set[str], optional: set[str] = frozenset()) -> dict[str, str]:
    """module -> distribution, for every import that is neither stdlib nor the distribution's own.
    ``optional``: distributions of optional extras, which need not be installed to be recognised."""
    owners = packages_distributions()
    out = {}
    for m in sorted(modules - own - set(sys.stdlib_module_names) - {"__future__"}):
        dists = owners.get(m)
        if not dists and _norm(m) in optional:  # e.g. ray (dsh-batch[ray]), absent from the tests env
            out[m] = _norm(m)
            continue
        assert dists, f"import {m!r}: no installed distribution provides it"
        out[m] = _norm(dists[0])
    return out


@pytest.mark.parametrize("root", DISTRIBUTIONS, ids=lambda p: p.name if p != REPO else "dsh-core")
def test_declared_dependencies_are_exactly_the_imported_ones(root):
    label = root.name if root != REPO else "dsh-core"
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    project, packages = meta["project"], meta["tool"]["setuptools"]["packages"]
    own = {p.split(".")[0] for p in packages}
    declared = {_requirement_name(r) for r in project.get("dependencies", [])}
    test_extra = {_requirement_name(r) for r in project.get("optional-dependencies", {}).get("test", [])}
    # other extras (e.g. dsh-batch[ray]) declare what optional code paths import
    extras = {
        _requirement_name(r)
        for name, reqs in project.get("optional-dependencies", {}).items()
        if name != "test"
        for r in reqs
    }

    files = [f for p in own for f in (root / p).rglob("*.py")]
    assert files, root
    # A package's testing.py (dsh_sandbox_tools.testing, dsh_acp.testing) is opt-in pytest support:
    # its imports belong to the distribution's `test` extra, not to every user's install. The test
    # kit itself is its own distribution (dsh-testing), whose runtime is pytest.
    helpers = [f for f in files if f.name == "testing.py"]
    runtime = [f for f in files if f not in helpers]
    needed = set(_third_party(_imported_top_levels(runtime), own, extras).values())
    # a namespace package several distributions install (opentelemetry): the ones whose modules are imported
    dotted = _imported_modules(runtime)
    for top, dists in packages_distributions().items():
        if len(set(map(_norm, dists))) > 1 and top in {m.split(".")[0] for m in dotted}:
            needed -= {_norm(d) for d in dists}
            needed |= _namespace_owners(top, list(dict.fromkeys(dists)), dotted)
    assert needed - declared - extras == set(), f"{label}: imported but not declared in [project] dependencies"
    # a dependency that ships a program the plugin runs (a language server) or data a library reads
    # (tzdata for zoneinfo), not a module it imports, says so in [tool.dsh]
    dsh_table = meta.get("tool", {}).get("dsh", {})
    programs = {_norm(p) for key in ("program-dependencies", "data-dependencies") for p in dsh_table.get(key, [])}
    assert (declared | extras) - needed - programs == set(), f"{label}: declared but never imported"
    testing_needs = set(_third_party(_imported_top_levels(helpers), own).values())
    assert testing_needs - declared - test_extra == set(), f"{label}: testing.py imports beyond {label}[test]"
    if root == REPO:
        assert "pytest" not in needed and not helpers  # no test code ships in the spine
        assert "httpx" not in declared  # the DeepSeek adapter's client, not the core's


def test_every_distribution_has_a_name_of_its_own():
    """The name ``dsh`` on the package index belongs to an unrelated project (which also installs
    a ``dsh`` script): depending on it installs that. Every distribution here is ``dsh-<part>``,
    and the plugins the spine names in its install hints are exactly the shipped ones."""
    from dsh_core.host import SHIPPED_PLUGINS

    names = {tomllib.loads((root / "pyproject.toml").read_text())["project"]["name"] for root in DISTRIBUTIONS}
    assert "dsh" not in names and all(n.startswith("dsh-") for n in names), names
    for root in DISTRIBUTIONS:
        deps = tomllib.loads((root / "pyproject.toml").read_text())["project"].get("dependencies", [])
        assert "dsh" not in {_requirement_name(r) for r in deps}, f"{root.name} depends on the index's `dsh`"
    plugins = set()
    for root in DISTRIBUTIONS[1:]:
        meta = tomllib.loads((root / "pyproject.toml").read_text())["project"]
        plugins |= set(meta.get("entry-points", {}).get("dsh", {}))
        if meta.get("entry-points", {}).get("dsh"):
            assert meta["name"] == f"dsh-{root.name}", f"{root.name}: distribution {meta['name']}"
    assert plugins == SHIPPED_PLUGINS


def test_a_missing_plugin_hint_names_a_real_distribution(monkeypatch, tmp_path):
    from dsh_core import host

    monkeypatch.setattr(host, "__file__", str(tmp_path / "dsh_core" / "host.py"))  # not a source checkout
    assert host.install_hint("compaction").endswith("-m pip install dsh-compaction")
    third = host.install_hint("wordcount")
    assert "dsh-wordcount" not in third and "entry point named 'wordcount' in group 'dsh'" in third
