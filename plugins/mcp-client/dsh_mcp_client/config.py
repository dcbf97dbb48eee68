"""``[config.mcp-client]``: the servers every session of the composition gets, whether a client
may hand a session more (ACP ``session/new``), and the bounds of both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from dsh_core.config import PluginConfig
from dsh_core.types import McpServer

Seconds = Annotated[float, Meta(gt=0, le=86_400)]
Attempts = Annotated[int, Meta(ge=0, le=100)]


class ServerConfig(PluginConfig):
    """One ``[[config.mcp-client.servers]]`` entry."""

    name: Annotated[str, Meta(min_length=1, max_length=64, description="the server's name: its tools are mcp__<name>__<tool>")]
    transport: Annotated[Literal["stdio", "http"], Meta(description="stdio: a command dsh starts; http: streamable HTTP at url")] = "stdio"
    command: Annotated[str, Meta(description="stdio: the program to start")] = ""
    args: Annotated[list[str], Meta(description="stdio: its arguments")] = msgspec.field(default_factory=list)
    env: Annotated[dict[str, str], Meta(description="stdio: variables added to the scrubbed environment (never logged)")] = msgspec.field(default_factory=dict)
    cwd: Annotated[str | None, Meta(description="stdio: where it runs (relative: to the session's directory); default the session's directory")] = None
    url: Annotated[str, Meta(description="http: the server's endpoint, e.g. http://127.0.0.1:8000/mcp")] = ""
    headers: Annotated[dict[str, str], Meta(description="http: headers sent with every request (never logged)")] = msgspec.field(default_factory=dict)
    connect_timeout: Annotated[Seconds | None, Meta(description="seconds to start, initialize and list tools (default: the plugin's)")] = None
    call_timeout: Annotated[Seconds | None, Meta(description="seconds one tool call may take (default: the plugin's)")] = None
    reconnect_attempts: Annotated[Attempts | None, Meta(description="reconnects after a crash before its tools go away (default: the plugin's)")] = None


class McpClientConfig(PluginConfig):
    """``[config.mcp-client]``"""

    servers: Annotated[list[ServerConfig], Meta(description="servers every session gets")] = msgspec.field(default_factory=list)
    accept_client_servers: Annotated[bool, Meta(description="take the servers an ACP client hands a session in session/new")] = False
    connect_timeout: Annotated[Seconds, Meta(description="seconds a server may take to start, initialize and list its tools")] = 30.0
    call_timeout: Annotated[Seconds, Meta(description="seconds one tool call may take before it is cancelled")] = 300.0
    reconnect_attempts: Annotated[Attempts, Meta(description="reconnects (exponential backoff from 0.5 s, at most 30 s apart) before a crashed server's tools go away")] = 5
    confine: Annotated[bool, Meta(description="start stdio servers confined like the session's bash (its tier, "
                                              "writable roots and mechanism); false: unconfined, as the person's own process")] = True


@dataclass(frozen=True, kw_only=True)
class ServerSpec:
    """One server as a session's link uses it, wherever it came from (``source``: ``config`` or
    ``client``). ``env`` and ``headers`` may hold secrets: ``__repr__`` leaves them out."""

    name: str
    transport: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    connect_timeout: float = 30.0
    call_timeout: float = 300.0
    reconnect_attempts: int = 5
    source: str = "config"
    confine: bool = True

    def __repr__(self) -> str:
        return f"ServerSpec({self.name!r}, {self.transport}, {self.source})"


def problems(cfg: McpClientConfig) -> list[str]:
    """What is wrong with the configured servers (each a sentence naming the server)."""
    out: list[str] = []
    seen: set[str] = set()
    for i, s in enumerate(cfg.servers):
        label = f"servers[{i}] ({s.name!r})"
        if s.name in seen:
            out.append(f"{label}: a server named {s.name!r} is already configured; names must be unique")
        seen.add(s.name)
        if s.transport == "stdio" and not s.command:
            out.append(f"{label}: a stdio server needs a command")
        if s.transport == "http" and not s.url.startswith(("http://", "https://")):
            out.append(f"{label}: an http server needs a url starting with http:// or https://")
    return out


def from_config(cfg: McpClientConfig) -> list[ServerSpec]:
    return [
        ServerSpec(
            name=s.name, transport=s.transport, command=s.command, args=tuple(s.args), env=tuple(s.env.items()),
            cwd=s.cwd, url=s.url, headers=tuple(s.headers.items()),
            connect_timeout=s.connect_timeout or cfg.connect_timeout, call_timeout=s.call_timeout or cfg.call_timeout,
            reconnect_attempts=cfg.reconnect_attempts if s.reconnect_attempts is None else s.reconnect_attempts,
            confine=cfg.confine,
        )
        for s in cfg.servers
    ]


def from_client(cfg: McpClientConfig, server: McpServer) -> ServerSpec:
    return ServerSpec(
        name=server.name, transport=server.transport, command=server.command, args=tuple(server.args),
        env=tuple(server.env), url=server.url, headers=tuple(server.headers), connect_timeout=cfg.connect_timeout,
        call_timeout=cfg.call_timeout, reconnect_attempts=cfg.reconnect_attempts, source="client", confine=cfg.confine,
    )
