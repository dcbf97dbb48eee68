"""dsh plugin ``lsp``: the original's ``lsp`` tool over real language servers.

``lsp {operation, file_path, line, character}`` asks the language server configured for the
file's extension (``[config.lsp.servers.<name>]``: a command, the extensions it handles and
their language ids, settings) for ``goToDefinition``, ``findReferences`` (declaration
included), ``goToImplementation`` or ``hover`` at a one-based line and UTF-16 character. The
server is started on the session's first query that needs it, confined as the session's
``bash`` is (``host.confinement``), stays warm for the session and stops with it (the session
slot ``LspServers``). No server for the extension: the original's ``LSP_UNAVAILABLE`` error.

Beyond the original: after a ``write`` or ``edit`` of a file that a warm server of the session
handles, the result is followed by the diagnostics the change introduced, bounded
(``diagnostics`` settings; ``dsh_before_tool`` takes the baseline, ``dsh_after_tool`` the
difference). See README.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio
import msgspec
from lsprotocol import types as t
from msgspec import Meta

from dsh_core import FunctionTool, ToolError, config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.doctor import Finding
from dsh_core.types import AfterTool, ToolOutput

from .client import Connection, ServerFailed
from .diagnostics import Baseline, describe, introduced, read_text, shown
from .render import OPERATIONS, format_hover, format_locations, hover_text, one_based
from .session import LspServers, resolve_command

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import Agent, Host
    from dsh_core.types import ToolCallBlock

__all__ = ["Connection", "LspConfig", "LspServers", "ServerCheck", "ServerConfig", "resolve_command"]

NAME = "lsp"

DESCRIPTION = (
    "Ask a language server about the symbol at one position of a source file, for exact code navigation. "
    "The operation argument picks the lookup: hover, goToDefinition, goToImplementation or findReferences. "
    "line and character count from 1, the character in UTF-16 code units. The references found by "
    "findReferences include the declaration itself."
)
PARAMETERS = {
    "type": "object",
    "properties": {
        "operation": {"type": "string", "enum": list(OPERATIONS),
                      "description": "Which lookup to run: hover, goToDefinition, goToImplementation or findReferences."},
        "file_path": {"type": "string", "description": "Path of the file to look in: absolute, or relative to the workspace root."},
        "line": {"type": "number", "description": "Line number of the position, counting from 1."},
        "character": {"type": "number", "description": "Column of the position, counting from 1 in UTF-16 code units."},
    },
    "required": ["operation", "file_path", "line", "character"],
    "additionalProperties": False,
}
_POS = {"type": "object", "properties": {"line": {"type": "integer"}, "character": {"type": "integer"}},
        "required": ["line", "character"]}
_RANGE = {"type": "object", "properties": {"start": _POS, "end": _POS}, "required": ["start", "end"]}
OUTPUT_SCHEMA = {"oneOf": [
    {"type": "object", "properties": {
        "kind": {"const": "locations"},
        "locations": {"type": "array", "items": {"type": "object", "properties": {"uri": {"type": "string"},
                                                                                  "range": _RANGE},
                                                 "required": ["uri", "range"]}},
        "resolvedWorkspaceUri": {"type": "string"}}, "required": ["kind", "locations", "resolvedWorkspaceUri"]},
    {"type": "object", "properties": {
        "kind": {"const": "hover"},
        "hover": {"oneOf": [{"type": "null"}, {"type": "object", "properties": {"contents": {"type": "string"},
                                                                               "range": _RANGE},
                                               "required": ["contents"]}]}},
     "required": ["kind", "hover"]},
]}


class ServerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    """``[config.lsp.servers.<name>]``: one language server."""

    command: Annotated[list[str], Meta(min_length=1, description=(
        "the server's argv (stdio); a bare name is looked up beside dsh's Python, then on PATH"))]
    extensions: Annotated[dict[str, str], Meta(description=(
        'the file extensions it handles and their LSP language ids: {".py" = "python"}'))]
    settings: Annotated[dict[str, Any], Meta(description=(
        "what the server's workspace/configuration requests read (by dotted section)"))] = {}
    initialization_options: Annotated[Any, Meta(description="initializationOptions of its initialize request")] = None
    open_wait_ms: Annotated[int, Meta(ge=0, description=(
        "a query about a file the server has not seen first waits this long at most for the server's first "
        "diagnostics of it (the sign it analysed the file and its workspace); 0: ask at once"))] = 10_000


def default_servers() -> dict[str, ServerConfig]:
    return {"python": ServerConfig(
        command=["basedpyright-langserver", "--stdio"], extensions={".py": "python", ".pyi": "python"},
        settings={"basedpyright": {"analysis": {"typeCheckingMode": "standard"}}},
    )}


class LspConfig(PluginConfig):
    """[config.lsp]"""

    servers: Annotated[dict[str, ServerConfig], Meta(description=(
        "language servers by name (default: python = basedpyright); an empty table mounts none"))] = msgspec.field(
        default_factory=default_servers)
    max_locations: Annotated[int, Meta(ge=1, description="locations shown before an omission line")] = 100
    max_result_chars: Annotated[int, Meta(ge=1, description="characters of one result, its notices included")] = 16_000
    timeout_ms: Annotated[int, Meta(ge=1, description="a server's start or one request, at most")] = 60_000
    mode: Annotated[Literal["read-only", "workspace-write", "session"], Meta(description=(
        "the servers' confinement: this tier, narrowed further by the session's, never wider; \"session\": "
        "the session's own tier"))] = "read-only"
    diagnostics: Annotated[bool, Meta(description=(
        "after a write or edit of a file a warm server handles, add the diagnostics the change introduced"))] = True
    diagnostics_severity: Annotated[Literal["error", "warning", "information", "hint"], Meta(description=(
        "the least severe diagnostic reported"))] = "warning"
    diagnostics_max: Annotated[int, Meta(ge=1, description="diagnostics listed after one change")] = 10
    diagnostics_max_chars: Annotated[int, Meta(ge=80, description="characters of that list")] = 2000
    diagnostics_wait_ms: Annotated[int, Meta(ge=0, description="how long to wait for the server's diagnostics")] = (
        5000)


def config_of(host: Host) -> LspConfig:
    return host.config_for(LspConfig)


dsh_config_type = config_type_hook(NAME, LspConfig)


@hookimpl
def dsh_register_tools(register: Callable[[Any], None], host: Host) -> None:
    register(FunctionTool(NAME, DESCRIPTION, PARAMETERS, LspTool(host).run, parallel_safe=True, kind="read",
                          output_schema=OUTPUT_SCHEMA))


@hookimpl
def dsh_register_guidance(register: Callable[[Any], None], host: Host) -> None:
    from .guidance import SECTIONS  # the text lives in its own module (guidance.py)

    for section in SECTIONS:
        register(section)


@dataclass
class ServerCheck:
    """``dsh doctor``: is a configured server's program there? (Nothing is started.)"""

    server: str
    config: ServerConfig

    @property
    def name(self) -> str:
        return f"lsp {self.server}"

    async def run(self) -> Finding:
        argv = resolve_command(list(self.config.command))
        exts = ", ".join(sorted(self.config.extensions))
        if os.access(argv[0], os.X_OK) and os.path.isfile(argv[0]):
            return Finding(self.name, "ok", f"{argv[0]} serves {exts}")
        return Finding(self.name, "warn", f"{self.config.command[0]!r} is not installed: lsp answers "
                                          f"LSP_SERVER_FAILED for {exts}",
                       fix=f"install it (on PATH or beside dsh's Python), or change [config.lsp.servers.{self.server}]")


@hookimpl
def dsh_register_doctor_checks(register: Callable[[ServerCheck], None], host: Host) -> None:
    for name, server in config_of(host).servers.items():
        register(ServerCheck(name, server))


# ---------------------------------------------------------------------- the tool


def owner_of(agent: Agent, c: LspConfig) -> Agent:
    """Whose servers a session uses: read-only servers (the default ``mode``, the narrowest tier,
    so never wider than any session's) are shared down a session's tree of subagents and belong to
    its root (children end with it); with ``mode = "session"`` each session confines its own in its tier."""
    if c.mode != "read-only":
        return agent
    while agent.spec.parent is not None:
        agent = agent.spec.parent
    return agent


def server_for(c: LspConfig, path: str) -> tuple[str, ServerConfig] | None:
    ext = os.path.splitext(path)[1].lower()
    for name, server in c.servers.items():
        if ext and ext in {e.lower() for e in server.extensions}:
            return name, server
    return None


_CAPABILITY = {"goToDefinition": "definition_provider", "findReferences": "references_provider",
               "goToImplementation": "implementation_provider", "hover": "hover_provider"}


@dataclass
class LspTool:
    host: Host

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        c = config_of(self.host)
        operation = args.get("operation")
        if operation not in OPERATIONS:
            raise ToolError(f"operation must be one of {', '.join(OPERATIONS)}", code="INVALID_ARGUMENTS")
        file_path = args.get("file_path")
        if not isinstance(file_path, str) or not file_path.strip():
            raise ToolError("file_path must be a non-empty string", code="INVALID_ARGUMENTS")
        try:
            line, character = one_based(args.get("line"), "line"), one_based(args.get("character"), "character")
        except ValueError as exc:
            raise ToolError(str(exc), code="INVALID_ARGUMENTS") from None
        root = os.path.realpath(ctx.cwd)
        path = os.path.realpath(os.path.join(root, file_path))
        chosen = server_for(c, path)
        if chosen is None:
            raise ToolError(f'no LSP provider handles "{file_path}"', code="LSP_UNAVAILABLE")
        text = await anyio.to_thread.run_sync(read_text, path)
        if text is None:
            raise ToolError(f"{file_path} does not exist or is not UTF-8 text", code="NOT_FOUND")
        timeout_s = c.timeout_ms / 1000
        name, server = chosen
        owner = owner_of(ctx.agent, c)
        servers = owner.state(LspServers)
        for attempt in (1, 2):
            conn = await servers.get(owner, name, server, root, mode=None if c.mode == "session" else c.mode,
                                     timeout_s=timeout_s)
            try:
                result = await self._ask(conn, name, server, operation, path, text, line, character, timeout_s)
                break
            except ServerFailed as exc:
                # it died before or while answering (found out only now): once more, with a fresh one
                if attempt == 1 and conn.failure is not None:
                    continue
                raise ToolError(str(exc), code="LSP_SERVER_FAILED") from None
        if operation == "hover":
            hover = None if result is None else _hover(result)
            out = ToolOutput.text(format_hover(hover, c.max_result_chars))
            out.structured = {"kind": "hover", "hover": hover}
            return out
        locations = _locations(result)
        out = ToolOutput.text(format_locations(locations, root, c.max_locations, c.max_result_chars))
        out.structured = {"kind": "locations", "locations": locations, "resolvedWorkspaceUri": file_uri(root)}
        return out

    async def _ask(self, conn: Connection, name: str, server: ServerConfig, operation: str, path: str, text: str,
                   line: int, character: int, timeout_s: float) -> Any:
        """The server's raw answer (lsprotocol types); ServerFailed when it could not give one."""
        capability = getattr(conn.capabilities, _CAPABILITY[operation], None)
        if not capability:
            raise ToolError(f"the language server {name!r} does not support {operation}",
                            code="LSP_UNSUPPORTED_OPERATION")
        known, seq = file_uri(path) in conn.docs, conn.seq
        uri, version = conn.sync(path, text)
        if not known and server.open_wait_ms and not conn.silent:  # a file it has not seen: let it analyse it
            published = await conn.diagnostics_after(uri, seq, version, server.open_wait_ms / 1000)
            if published is None and conn.seq == 0:  # it publishes none at all: never wait for it again
                conn.silent = True
        doc = t.TextDocumentIdentifier(uri=uri)
        pos = t.Position(line=line - 1, character=character - 1)
        client = conn.client
        awaitable: Coroutine[Any, Any, Any]
        if operation == "hover":
            awaitable = client.text_document_hover_async(t.HoverParams(text_document=doc, position=pos))
        elif operation == "goToDefinition":
            awaitable = client.text_document_definition_async(t.DefinitionParams(text_document=doc, position=pos))
        elif operation == "goToImplementation":
            awaitable = client.text_document_implementation_async(
                t.ImplementationParams(text_document=doc, position=pos))
        else:
            awaitable = client.text_document_references_async(t.ReferenceParams(
                text_document=doc, position=pos, context=t.ReferenceContext(include_declaration=True)))
        return await conn.request(awaitable, timeout_s)


def file_uri(path: str) -> str:
    return Path(path).as_uri()


def _range(r: t.Range) -> dict[str, Any]:
    return {"start": {"line": r.start.line, "character": r.start.character},
            "end": {"line": r.end.line, "character": r.end.character}}


def _locations(result: Any) -> list[dict[str, Any]]:
    """Location | Location[] | LocationLink[] | None as ``[{uri, range}]`` (a link's target selection)."""
    if result is None:
        return []
    items = result if isinstance(result, list | tuple) else [result]
    out = []
    for item in items:
        if isinstance(item, t.LocationLink):
            out.append({"uri": item.target_uri, "range": _range(item.target_selection_range)})
        elif isinstance(item, t.Location):
            out.append({"uri": item.uri, "range": _range(item.range)})
    return out


def _hover(result: t.Hover) -> dict[str, Any] | None:
    text = hover_text(result.contents).strip()
    if not text:
        return None
    hover: dict[str, Any] = {"contents": text}
    if result.range is not None:
        hover["range"] = _range(result.range)
    return hover


# ---------------------------------------------------------------------- diagnostics after an edit

EDIT_TOOLS = ("write", "edit")
BASELINES_KEPT = 64


@dataclass
class _Baselines:
    """The session's baselines, by tool call id, between ``dsh_before_tool`` and ``dsh_after_tool``."""

    by_call: dict[str, Baseline] = field(default_factory=dict)


def _edited_path(session: Agent, args: Mapping[str, Any]) -> str | None:
    raw = args.get("file_path", args.get("path"))
    if not isinstance(raw, str) or not raw:
        return None
    return os.path.realpath(os.path.join(session.cwd, raw))


def _warm(session: Agent, path: str) -> Connection | None:
    c = config_of(session.host)
    if not c.diagnostics:
        return None
    chosen = server_for(c, path)
    if chosen is None:
        return None
    return owner_of(session, c).state(LspServers).find(chosen[0], os.path.realpath(session.cwd))


@dataclass
class _TakeBaseline:
    session: Agent
    call_id: str
    conn: Connection
    path: str

    async def decide(self) -> None:
        c = config_of(self.session.host)
        text = await anyio.to_thread.run_sync(read_text, self.path)
        items: list[t.Diagnostic] = []
        if text is not None:
            uri = file_uri(self.path)
            doc = self.conn.docs.get(uri)
            pub = self.conn.published.get(uri)
            if doc is not None and doc.text == text and pub is not None and (pub.version or doc.version) >= doc.version:
                items = pub.items
            else:
                seq = self.conn.seq
                _, version = self.conn.sync(self.path, text)
                items = await self.conn.diagnostics_after(uri, seq, version, c.diagnostics_wait_ms / 1000) or []
        kept = self.session.state(_Baselines).by_call
        kept[self.call_id] = Baseline(self.conn, self.path, items)
        while len(kept) > BASELINES_KEPT:
            kept.pop(next(iter(kept)))


@dataclass
class _Report:
    session: Agent
    baseline: Baseline

    async def decide(self) -> AfterTool | None:
        c = config_of(self.session.host)
        conn, path = self.baseline.conn, self.baseline.path
        if not conn.alive:
            return None
        text = await anyio.to_thread.run_sync(read_text, path)
        if text is None:
            return None
        seq = conn.seq
        uri, version = conn.sync(path, text)
        after = await conn.diagnostics_after(uri, seq, version, c.diagnostics_wait_ms / 1000)
        if after is None:
            return None
        new = introduced(self.baseline.items, after, c.diagnostics_severity)
        if not new:
            return None
        where = shown(path, os.path.realpath(self.session.cwd))
        return AfterTool(context=[describe(new, where, max_items=c.diagnostics_max,
                                           max_chars=c.diagnostics_max_chars)])


@hookimpl
def dsh_before_tool(session: Agent, name: str, args: dict[str, Any], call_id: str, turn: int,
                    step: int) -> _TakeBaseline | None:
    if name not in EDIT_TOOLS:
        return None
    path = _edited_path(session, args)
    conn = _warm(session, path) if path is not None else None
    return None if conn is None or path is None else _TakeBaseline(session, call_id, conn, path)


@hookimpl
def dsh_after_tool(session: Agent, call: ToolCallBlock, output: ToolOutput) -> _Report | None:
    if call.name not in EDIT_TOOLS:
        return None
    baseline = session.state(_Baselines).by_call.pop(call.id, None)
    if baseline is None or output.is_error:
        return None
    try:
        args = json.loads(call.arguments)
    except ValueError:
        return None
    if not isinstance(args, dict) or _edited_path(session, args) != baseline.path:
        return None
    return _Report(session, baseline)
