"""Fixtures: a workspace with a small Python project, HOME outside every writable root, a clean env,
and ``lsp_host``: an in-process host with the real sandbox-tools and lsp plugins and a scripted model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import dsh_sandbox_tools.testing as sandbox_fixtures
import pytest

from dsh_core import ToolError
from dsh_core.contracts import AgentSpec, ToolContext
from dsh_core.types import TextBlock, ToolOutput, UserMessage
from dsh_testing import memory_host

# the small project of the recorded scenario (its workspace), the same files for the tests
SAMPLE = Path(__file__).resolve().parents[1] / "snapshots" / "lsp-python" / "diagnostics-after-edit" / "workspace"
SHAPES = (SAMPLE / "shapes.py").read_text()
MAIN = (SAMPLE / "main.py").read_text()

# a clean env and HOME outside every writable root (autouse), a workspace directory
_home, root = sandbox_fixtures._home, sandbox_fixtures.root


@pytest.fixture
def workspace(root: Path) -> Path:
    """``root`` (``tmp_path/ws``) holding the sample project."""
    (root / "shapes.py").write_text(SHAPES)
    (root / "main.py").write_text(MAIN)
    return root


class Session:
    """One session of an in-process host: ``call`` runs a tool as the loop does (ToolError → error result)."""

    def __init__(self, host: Any, agent: Any) -> None:
        self.host, self.agent, self.n = host, agent, 0

    async def call(self, tool: str, **args: Any) -> ToolOutput:
        self.n += 1
        ctx = ToolContext(agent=self.agent, call_id=f"c{self.n}", tool_name=tool, turn=1, step=self.n)
        try:
            return await self.host.tools[tool].run(args, ctx)
        except ToolError as exc:
            return ToolOutput.text(f"Error: {exc.message}", is_error=True, code=exc.code)

    @property
    def events(self) -> list[Any]:
        return self.host.session_store.logs[self.agent.session_id].events

    async def prompt(self, text: str = "go") -> None:
        self.agent.submit(UserMessage(id=f"u{self.n}", content=[TextBlock(text=text)]))
        await self.agent.wait_idle()


def text(out: ToolOutput) -> str:
    return "\n".join(getattr(b, "text", "") for b in out.content)


@pytest.fixture
def lsp_host(tmp_path: Path, workspace: Path):
    """``async with lsp_host(steps=[…], lsp={…}, sandbox={…}) as session``."""

    @asynccontextmanager
    async def factory(steps: list[dict[str, Any]] | None = None, *, lsp: dict[str, Any] | None = None,
                      sandbox: dict[str, Any] | None = None, cwd: Path | None = None) -> AsyncIterator[Session]:
        script = tmp_path / "script.json"
        script.write_text(json.dumps({"default": steps or [{"text": "done"}]}))
        config = {"lsp": lsp or {}, "sandbox-tools": sandbox or {}}
        async with memory_host(script, plugins=("scripted-model", "sandbox-tools", "lsp"), config=config) as host:
            agent = host.create_agent(AgentSpec(cwd=str(cwd or workspace), provider="scripted", model=str(script)))
            yield Session(host, agent)

    return factory
