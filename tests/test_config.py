"""Typed plugin config (issue 28 item 1): a plugin declares its table as one msgspec Struct
(``dsh_config_type``), the host decodes it once, a bad table is one ConfigError naming the
example file, the plugin, the key, what was expected and what was found; ``dsh config`` prints
schemas and effective values; each plugin README's config table is checked against its Struct."""

from __future__ import annotations

import functools
import importlib
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import msgspec
import pytest

from dsh_core.builtin.commands import plugin_manager
from dsh_core.compose import Composition, load_composition
from dsh_core.config import PluginConfig, decode
from dsh_core.errors import ConfigError
from dsh_core.host import SHIPPED_PLUGINS, SPINE_CONFIGS, decode_plugin_configs, load_plugins
from dsh_testing import REPO, minimal_env


def _dsh(tmp_path: Path, *args: str, examples: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = minimal_env(DSH_HOME=str(tmp_path / "home"))
    if examples is not None:
        env["DSH_EXAMPLES_PATH"] = str(examples)
    return subprocess.run([sys.executable, "-m", "dsh_core.cli", *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)


@functools.cache
def _typed_configs(*examples: str) -> dict[str, type[PluginConfig]]:
    """The declared config Structs of the plugins ``examples`` mount (default: every plugin this
    project ships, mounted together)."""
    compositions = [load_composition(e) for e in examples] or [
        Composition(name="shipped", path=REPO / "shipped.toml", plugins=tuple(sorted(SHIPPED_PLUGINS)))]
    found: dict[str, type[PluginConfig]] = {}
    for composition in compositions:
        pm = plugin_manager()
        load_plugins(pm, composition)
        found.update({name: cls for name, cls in (e for e in pm.hook.dsh_config_type() if e)})
    return found


def test_dsh_config_prints_each_schema_and_the_effective_values_as_json(tmp_path):
    proc = _dsh(tmp_path, "config", "--example", "acp-agent", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # stdout is the JSON and nothing else
    assert {"todo", "guards", "agent-instructions"} <= set(report)
    todo = report["todo"]
    assert todo["values"] == {"remind-every": 10}
    assert todo["schema"]["properties"]["remind-every"]["minimum"] == 1
    assert todo["schema"]["additionalProperties"] is False
    text = _dsh(tmp_path, "config", "--example", "acp-agent").stdout
    assert "[config.guards]" in text and "max-steps = 200  # integer (minimum 1)" in text


def test_a_bad_table_stops_start_up_with_one_line_naming_file_plugin_and_key(tmp_path):
    examples = tmp_path / "examples"
    (examples / "bad").mkdir(parents=True)
    manifest = examples / "bad" / "example.toml"
    source = (REPO / "examples" / "acp-agent" / "example.toml").read_text()
    manifest.write_text(source + "\n[config.todo]\nremind-every = 0\n")
    proc = _dsh(tmp_path, "run", "--example", "bad", "--provider", "scripted", "--model",
                str(REPO / "examples" / "acp-agent" / "demo.json"), examples=examples)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line == f"dsh: {manifest}: [config.todo] remind-every: expected `int` >= 1, found 0"
    manifest.write_text(source + "\n[config.guards]\nmax-step = 3\n")
    proc = _dsh(tmp_path, "config", "--example", "bad", examples=examples)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"dsh: {manifest}: [config.guards] unknown key 'max-step' "
                                   "(known keys: repeat-thresholds, max-steps)")


def test_the_host_hands_out_the_decoded_config_and_defaults_without_a_table():
    composition = load_composition("acp-agent")
    pm = plugin_manager()
    load_plugins(pm, composition)
    configs = decode_plugin_configs(pm, composition)
    types = _typed_configs("acp-agent")
    assert set(configs) == set(types) | set(SPINE_CONFIGS)  # the plugins' tables and the spine's own ([config.spill])
    assert all(type(configs[name]) is cls for name, cls in types.items())
    assert configs["todo"] == types["todo"]()  # no [config.todo] in acp-agent: the defaults


@pytest.mark.parametrize("plugin", sorted(_typed_configs()))
def test_the_plugin_readme_documents_exactly_its_config(plugin):
    """The ```toml block with [config.<plugin>] in the plugin's README decodes with its Struct and
    names every key the Struct has: the documentation cannot drift from the code."""
    cls = _typed_configs()[plugin]
    fields = {f.encode_name for f in msgspec.structs.fields(cls)}
    if not fields:  # a plugin with no options says so where its config table would be documented
        readme = (REPO / f"plugins/{plugin}/README.md").read_text()
        assert f"`[config.{plugin}]` takes no options" in " ".join(readme.split()), plugin
        return
    # the spine's own table ([config.agent], its builtin defaults) is documented with the contract
    readme = (REPO / ("docs/acp-contract.md" if plugin == "agent" else f"plugins/{plugin}/README.md")).read_text()
    tables = [tomllib.loads(block) for block in re.findall(r"```toml\n(.*?)```", readme, re.S)
              if f"[config.{plugin}]" in block]
    assert tables, f"{plugin}'s documentation has no ```toml block with [config.{plugin}]"
    documented: set[str] = set()
    for doc in tables:
        table = doc["config"][plugin]
        decode(plugin, cls, table, where=f"plugins/{plugin}/README.md")  # raises ConfigError if it drifted
        documented |= set(table)
    assert documented == fields, f"README keys {sorted(documented)} vs {cls.__name__} {sorted(fields)}"


def test_wrong_types_are_named_with_what_was_found():
    cls = _typed_configs()["guards"]
    with pytest.raises(ConfigError) as err:
        decode("guards", cls, {"max-steps": True}, where="x.toml")
    assert str(err.value) == "x.toml: [config.guards] max-steps: expected `int`, found True"


# --------------------------------------------------------------------------- every plugin declares its table


def _example_manifests() -> list[Path]:
    """Every composition this repository ships: the examples, and the third-party plugin's own."""
    return sorted(REPO.glob("examples/*/example.toml")) + sorted(REPO.glob("examples/third-party/*/examples/*/example.toml"))


def _declarations(composition: Composition, **own: object) -> dict[str, tuple[str, type]]:
    """``{mounted plugin: (the table it declares, its Struct)}``, read off each plugin's own
    hookimpl (``own``: plugins registered by name first, as a test injects them)."""
    pm = plugin_manager()
    for name, plugin in own.items():
        pm.register(plugin, name=name)
    load_plugins(pm, composition)
    return {impl.plugin_name: impl.function() for impl in pm.hook.dsh_config_type.get_hookimpls()}


@pytest.mark.parametrize("manifest", _example_manifests(), ids=lambda p: p.parent.name)
def test_every_plugin_an_example_mounts_declares_its_config(manifest, monkeypatch):
    """Derived from the real compositions: a plugin added to an example without a
    ``dsh_config_type`` (even one with no options, an empty Struct) fails here. The third-party
    example's plugin is imported from its source tree (its own package, not installed here)."""
    own: dict[str, object] = {}
    if "third-party" in manifest.parts:
        monkeypatch.syspath_prepend(str(manifest.parents[2]))
        own["wordcount"] = importlib.import_module("dsh_wordcount")
    composition = load_composition(str(manifest))
    assert composition.plugins
    declared = _declarations(composition, **own)
    for plugin in composition.plugins:
        assert plugin in declared, f"{manifest}: plugin {plugin!r} declares no config (dsh_config_type)"
        name, cls = declared[plugin]
        assert name == plugin, f"plugin {plugin!r} declares the table [config.{name}]"
        assert isinstance(cls, type) and issubclass(cls, PluginConfig)


def test_every_shipped_plugin_declares_its_config():
    """Also the ones no example mounts (batch is a command; a composition may still list it)."""
    composition = Composition(name="shipped", path=REPO / "shipped.toml", plugins=tuple(sorted(SHIPPED_PLUGINS)))
    declared = _declarations(composition)
    assert {p: declared.get(p, (None,))[0] for p in SHIPPED_PLUGINS} == {p: p for p in SHIPPED_PLUGINS}


NO_OPTIONS = sorted(name for name, cls in _typed_configs().items() if not msgspec.structs.fields(cls))


def test_the_plugins_with_no_options_are_the_known_ones():
    assert {"jsonl-persistence", "replay-model", "batch", "otel"} <= set(NO_OPTIONS)


@pytest.mark.parametrize("plugin", NO_OPTIONS)
def test_a_bogus_key_under_a_plugin_with_no_options_is_refused_naming_plugin_and_key(plugin):
    cls = _typed_configs()[plugin]
    assert decode(plugin, cls, {}, where="x.toml") == cls()  # an empty table is its defaults
    with pytest.raises(ConfigError) as err:
        decode(plugin, cls, {"bogus-key": 1}, where="x.toml")
    assert str(err.value) == f"x.toml: [config.{plugin}] unknown key 'bogus-key' (it takes no options)"


def _manifest(tmp_path: Path, extra: str, source: str = "acp-agent") -> Path:
    examples = tmp_path / "examples"
    (examples / "bad").mkdir(parents=True, exist_ok=True)
    manifest = examples / "bad" / "example.toml"
    manifest.write_text((REPO / "examples" / source / "example.toml").read_text() + extra)
    return manifest


def test_a_bogus_key_under_jsonl_persistence_stops_the_real_cli(tmp_path):
    manifest = _manifest(tmp_path, "\n[config.jsonl-persistence]\nfsync = true\n")
    proc = _dsh(tmp_path, "run", "--example", "bad", "--provider", "scripted", "--model",
                str(REPO / "examples" / "acp-agent" / "demo.json"), examples=manifest.parent.parent)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"dsh: {manifest}: [config.jsonl-persistence] unknown key 'fsync' (it takes no options)"


def _refusal(tmp_path: Path, extra: str, pm_extra: object | None = None) -> str:
    composition = load_composition(str(_manifest(tmp_path, extra)))
    pm = plugin_manager()
    if pm_extra is not None:
        pm.register(pm_extra, name="declares-nothing")
        composition = Composition(name=composition.name, path=composition.path,
                                  plugins=(*composition.plugins, "declares-nothing"), config=composition.config)
    load_plugins(pm, composition)
    with pytest.raises(ConfigError) as err:
        decode_plugin_configs(pm, composition)
    return str(err.value).removeprefix(f"{composition.path}: ")


def test_a_table_for_no_plugin_is_refused_naming_it(tmp_path):
    text = _refusal(tmp_path, "\n[config.todos]\nremind-every = 3\n")
    assert text.startswith("[config.todos]: there is no plugin 'todos' (mounted: acp-transport, jsonl-persistence,")
    # an empty table holds nothing that could go unread: let be (tests hand `{}` for a plugin they may not mount)
    composition = load_composition(str(_manifest(tmp_path, "\n[config.todos]\n[config.otel]\n")))
    pm = plugin_manager()
    load_plugins(pm, composition)
    assert not {"todos", "otel"} & set(decode_plugin_configs(pm, composition))


def test_a_table_for_a_known_plugin_this_example_does_not_mount_is_refused(tmp_path):
    """acp-agent does not mount otel (acp-extended does): its table would never be read."""
    text = _refusal(tmp_path, "\n[config.otel]\nendpoint = 'http://localhost:4318'\n")
    assert text.startswith("[config.otel]: plugin 'otel' is not mounted by example 'bad', so nothing reads this "
                           "table; add 'otel' to [example] plugins or remove the table (mounted: acp-transport,")


def test_a_mounted_plugin_that_declares_nothing_takes_no_options(tmp_path):
    """A third party's plugin without dsh_config_type: a key under its table is refused; an
    empty table is let be."""

    class DeclaresNothing:
        pass

    text = _refusal(tmp_path, "\n[config.declares-nothing]\nlevel = 2\n", DeclaresNothing())
    assert text == ("[config.declares-nothing] unknown key 'level': plugin 'declares-nothing' declares no config "
                    "(dsh_config_type), so it takes no options")
    composition = load_composition(str(_manifest(tmp_path, "\n[config.declares-nothing]\n")))
    composition = Composition(name=composition.name, path=composition.path,
                              plugins=(*composition.plugins, "declares-nothing"), config=composition.config)
    pm = plugin_manager()
    pm.register(DeclaresNothing(), name="declares-nothing")
    load_plugins(pm, composition)
    assert "declares-nothing" not in decode_plugin_configs(pm, composition)


def test_the_spill_table_is_typed_too(tmp_path):
    assert _refusal(tmp_path, "\n[config.spill]\nmax-byte = 3\n") == (
        "[config.spill] unknown key 'max-byte' (known keys: max-bytes, dir)")
    assert _refusal(tmp_path, "\n[config.spill]\nmax-bytes = 0\n") == (
        "[config.spill] max-bytes: expected `int` >= 1, found 0")


@pytest.mark.parametrize("manifest", sorted(REPO.glob("examples/*/example.toml")), ids=lambda p: p.parent.name)
def test_dsh_config_lists_the_schema_of_every_plugin_the_example_mounts(tmp_path, manifest):
    proc = _dsh(tmp_path, "config", "--example", str(manifest), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report) == {*load_composition(str(manifest)).plugins, "agent", *SPINE_CONFIGS}
    assert all(entry["schema"]["additionalProperties"] is False for entry in report.values())
    text = _dsh(tmp_path, "config", "--example", str(manifest)).stdout
    assert all(f"[config.{name}]" in text for name in report)
    assert "[config.jsonl-persistence]\n# takes no options (a key here is refused)\n" in text


def test_two_declarations_of_one_table_are_a_composition_error(tmp_path):
    from dsh_core import hookimpl
    from dsh_core.errors import CompositionError

    class Other(PluginConfig):
        pass

    class Squatter:
        @hookimpl
        def dsh_config_type(self):
            return "spill", Other

    composition = load_composition(str(_manifest(tmp_path, "")))
    pm = plugin_manager()
    pm.register(Squatter(), name="squatter")
    load_plugins(pm, composition)
    with pytest.raises(CompositionError, match=r"two declarations of \[config.spill\]: SpillConfig and Other"):
        decode_plugin_configs(pm, composition)
