"""Default seams: the agent factory, an in-memory session store, the base system prompt."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..agent import Agent
from ..config import AgentConfig
from ..errors import DshError
from ..hookspecs import config_type_hook, hookimpl
from ..types import DurableEvent, SessionHeader

if TYPE_CHECKING:  # pragma: no cover
    from ..protocols import AgentSpec, Host


class MemoryLog:
    def __init__(self, store: MemoryStore, header: SessionHeader) -> None:
        self.header = header
        self.events: list[DurableEvent] = []
        store.logs[header.id] = self

    def append(self, event: DurableEvent) -> None:
        self.events.append(event)

    async def close(self) -> None:
        pass


class MemoryStore:
    """Keeps session logs in memory (lost at exit); used when no persistence plugin is mounted."""

    def __init__(self) -> None:
        self.logs: dict[str, MemoryLog] = {}

    def open(self, header: SessionHeader) -> MemoryLog:
        return MemoryLog(self, header)

    async def list_sessions(self) -> list[SessionHeader]:
        return [log.header for log in self.logs.values()]

    async def read(self, session_id: str) -> tuple[SessionHeader, list[DurableEvent]]:
        log = self.logs.get(session_id)
        if log is None:
            raise DshError(f"no session {session_id!r}")
        return log.header, list(log.events)


dsh_config_type = config_type_hook("agent", AgentConfig)


@hookimpl(trylast=True)
def dsh_make_agent(spec: AgentSpec, host: Host) -> Agent:
    return Agent(spec, host)


@hookimpl(trylast=True)
def dsh_session_store(host: Host) -> MemoryStore:
    return MemoryStore()


@hookimpl(trylast=True)
def dsh_system_prompt(spec: AgentSpec, host: Host) -> str:
    return (
        f"You are dsh, an automation agent working in {spec.cwd}. "
        "Use the tools to inspect and change the workspace; answer with the result when done."
    )
