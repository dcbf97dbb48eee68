"""A session's language servers: started on first need, warm for the session, stopped with it.

``LspServers`` is the session's state slot (``agent.state``): one ``Connection`` per configured
server and workspace root, started lazily by the first query that needs it (one start at a
time per server; a concurrent caller waits for it), restarted by the next query after it died,
and closed by the slot's ``aclose`` when the session is disposed. The process is confined
through the host's ``Confinement`` seam exactly as a ``bash`` call of that session, narrowed to
``mode`` when configured; without the seam nothing starts (``SANDBOX_UNAVAILABLE``).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from dsh_core import ToolError

from .client import Connection, ServerFailed

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent

    from . import ServerConfig


def resolve_command(argv: list[str]) -> list[str]:
    """A bare program name found beside this Python first (a server installed in dsh's own
    environment, as the Python default is), then on PATH; anything else as it is."""
    program = argv[0]
    if os.sep in program:
        return list(argv)
    beside = os.path.join(os.path.dirname(sys.executable), program)
    if os.access(beside, os.X_OK):
        return [beside, *argv[1:]]
    found = shutil.which(program)
    return [found or program, *argv[1:]]


@dataclass
class LspServers:
    """``agent.state(LspServers)``: the session's running servers by (name, root)."""

    running: dict[tuple[str, str], Connection] = field(default_factory=dict)
    _locks: dict[tuple[str, str], anyio.Lock] = field(default_factory=dict)
    closed: bool = False

    def __repr__(self) -> str:
        return f"LspServers({', '.join(f'{n}@{r}' for n, r in self.running) or 'none'})"

    def find(self, name: str, root: str) -> Connection | None:
        """The warm server, when it is running (never starts one)."""
        conn = self.running.get((name, root))
        return conn if conn is not None and conn.alive else None

    async def get(self, agent: Agent, name: str, server: ServerConfig, root: str, *, mode: str | None,
                  timeout_s: float) -> Connection:
        """The warm server for ``name`` at ``root``, started (confined) if it is not running."""
        if self.closed:
            raise ToolError("the session is closing; no language server starts now", code="LSP_UNAVAILABLE")
        key = (name, root)
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            conn = self.running.get(key)
            if conn is not None and conn.alive:
                return conn
            if conn is not None:  # it died: say goodbye to what is left of it and start afresh
                await conn.aclose()
            confinement = agent.host.confinement
            if confinement is None:
                raise ToolError("the lsp tool needs a plugin that provides confinement (mount sandbox-tools); it "
                                "never starts a language server unconfined", code="SANDBOX_UNAVAILABLE")
            confined = await confinement.confine(resolve_command(list(server.command)), cwd=root, mode=mode,
                                                 session=agent)
            conn = Connection(name=name, root=root, languages=dict(server.extensions),
                              settings=dict(server.settings), initialization_options=server.initialization_options)
            self.running[key] = conn
            try:
                await conn.start(confined.argv, confined.env, agent.host.task_group, timeout_s)
            except ServerFailed as exc:
                raise ToolError(f"could not start {server.command[0]!r}: {exc}", code="LSP_SERVER_FAILED") from None
            return conn

    async def aclose(self) -> None:
        self.closed = True
        conns, self.running = list(self.running.values()), {}
        for conn in conns:
            await conn.aclose()

    def pids(self) -> list[Any]:
        return [c.pid for c in self.running.values() if c.pid is not None]
