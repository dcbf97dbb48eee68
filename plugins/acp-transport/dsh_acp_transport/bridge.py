"""The ACP bridge: sessions, prompt admission and settlement, committed-only output,
cancel, one-shot permission, teardown. ACP-n cites a rule of the door's contract,
docs/acp-contract.md (anchor #acp-n).

It programs the interface-level services of the host (``create_agent``, ``Agent``,
the approval seam, the attachment store), never the concrete loop.
"""

from __future__ import annotations

import base64
import math
import shutil
from datetime import datetime, timezone
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from os import path as osp
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from dsh_core import AttachmentCorrupt, AttachmentError, RouteError
from dsh_core.errors import DshError
from dsh_core.contracts import AgentSpec, new_id
from dsh_core.diag import debug, warn
from dsh_core.media import RASTER_MIME_TYPES, Base64Error, decode_base64_strict
from dsh_core.types import (
    AgentError,
    ApprovalOutcome,
    ApprovalRequest,
    AssistantMessageEvent,
    ImageBlock,
    InboxClaimed,
    InboxDropped,
    RequestHeader,
    SessionHeader,
    TextBlock,
    TurnEnd,
    Usage,
    UserMessage,
)

from . import wire
from .permission import tool_call_of
from .rpc import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    Peer,
    RpcFailure,
    TransportClosed,
    decode_params,
    internal_error,
    invalid_params,
)

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent
    from dsh_core.host import Host

_PROMPT_BLOCKS = msgspec.json.Decoder(wire.ContentIn)


CLOSING = "the connection is closing (the client closed stdin, or the agent was signalled to stop); "


def _embedded_text(block: wire.ResourceIn) -> tuple[str, str]:
    """(uri, text) of an embedded text resource; a blob or a malformed resource is invalid params."""
    res = block.resource
    if not isinstance(res, dict) or not isinstance(res.get("uri"), str):
        raise invalid_params("embedded resource needs a resource with a uri and text")
    if "blob" in res and "text" not in res:
        raise invalid_params(
            f"embedded binary resources are not supported ({res['uri']}); send text, or a resource_link"
        )
    if not isinstance(res.get("text"), str):
        raise invalid_params(f"embedded resource {res['uri']} has no text")
    return res["uri"], res["text"]


def agent_info() -> wire.Implementation:
    try:
        v = version("dsh-acp-transport")
    except PackageNotFoundError:  # pragma: no cover
        v = "0.0.0"
    return wire.Implementation(name="dsh", title="dsh", version=v)


# --------------------------------------------------------------------------- usage


def _add_usage(total: Usage | None, u: Usage) -> Usage:
    if total is None:
        total = Usage()
    out = Usage(
        input_tokens=total.input_tokens + u.input_tokens,
        output_tokens=total.output_tokens + u.output_tokens,
        cache_hit_tokens=total.cache_hit_tokens + u.cache_hit_tokens,
        cache_miss_tokens=total.cache_miss_tokens + u.cache_miss_tokens,
        reasoning_tokens=total.reasoning_tokens + u.reasoning_tokens,
    )
    return out


def _usage_meta(u: Usage, calls: int) -> dict[str, int]:
    """The turn's usage as ``_meta.usage`` of the prompt response (camelCase, like the wire)."""
    return {
        "inputTokens": u.input_tokens,
        "outputTokens": u.output_tokens,
        "totalTokens": u.input_tokens + u.output_tokens,
        "cacheHitTokens": u.cache_hit_tokens,
        "cacheMissTokens": u.cache_miss_tokens,
        "reasoningTokens": u.reasoning_tokens,
        "modelCalls": calls,
    }


# --------------------------------------------------------------------------- session/list

LIST_PAGE = 50
LOG_FORMAT = SessionHeader(id="-").version  # the session log format this dsh writes (and reads)


def _encode_cursor(updated_ns: int, session_id: str) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode([updated_ns, session_id])).decode("ascii")


def _decode_cursor(cursor: str) -> tuple[int, str]:
    try:
        ns, sid = msgspec.json.decode(base64.urlsafe_b64decode(cursor.encode("ascii")), type=tuple[int, str])
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise invalid_params("cursor is not one this agent gave out (pass nextCursor unchanged)") from None
    return ns, sid


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- delivery


class Delivery:
    """A per-session ordered delivery chain (ACP-6, committed-only output): frames leave in the
    order they were queued.

    Queuing is synchronous (called from the agent's event observer); a worker task
    re-reads assistant images from the store and writes each frame. ``drain`` returns
    when everything queued so far is written (or failed).
    """

    def __init__(self, bridge: "Bridge", session_id: str) -> None:
        self.bridge = bridge
        self.session_id = session_id
        self._send, self._recv = anyio.create_memory_object_stream[tuple[int, Any]](math.inf)
        self._queued = 0
        self._done = 0
        self._changed = anyio.Event()
        self.failure: str | None = None  # first failure since the last ``take_failure``

    def push(self, block: TextBlock | ImageBlock, message_id: str) -> None:
        self._queued += 1
        if self._done == self._queued - 1 and isinstance(block, TextBlock):
            # Nothing of this session is waiting: write text now, skipping the worker hop
            # (two event-loop iterations of the eight a prompt round trip takes).
            try:
                if self.bridge.peer.write_nowait(self._frame(wire.TextOut(text=block.text), message_id)):
                    self._done = self._queued
                    return
            except TransportClosed:
                self._done = self._queued
                return
        self._send.send_nowait((self._queued, (block, message_id)))

    def push_update(self, update: Any) -> None:
        """Queue a non-chunk session update (``usage_update``) behind the output already queued."""
        self._queued += 1
        self._send.send_nowait((self._queued, update))

    def _frame(self, content: Any, message_id: str) -> wire.Notification:
        return wire.Notification(
            method="session/update",
            params=wire.SessionNotification(
                session_id=self.session_id, update=wire.MessageChunk(content=content, message_id=message_id)
            ),
        )

    def take_failure(self) -> str | None:
        failure, self.failure = self.failure, None
        return failure

    async def drain(self) -> None:
        target = self._queued
        while self._done < target:
            await self._changed.wait()

    def close(self) -> None:
        self._send.close()

    async def run(self) -> None:
        async with self._recv:
            async for n, block in self._recv:
                try:
                    await self._deliver(block)
                except TransportClosed:
                    pass
                except Exception as exc:
                    if self.failure is None:
                        self.failure = str(exc)
                    warn(f"acp: assistant output delivery failed: {exc}")
                finally:
                    self._done = n
                    self._changed.set()
                    self._changed = anyio.Event()

    async def _deliver(self, item: Any) -> None:
        if isinstance(item, wire.UsageUpdate):
            await self.bridge.peer.notify(
                "session/update", wire.SessionNotification(session_id=self.session_id, update=item)
            )
            return
        block, message_id = item
        if isinstance(block, TextBlock):
            content: Any = wire.TextOut(text=block.text)
        else:
            store = self.bridge.host.attachment_store
            if store is None:
                raise RuntimeError("cannot deliver assistant image: no attachment store is mounted")
            try:
                data = await store.read_image(block)
            except (AttachmentCorrupt, OSError) as exc:
                raise RuntimeError(f"cannot deliver assistant image: {exc}") from exc
            content = wire.ImageOut(data=base64.b64encode(data).decode("ascii"), mime_type=block.mime)
        await self.bridge.peer.write(self._frame(content, message_id))


# --------------------------------------------------------------------------- sessions and prompts


@dataclass(eq=False)
class Slot:
    """One admitted prompt: the interval it is responsible for (ACP-7, settlement)."""

    request_id: Any = None
    cancelled: bool = False
    admission: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    message_id: str | None = None
    in_inbox: bool = False
    turn: int | None = None
    end: TurnEnd | None = None
    interval_error: str | None = None
    dropped: bool = False
    usage: Usage | None = None  # summed over the turn's committed model calls that reported usage
    calls: int = 0  # model calls of the turn that reported usage
    context: int = 0  # tokens in context after the last such call: its prompt plus its answer
    settled: anyio.Event = field(default_factory=anyio.Event)  # the prompt handler is done with it


@dataclass(eq=False)
class Session:
    id: str
    agent: "Agent"
    delivery: Delivery
    slot: Slot | None = None
    unsubscribe: Any = None
    permissions: set[int] = field(default_factory=set)
    cancel_seq: int = 0  # read order of the last session/cancel: it applies to every prompt read before it
    closed: anyio.Event | None = None  # set by session/close; fires when the session is disposed


class Bridge:
    """Owns one connection's sessions. One instance per ``serve``."""

    name = "acp"  # recorded as ``answeredBy`` in approval/decided events

    def __init__(
        self, host: "Host", peer: Peer, *, permission_timeout: float = 300.0, usage_updates: bool = False
    ) -> None:
        self.host = host
        self.peer = peer
        self.permission_timeout = permission_timeout
        self.usage_updates = usage_updates
        self.sessions: dict[str, Session] = {}
        self.closing: dict[str, Session] = {}  # closed by the client, still being disposed
        self.initialized = False
        self.closed = False
        self._quiesced: anyio.Event | None = None
        self._teardown_error: BaseException | None = None
        peer.requests.update(
            {
                "initialize": self.initialize,
                "authenticate": self.authenticate,
                "session/new": self.new_session,
                "session/prompt": self.prompt,
                "session/close": self.close_session,
                "session/list": self.list_sessions,
                "session/resume": self.resume_session,
                "session/delete": self.delete_session,
            }
        )
        peer.notifications["session/cancel"] = self.cancel
        peer.gate = self._gate
        peer.on_cancel_request = self._cancel_request

    # ------------------------------------------------------------------ gate

    def _gate(self, method: str) -> None:
        if method == "initialize":
            if self.initialized:
                raise RpcFailure(INVALID_REQUEST, "Invalid request: already initialized",
                                 details="initialize was already answered on this connection")
        elif not self.initialized and method in self.peer.requests:
            raise RpcFailure(INVALID_REQUEST, "Invalid request: not initialized (send initialize first)",
                             details="send initialize first")

    def _cancel_request(self, request_id: Any, method: str) -> bool:
        """``$/cancel_request`` for a ``session/prompt`` is a ``session/cancel`` of that prompt
        (ACP-8; client facts, 7). Its handler may not have started yet: then it finds the cancel
        when it does."""
        if method != "session/prompt":
            return False
        for session in self.sessions.values():
            if session.slot is not None and session.slot.request_id == request_id:
                self._cancel_session(session)
        return True

    def _cancelled_before_start(self, rid: Any, session: Session) -> bool:
        """A cancel read after this prompt but handled before its handler started (one write)."""
        entry = self.peer.inbound(rid)
        return entry is not None and (entry.cancel_requested or session.cancel_seq > entry.seq)

    # ------------------------------------------------------------------ initialize, capabilities (ACP-2)

    def image_capable(self) -> bool:
        """Truthful: a store is mounted and the configured exact route declares image input."""
        if self.host.attachment_store is None:
            return False
        try:
            provider, model = self.host.check_route()
            return bool(self.host.provider(provider).resolve(model).image_input)
        except Exception:
            return False

    async def initialize(self, rid: Any, params: msgspec.Raw | None) -> Any:
        decode_params(params, wire.InitializeParams)
        self.initialized = True
        return wire.InitializeResult(
            protocol_version=wire.PROTOCOL_VERSION,
            agent_capabilities=wire.AgentCapabilities(
                prompt_capabilities=wire.PromptCapabilities(image=self.image_capable(), embedded_context=True),
                session_capabilities=wire.SessionCapabilities(
                    close={},
                    **({"list": {}, "resume": {}, "delete": {}} if self.durable_store() is not None else {}),
                ),
            ),
            agent_info=agent_info(),
            auth_methods=[],
        )

    async def authenticate(self, rid: Any, params: msgspec.Raw | None) -> Any:
        return {}

    # ------------------------------------------------------------------ session/new (ACP-3)

    async def new_session(self, rid: Any, params: msgspec.Raw | None) -> Any:
        p = decode_params(params, wire.NewSessionParams)
        if self.closed:
            raise internal_error(CLOSING + "no session was created")
        if not osp.isabs(p.cwd):
            raise invalid_params(f"cwd must be an absolute path: {p.cwd}")
        if p.mcp_servers:
            raise invalid_params("mcpServers is not supported")
        if p.additional_directories:
            raise invalid_params("additionalDirectories is not supported")
        if not osp.isdir(p.cwd):
            raise invalid_params(f"cwd is not a directory: {p.cwd}")
        try:
            provider, model = self.host.check_route()
            agent = self.host.create_agent(AgentSpec(cwd=osp.normpath(p.cwd), provider=provider, model=model))
        except RouteError as exc:
            raise internal_error(str(exc)) from None
        if self.closed:  # lost the race with close: dispose the unpublished handle
            with anyio.CancelScope(shield=True):
                await agent.dispose()
            self.host.forget(agent)
            raise internal_error(CLOSING + "no session was created")
        self._publish(agent)
        return wire.NewSessionResult(session_id=agent.session_id)

    def _publish(self, agent: "Agent") -> Session:
        session = Session(id=agent.session_id, agent=agent, delivery=Delivery(self, agent.session_id))
        session.unsubscribe = agent.subscribe(self._observer(session))
        self.sessions[session.id] = session
        self.peer.start_soon(session.delivery.run)
        return session

    def _observer(self, session: Session) -> Any:
        def observe(agent: "Agent", event: Any) -> None:
            if agent is not session.agent:
                return
            slot = session.slot
            if isinstance(event, AssistantMessageEvent):
                for block in event.message.content:
                    if (isinstance(block, TextBlock) and block.text) or isinstance(block, ImageBlock):
                        session.delivery.push(block, event.message.id)
                if slot is not None and event.usage is not None and event.turn == slot.turn:
                    slot.usage = _add_usage(slot.usage, event.usage)
                    slot.calls += 1
                    slot.context = event.usage.input_tokens + event.usage.output_tokens
            elif slot is None:
                return
            elif isinstance(event, InboxClaimed):
                if slot.message_id in event.message_ids:
                    slot.turn = event.turn
            elif isinstance(event, TurnEnd):
                if slot.turn == event.turn:
                    slot.end = event
                    if self.usage_updates and slot.usage is not None:
                        session.delivery.push_update(self._usage_update(session, slot))
            elif isinstance(event, AgentError):
                if slot.in_inbox and event.turn != slot.turn and slot.interval_error is None:
                    slot.interval_error = event.message
            elif isinstance(event, InboxDropped):
                if slot.message_id in event.message_ids:
                    slot.dropped = True

        return observe

    # ------------------------------------------------------------------ prompt: admission, one in flight, settlement (ACP-4/5/7)

    async def prompt(self, rid: Any, params: msgspec.Raw | None) -> Any:
        p = decode_params(params, wire.PromptParams)
        if self.closed:
            raise internal_error(CLOSING + "the prompt was not run")
        session = self.sessions.get(p.session_id)
        if session is None:
            raise invalid_params(f"unknown session: {p.session_id}")
        if self._cancelled_before_start(rid, session):
            return wire.PromptResult(stop_reason="cancelled")  # nothing was submitted
        if session.slot is not None:
            raise invalid_params("a prompt is already in flight for this session")
        slot = session.slot = Slot()  # reserved before any await (ACP-5, ACP-8)
        slot.request_id = rid
        session.delivery.take_failure()
        try:
            content, images = self._admit(p.prompt)
            if images:  # the only awaited part of admission: cancel aborts it (ACP-8)
                with slot.admission:
                    await self._store_images(session, content, images)
            if slot.cancelled or self.closed:
                return wire.PromptResult(stop_reason="cancelled")
            content = [b for b in content if not (isinstance(b, TextBlock) and not b.text)]
            message = UserMessage(id=new_id("msg_"), content=content)
            slot.message_id = message.id
            try:
                session.agent.submit(message)
            except Exception as exc:
                detail = "the agent was disposed outside the bridge" if session.agent.disposed else str(exc)
                raise internal_error(f"prompt was not queued: {detail}") from None
            slot.in_inbox = True
            await session.agent.wait_idle()
            await session.delivery.drain()
            result = self._settle(session, slot)
            if slot.usage is not None:
                result.meta = {"usage": _usage_meta(slot.usage, slot.calls)}
            return result
        finally:
            session.slot = None
            slot.settled.set()

    def _settle(self, session: Session, slot: Slot) -> wire.PromptResult:
        """Settlement precedence (ACP-7), first match wins."""
        if slot.cancelled:
            return wire.PromptResult(stop_reason="cancelled")
        failure = session.delivery.take_failure()
        if failure is not None:
            raise internal_error(f"assistant output delivery failed: {failure}")
        if slot.interval_error is not None:
            raise internal_error(f"turn failed: {slot.interval_error}")
        end = slot.end
        if end is None:
            return wire.PromptResult(stop_reason="cancelled")  # turnless slot
        if end.reason == "error":
            raise internal_error(f"turn failed: {end.error}")
        if end.reason == "disposed" or (end.reason == "aborted" and end.abort_kind == "disposed"):
            return wire.PromptResult(stop_reason="cancelled")
        if end.reason == "max-steps":  # a step budget ran out; the answer so far is committed
            return wire.PromptResult(stop_reason="max_turn_requests")
        return wire.PromptResult(stop_reason="end_turn")  # completed, max-tokens, hook-aborted, blocked

    def _admit(self, raw_blocks: list[msgspec.Raw]) -> tuple[list[Any], list[tuple[int, str, bytes]]]:
        """Validate and convert a prompt without awaiting (ACP-4, prompt admission). Images are
        decoded here and returned as (index, mime, bytes) for ``_store_images``; their slots in content are None."""
        blocks: list[Any] = []
        for i, raw in enumerate(raw_blocks):
            try:
                blocks.append(_PROMPT_BLOCKS.decode(raw))
            except msgspec.ValidationError as exc:
                raise invalid_params(f"malformed prompt content block {i}: {exc}") from None
        content: list[Any] = []
        images: list[tuple[int, str, bytes]] = []

        def add_text(text: str) -> None:
            if content and isinstance(content[-1], TextBlock):
                content[-1] = TextBlock(text=content[-1].text + text)
            else:
                content.append(TextBlock(text=text))

        for block in blocks:
            if isinstance(block, wire.TextIn):
                add_text(block.text)
            elif isinstance(block, wire.ResourceLinkIn):  # a textual reference, never fetched
                prev = content[-1].text if content and isinstance(content[-1], TextBlock) else ""
                sep = "\n" if prev and not prev[-1].isspace() else ""
                add_text(f"{sep}[Resource link: {block.name} <{block.uri}>]")
            elif isinstance(block, wire.AudioIn):
                raise invalid_params("audio prompt content is not supported")
            elif isinstance(block, wire.ResourceIn):  # embedded text, e.g. an @file mention
                uri, text = _embedded_text(block)
                prev = content[-1].text if content and isinstance(content[-1], TextBlock) else ""
                sep = "\n" if prev and not prev.endswith("\n") else ""
                end = "" if text.endswith("\n") or not text else "\n"
                add_text(f"{sep}[Resource: {uri}]\n{text}{end}[End of resource: {uri}]")
            elif isinstance(block, wire.ImageIn):
                images.append((len(content), block.mime_type, self._decode_image(block)))
                content.append(None)  # placeholder, filled after the batch is saved
        if not any(isinstance(b, TextBlock) and b.text.strip() for b in content) and not images:
            raise invalid_params("empty prompt")
        return content, images

    async def _store_images(self, session: Session, content: list[Any], images: list[tuple[int, str, bytes]]) -> None:
        refs = await self._save_images(session, [(mime, data) for _, mime, data in images])
        for (index, _, _), ref in zip(images, refs, strict=False):
            content[index] = ref

    def _decode_image(self, block: wire.ImageIn) -> bytes:
        if not self.image_capable():
            raise invalid_params("inline image prompts were not advertised by this connection")
        if block.mime_type not in RASTER_MIME_TYPES:
            raise invalid_params("image mimeType must be image/png, image/jpeg, image/webp, or image/gif")
        try:
            return decode_base64_strict(block.data)
        except Base64Error:
            raise invalid_params("image data must be canonical base64") from None

    async def _save_images(self, session: Session, batch: list[tuple[str, bytes]]) -> list[ImageBlock]:
        store = self.host.attachment_store
        if store is None:
            raise invalid_params("no attachment store is mounted")
        agent = session.agent
        try:
            route = agent.provider.resolve(agent.route.model)  # the session's *current* route
        except Exception:
            raise internal_error("the current model route could not be verified for image input") from None
        if not route.image_input:
            raise invalid_params(f'model "{route.model}" does not declare image input')
        try:
            with anyio.CancelScope(shield=True):  # writes already started finish (ACP-8)
                return await store.save_images(batch)
        except AttachmentError as exc:
            raise invalid_params(str(exc)) from None
        except Exception as exc:
            warn(f"acp: saving prompt images failed: {exc!r}")
            raise internal_error("unable to persist the prompt image batch") from None

    # ------------------------------------------------------------------ usage

    def _usage_update(self, session: Session, slot: Slot) -> wire.UsageUpdate:
        """Context in use after the turn (the last call's prompt plus its answer) of the routed window."""
        return wire.UsageUpdate(used=slot.context, size=session.agent.route.context_window)

    # ------------------------------------------------------------------ session/list

    def durable_store(self) -> Any:
        """The mounted session store if its logs outlive the process (jsonl-persistence), else None."""
        store = self.host.session_store
        return store if getattr(store, "durable", False) else None

    def _needs_store(self, method: str) -> Any:
        store = self.durable_store()
        if store is None:
            detail = (f"{method} needs a durable session store (the jsonl-persistence plugin), "
                      "which this example does not mount; it was not advertised in initialize")
            raise RpcFailure(METHOD_NOT_FOUND, "Method not found", {"method": method}, details=detail)
        return store

    async def list_sessions(self, rid: Any, params: msgspec.Raw | None) -> Any:
        """Recorded top-level sessions, newest first (log mtime, then id), ``LIST_PAGE`` a page.
        The cursor is the (mtime, id) of the last row sent: pages stay consistent when
        sessions are added or touched meanwhile (a touched one moves to the front)."""
        store = self._needs_store("session/list")
        p = decode_params(params, wire.ListSessionsParams)
        if p.cwd is not None and not osp.isabs(p.cwd):
            raise invalid_params(f"cwd must be an absolute path: {p.cwd}")
        after: tuple[int, str] | None = None
        if p.cursor is not None:
            after = _decode_cursor(p.cursor)
        rows = await store.summaries(cwd=osp.normpath(p.cwd) if p.cwd else None)
        if after is not None:
            rows = [r for r in rows if (-r.updated_ns, r.id) > (-after[0], after[1])]
        page, rest = rows[:LIST_PAGE], rows[LIST_PAGE:]
        result = wire.ListSessionsResult(sessions=[
            wire.SessionInfo(
                session_id=r.id, cwd=r.cwd, updated_at=_iso(r.updated_ns),
                **({"title": r.title} if r.title else {}),
            )
            for r in page
        ])
        if rest:
            result.next_cursor = _encode_cursor(page[-1].updated_ns, page[-1].id)
        return result

    # ------------------------------------------------------------------ session/resume, session/delete

    def _open_here(self, session_id: str) -> bool:
        """Open in this process: on this connection (or closing), or any live agent of the host."""
        return (session_id in self.sessions or session_id in self.closing
                or any(a.session_id == session_id for a in self.host.agents))

    def _recorded(self, store: Any, session_id: str) -> Any:
        try:
            path = store.path_for(session_id)
        except DshError:
            raise invalid_params(f"unknown session: {session_id}") from None
        if not path.is_file():
            raise invalid_params(f"unknown session: {session_id} (no log in the session store)")
        return path

    async def resume_session(self, rid: Any, params: msgspec.Raw | None) -> Any:
        """Re-open a recorded session: history rebuilt from its log (``Agent.restore``), the route
        the log recorded last, appending to the same file. Nothing is sent to the client."""
        store = self._needs_store("session/resume")
        p = decode_params(params, wire.ResumeSessionParams)
        if self.closed:
            raise internal_error(CLOSING + "the session was not resumed")
        if not osp.isabs(p.cwd):
            raise invalid_params(f"cwd must be an absolute path: {p.cwd}")
        if p.mcp_servers:
            raise invalid_params("mcpServers is not supported")
        if p.additional_directories:
            raise invalid_params("additionalDirectories is not supported")
        self._recorded(store, p.session_id)
        if self._open_here(p.session_id):
            raise invalid_params(f"session {p.session_id} is already open in this agent process")
        try:
            contents = (await store.read(p.session_id)).contents
        except DshError as exc:
            raise internal_error(f"the session log cannot be read: {exc}") from None
        header = contents.header
        if header.version > LOG_FORMAT:
            raise invalid_params(
                f"session {p.session_id} was recorded in log format {header.version}, newer than this "
                f"dsh reads ({LOG_FORMAT}); resume it with a newer dsh"
            )
        if header.parent_session is not None:
            raise invalid_params(f"session {p.session_id} is a subagent's session; resume its parent")
        cwd = osp.normpath(p.cwd)
        if cwd != header.cwd:
            raise invalid_params(f"cwd {p.cwd} differs from the session's recorded cwd {header.cwd}")
        if not osp.isdir(cwd):
            raise invalid_params(f"cwd is not a directory: {p.cwd}")
        provider, model = header.provider, header.model
        for ev in contents.events:  # the route last recorded (a session may switch models)
            if isinstance(ev, RequestHeader):
                provider, model = ev.provider, ev.model
        if self._open_here(p.session_id):  # re-checked: the read awaited
            raise invalid_params(f"session {p.session_id} is already open in this agent process")
        try:
            self.host.check_route(provider, model)
            agent = self.host.create_agent(
                AgentSpec(cwd=cwd, provider=provider, model=model, session_id=header.id, origin=header.origin)
            )
        except RouteError as exc:
            raise internal_error(f"the recorded route {provider}/{model} is not available here: {exc}") from None
        try:
            agent.restore(contents.events)
        except Exception as exc:
            with anyio.CancelScope(shield=True):
                await agent.dispose()
            self.host.forget(agent)
            raise internal_error(f"the session could not be rebuilt from its log: {exc}") from None
        if self.closed:
            with anyio.CancelScope(shield=True):
                await agent.dispose()
            self.host.forget(agent)
            raise internal_error(CLOSING + "the session was not resumed")
        self._publish(agent)
        return {}

    async def delete_session(self, rid: Any, params: msgspec.Raw | None) -> Any:
        """Remove a closed session's log and the files plugins keep for it (spill files)."""
        store = self._needs_store("session/delete")
        p = decode_params(params, wire.DeleteSessionParams)
        path = self._recorded(store, p.session_id)
        if self._open_here(p.session_id):
            raise invalid_params(f"session {p.session_id} is open; close it (session/close) before deleting it")
        artifacts = [Path(a) for paths in self.host.pm.hook.dsh_session_artifacts(session_id=p.session_id,
                                                                                   host=self.host) if paths
                     for a in paths]

        def remove() -> None:
            path.unlink(missing_ok=True)
            for a in artifacts:
                if a.is_dir() and not a.is_symlink():
                    shutil.rmtree(a, ignore_errors=True)
                else:
                    a.unlink(missing_ok=True)

        await anyio.to_thread.run_sync(remove)
        return {}

    # ------------------------------------------------------------------ session/close

    async def close_session(self, rid: Any, params: msgspec.Raw | None) -> Any:
        """Cancel the prompt in flight (it settles ``cancelled``), withdraw a pending permission
        request (the turn's cancel cancels it), dispose the agent (children first) and forget it.
        A close racing another close of the same session waits for the same disposal."""
        p = decode_params(params, wire.CloseSessionParams)
        session = self.sessions.pop(p.session_id, None)
        if session is None:
            closing = self.closing.get(p.session_id)
            if closing is None or closing.closed is None:
                raise invalid_params(f"unknown session: {p.session_id}")
            await closing.closed.wait()
            return {}
        session.closed = anyio.Event()
        self.closing[session.id] = session
        try:
            with anyio.CancelScope(shield=True):  # a half-closed session would leak: finish it
                await self._dispose_session(session)
                slot = session.slot
                if slot is not None:
                    await slot.settled.wait()
        finally:
            self.closing.pop(session.id, None)
            session.closed.set()
        return {}

    async def _dispose_session(self, session: Session) -> None:
        if session.slot is not None:
            self._cancel_session(session, "disposed")
        try:
            await session.agent.dispose()  # cancels, waits for rest, children first, closes the log
            with anyio.move_on_after(2.0):
                await session.delivery.drain()
        finally:
            session.unsubscribe()
            session.delivery.close()
            self.host.forget(session.agent)

    # ------------------------------------------------------------------ cancel (ACP-8)

    def cancel(self, params: msgspec.Raw | None) -> None:
        try:
            p = decode_params(params, wire.CancelParams)
        except RpcFailure:
            return  # never answer a notification
        session = self.sessions.get(p.session_id)
        if session is None:
            debug(f"acp: session/cancel for unknown session {p.session_id!r} ignored")
            return
        session.cancel_seq = self.peer.read_seq  # also for prompts read before it whose handler has not run
        self._cancel_session(session)

    def _cancel_session(self, session: Session, kind: str = "user") -> None:
        slot = session.slot
        if slot is None:
            session.agent.cancel(kind)  # autonomous work
            return
        slot.cancelled = True
        if not slot.in_inbox:
            slot.admission.cancel()  # before inbox receipt: abort admission only
        else:
            session.agent.cancel(kind)

    # ------------------------------------------------------------------ permission requests (ACP-9)

    def _owned(self, agent: Any) -> Session | None:
        session = self.sessions.get(getattr(agent, "session_id", ""))
        return session if session is not None and session.agent is agent else None

    async def answer(self, request: ApprovalRequest) -> ApprovalOutcome | None:
        session = self._owned(request.agent)
        if session is None or not request.call_id:
            return None  # foreign or call-less: the next answerer decides
        if self.closed:
            return "unavailable"
        params = wire.PermissionParams(
            session_id=session.id,
            tool_call=tool_call_of(request),
            options=wire.PERMISSION_OPTIONS,
        )
        try:
            raw = await self.peer.request("session/request_permission", params, timeout=self.permission_timeout)
        except (RpcFailure, TransportClosed, TimeoutError) as exc:
            warn(f"acp: permission request failed closed: {exc!r}")
            return "unavailable"
        try:
            result = msgspec.json.decode(raw, type=wire.PermissionResult)
        except msgspec.ValidationError:
            return "rejected"
        if result.outcome.outcome == "cancelled":
            return "cancelled"
        if result.outcome.outcome == "selected" and result.outcome.option_id == "allow-once":
            return "allowed-once"
        return "rejected"  # reject-once, an option we did not offer, anything else

    # ------------------------------------------------------------------ teardown (ACP-11)

    async def quiesce(self) -> None:
        """The one memoized teardown routine shared by EOF, transport failure and disposal."""
        if self._quiesced is not None:
            await self._quiesced.wait()
            if self._teardown_error is not None:
                raise self._teardown_error
            return
        self._quiesced = anyio.Event()
        try:
            self.closed = True  # 1. close the doors
            sessions = list(self.sessions.values())
            closing = [s.closed for s in self.closing.values() if s.closed is not None]
            for s in sessions:  # 2. settle pending prompts as cancelled, stop agents
                if s.slot is not None:
                    self._cancel_session(s, "disposed")
                else:
                    s.agent.cancel("disposed")
            async with anyio.create_task_group() as tg:  # … and bring them to rest
                for s in sessions:
                    if s.agent.busy:  # a task per busy session only: 10,000 idle ones cost no tasks
                        tg.start_soon(s.agent.wait_idle)
            with anyio.move_on_after(2.0):
                for s in sessions:
                    await s.delivery.drain()
            errors: list[Exception] = []

            async def dispose(s: Session) -> None:  # 3+4. children first (Agent.dispose), in parallel
                try:
                    await s.agent.dispose()
                except Exception as exc:
                    errors.append(exc)
                finally:
                    s.unsubscribe()
                    s.delivery.close()
                    self.host.forget(s.agent)

            async with anyio.create_task_group() as tg:
                for s in sessions:
                    if s.agent.children:
                        tg.start_soon(dispose, s)  # may wait on its children: in parallel
                    else:
                        await dispose(s)  # at rest already: completes without suspending
                for event in closing:  # sessions the client closed: their close finishes them
                    tg.start_soon(event.wait)
            if errors:
                self._teardown_error = ExceptionGroup(
                    f"ACP agent teardown failed for {len(errors)} session(s)", errors
                )
                raise self._teardown_error
        finally:
            self._quiesced.set()
