"""One session's connection to one MCP server (``ServerLink``) and the tools it offers (``McpTool``).

The MCP itself is the official SDK's (``mcp.Client`` over its stdio or streamable-HTTP
transport); this module adds what a session needs around it:

- **Bounded start.** Starting, ``initialize`` and listing the tools share one deadline
  (``connect_timeout``); a server that never answers costs the session that long, no more.
- **Crash and reconnect.** The transport's read side is watched: when it ends (the process
  died, the HTTP session broke) the link reconnects after 0.5 s, 1 s, 2 s … (at most 30 s
  apart), up to ``reconnect_attempts`` failures in a row; past that its tools go away and the
  model is told. A call while the server is away is answered at once with an error.
- **Re-sync.** ``notifications/tools/list_changed`` (handshake-era servers) or a
  ``subscriptions/listen`` change event (2026-07-28 servers) lists the tools again; a failed
  listing keeps the last good set.
- **Process.** A stdio server runs with dsh's environment minus credential-shaped variables,
  plus its own ``env``, in its own process group (the SDK's transport kills the group when the
  link ends: stdin closed, 2 s, SIGTERM, 2 s, SIGKILL). Its stderr goes to an unnamed temporary
  file, never to dsh's (a client may never read that): the last of it explains a failed start.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import fcntl
import json
import logging
import math
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

import anyio
import httpx2
import mcp_types
from anyio.abc import TaskStatus
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.shared.message import SessionMessage

from dsh_core.errors import ToolError
from dsh_core.hardening import is_credential_name
from dsh_core.types import ContentBlock, McpConnected, McpFailed, TextBlock, ToolOutput, ToolSpec

from .config import ServerSpec
from .names import tool_name

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import Agent

log = logging.getLogger("dsh.mcp-client")

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 30.0
MAX_STDERR_TAIL = 2000
CLIENT_INFO = mcp_types.Implementation(name="dsh", version="0.1.0")


def backoff(failures: int) -> float:
    """Seconds before reconnect attempt ``failures`` (1-based): 0.5, 1, 2, … at most 30."""
    return min(FIRST_DELAY_S * 2 ** (failures - 1), MAX_DELAY_S)


def server_env(own: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """dsh's environment without credential-shaped variables, plus the server's own."""
    env = {k: v for k, v in os.environ.items() if not is_credential_name(k)}
    env.update(dict(own))
    return env


class McpTool:
    """One tool of one server, as the session's tool: ``mcp__<server>__<tool>``."""

    def __init__(self, link: ServerLink, tool: mcp_types.Tool) -> None:
        self.link = link
        self.remote = tool.name
        hints = tool.annotations
        read_only = bool(hints is not None and hints.read_only_hint)
        schema = dict(tool.input_schema or {})
        schema.setdefault("type", "object")
        description = tool.description or (hints.title if hints is not None and hints.title else "")
        self.spec = ToolSpec(
            name=tool_name(link.spec.name, tool.name),
            description=description or f"The {tool.name} tool of MCP server {link.spec.name}.",
            parameters=schema,
            output_schema=tool.output_schema,
            parallel_safe=read_only,
            kind="read" if read_only else None,
        )

    def __eq__(self, other: object) -> bool:  # the same tool again: the session's request stays as it was
        return isinstance(other, McpTool) and other.link is self.link and other.remote == self.remote and other.spec == self.spec

    __hash__ = None  # type: ignore[assignment]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        link = self.link
        client = link.client
        server = link.spec.name
        if client is None:
            raise ToolError(f"MCP server {server!r} is not connected ({link.status}); its tools answer again once it is back",
                            code="MCP_UNAVAILABLE")
        timeout = link.spec.call_timeout
        try:
            with anyio.fail_after(timeout):
                result = await client.call_tool(self.remote, args)
        except TimeoutError:
            raise ToolError(f"{self.remote} of MCP server {server!r} did not answer within {timeout:g} s; the call was "
                            "cancelled", code="TIMEOUT") from None
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED:  # it crashed or closed during the call: the link reconnects
                raise ToolError(f"MCP server {server!r} went away during the call of {self.remote}; it is being "
                                "restarted, so the call may be tried again shortly", code="MCP_UNAVAILABLE") from None
            raise ToolError(f"MCP server {server!r} refused the call of {self.remote}: {exc}", code="MCP_ERROR") from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError, httpx2.HTTPError) as exc:
            raise ToolError(f"the connection to MCP server {server!r} broke during the call ({type(exc).__name__})",
                            code="MCP_UNAVAILABLE") from None
        return await to_output(result, ctx)


async def to_output(result: mcp_types.CallToolResult, ctx: ToolContext) -> ToolOutput:
    """An MCP result as a tool result: texts joined, images through the attachment store when
    the route takes images, ``structuredContent`` kept for programs, ``isError`` an error."""
    texts: list[str] = []
    images: list[tuple[str, bytes]] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            texts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent):
            try:
                images.append((block.mime_type, base64.b64decode(block.data, validate=True)))
            except (binascii.Error, ValueError):
                texts.append(f"[an image ({block.mime_type}) that is not valid base64 was left out]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            text = getattr(resource, "text", None)
            texts.append(text if isinstance(text, str) else f"[resource {resource.uri} ({resource.mime_type or 'binary'})]")
        elif isinstance(block, mcp_types.ResourceLink):
            texts.append(f"[resource link: {block.uri}]")
        else:
            texts.append(f"[{getattr(block, 'type', 'content')} content left out]")
    content: list[ContentBlock] = []
    if images:
        store = ctx.host.attachment_store
        accepted = [(m, b) for m, b in images if store is not None and m in store.mime_types]
        if store is not None and ctx.route.image_input and accepted:
            try:
                content.extend(await store.save_images(accepted))
            except Exception as exc:  # a bad image: the text still reaches the model
                texts.append(f"[{len(accepted)} image(s) could not be kept: {exc}]")
        else:
            why = "the model cannot see images" if not ctx.route.image_input else "no attachment store takes them"
            texts.append(f"[{len(images)} image(s) left out: {why}]")
    if not texts and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(texts) if texts else ("(no output)" if not result.is_error else "the tool failed without saying why")
    return ToolOutput(content=[TextBlock(text=text), *content], is_error=result.is_error,
                      code="MCP_TOOL_ERROR" if result.is_error else None, structured=result.structured_content)


class ServerLink:
    """One session's connection to one server: connect, list, watch, reconnect, until cancelled."""

    def __init__(self, spec: ServerSpec, session: Agent, changed: Callable[[], None]) -> None:
        self.spec = spec
        self.session = session
        self.changed = changed  # the link's tools changed: the source publishes the session's set again
        self.client: Client | None = None
        self.tools: list[McpTool] = []
        self.status = "connecting"
        self.confinement: str | None = None  # the tier a stdio server runs in ("none": unconfined; None: http)
        self._relist = anyio.Event()
        self._stderr: TextIO | None = None

    async def run(self, ready: Callable[[], None]) -> None:
        failures = 0
        attempt = 0
        try:
            while True:
                attempt += 1
                error = await self._connect_and_serve(attempt, ready)
                if error is None:  # connected and served until it went away
                    failures = 0
                    error = "the server closed the connection"
                failures += 1
                self.client = None
                if failures > self.spec.reconnect_attempts:
                    self._give_up(error, attempt)
                    ready()
                    return
                delay = backoff(failures)
                self.status = f"reconnecting in {delay:g} s after: {error}"
                self.session.emit(McpFailed(server=self.spec.name, transport=self.spec.transport, error=error,
                                            attempt=attempt, retry_in=delay))
                ready()  # a first turn never waits for a backoff
                await anyio.sleep(delay)
        finally:
            self.client = None
            if self._stderr is not None:
                self._stderr.close()

    async def _connect_and_serve(self, attempt: int, ready: Callable[[], None]) -> str | None:
        """Connect, list, publish, then serve until the server goes away (None) or fails (why)."""
        lost = anyio.Event()
        self._relist = anyio.Event()
        try:
            # The deadline's scope encloses the client (its task groups nest inside it), and is
            # lifted once the tools are listed and the change stream is acknowledged.
            with anyio.CancelScope(deadline=anyio.current_time() + self.spec.connect_timeout) as start:
                async with Client(self._transport(lost), message_handler=self._on_message, client_info=CLIENT_INFO) as client:
                    listing = await self._list(client)
                    async with anyio.create_task_group() as tg:
                        # Listening before the tools are offered: a call the session makes at once
                        # (a fast model) that changes them is heard, not published to nobody.
                        await tg.start(self._listen, client)
                        start.deadline = math.inf
                        self.client = client
                        self._set(listing)
                        self.status = "connected"
                        self.session.emit(McpConnected(
                            server=self.spec.name, transport=self.spec.transport, tools=len(self.tools),
                            attempt=attempt, source=self.spec.source, protocol_version=client.protocol_version,
                            confinement=self.confinement))
                        ready()
                        tg.start_soon(self._resync, client)
                        await lost.wait()
                        tg.cancel_scope.cancel()
            if start.cancelled_caught:
                return (f"no answer within {self.spec.connect_timeout:g} s (start, initialize, the tool list and its change stream)"
                        + self._stderr_tail())
            return None
        except Exception as exc:
            return self._describe(exc)
        finally:
            self.client = None

    @asynccontextmanager
    async def _transport(self, lost: anyio.Event) -> AsyncIterator[Any]:
        """The SDK's transport, its read side relayed so that its end (the server went away) is seen."""
        async with AsyncExitStack() as stack:
            if self.spec.transport == "stdio":
                if self._stderr is None:
                    self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 - lives as long as the link
                    # O_APPEND: after a truncation the next server writes from the start, not past a hole
                    fcntl.fcntl(self._stderr.fileno(), fcntl.F_SETFL, fcntl.fcntl(self._stderr.fileno(), fcntl.F_GETFL) | os.O_APPEND)
                else:  # a new server process: its predecessor's last words are no longer the news
                    os.ftruncate(self._stderr.fileno(), 0)
                cwd = self.spec.cwd
                cwd = os.path.join(self.session.cwd, cwd) if cwd else self.session.cwd
                argv, env = await self._confined([self.spec.command, *self.spec.args], cwd)
                params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=cwd)
                group = Group(self._stderr)
                stack.callback(group.kill)  # after the SDK's own shutdown (LIFO): what it left behind
                read, write = await stack.enter_async_context(stdio_client(params, errlog=self._stderr))
                group.find()
            else:
                http = await stack.enter_async_context(httpx2.AsyncClient(
                    headers=dict(self.spec.headers), timeout=httpx2.Timeout(30.0, read=self.spec.call_timeout + 30.0)))
                read, write = await stack.enter_async_context(streamable_http_client(self.spec.url, http_client=http))
            send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

            async def relay() -> None:
                try:
                    async with send:
                        async for item in read:
                            await send.send(item)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass
                finally:
                    lost.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(relay)
                try:
                    yield receive, write
                finally:
                    tg.cancel_scope.cancel()
                    receive.close()

    async def _confined(self, argv: list[str], cwd: str) -> tuple[list[str], dict[str, str]]:
        """``argv`` and its environment as the server starts: confined like the session's ``bash``
        (its tier, the mechanism, the writable roots) when ``confine`` is on and the host has a
        confinement, else as is. ``confinement`` records the tier it runs in (``none``: not
        confined at all), for the log and ``/status``. A confined tier with no working mechanism
        refuses to start the server (``SANDBOX_UNAVAILABLE``), as it refuses ``bash``."""
        env = server_env(self.spec.env)
        confinement = getattr(getattr(self.session, "host", None), "confinement", None)
        if not self.spec.confine or confinement is None:
            self.confinement = "none"
            return argv, env
        if os.sep not in argv[0] and shutil.which(argv[0], path=env.get("PATH")) is None:
            raise FileNotFoundError(argv[0])  # said as "no such program", not as the wrapper's exec failure
        confined = await confinement.confine(argv, cwd=cwd, session=self.session)
        self.confinement = confined.mode
        return list(confined.argv), {**confined.env, **dict(self.spec.env)}

    async def _list(self, client: Client) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(100):  # pages; a server that pages forever is cut off
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    def _set(self, listing: list[mcp_types.Tool]) -> None:
        seen: set[str] = set()
        tools = []
        for t in listing:
            if t.name in seen:
                continue
            seen.add(t.name)
            tools.append(McpTool(self, t))
        self.tools = tools
        self.changed()

    async def _on_message(self, message: Any) -> None:
        """Handshake-era servers announce a changed tool list with a notification."""
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._relist.set()

    async def _listen(self, client: Client, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """2026-07-28 servers announce changes on a ``subscriptions/listen`` stream. Started once
        the server acknowledged it, or once it is not to be had."""
        try:
            async with client.listen(tools_list_changed=True) as sub:
                task_status.started()
                async for _event in sub:
                    self._relist.set()
        except ListenNotSupportedError:
            task_status.started()  # a handshake-era connection: the notification comes to _on_message
        except Exception as exc:  # the stream broke: the read side says whether the server is gone
            log.debug("MCP server %r: change stream ended: %r", self.spec.name, exc)
            with contextlib.suppress(RuntimeError):  # unless it was started already
                task_status.started()

    async def _resync(self, client: Client) -> None:
        while True:
            await self._relist.wait()
            self._relist = anyio.Event()
            try:
                with anyio.fail_after(self.spec.connect_timeout):
                    listing = await self._list(client)
            except Exception as exc:  # keep the last good set
                log.warning("MCP server %r: listing its changed tools failed; keeping the last list: %s",
                            self.spec.name, self._describe(exc))
                continue
            self._set(listing)
            self.session.emit(McpConnected(server=self.spec.name, transport=self.spec.transport, tools=len(self.tools),
                                           source=self.spec.source, protocol_version=client.protocol_version,
                                           confinement=self.confinement))

    def _give_up(self, error: str, attempt: int) -> None:
        names = [t.spec.name for t in self.tools]
        self.status = f"gone: {error}"
        self.tools = []
        self.changed()
        self.session.emit(McpFailed(server=self.spec.name, transport=self.spec.transport, error=error, attempt=attempt))
        if names:
            self.session.splice([TextBlock(text=(
                f"MCP server {self.spec.name!r} stopped ({error}) and did not come back after "
                f"{self.spec.reconnect_attempts} reconnect attempts; its tools ({', '.join(names)}) are gone for the "
                "rest of this session."))])

    def _describe(self, exc: BaseException) -> str:
        """Why a connection failed, for the log and the model: never a header or env value."""
        if isinstance(exc, BaseExceptionGroup):
            leaves = list(_leaves(exc))
            exc = leaves[0] if leaves else exc
        if isinstance(exc, FileNotFoundError):
            return f"cannot start {self.spec.command!r}: no such program"
        if isinstance(exc, PermissionError):
            return f"cannot start {self.spec.command!r}: permission denied"
        if isinstance(exc, httpx2.HTTPStatusError):
            return f"HTTP {exc.response.status_code} from the server"
        if isinstance(exc, httpx2.HTTPError):
            return f"cannot reach the server ({type(exc).__name__})"
        if isinstance(exc, MCPError):
            return f"{exc}{self._stderr_tail()}"
        return f"{type(exc).__name__}: {exc}{self._stderr_tail()}"

    def _stderr_tail(self) -> str:
        """The last line the server wrote to its stderr (read in place: the offset it shares is untouched)."""
        if self._stderr is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            fd = self._stderr.fileno()
            size = os.fstat(fd).st_size
            tail = os.pread(fd, MAX_STDERR_TAIL, max(0, size - MAX_STDERR_TAIL)).decode("utf-8", "replace").strip()
            if tail:
                return f"; its stderr ends: {tail.splitlines()[-1][:500]}"
        return ""


def _leaves(group: BaseExceptionGroup) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


class Group:
    """What a stdio server started, found by the stderr file it was given (``_stderr``, one per
    link): its process group, and any process still writing to that file.

    The SDK's transport stops the server itself (stdin closed, then SIGTERM and SIGKILL to its
    group), but signals the group only when the server outlives stdin's close by 2 s: a server
    that exits at once leaves its children running. Once the transport is done, ``kill`` ends
    the group and every process that still holds the file as its stderr (a child that moved to
    a session of its own included), so a session leaves no process behind."""

    def __init__(self, stderr: TextIO) -> None:
        st = os.fstat(stderr.fileno())
        self.file = (st.st_dev, st.st_ino)
        self.pgid: int | None = None
        self.started: str | None = None  # the leader's start time (/proc/<pid>/stat field 22)

    def holders(self) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    st = os.stat(f"/proc/{entry}/fd/2")
                    if (st.st_dev, st.st_ino) == self.file:
                        found.append(int(entry))
        return found

    def find(self) -> None:
        """Right after the start: the server leads a session of its own (the SDK starts it so)."""
        for pid in self.holders():
            with contextlib.suppress(OSError):
                if os.getsid(pid) == pid:
                    self.pgid, self.started = pid, _start_time(pid)
                    return

    def kill(self) -> None:
        # A group's id stays taken while any member lives; once all are gone the number may be
        # reused by a new process leading a new group: signal it only while it is still ours
        # (its leader the same process, or gone with members left, which keep the id ours).
        leader = _start_time(self.pgid) if self.pgid is not None else None
        if self.pgid is not None and (leader is None or leader == self.started):
            with contextlib.suppress(OSError):
                os.killpg(self.pgid, signal.SIGKILL)
        for pid in self.holders():
            if pid != os.getpid():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class _Probe:
    """What a link needs of a session, for ``dsh doctor``: a directory, and somewhere its events go."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd
        self.events: list[Any] = []

    def emit(self, event: Any) -> None:
        self.events.append(event)

    def splice(self, content: Any) -> None:
        pass


async def probe(spec: ServerSpec, cwd: str) -> tuple[int | None, str]:
    """Connect to ``spec`` once (no reconnect), list its tools and disconnect: (tool count, "")
    when it answered, (None, why) when it did not."""
    session = _Probe(cwd)
    link = ServerLink(dataclasses.replace(spec, reconnect_attempts=0), cast("Agent", session), lambda: None)
    answered = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(link.run, answered.set)
        await answered.wait()
        tg.cancel_scope.cancel()
    for event in session.events:
        if isinstance(event, McpConnected):
            return event.tools, ""
        if isinstance(event, McpFailed):
            return None, event.error
    return None, "no answer"
