"""Test helpers: a real host with a throwaway model provider, a session wrapper, an approval answerer."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import dsh_sandbox_tools
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from dsh_core import ToolError, hookimpl
from dsh_core.compose import Composition
from dsh_core.contracts import AgentSpec, ToolContext
from dsh_core.host import make_plugin_manager, open_host, register_plugin
from dsh_core.types import Finish, ModelInfo, RetryPolicy, ToolOutput
from dsh_testing import live_processes


class FakeProvider:
    name = "fake"
    retry_policy = RetryPolicy(max_retries=0)

    def resolve(self, model: str) -> ModelInfo:
        return ModelInfo(provider="fake", model=model, image_input=model == "vision")

    async def stream(self, request: Any):  # pragma: no cover - tools are driven directly
        yield Finish(reason="stop")


class FakeModelPlugin:
    @hookimpl
    def dsh_register_models(self, register: Any) -> None:
        register(FakeProvider())


class Answer:
    """A throwaway approval answerer that records what it was asked."""

    def __init__(self, outcome: str | None) -> None:
        self.outcome = outcome
        self.requests: list[Any] = []

    async def answer(self, request: Any) -> Any:
        self.requests.append(request)
        return self.outcome


class Session:
    def __init__(self, host: Any, root: Path, model: str = "m") -> None:
        self.host = host
        self.root = root
        self.agent = host.create_agent(AgentSpec(cwd=str(root), provider="fake", model=model))
        self.n = 0

    def ctx(self, tool: str) -> ToolContext:
        self.n += 1
        return ToolContext(agent=self.agent, call_id=f"c{self.n}", tool_name=tool, turn=1, step=self.n)

    async def call(self, tool: str, **args: Any) -> ToolOutput:
        """Run a tool the way the agent loop does (ToolError → error result)."""
        try:
            return await self.host.tools[tool].run(args, self.ctx(tool))
        except ToolError as exc:
            return ToolOutput.text(f"Error: {exc.message}", is_error=True, code=exc.code)

    @property
    def events(self) -> list[Any]:
        return self.host.session_store.logs[self.agent.session_id].events


def text(out: ToolOutput) -> str:
    return "\n".join(getattr(b, "text", "") for b in out.content)


@asynccontextmanager
async def running_host(mode: str = "workspace-write", mechanism: str = "auto", **extra: Any):
    if mechanism in MECHANISMS:
        require_mechanism(mechanism)  # skips with the reason only when the machine lacks it
    pm = make_plugin_manager()
    register_plugin(pm, FakeModelPlugin(), "fake-model")
    register_plugin(pm, dsh_sandbox_tools, "sandbox-tools")
    for name, plugin in extra.pop("plugins", {}).items():
        register_plugin(pm, plugin, name)
    config = {"sandbox-tools": {"permission-mode": mode, "mechanism": mechanism, **extra}}
    comp = Composition(
        name="sandbox-test", path=Path("/nonexistent/example.toml"),
        plugins=tuple(["fake-model", "sandbox-tools"]), config=config,
    )
    async with open_host(comp, pm=pm, provider="fake", model="m") as host:
        yield host


def mechanisms() -> list[str]:
    """Every mechanism; a test parametrised over these runs once per mechanism the machine has."""
    return list(MECHANISMS)


def host_alive_with(token: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line contains ``token``."""
    return live_processes(lambda argv, cwd: token.encode() in b"\0".join(argv))
