"""dsh plugin ``session-query``: the model looks up what happened earlier — in this session, in its
subagents' sessions and in other sessions of the same workspace — with the original's five tools:
``session_search``, ``session_event_search``, ``session_event_read``, ``session_event_trace`` and
``session_trace``.

The JSONL logs (jsonl-persistence) are the source of truth; searches go through an SQLite FTS5
index that is derived from them and brought up to date before every query (``index.py``). A
session reads only what its client could resume (``query.py``). People get the same search as
``dsh sessions search QUERY`` (``cli.py``). See README.md.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from os import path as osp
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from msgspec import Meta

from dsh_core import FunctionTool, ToolError, config_type_hook, hookimpl
from dsh_core.config import PluginConfig

from . import query
from .index import IndexUnavailable, SessionIndex

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import Host, Tool

__all__ = ["SessionIndex", "SessionQueryConfig", "index_for"]

PLUGIN = "session-query"
INDEX_FILE = "session-index.sqlite3"


class SessionQueryConfig(PluginConfig):
    """[config.session-query]"""

    max_search_results: Annotated[int, Meta(ge=1, description="hits one search returns at most (then it asks "
                                                               "the model to narrow the query)")] = 100
    search_timeout_ms: Annotated[int, Meta(ge=1, le=2_147_483_647, description="how long one search may run")] = 30_000
    index: Annotated[str | None, Meta(description="the index file (default: session-index.sqlite3 beside the "
                                                  "sessions directory); it is rebuilt from the logs when missing")] = None


def index_for(sessions_root: Path, configured: str | None = None) -> SessionIndex:
    return SessionIndex(sessions_root, Path(configured) if configured else sessions_root.parent / INDEX_FILE)


# --------------------------------------------------------------------------- schemas (the original's)

def _array(description: str, enum: tuple[str, ...] | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "string", **({"enum": list(enum)} if enum else {})}
    return {"type": "array", "description": description, "items": item}



def _bounds(prefix: str) -> dict[str, Any]:
    """The event sequence and time bounds of a search (``<prefix>seq_from`` …), each inclusive."""
    return {
        f"{prefix}seq_from": {"type": "integer", "description": "Smallest event sequence number to match; the bound itself matches."},
        f"{prefix}seq_to": {"type": "integer", "description": "Largest event sequence number to match; the bound itself matches."},
        f"{prefix}time_from": {"type": "string", "description": "Earliest event time to match, ISO 8601 with a timezone; the bound itself matches."},
        f"{prefix}time_to": {"type": "string", "description": "Latest event time to match, ISO 8601 with a timezone; the bound itself matches."},
    }

_TARGET = {"session_id": {"type": "string", "description": "Id of the session to look in; leave it out to mean this session."}}
_SEQ = {"seq": {"type": "integer", "description": "Sequence number of the event in question."}}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **({"required": required} if required else {})}


SESSION_SEARCH = _object({
    "query": {"type": "string", "description": "Text to look for, taken literally, across the history of earlier sessions."},
    "session_ids": _array("Limit the search to these session ids (optional)."),
    "created_at_from": {"type": "string", "description": "Earliest session creation time to match, ISO 8601 with a timezone; the bound itself matches."},
    "created_at_to": {"type": "string", "description": "Latest session creation time to match, ISO 8601 with a timezone; the bound itself matches."},
    "parent_session_ids": _array("Keep only sessions whose immediate parent is one of these ids (optional)."),
    "include_root_sessions": {"type": "boolean", "description": "When filtering by parent, also keep top-level sessions that have no parent."},
    "availability": _array("Keep only sessions whose source has at least one of these availabilities.", query.AVAILABILITIES),
    **_bounds("event_"),
    "event_types": _array("Keep only events of these types."),
    "event_surfaces": _array("Keep only events on these surfaces.", query.SURFACES),
}, ["query"])

EVENT_SEARCH = _object({
    **_TARGET,
    "query": {"type": "string", "description": "Text to look for, taken literally, within the chosen session."},
    **_bounds(""),
    "event_types": _array("Keep only events of these types."),
    "surfaces": _array("Keep only events on these surfaces.", query.SURFACES),
}, ["query"])

SESSION_TRACE = _object({**_TARGET}, [])
EVENT_TRACE = _object({**_TARGET, **_SEQ}, ["seq"])
EVENT_READ = _object({
    **_TARGET, **_SEQ,
    "before": {"type": "integer", "description": "How many raw events before this one to show as short summaries; leave it out for none."},
    "after": {"type": "integer", "description": "How many raw events after this one to show as short summaries; leave it out for none."},
}, ["seq"])


# --------------------------------------------------------------------------- running a question


class SessionQueryTools:
    """The five tools of one host: each call runs its question in a worker thread against the
    index of the host's session store."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.config = host.config_for(SessionQueryConfig)
        self.index: SessionIndex | None = None  # made on first use: the session store is picked after the tools

    def _index(self) -> SessionIndex:
        if self.index is None:
            root = getattr(self.host.session_store, "root", None)
            if not getattr(self.host.session_store, "durable", False) or not isinstance(root, Path):
                raise ToolError("session search is disabled in this deployment (the session store keeps no logs)",
                                code="SESSION_QUERY_SEARCH_DISABLED")
            self.index = index_for(root, self.config.index)
        return self.index

    def close(self) -> None:
        if self.index is not None:
            self.index.close()

    def _caller(self, ctx: ToolContext) -> query.Caller:
        return query.Caller(id=ctx.session_id, cwd=osp.normpath(ctx.cwd),
                            live=frozenset(a.session_id for a in self.host.agents), turn=ctx.turn, step=ctx.step)

    async def _run(self, ctx: ToolContext, ask: Callable[..., str], *, search: bool) -> str:
        index = self._index()
        caller = self._caller(ctx)
        limit = self.config.search_timeout_ms / 1000
        deadline_at = time.monotonic() + limit

        def deadline() -> None:
            if search and time.monotonic() > deadline_at:
                raise ToolError(f"session search took longer than its {self.config.search_timeout_ms} ms limit; "
                                "narrow the query or add filters", code="SESSION_QUERY_TIMEOUT")

        def work() -> str:
            try:
                with index.connect() as conn:
                    if search:  # SQLite checks the clock too, inside one long statement
                        conn.set_progress_handler(lambda: int(time.monotonic() > deadline_at), 20_000)
                    try:
                        return ask(conn, index, caller, deadline)
                    except query.sqlite3.OperationalError as exc:
                        if "interrupted" in str(exc):
                            deadline()
                        raise
            except IndexUnavailable as exc:
                raise ToolError(f"session search index is unavailable: {exc}", code="SESSION_QUERY_INDEX_FAILED") from None

        return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)

    # the five executors

    async def session_search(self, args: dict[str, Any], ctx: ToolContext) -> str:
        cap = self.config.max_search_results
        return await self._run(ctx, lambda c, i, who, d: query.session_search(c, who, args, cap, d), search=True)

    async def event_search(self, args: dict[str, Any], ctx: ToolContext) -> str:
        cap = self.config.max_search_results
        return await self._run(ctx, lambda c, i, who, d: query.event_search(c, i, who, args, cap, d), search=True)

    async def session_trace(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return await self._run(ctx, lambda c, i, who, d: query.session_trace(c, who, args), search=False)

    async def event_trace(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return await self._run(ctx, lambda c, i, who, d: query.event_trace(c, i, who, args), search=False)

    async def event_read(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return await self._run(ctx, lambda c, i, who, d: query.event_read(c, i, who, args), search=False)

    def tools(self) -> list[Tool]:
        return [
            FunctionTool("session_search", "Look through earlier sessions of this workspace for text; each matching "
                         "session contributes its single best-matching event.", SESSION_SEARCH, self.session_search, kind="search"),
            FunctionTool("session_event_search", "Look for text among the events of one session you may read. In this "
                         "session, the step making this call is left out.", EVENT_SEARCH, self.event_search, kind="search"),
            FunctionTool("session_trace", "Show where one session you may read sits in its family: every visible "
                         "ancestor and descendant session and how they relate.", SESSION_TRACE, self.session_trace,
                         parallel_safe=True, kind="read"),
            FunctionTool("session_event_trace", "For one event of a session you may read, list each event that directly "
                         "replaced it and each link to a source event it cites.", EVENT_TRACE, self.event_trace,
                         parallel_safe=True, kind="read"),
            FunctionTool("session_event_read", "Fetch one event in full, nothing cut, from a session you may read, "
                         "optionally with short summaries of the raw events around it.", EVENT_READ, self.event_read,
                         parallel_safe=True, kind="read"),
        ]


# --------------------------------------------------------------------------- hooks


dsh_config_type = config_type_hook(PLUGIN, SessionQueryConfig)


def tools_of(host: Host) -> SessionQueryTools:
    found: SessionQueryTools = host.state(SessionQueryTools, lambda: SessionQueryTools(host))
    return found


@hookimpl(trylast=True)  # after the workspace tools: the tool list only grows at its end
def dsh_register_tools(register: Callable[[Tool], None], host: Host) -> None:
    for tool in tools_of(host).tools():
        register(tool)


@asynccontextmanager
async def _close_at_exit(host: Host) -> AsyncIterator[None]:
    try:
        yield
    finally:
        tools_of(host).close()


@hookimpl
def dsh_lifespan(host: Host) -> Any:
    return _close_at_exit(host)


@hookimpl
def dsh_register_guidance(register: Callable[[Any], None], host: Host) -> None:
    from .guidance import SECTIONS  # the text lives in its own module (guidance.py)

    for section in SECTIONS:
        register(section)
