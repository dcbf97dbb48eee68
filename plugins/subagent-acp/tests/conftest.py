"""Fixtures: generated examples; the third-party peer agent and a process-tree check come from
``dsh_acp.testing`` (``scripted``/``acp_agent`` from ``dsh_testing``, which the
repository's root conftest loads)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dsh_acp.testing import live, peer_command

from dsh_testing import REPO

__all__ = ["examples", "live", "peer_command"]


@pytest.fixture
def examples(tmp_path: Path) -> Callable[..., str]:
    """``examples(name, subagent={...}, extra_plugins=[...])`` writes an example under a temp
    examples dir and returns the DSH_EXAMPLES_PATH that finds it (and the repo's test examples)."""
    root = tmp_path / "examples"
    root.mkdir()

    def make(name: str = "sub", *, subagent: dict[str, Any] | None = None, plugins: list[str] | None = None) -> str:
        d = root / name
        d.mkdir(exist_ok=True)
        plugins = plugins or ["acp-transport", "jsonl-persistence", "scripted-model", "subagent-acp", "testkit-approval"]
        lines = [
            "[example]",
            'description = "subagent-acp test composition"',
            'front-door = "acp-stdio"',
            f"plugins = {plugins!r}".replace("'", '"'),
            "[route]",
            'provider = "scripted"',
            'model = "set-by-test.json"',
            "[config.acp-transport]",
            "permission-timeout = 10",
            "[config.subagent-acp]",
        ]
        sub = {"example": name, "eof-grace": 1.0, "term-grace": 1.0, **(subagent or {})}
        for key, value in sub.items():
            if isinstance(value, str):
                lines.append(f'{key} = "{value}"')
            elif isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, (list, dict)):
                import json

                if isinstance(value, dict):
                    lines.append(f"{key} = {{ " + ", ".join(f'{k} = {json.dumps(v)}' for k, v in value.items()) + " }")
                else:
                    lines.append(f"{key} = {json.dumps(value)}")
            else:
                lines.append(f"{key} = {value}")
        (d / "example.toml").write_text("\n".join(lines) + "\n")
        return os.pathsep.join([str(root), str(REPO / "tests" / "examples")])

    return make

