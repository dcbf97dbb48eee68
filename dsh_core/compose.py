"""``examples/<name>/example.toml`` → ``Composition``.

A manifest names exactly the plugins an example mounts; nothing else installed is loaded.

    [example]
    description = "…"
    front-door = "acp-stdio"
    plugins = ["acp-transport", "jsonl-persistence", "scripted-model"]

    [route]                      # the default exact route (CLI/env override it)
    provider = "deepseek"
    model = "deepseek-flash"

    [config.acp-transport]       # one table per plugin, handed to dsh_configure
    max-frame-bytes = 67108864
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CompositionError


@dataclass(frozen=True)
class Composition:
    name: str
    path: Path
    plugins: tuple[str, ...]
    front_door: str | None = None
    description: str = ""
    provider: str | None = None
    model: str | None = None
    config: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def directory(self) -> Path:
        return self.path.parent


def example_dirs() -> list[Path]:
    """Where examples are looked up: ``$DSH_EXAMPLES_PATH`` (os.pathsep list), then the shipped ones.

    The shipped examples are ``examples/<name>/`` in a source checkout; the core wheel carries
    the same files as package data in ``dsh_core/examples/<name>/`` (see pyproject.toml).
    """
    dirs = [Path(p) for p in os.environ.get("DSH_EXAMPLES_PATH", "").split(os.pathsep) if p]
    here = Path(__file__).resolve().parent
    if (here / "examples").is_dir():  # installed from a wheel
        dirs.append(here / "examples")
    elif (here.parent / "pyproject.toml").is_file():  # a source checkout (editable install)
        dirs.append(here.parent / "examples")
    return dirs


def available_examples() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in example_dirs():
        if d.is_dir():
            for manifest in sorted(d.glob("*/example.toml")):
                found.setdefault(manifest.parent.name, manifest)
    return found


def example_argument(value: str) -> str:
    """``--example VALUE`` as a child process must get it: ``load_composition`` reads an existing
    directory or ``.toml`` file as a path, relative to where the user ran the command, so that is
    made absolute (the child runs in the agent's cwd); an example's name is left as it is."""
    path = Path(value)
    return str(path.absolute()) if path.is_dir() or (path.suffix == ".toml" and path.is_file()) else value


def load_composition(name_or_path: str) -> Composition:
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = path / "example.toml" if path.is_dir() else available_examples().get(name_or_path, Path())
    if not path.is_file():
        known = ", ".join(available_examples()) or "none"
        raise CompositionError(f"unknown example {name_or_path!r} (known examples: {known}; see `dsh examples`)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise CompositionError(f"{path}: not valid TOML: {exc}") from exc
    meta = data.get("example", {})
    plugins = meta.get("plugins")
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise CompositionError(f"{path}: [example] plugins must be a list of plugin names")
    if len(set(plugins)) != len(plugins):
        raise CompositionError(f"{path}: [example] plugins lists a plugin twice")
    route = data.get("route", {})
    config = data.get("config", {})
    if not isinstance(config, dict):
        raise CompositionError(f"{path}: [config] must be a table of per-plugin tables")
    return Composition(
        name=path.parent.name,
        path=path,
        plugins=tuple(plugins),
        front_door=meta.get("front-door"),
        description=meta.get("description", ""),
        provider=route.get("provider"),
        model=route.get("model"),
        config={k: dict(v) for k, v in config.items()},
    )
