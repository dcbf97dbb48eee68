"""Typed plugin config (issue 28 item 1): a plugin declares its table as one msgspec Struct
(``dsh_config_type``), the host decodes it once, a bad table is one ConfigError naming the
example file, the plugin, the key, what was expected and what was found; ``dsh config`` prints
schemas and effective values; each plugin README's config table is checked against its Struct."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dsh_core.builtin.commands import plugin_manager
from dsh_core.compose import load_composition
from dsh_core.config import PluginConfig, decode
from dsh_core.errors import ConfigError
from dsh_core.host import decode_plugin_configs, load_plugins
from dsh_testing import REPO, minimal_env


def _dsh(tmp_path: Path, *args: str, examples: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = minimal_env(DSH_HOME=str(tmp_path / "home"))
    if examples is not None:
        env["DSH_EXAMPLES_PATH"] = str(examples)
    return subprocess.run([sys.executable, "-m", "dsh_core.cli", *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=tmp_path, stdin=subprocess.DEVNULL)


def _typed_configs(*examples: str) -> dict[str, type[PluginConfig]]:
    """Every shipped plugin's declared config Struct, from the examples that mount them all
    (acp-agent's roster, and acp-extended's beyond it)."""
    found: dict[str, type[PluginConfig]] = {}
    for example in examples or ("acp-agent", "acp-extended"):
        pm = plugin_manager()
        load_plugins(pm, load_composition(example))
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
    assert set(configs) == set(types)
    assert all(type(configs[name]) is cls for name, cls in types.items())
    assert configs["todo"] == types["todo"]()  # no [config.todo] in acp-agent: the defaults


@pytest.mark.parametrize("plugin", sorted(_typed_configs()))
def test_the_plugin_readme_documents_exactly_its_config(plugin):
    """The ```toml block with [config.<plugin>] in the plugin's README decodes with its Struct and
    names every key the Struct has: the documentation cannot drift from the code."""
    cls = _typed_configs()[plugin]
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
    fields = {f.encode_name for f in __import__("msgspec").structs.fields(cls)}
    assert documented == fields, f"README keys {sorted(documented)} vs {cls.__name__} {sorted(fields)}"


def test_wrong_types_are_named_with_what_was_found():
    cls = _typed_configs()["guards"]
    with pytest.raises(ConfigError) as err:
        decode("guards", cls, {"max-steps": True}, where="x.toml")
    assert str(err.value) == "x.toml: [config.guards] max-steps: expected `int`, found True"
