"""Helpers: an in-process host with the real sandbox-tools and code-mode plugins and a scripted model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dsh_sandbox_tools.testing as sandbox_fixtures
import pytest

from dsh_core.contracts import AgentSpec
from dsh_core.types import TextBlock, UserMessage
from dsh_testing import memory_host

# a clean env and HOME outside every writable root (autouse), a workspace directory
_home, root = sandbox_fixtures._home, sandbox_fixtures.root


class Turn:
    """One scripted turn on an in-process host: ``events`` of the session afterwards."""

    def __init__(self, host: Any, agent: Any) -> None:
        self.host = host
        self.agent = agent

    @property
    def events(self) -> list[Any]:
        return self.host.session_store.logs[self.agent.session_id].events

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def workspace(root: Path) -> Path:
    """The session's workspace: ``root`` (``tmp_path/ws``)."""
    return root


@pytest.fixture
def code_host(tmp_path: Path, workspace: Path):
    """``async with code_host(steps, mode="code", **config) as turn`` runs one prompt whose model plays ``steps``."""
    from contextlib import asynccontextmanager

    counter = iter(range(1000))

    @asynccontextmanager
    async def factory(steps: list[dict[str, Any]], *, mode: str = "code", prompt: str = "go",
                      capabilities: dict[str, Any] | None = None, extra: tuple = (), sandbox: dict | None = None,
                      **config: Any):
        script = tmp_path / f"script-{next(counter)}.json"
        body: dict[str, Any] = {"default": steps}
        if capabilities:
            body["capabilities"] = capabilities
        script.write_text(json.dumps(body))
        plugins = ("scripted-model", "sandbox-tools", "attachment-store", "code-mode")
        cfg = {"code-mode": {"mode": mode, **{k.replace("_", "-"): v for k, v in config.items()}},
               "sandbox-tools": sandbox or {}}
        async with memory_host(script, *extra, plugins=plugins, config=cfg) as host:
            agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
            turn = Turn(host, agent)
            agent.submit(UserMessage(id="u1", content=[TextBlock(text=prompt)]))
            yield turn
            await agent.wait_idle()

    return factory


def run(code: str, description: str = "a program") -> dict[str, Any]:
    """A scripted step that calls run_code."""
    return {"tool": "run_code", "args": {"code": code, "description": description}}
