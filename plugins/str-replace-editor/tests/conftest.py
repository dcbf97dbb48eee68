"""Fixtures: a workspace under /tmp, a directory outside every writable root (HOME outside them too),
a clean env, and ``editor_host``: a real host with the real sandbox-tools and str-replace-editor
plugins (a throwaway model provider: the tools are called directly, as the agent loop calls them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import dsh_sandbox_tools
import dsh_sandbox_tools.testing as sandbox_fixtures
import dsh_str_replace_editor
import pytest
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from dsh_core import ToolError, hookimpl
from dsh_core.compose import Composition
from dsh_core.contracts import AgentSpec, ToolContext
from dsh_core.host import make_plugin_manager, open_host, register_plugin
from dsh_core.tools import argument_problems
from dsh_core.types import Finish, ModelInfo, RetryPolicy, TextBlock, ToolOutput

# the fixtures of every plugin whose tests run the sandbox: a clean env and HOME outside the roots
# (autouse), a workspace, a directory in no writable root
_home, outside, root = sandbox_fixtures._home, sandbox_fixtures.outside, sandbox_fixtures.root


class _Provider:
    name = "fake"
    retry_policy = RetryPolicy(max_retries=0)

    def resolve(self, model: str) -> ModelInfo:
        return ModelInfo(provider="fake", model=model)

    async def stream(self, request: Any):  # pragma: no cover - the tools are called directly
        yield Finish(reason="stop")


class _Model:
    @hookimpl
    def dsh_register_models(self, register: Any) -> None:
        register(_Provider())


def text(out: ToolOutput) -> str:
    return "".join(b.text for b in out.content if isinstance(b, TextBlock))


class Session:
    """One session of the host; ``call`` runs a tool as the spine does (schema check, ToolError →
    an ``Error: …`` result)."""

    def __init__(self, host: Any, root: Path) -> None:
        self.host = host
        self.agent = host.create_agent(AgentSpec(cwd=str(root), provider="fake", model="m"))
        self.n = 0

    async def call(self, tool: str, **args: Any) -> ToolOutput:
        self.n += 1
        spec = self.host.tools[tool]
        problems = argument_problems(spec.spec.parameters, args)
        if problems:
            return ToolOutput.text(f"Error: {tool}: {'; '.join(problems)}", is_error=True, code="INVALID_ARGUMENTS")
        ctx = ToolContext(agent=self.agent, call_id=f"c{self.n}", tool_name=tool, turn=1, step=self.n)
        try:
            return await spec.run(args, ctx)
        except ToolError as exc:
            return ToolOutput.text(f"Error: {exc.message}", is_error=True, code=exc.code)

    async def edit(self, **args: Any) -> ToolOutput:
        return await self.call("str_replace_editor", **args)


@asynccontextmanager
async def running_host(mode: str = "workspace-write", mechanism: str = "auto",
                       editor: dict[str, Any] | None = None, sandbox: bool = True) -> AsyncIterator[Any]:
    if mechanism in MECHANISMS:
        require_mechanism(mechanism)  # skips with the reason only when the machine lacks it
    pm = make_plugin_manager()
    register_plugin(pm, _Model(), "fake-model")
    if sandbox:
        register_plugin(pm, dsh_sandbox_tools, "sandbox-tools")
    register_plugin(pm, dsh_str_replace_editor, "str-replace-editor")
    config = {"sandbox-tools": {"permission-mode": mode, "mechanism": mechanism},
              "str-replace-editor": editor or {}}
    plugins = ("fake-model", *(("sandbox-tools",) if sandbox else ()), "str-replace-editor")
    comp = Composition(name="editor-test", path=Path("/nonexistent/example.toml"), plugins=plugins,
                       config={k: v for k, v in config.items() if k in plugins})
    async with open_host(comp, pm=pm, provider="fake", model="m") as host:
        yield host


@pytest.fixture
def editor_session(root: Path):
    """``async with editor_session(mode=…, mechanism=…) as s`` : a Session on ``root``."""

    @asynccontextmanager
    async def make(**kw: Any) -> AsyncIterator[Session]:
        async with running_host(**kw) as host:
            yield Session(host, root)

    return make
