"""dsh plugin ``mcp-client``: tools from Model Context Protocol servers.

Each session gets the servers of ``[config.mcp-client] servers`` and, when the composition
says ``accept-client-servers = true``, the ones its ACP client handed it in ``session/new``
(``AgentSpec.mcp_servers``; the door refuses them otherwise, ACP-3). Every server's tools
become the session's tools ``mcp__<server>__<tool>`` (``names``) through the spine's
per-session tool seam (``dsh_session_tools``): connected and listed before the first turn,
kept current while the session lives, ended with it (``link``). The MCP is the official
``mcp`` SDK's; nothing of the protocol is written here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from dsh_core import config_type_hook, hookimpl
from dsh_core.errors import ConfigError
from dsh_core.protocols import ClientMcp
from dsh_core.types import AfterTool

from .config import McpClientConfig, ServerSpec, from_client, from_config, problems
from .link import ServerLink, probe
from .names import tool_name

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.doctor import Finding
    from dsh_core.protocols import Agent, Host
    from dsh_core.types import ToolCallBlock, ToolOutput

log = logging.getLogger("dsh.mcp-client")

PLUGIN = "mcp-client"
SOURCE = "mcp-client"


class McpSource:
    """A session's MCP servers, as one ``ToolSource``: every link runs as its task; the session's
    set is republished, in server order (configured, then the client's), whenever one changes."""

    name = SOURCE

    def __init__(self, specs: list[ServerSpec]) -> None:
        self.specs = specs
        self.links: list[ServerLink] = []

    async def serve(self, session: Agent, ready: Callable[[], None]) -> None:
        self.links = [ServerLink(spec, session, lambda: self._publish(session)) for spec in self.specs]
        session.state(Served).source = self
        waiting = set(range(len(self.links)))

        def ready_of(i: int) -> Callable[[], None]:
            def link_ready() -> None:
                waiting.discard(i)
                if not waiting:
                    ready()
            return link_ready

        async with anyio.create_task_group() as tg:
            for i, link in enumerate(self.links):
                tg.start_soon(link.run, ready_of(i), name=f"mcp {link.spec.name}")

    def _publish(self, session: Agent) -> None:
        session.publish_tools(SOURCE, [tool for link in self.links for tool in link.tools])

    def __repr__(self) -> str:
        return f"McpSource({', '.join(f'{link.spec.name}: {link.status}' for link in self.links)})"


class Served:
    """The session's ``McpSource`` (its state slot), for what the model is told of a server that is away."""

    source: McpSource | None = None


def away(session: Agent, name: str) -> tuple[str, str] | None:
    """(server, status) when ``name`` is a tool name of one of ``session``'s servers that is not
    connected now (failed to start, or gone): the model called a tool it cannot have."""
    source = session.state(Served).source
    for link in source.links if source is not None else ():
        if link.client is None and name.startswith(tool_name(link.spec.name, "")):
            return link.spec.name, link.status
    return None


@hookimpl
def dsh_after_tool(session: Agent, call: ToolCallBlock, output: ToolOutput) -> AfterTool | None:
    """A call of ``mcp__<server>__…`` that found no tool, while that server is not connected: the
    model is told which server and why, instead of "unknown tool"."""
    if output.code != "UNKNOWN_TOOL":
        return None
    found = away(session, call.name)
    if found is None:
        return None
    server, status = found
    return AfterTool(block=f"Error: {call.name} is a tool of MCP server {server!r}, which is not connected "
                           f"({status}). Its tools are unavailable until it connects; tell the person if you need it.")


dsh_config_type = config_type_hook(PLUGIN, McpClientConfig)


@hookimpl
def dsh_configure(config: object, host: Host) -> None:
    cfg = host.config_for(McpClientConfig)
    wrong = problems(cfg)
    if wrong:
        raise ConfigError(f"[config.{PLUGIN}] " + "; ".join(wrong))


@hookimpl
def dsh_client_mcp(host: Host) -> ClientMcp | None:
    return ClientMcp(http=True) if host.config_for(McpClientConfig).accept_client_servers else None


class ServerCheck:
    """``dsh doctor``: one configured server, reached from the current directory, and its tool count."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.name = f"mcp server {spec.name}"

    async def run(self) -> Finding:
        from dsh_core.doctor import Finding

        count, why = await probe(self.spec, os.getcwd())
        where = self.spec.url if self.spec.transport == "http" else self.spec.command
        if count is not None:
            return Finding(self.name, "ok", f"{self.spec.transport} {where!r} answered: {count} tool(s)")
        return Finding(self.name, "warn", f"{self.spec.transport} {where!r} did not answer: {why}",
                       "check the server's command or url in [config.mcp-client] servers; sessions retry it in the background")


@hookimpl
def dsh_register_doctor_checks(register: Callable[[ServerCheck], None], host: Host) -> None:
    for spec in from_config(host.config_for(McpClientConfig)):
        register(ServerCheck(spec))


@hookimpl
def dsh_session_tools(session: Agent, host: Host) -> McpSource | None:
    cfg = host.config_for(McpClientConfig)
    specs = from_config(cfg)
    if session.spec.parent is None and cfg.accept_client_servers:
        taken = {s.name for s in specs}
        for server in session.spec.mcp_servers:
            if server.name in taken:  # the configured one stays: its tools keep their names
                log.warning("session %s: the client's MCP server %r is left out: a configured server has that name",
                            session.session_id, server.name)
            else:
                specs.append(from_client(cfg, server))
    return McpSource(specs) if specs else None
