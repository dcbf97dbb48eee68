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

from dsh_core import FunctionTool, ToolError, hookimpl
from dsh_core.config import PluginConfig

from . import query
from .index import IndexUnavailable, SessionIndex

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import AgentSpec, ToolContext
    from dsh_core.protocols import Host, Tool

__all__ = ["SessionIndex", "SessionQueryConfig", "index_for"]

PLUGIN = "session-query"
INDEX_FILE = "session-index.sqlite3"

PROMPT_TEXT = (
    "Use session_search to find relevant work from prior sessions, or session_event_search to search earlier "
    "events in one session. Search results are cursor-free and workspace-scoped. Follow a useful hit with "
    "session_trace, session_event_trace, or session_event_read when you need lineage, relationships, or exact data."
)


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


_TARGET = {"session_id": {"type": "string", "description": "Target session id. Omit for the current session."}}
_SEQ = {"seq": {"type": "integer", "description": "Target event sequence number."}}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **({"required": required} if required else {})}


SESSION_SEARCH = _object({
    "query": {"type": "string", "description": "Literal full-text query over prior session history."},
    "session_ids": _array("Optional session ids to include."),
    "created_at_from": {"type": "string", "description": "Inclusive timezone-qualified ISO 8601 creation-time lower bound."},
    "created_at_to": {"type": "string", "description": "Inclusive timezone-qualified ISO 8601 creation-time upper bound."},
    "parent_session_ids": _array("Optional direct parent session ids."),
    "include_root_sessions": {"type": "boolean", "description": "Include sessions with no parent in the parent filter."},
    "availability": _array("Require at least one selected source availability.", query.AVAILABILITIES),
    "event_seq_from": {"type": "integer", "description": "Inclusive event sequence lower bound."},
    "event_seq_to": {"type": "integer", "description": "Inclusive event sequence upper bound."},
    "event_time_from": {"type": "string", "description": "Inclusive timezone-qualified ISO 8601 event-time lower bound."},
    "event_time_to": {"type": "string", "description": "Inclusive timezone-qualified ISO 8601 event-time upper bound."},
    "event_types": _array("Event types to include."),
    "event_surfaces": _array("Event surfaces to include.", query.SURFACES),
}, ["query"])

EVENT_SEARCH = _object({
    **_TARGET,
    "query": {"type": "string", "description": "Literal full-text query over the target session."},
    "seq_from": {"type": "integer", "description": "Inclusive event sequence lower bound."},
    "seq_to": {"type": "integer", "description": "Inclusive event sequence upper bound."},
    "time_from": {"type": "string", "description": "Inclusive timezone-qualified ISO 8601 event-time lower bound."},
    "time_to": {"type": "string", "description": "Inclusive timezone-qualified ISO 8601 event-time upper bound."},
    "event_types": _array("Event types to include."),
    "surfaces": _array("Event surfaces to include.", query.SURFACES),
}, ["query"])

SESSION_TRACE = _object({**_TARGET}, [])
EVENT_TRACE = _object({**_TARGET, **_SEQ}, ["seq"])
EVENT_READ = _object({
    **_TARGET, **_SEQ,
    "before": {"type": "integer", "description": "Number of preceding raw events to summarize. Omit for none."},
    "after": {"type": "integer", "description": "Number of following raw events to summarize. Omit for none."},
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
            FunctionTool("session_search", "Search prior sessions in the caller workspace and return the strongest "
                         "matching event from each session.", SESSION_SEARCH, self.session_search, kind="search"),
            FunctionTool("session_event_search", "Search prior events in one authorized session; the current session "
                         "excludes the step performing this call.", EVENT_SEARCH, self.event_search, kind="search"),
            FunctionTool("session_trace", "Read the authorized session lineage around one session, including complete "
                         "visible ancestor and descendant relationships.", SESSION_TRACE, self.session_trace,
                         parallel_safe=True, kind="read"),
            FunctionTool("session_event_trace", "Read every direct replacement and relationship to a cited source "
                         "event for one event in an authorized session.", EVENT_TRACE, self.event_trace,
                         parallel_safe=True, kind="read"),
            FunctionTool("session_event_read", "Read one full unabridged event and optional neighboring raw-event "
                         "summaries from an authorized session.", EVENT_READ, self.event_read,
                         parallel_safe=True, kind="read"),
        ]


# --------------------------------------------------------------------------- hooks


@hookimpl
def dsh_config_type() -> tuple[str, type[PluginConfig]]:
    return PLUGIN, SessionQueryConfig


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
def dsh_system_prompt(spec: AgentSpec, host: Host) -> str:
    return PROMPT_TEXT
