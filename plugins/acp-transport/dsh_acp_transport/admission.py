"""What gets in (ACP-2, ACP-3): ``initialize`` and the gate before it, and the session
lifecycle: ``session/new``, ``list``, ``resume``, ``load``, ``fork`` (acp-editor's), ``delete``
and ``close``."""

from __future__ import annotations

import base64
import logging
import shutil
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from os import path as osp
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from dsh_acp import wire
from dsh_acp.rpc import (
    AUTH_REQUIRED,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RpcFailure,
    decode_params,
    internal_error,
    invalid_params,
    shown,
)
from msgspec import UNSET

from dsh_core import RouteError
from dsh_core.contracts import AgentSpec, new_id
from dsh_core.errors import DshError
from dsh_core.types import (
    AssistantMessageEvent,
    DurableEvent,
    HistoryForked,
    ImageBlock,
    McpServer,
    Note,
    RequestHeader,
    SessionHeader,
    TextBlock,
    ToolResultMessage,
    UserMessage,
    UserMessageEvent,
)

from .approvals import ApprovalRules
from .controls import COMMAND_ANSWERED, COMMAND_TYPED, Controls
from .delivery import Delivery
from .editor import ClientBuffers, ClientQuestions, client_buffers, client_questions
from .settlement import live_observer, observer, progress_observer
from .state import CLOSING, Session
from .waiting import Waiting

log = logging.getLogger("dsh.acp-transport")

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent, ClientMcp


def agent_info() -> wire.Implementation:
    try:
        v = version("dsh-acp-transport")
    except PackageNotFoundError:  # pragma: no cover
        v = "0.0.0"
    return wire.Implementation(name="dsh", title="dsh", version=v)



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
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")




class Admission(Controls):
    """``initialize`` (once, first) and the session lifecycle methods."""

    # ------------------------------------------------------------------ gate

    def _gate(self, method: str) -> None:
        if method == "initialize":
            if self.initialized:
                raise RpcFailure(INVALID_REQUEST, "Invalid request: already initialized",
                                 details="initialize was already answered on this connection")
        elif not self.initialized and self.peer.dispatcher.handles(method):
            raise RpcFailure(INVALID_REQUEST, "Invalid request: not initialized (send initialize first)",
                             details="send initialize first")

    # ------------------------------------------------------------------ initialize, capabilities (ACP-2)

    async def initialize(self, rid: Any, params: msgspec.Raw | None) -> Any:
        p = decode_params(params, wire.InitializeParams)
        self.initialized = True
        self.client_capabilities = p.client_capabilities if isinstance(p.client_capabilities, dict) else {}
        mcp = self.host.pm.hook.dsh_client_mcp(host=self.host)
        return wire.InitializeResult(
            protocol_version=wire.PROTOCOL_VERSION,
            agent_capabilities=wire.AgentCapabilities(
                prompt_capabilities=wire.PromptCapabilities(image=self.image_capable(), embedded_context=True),
                session_capabilities=wire.SessionCapabilities(
                    close={},
                    **({"list": {}, "resume": {}, "delete": {}} if self.durable_store() is not None else {}),
                    **({"fork": {}} if self.settings.fork and self.durable_store() is not None else {}),
                    **({"additional_directories": {}} if self.settings.additional_directories else {}),
                ),
                load_session=True if self.durable_store() is not None else UNSET,
                mcp_capabilities=wire.McpCapabilities(http=mcp.http, sse=mcp.sse) if mcp is not None else UNSET,
                auth=wire.AgentAuthCapabilities(logout={}) if self._logout() is not None else UNSET,
                meta=self._queue_capability(),
            ),
            agent_info=agent_info(),
            auth_methods=self._auth_methods() if self.settings.login else [],
        )

    def _queue_capability(self) -> Any:
        """``prompt-queue``: said the way claude-agent-acp and qoder say theirs (``promptQueueing``
        under the agent's own name in ``_meta``; ACP's schema has no field for it), with the bound."""
        limit = self.settings.prompt_queue
        return {"dsh": {"promptQueueing": True, "promptQueueLimit": limit}} if limit else UNSET

    # ------------------------------------------------------------------ login (the editor's; off in acp-agent)

    def _route_provider(self) -> Any:
        try:
            return self.host.provider(self.host.check_route()[0])
        except Exception:
            return None

    def _auth_methods(self) -> list[wire.AuthMethodOut]:
        methods = getattr(self._route_provider(), "auth_methods", None)
        if methods is None:
            return []
        auth = self.client_capabilities.get("auth")
        terminal = isinstance(auth, dict) and auth.get("terminal") is True  # only then may we offer one (ACP)
        out = []
        for m in methods():
            method = wire.AuthMethodOut(id=m.id, name=m.name)
            if m.description:
                method.description = m.description
            if terminal:
                method.type, method.args = "terminal", list(m.args)
            out.append(method)
        return out

    def _require_credential(self) -> None:
        """ACP's auth-required (-32000) while the route's provider has no credential: the client
        shows its login, instead of a session whose every prompt fails."""
        if not self.settings.login:
            return
        check = getattr(self._route_provider(), "credential_problem", None)
        problem = check() if check is not None else None
        if problem is not None:
            raise RpcFailure(AUTH_REQUIRED, "Authentication required", details=problem)

    def _logout(self) -> Any:
        """The route provider's ``logout`` when the door offers login (``login = true``), else None."""
        return getattr(self._route_provider(), "logout", None) if self.settings.login else None

    async def logout(self, rid: Any, params: msgspec.Raw | None) -> Any:
        """ACP ``logout``: the stored credential is removed, as ``dsh auth logout`` does. Sessions
        already open keep the key they hold; the next session/new answers auth-required (unless
        the environment still gives a key). Where it was removed from is in ``_meta``, never the key."""
        forget = self._logout()
        if forget is None:
            raise RpcFailure(METHOD_NOT_FOUND, "Method not found", {"method": "logout"},
                             details="the route's provider keeps no credential to remove")
        if params is not None and bytes(params).strip() != b"null":
            decode_params(params, wire.LogoutParams)  # an object (only _meta), or nothing
        removed = await anyio.to_thread.run_sync(forget)
        log.info(f"logout: the stored key was removed from {', '.join(removed)}" if removed else "logout: no stored key")
        return {"_meta": {"dsh": {"removedFrom": list(removed)}}}

    async def authenticate(self, rid: Any, params: msgspec.Raw | None) -> Any:
        if self.settings.login:
            p = decode_params(params, wire.AuthenticateParams)
            known = [m.id for m in self._auth_methods()]
            if p.method_id not in known:
                raise invalid_params(f"unknown auth method {shown(p.method_id)} (offered: {', '.join(known) or 'none'})")
            self._require_credential()
        return {}

    # ------------------------------------------------------------------ session/new (ACP-3)

    async def new_session(self, rid: Any, params: msgspec.Raw | None) -> Any:
        p = decode_params(params, wire.NewSessionParams)
        if self.closed:
            raise internal_error(CLOSING + "no session was created")
        if not osp.isabs(p.cwd):
            raise invalid_params(f"cwd must be an absolute path: {p.cwd}")
        servers = client_servers(p.mcp_servers, self.host.pm.hook.dsh_client_mcp(host=self.host))
        extra = self._additional(p.additional_directories) or ()
        if not osp.isdir(p.cwd):
            raise invalid_params(f"cwd is not a directory: {p.cwd}")
        self._require_credential()
        try:
            provider, model = self.host.check_route()
            agent = self.host.create_agent(
                AgentSpec(cwd=osp.normpath(p.cwd), provider=provider, model=model, mcp_servers=servers,
                          session_id=(sid := new_id()), buffers=self._buffers(sid, osp.normpath(p.cwd)),
                          questions=self._questions(sid), additional_directories=extra,
                          trace_context=wire.trace_context(p.meta)))
        except RouteError as exc:
            raise internal_error(str(exc)) from None
        except DshError as exc:  # the session store could not create the log
            raise internal_error(f"no session was created: {exc}") from None
        if self.closed:  # lost the race with close: dispose the unpublished handle
            with anyio.CancelScope(shield=True):
                await agent.dispose()
            self.host.forget(agent)
            raise internal_error(CLOSING + "no session was created")
        return self._opened_new(rid, agent)

    def _opened_new(self, rid: Any, agent: Agent) -> wire.NewSessionResult:
        """A new session (session/new, session/fork) published, and its answer: its id and settings."""
        session = self._publish(agent)
        self.opened(rid, session)
        state = self.session_state(agent)
        return wire.NewSessionResult(session_id=agent.session_id, config_options=state.get("configOptions", UNSET),
                                     modes=state.get("modes", UNSET))

    def _additional(self, raw: list[Any] | None) -> tuple[str, ...] | None:
        """A request's ``additionalDirectories``, checked: None when absent, else the directories
        (absolute, existing; normalised, each once). Refused (``-32602``) naming the bad entry;
        refused whole, non-empty, where the door does not take them (acp-agent, ACP-3)."""
        if raw is None:
            return None
        if not raw:
            return ()
        if not self.settings.additional_directories:
            raise invalid_params("additionalDirectories is not supported")
        out: list[str] = []
        for i, entry in enumerate(raw):
            if not isinstance(entry, str) or not entry:
                raise invalid_params(f"additionalDirectories[{i}]: expected an absolute path (a non-empty string)")
            if not osp.isabs(entry):
                raise invalid_params(f"additionalDirectories[{i}] must be an absolute path: {entry}")
            if not osp.isdir(entry):
                raise invalid_params(f"additionalDirectories[{i}] is not a directory: {entry}")
            if (d := osp.normpath(entry)) not in out:
                out.append(d)
        return tuple(out)

    def _buffers(self, session_id: str, cwd: str) -> ClientBuffers | None:
        """The editor's open files, when this composition uses them and the client offers them."""
        return client_buffers(self.client_capabilities, self.peer, session_id, cwd) if self.settings.buffers else None

    def _questions(self, session_id: str) -> ClientQuestions | None:
        """Asking the person, when this composition lets tools ask and the client offers forms."""
        if not self.settings.questions:
            return None
        return client_questions(self.client_capabilities, self.peer, session_id, self.settings.permission_timeout)

    def _watch_silence(self, session: Session, unsubscribe: Any) -> Any:
        waiting = Waiting(session, self.settings.waiting, live=self.settings.stream == "live")
        off = session.agent.subscribe(waiting.observe)
        unwatch = session.agent.watch(waiting.watch)
        self.peer.start_soon(waiting.run)

        def unsubscribe_all() -> None:
            unsubscribe()
            off()
            unwatch()
            waiting.close()

        return unsubscribe_all

    def _publish(self, agent: Agent) -> Session:
        session = Session(id=agent.session_id, agent=agent, delivery=Delivery(self.peer, self.host, agent.session_id))
        controlled = bool(self.host.pm.hook.dsh_session_controls.get_hookimpls())
        unsubscribe = agent.subscribe(observer(
            session, self.settings.usage_updates,
            on_settings=(lambda changed: self.settings_changed(session, changed)) if controlled else None,
            on_turn_end=(lambda: self.turn_ended(session)) if self.settings.commands else None))
        if self.settings.stream == "live":
            unwatch = agent.watch(live_observer(session))

            def unsubscribe_both() -> None:
                unsubscribe()
                unwatch()

            session.unsubscribe = unsubscribe_both
        else:
            session.unsubscribe = unsubscribe
        shows_progress = progress_observer(session)
        if shows_progress is not None:  # acp-editor: a running command's output so far on its card
            unwatch_progress = agent.watch_progress(shows_progress)
            before = session.unsubscribe

            def unsubscribe_progress() -> None:
                before()
                unwatch_progress()

            session.unsubscribe = unsubscribe_progress
        if self.settings.waiting > 0:  # acp-editor: a silent model call is said to be one
            session.unsubscribe = self._watch_silence(session, session.unsubscribe)
        self.sessions[session.id] = session
        return session

    # ------------------------------------------------------------------ session/list

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
            raise invalid_params(f"unknown session: {shown(session_id)}") from None
        if not path.is_file():
            raise invalid_params(f"unknown session: {session_id} (no log in the session store)")
        return path

    async def resume_session(self, rid: Any, params: msgspec.Raw | None) -> Any:
        """Re-open a recorded session: history rebuilt from its log (``Agent.restore``), on this
        agent's configured route (a different recorded route is reported in ``_meta``, not
        obeyed), appending to the same file. Nothing is sent to the client."""
        p = decode_params(params, wire.ResumeSessionParams)
        result, session, _events = await self._reopen(p, "session/resume")
        self.opened(rid, session)
        return {**result, **self.session_state(session.agent)}

    async def load_session(self, rid: Any, params: msgspec.Raw | None) -> Any:
        """``session/load``: re-open as ``session/resume`` does, then replay the conversation
        before answering — each user prompt as ``user_message_chunk``s and each committed
        assistant message as ``agent_message_chunk``s (text and images as stored; reasoning,
        tool calls and the harness's own messages are shown again only by a ``dsh_present_replay``
        implementation: acp-presentation's cards, thoughts and plans) — for clients that resume
        only this way (Toad, acpc). A slash command (``commands = true``) is shown as the person
        typed it: one whose prompt went to the model by its text instead of that prompt, one that
        answered by itself with its answer (the ``acp/command-*`` notes in the log)."""
        p = decode_params(params, wire.LoadSessionParams)
        result, session, events = await self._reopen(p, "session/load")
        typed: dict[str, str] = {}  # a command's prompt (message id) -> the command as typed
        hook = self.host.pm.hook.dsh_present_replay
        present = hook if hook.get_hookimpls() else None  # none mounted (acp-agent): not even the call
        for event in events:
            if present is not None:
                _present_again(present, session, event)
            if isinstance(event, Note) and event.kind in (COMMAND_TYPED, COMMAND_ANSWERED):
                text, message_id = event.data.get("text"), event.data.get("messageId")
                if not isinstance(text, str) or not isinstance(message_id, str):
                    continue
                if event.kind == COMMAND_TYPED:
                    typed[message_id] = text
                    continue
                reply, typed_id = event.data.get("reply"), event.data.get("typedId")
                session.delivery.push(TextBlock(text=text), typed_id if isinstance(typed_id, str) else new_id("msg_"),
                                      user=True)
                if isinstance(reply, str):
                    session.delivery.push(TextBlock(text=reply), message_id)
                continue
            if isinstance(event, HistoryForked):  # a fork (session/fork): the conversation it started from
                _show_inherited(session, event)
                continue
            if isinstance(event, UserMessageEvent) and event.message.source == "user":
                blocks, message_id, user = event.message.content, event.message.id, True
                if message_id in typed and blocks and isinstance(blocks[0], TextBlock):
                    blocks = [TextBlock(text=typed[message_id]), *blocks[1:]]  # as the person typed it
            elif isinstance(event, AssistantMessageEvent):
                blocks, message_id, user = event.message.content, event.message.id, False
            else:
                continue
            for block in blocks:
                if isinstance(block, (TextBlock, ImageBlock)):
                    session.delivery.push(block, message_id, user=user)
        await session.delivery.drain()
        failure = session.delivery.take_failure()
        if failure is not None:
            log.warning(f"session/load of {p.session_id}: part of the history could not be shown: {failure}")
        self.opened(rid, session)
        return {**result, **self.session_state(session.agent)}

    async def _reopen(self, p: wire.ResumeSessionParams, method: str) -> tuple[dict[str, Any], Session, list[Any]]:
        """The shared part of resume and load: the published session and its recorded events."""
        store = self._needs_store(method)
        servers, contents, cwd, before, extra = await self._prepare(store, p, "the session was not resumed",
                                                                    exclusive=True)
        header = contents.header
        recorded = _last_route(header, contents.events)
        if self._open_here(p.session_id):  # re-checked: the read awaited
            raise invalid_params(f"session {p.session_id} is already open in this agent process")
        # The route is this agent's own (example, then --provider/--model, DSH_PROVIDER/DSH_MODEL),
        # never the one written in the log: a log is a file anyone with the data dir can edit, and
        # obeying it would let a tampered log pick the model (a scripted one whose tool calls run).
        try:
            provider, model = self.host.check_route()
            agent = self.host.create_agent(
                AgentSpec(cwd=cwd, provider=provider, model=model, session_id=header.id, origin=header.origin,
                          mcp_servers=servers, buffers=self._buffers(header.id, cwd),
                          questions=self._questions(header.id), additional_directories=extra)
            )
        except RouteError as exc:
            raise internal_error(f"no model route to resume on: {exc}") from None
        except DshError as exc:  # the log is open in another dsh process (its lock), or unwritable
            raise invalid_params(str(exc)) from None
        try:
            agent.restore(contents.events)
        except Exception as exc:
            await self._abandon(agent)
            raise internal_error(f"the session could not be rebuilt from its log: {exc}") from None
        if self.settings.remember_approvals:  # the person's "always" answers, as far as a file may give them
            agent.state(ApprovalRules).fold(contents.events)
        if extra != before:  # the client gave another list: the log says so, for the next resume
            agent.emit(Note(kind=DIRECTORIES, data={"directories": list(extra)}))
        if self.closed:
            await self._abandon(agent)
            raise internal_error(CLOSING + "the session was not resumed")
        session = self._publish(agent)
        if recorded != (provider, model):
            note = (f"session {header.id} was recorded on {recorded[0]}/{recorded[1]}; it resumes on this "
                    f"agent's route {provider}/{model}")
            log.warning(f"{note}")
            return ({"_meta": {"dsh": {"route": f"{provider}/{model}", "recordedRoute": f"{recorded[0]}/{recorded[1]}",
                                       "note": note}}}, session, list(contents.events))
        return {}, session, list(contents.events)

    async def _prepare(self, store: Any, p: wire.ResumeSessionParams | wire.ForkSessionParams, refused: str, *,
                       exclusive: bool) -> tuple[tuple[McpServer, ...], Any, str, tuple[str, ...], tuple[str, ...]]:
        """What resume, load and fork check and read before they build an agent: not closing (else
        ``refused``), the client's MCP servers, its ``additionalDirectories``, the session recorded, a
        credential, and (``exclusive``: resume and load) not open here; then the log read and its cwd
        checked. Returns the servers, the log's contents, the cwd, the recorded additional directories
        and the ones the new agent gets (those asked for, else the recorded ones kept)."""
        if self.closed:
            raise internal_error(CLOSING + refused)
        servers = _check_resume_params(p, self.host.pm.hook.dsh_client_mcp(host=self.host))
        asked = self._additional(p.additional_directories)
        self._recorded(store, p.session_id)
        self._require_credential()
        if exclusive and self._open_here(p.session_id):
            raise invalid_params(f"session {p.session_id} is already open in this agent process")
        try:
            contents = (await store.read(p.session_id)).contents
        except DshError as exc:
            raise internal_error(f"the session log cannot be read: {exc}") from None
        cwd = _check_resumable(p, contents.header)
        before = recorded_directories(contents.header, contents.events)
        return servers, contents, cwd, before, self._kept_directories(before) if asked is None else asked

    def _kept_directories(self, recorded: tuple[str, ...]) -> tuple[str, ...]:
        """A resumed session's recorded additional directories, when the request names none: kept
        where the door takes them (each still a directory, else ``-32602`` naming it: pass the
        list to replace it); dropped where it does not (acp-agent resumes with the workspace only)."""
        if not self.settings.additional_directories:
            return ()
        for d in recorded:
            if not osp.isdir(d):
                raise invalid_params(f"the session's additional directory {d} is no longer a directory; "
                                     "pass additionalDirectories to replace the recorded list")
        return recorded

    # ------------------------------------------------------------------ session/fork (unstable ACP)

    async def fork_session(self, rid: Any, params: msgspec.Raw | None) -> Any:
        """``session/fork``: a new session (new id, its own log whose header names the source in
        ``forkedFrom``) that starts from the recorded session's committed history — up to its
        last ended turn — and its settings (model, thinking, mode; never full-access from a file,
        as resume). The source is only read: it may be open (here or in another process) or
        closed, and nothing of it changes. ``cwd`` must be the source's; ``additionalDirectories``
        absent means the source's recorded ones. Answered as session/new is."""
        store = self._needs_store("session/fork")
        p = decode_params(params, wire.ForkSessionParams)
        servers, contents, cwd, _, extra = await self._prepare(store, p, "no session was created", exclusive=False)
        header = contents.header
        try:
            provider, model = self.host.check_route()
            agent = self.host.create_agent(
                AgentSpec(cwd=cwd, provider=provider, model=model, session_id=(sid := new_id()), mcp_servers=servers,
                          buffers=self._buffers(sid, cwd), questions=self._questions(sid),
                          additional_directories=extra, forked_from=header.id))
        except RouteError as exc:
            raise internal_error(str(exc)) from None
        except DshError as exc:
            raise internal_error(f"no session was created: {exc}") from None
        try:
            agent.restore(contents.events, fork_of=header.id)
        except Exception as exc:
            await self._abandon(agent)
            raise internal_error(f"the session could not be forked from its log: {exc}") from None
        if self.closed:
            await self._abandon(agent)
            raise internal_error(CLOSING + "no session was created")
        return self._opened_new(rid, agent)

    async def _abandon(self, agent: Agent) -> None:
        """Dispose and forget an agent built for a resume that does not go through."""
        with anyio.CancelScope(shield=True):
            await agent.dispose()
        self.host.forget(agent)

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
        delete = getattr(store, "delete", None)
        if delete is None:  # a store without cross-process locks: remove what it names
            await anyio.to_thread.run_sync(_remove, [path, *artifacts])
            return {}
        try:  # refused while any dsh process (another client's connection too) has it open
            await delete(p.session_id, artifacts)
        except DshError as exc:
            raise invalid_params(str(exc)) from None
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
                raise invalid_params(f"unknown session: {shown(p.session_id)}")
            await closing.closed.wait()
            return {}
        session.closed = anyio.Event()
        self.closing[session.id] = session
        waiting = list(session.queued)  # prompts in line (prompt-queue): answered cancelled before the close
        try:
            with anyio.CancelScope(shield=True):  # a half-closed session would leak: finish it
                await self._dispose_session(session)
                slot = session.slot
                if slot is not None:
                    await slot.settled.wait()
                for queued in waiting:
                    await queued.settled.wait()
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


def _present_again(present: Any, session: Session, event: Any) -> None:
    """session/load: what a presentation plugin shows again for ``event`` (``dsh_present_replay``)."""
    try:
        shown_then = [u for updates in present(session=session.agent, event=event) for u in updates or ()]
    except Exception as exc:  # a presentation plugin's bug costs its updates, never the load
        log.warning(f"replaying {type(event).__name__} failed: {exc!r}")
        shown_then = []
    for update in shown_then:
        session.delivery.push_update(update)


def _show_inherited(session: Session, event: HistoryForked) -> None:
    """session/load of a fork: the text of the conversation it inherited, as load shows its own."""
    for message in event.history():
        if isinstance(message, ToolResultMessage) or (isinstance(message, UserMessage) and message.source != "user"):
            continue
        for block in message.content:
            if isinstance(block, (TextBlock, ImageBlock)):
                session.delivery.push(block, message.id, user=isinstance(message, UserMessage))


def _remove(paths: list[Path]) -> None:
    for a in paths:
        if a.is_dir() and not a.is_symlink():
            shutil.rmtree(a, ignore_errors=True)
        else:
            a.unlink(missing_ok=True)


def _check_resume_params(p: wire.ResumeSessionParams, mcp: ClientMcp | None) -> tuple[McpServer, ...]:
    """What session/resume refuses before it looks at the store; the MCP servers it takes."""
    if not osp.isabs(p.cwd):
        raise invalid_params(f"cwd must be an absolute path: {p.cwd}")
    return client_servers(p.mcp_servers, mcp)


def client_servers(raw: list[Any] | None, mcp: ClientMcp | None) -> tuple[McpServer, ...]:
    """The ``mcpServers`` a client handed a session, read and checked (ACP-3): refused whole
    (``-32602``) unless the composition takes them (``dsh_client_mcp``), and then one of a
    transport it does not take, a malformed entry, or two entries of one name."""
    if not raw:
        return ()
    if mcp is None:
        raise invalid_params("mcpServers is not supported")
    servers: list[McpServer] = []
    for i, entry in enumerate(raw):
        kind = entry.get("type", "stdio") if isinstance(entry, dict) else None
        try:
            if kind == "stdio":
                stdio = msgspec.convert(entry, wire.McpServerStdio)
                server = McpServer(name=stdio.name, transport="stdio", command=stdio.command, args=tuple(stdio.args),
                                   env=tuple((e.name, e.value) for e in stdio.env))
            elif kind in ("http", "sse"):
                remote = msgspec.convert(entry, wire.McpServerRemote)
                server = McpServer(name=remote.name, transport=remote.type, url=remote.url,
                                   headers=tuple((h.name, h.value) for h in remote.headers))
            else:
                raise invalid_params(f"mcpServers[{i}]: expected an object with type stdio, http or sse")
        except msgspec.ValidationError as exc:
            raise invalid_params(f"mcpServers[{i}]: {exc}") from None
        if not mcp.accepts(server.transport):
            raise invalid_params(f"mcpServers[{i}] ({server.name!r}): {server.transport} MCP servers are not supported "
                                 f"(mcpCapabilities.{server.transport} is false)")
        if not server.name.strip():
            raise invalid_params(f"mcpServers[{i}]: the name is empty")
        if server.transport == "stdio" and not server.command:
            raise invalid_params(f"mcpServers[{i}] ({server.name!r}): the command is empty")
        if server.transport != "stdio" and not server.url.startswith(("http://", "https://")):
            raise invalid_params(f"mcpServers[{i}] ({server.name!r}): the url must start with http:// or https://")
        if any(s.name == server.name for s in servers):
            raise invalid_params(f"mcpServers[{i}]: two servers are named {server.name!r}; names must be unique")
        servers.append(server)
    return tuple(servers)


def _check_resumable(p: wire.ResumeSessionParams, header: SessionHeader) -> str:
    """The session's cwd, once its recorded header says this process may resume it here."""
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
    return cwd


DIRECTORIES = "acp/additional-directories"  # a note: the list a resume or load replaced the recorded one with


def recorded_directories(header: SessionHeader, events: list[DurableEvent]) -> tuple[str, ...]:
    """A session's additional directories as its log last says: the header's, or the last note
    of a resume that gave another list."""
    found = tuple(header.additional_directories)
    for ev in events:
        if isinstance(ev, Note) and ev.kind == DIRECTORIES:
            dirs = ev.data.get("directories")
            if isinstance(dirs, list) and all(isinstance(d, str) for d in dirs):
                found = tuple(dirs)
    return found


def _last_route(header: SessionHeader, events: list[DurableEvent]) -> tuple[str, str]:
    """The route last recorded (a session may switch models): the header's, or the last request's."""
    provider, model = header.provider, header.model
    for ev in events:
        if isinstance(ev, RequestHeader):
            provider, model = ev.provider, ev.model
    return provider, model
