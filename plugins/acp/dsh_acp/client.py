"""The client side of ACP: drive another ACP agent over stdio, one process per client.

``open_client(argv, cwd=…, env=…)`` spawns the agent in its own process session (its
own process group; ``proctree``), speaks JSON-RPC to it through ``rpc.Peer`` over raw pipes
with the Structs of ``wire``, and on exit shuts it down in tiers: close stdin and wait
``eof_grace`` for the whole tree to exit, then SIGTERM the tree, wait ``term_grace``, then
SIGKILL, and finally *prove* the tree is gone (``proctree.ProcessTree.stop``).

    async with open_client(argv, cwd=cwd, env=scrub_env(extra={...}), on_permission=policy) as c:
        await c.start()                       # initialize (version checked) + session/new
        result = await c.prompt("task", on_text=print)
        result.stop_reason, result.text

Only committed ``agent_message_chunk`` text is collected; thoughts, tool updates, plans
and everything else are ignored. ``session/request_permission`` goes to the
``on_permission`` callback, which answers ``"allow"``, ``"reject"`` or ``"cancelled"``;
the client picks an *offered* option (never invents one) and fails closed. The child's
stderr is drained continuously into a bounded tail (and optionally forwarded), so a
chatty child never blocks on a full pipe (docs/acp-contract.md#client-facts, 4).

Many sessions on one connection (``dsh batch``): ``await c.initialize()`` once, then
``s = await c.new_session(cwd, on_permission=…)`` per task; each ``AcpSession`` has its own
``prompt``/``cancel``/``close`` and collects only its own text and permission questions.
``close`` sends ``session/close`` only when the agent advertised
``sessionCapabilities.close``; otherwise it only forgets the session on the client side.
"""

from __future__ import annotations

import logging
import os
import re
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

import anyio
import anyio.abc
import msgspec

from . import wire
from .fdstream import FdReader, FdWriter, TransportClosed
from .proctree import ExitStatus, ProcessTree, SpawnError, SurvivorsError, spawn, tree_pids
from .rpc import DEFAULT_MAX_FRAME, Dispatcher, Peer, RpcFailure
from .wire import PROTOCOL_VERSION

log = logging.getLogger("dsh.acp-client")

__all__ = [
    "AcpClient",
    "AcpClientError",
    "AcpSession",
    "PermissionAsk",
    "PromptResult",
    "open_client",
    "scrub_env",
    "tree_pids",
]

CREDENTIAL_SHAPED = re.compile(r"KEY|PASSWORD|SECRET|TOKEN", re.IGNORECASE)

PermissionVerdict = Literal["allow", "reject", "cancelled"]


class AcpClientError(Exception):
    """The child could not be started or spoke something other than ACP v1."""


# --------------------------------------------------------------------------- environment


def scrub_env(
    base: Mapping[str, str] | None = None,
    *,
    extra: Mapping[str, str] | None = None,
    inherit: Iterable[str] = (),
) -> dict[str, str]:
    """``base`` (default ``os.environ``) without credential-shaped variables
    (KEY/PASSWORD/SECRET/TOKEN in the name) and without ambient ``DSH_*``; the names in
    ``inherit`` are kept anyway (explicit configuration), then ``extra`` is merged on top."""
    base = os.environ if base is None else base
    keep = set(inherit)
    env = {
        k: v
        for k, v in base.items()
        if k in keep or not (CREDENTIAL_SHAPED.search(k) or k.startswith("DSH_"))
    }
    env.update(extra or {})
    return env


@dataclass
class PermissionAsk:
    """What the child asks: its tool call id, title and kind (as it states them), and options."""

    session_id: str
    tool_call_id: str
    title: str | None
    kind: str | None
    options: list[tuple[str, str]]  # (option id, kind)

    def describe(self) -> str:
        what = self.title or self.kind or "a tool call"
        return f"{what} (tool call {self.tool_call_id})" if self.tool_call_id else what


@dataclass
class PromptResult:
    """How a prompt ended. ``stop_reason`` is ACP's (end_turn, cancelled, max_tokens,
    refusal, max_turn_requests, …) or ``"error"`` with ``error`` set; ``text`` is the
    committed agent text received, partial when cancelled or failed."""

    stop_reason: str
    text: str
    session_id: str | None = None
    error: str | None = None
    # set by AcpSession.prompt when stop_reason == "error": "rpc" (the agent answered a
    # JSON-RPC error, ``error_code``), "closed" (the connection or the process went away),
    # "malformed" (an undecodable result)
    error_kind: str | None = None
    error_code: int | None = None
    meta: dict[str, Any] | None = None  # the result's ``_meta`` (dsh says ``{"dsh": {"turnEnd": …}}``)


PermissionPolicy = Callable[[PermissionAsk], Awaitable[PermissionVerdict]]


def _meta_of(result: wire.PromptResult) -> dict[str, Any] | None:
    return result.meta if isinstance(result.meta, dict) else None


def _client_version() -> str:
    try:
        return version("dsh-acp")
    except PackageNotFoundError:  # pragma: no cover
        return "0.0.0"


_CANCELLED = wire.PermissionResult(outcome=wire.PermissionOutcome(outcome="cancelled"))


def _prompt_params(session_id: str, text: str) -> wire.PromptParams:
    """One text block, encoded once here (the door decodes blocks one by one, so they travel raw)."""
    block = msgspec.Raw(wire.encoder.encode(wire.TextOut(text=text)))
    return wire.PromptParams(session_id=session_id, prompt=[block])


def pick_option(options: Sequence[tuple[str, str]], verdict: str) -> str | None:
    """The offered option for a verdict: allow → allow_once, else allow_always; reject →
    reject_once, else reject_always. None → answer ``cancelled`` (never invent an id)."""
    order = {"allow": ("allow_once", "allow_always"), "reject": ("reject_once", "reject_always")}.get(verdict, ())
    for kind in order:
        for option_id, option_kind in options:
            if option_kind == kind:
                return option_id
    return None


# --------------------------------------------------------------------------- the client


@dataclass(eq=False)
class AcpClient:
    """One spawned ACP agent and (at most) one session on it. Build with ``open_client``."""

    argv: list[str]
    cwd: str
    peer: Peer
    process: anyio.abc.Process
    on_permission: PermissionPolicy | None = None
    stderr_limit: int = 64 * 1024
    on_stderr: Callable[[bytes], None] | None = None
    eof_grace: float = 2.0
    term_grace: float = 2.0
    session_id: str | None = None
    agent_info: dict[str, Any] | None = None
    stderr_tail: deque[bytes] = field(default_factory=deque)
    _stderr_size: int = 0
    _text: list[str] = field(default_factory=list)
    _on_text: Callable[[str], Any] | None = None
    _permission_scopes: set[anyio.CancelScope] = field(default_factory=set)
    _cancel_sent: bool = False
    _closed: anyio.Event = field(default_factory=anyio.Event)
    _shutdown_done: bool = False
    _shutdown_finished: anyio.Event = field(default_factory=anyio.Event)
    exit_status: str | None = None  # "eof", "sigterm", "sigkill" once shut down
    _tg: Any = None
    _service_scopes: set[anyio.CancelScope] = field(default_factory=set)
    agent_capabilities: dict[str, Any] | None = None
    _initialized: bool = False
    _sessions: dict[str, AcpSession] = field(default_factory=dict)

    def _start_service(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn`` in the client's task group, shielded from the caller's cancellation
        (cancelling the caller must still let the child's answer in); stopped on close."""

        async def run() -> None:
            with anyio.CancelScope(shield=True) as scope:
                self._service_scopes.add(scope)
                try:
                    await fn(*args)
                finally:
                    self._service_scopes.discard(scope)

        assert self._tg is not None
        self._tg.start_soon(run)

    def _stop_services(self) -> None:
        for scope in list(self._service_scopes):
            scope.cancel()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def tree(self) -> ProcessTree:
        return ProcessTree(self.process)

    def stderr_text(self) -> str:
        return b"".join(self.stderr_tail).decode("utf-8", "replace")

    @property
    def text(self) -> str:
        """Committed agent text received so far for the current prompt."""
        return "".join(self._text)

    # ------------------------------------------------------------------ protocol

    async def start(self, *, timeout: float | None = 30.0, meta: dict[str, Any] | None = None) -> str:
        """``initialize`` (the agent must answer protocol version 1), then ``session/new`` (with
        ``meta`` as its ``_meta``, e.g. a W3C ``traceparent``)."""
        await self.initialize(timeout=timeout)
        raw = await self._call(
            "session/new", wire.NewSessionParams(cwd=os.path.abspath(self.cwd), mcp_servers=[], meta=meta or None),
            timeout=timeout,
        )
        self.session_id = msgspec.json.decode(raw, type=wire.NewSessionResult).session_id
        return self.session_id

    async def initialize(self, *, timeout: float | None = 30.0) -> dict[str, Any]:
        """``initialize`` once (the agent must answer protocol version 1); returns the
        agent's capabilities (``{}`` when it sent none)."""
        if self._initialized:
            return self.agent_capabilities or {}
        raw = await self._call(
            "initialize",
            wire.InitializeParams(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities={"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False},
                client_info={"name": "dsh", "version": _client_version()},
            ),
            timeout=timeout,
        )
        init = msgspec.json.decode(raw, type=wire.LenientInitializeResult)
        if init.protocol_version != PROTOCOL_VERSION:
            raise AcpClientError(
                f"the ACP agent {self.argv[0]!r} answered protocol version {init.protocol_version!r}; "
                f"dsh speaks version {PROTOCOL_VERSION}"
            )
        self.agent_info = init.agent_info
        self.agent_capabilities = init.agent_capabilities if isinstance(init.agent_capabilities, dict) else {}
        self._initialized = True
        return self.agent_capabilities

    def _session_capability(self, name: str) -> bool:
        caps = (self.agent_capabilities or {}).get("sessionCapabilities")
        return isinstance(caps, dict) and isinstance(caps.get(name), dict)

    async def resume(self, session_id: str, *, timeout: float | None = 30.0) -> str:
        """``initialize``, then ``session/resume`` of a recorded session in this client's cwd
        (the agent must advertise ``sessionCapabilities.resume``); it becomes the current session."""
        await self.initialize(timeout=timeout)
        if not self._session_capability("resume"):
            raise AcpClientError(f"the ACP agent {self.argv[0]!r} does not offer session/resume")
        await self._call("session/resume", {"sessionId": session_id, "cwd": os.path.abspath(self.cwd)},
                         timeout=timeout)
        self.session_id = session_id
        return session_id

    async def list_sessions(self, cwd: str | None = None, *, timeout: float | None = 30.0) -> list[dict[str, Any]]:
        """Every recorded session the agent lists (``session/list``, all pages), newest first."""
        await self.initialize(timeout=timeout)
        if not self._session_capability("list"):
            raise AcpClientError(f"the ACP agent {self.argv[0]!r} does not offer session/list")
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {}
            if cwd is not None:
                params["cwd"] = os.path.abspath(cwd)
            if cursor is not None:
                params["cursor"] = cursor
            page = msgspec.json.decode(await self._call("session/list", params, timeout=timeout))
            if not isinstance(page, dict) or not isinstance(page.get("sessions"), list):
                raise AcpClientError("malformed session/list result")
            out += [s for s in page["sessions"] if isinstance(s, dict)]
            cursor = page.get("nextCursor")
            if not isinstance(cursor, str):
                return out

    @property
    def can_close_sessions(self) -> bool:
        """The agent advertised ``sessionCapabilities.close`` (so ``session/close`` exists)."""
        caps = (self.agent_capabilities or {}).get("sessionCapabilities")
        return isinstance(caps, dict) and isinstance(caps.get("close"), dict)

    @property
    def alive(self) -> bool:
        """The connection is open and the process has not exited."""
        return not self.peer.closed and self.process.returncode is None

    async def new_session(
        self, cwd: str | None = None, *, on_permission: PermissionPolicy | None = None, timeout: float | None = 30.0
    ) -> AcpSession:
        """Open one more session on this connection (``initialize`` first, once)."""
        await self.initialize(timeout=timeout)
        where = os.path.abspath(cwd or self.cwd)
        raw = await self._call("session/new", wire.NewSessionParams(cwd=where, mcp_servers=[]), timeout=timeout)
        sid = msgspec.json.decode(raw, type=wire.NewSessionResult).session_id
        session = AcpSession(client=self, session_id=sid, cwd=where, on_permission=on_permission)
        self._sessions[sid] = session
        return session

    async def _call(self, method: str, params: Any, *, timeout: float | None = None) -> msgspec.Raw:
        try:
            return await self.peer.request(method, params, timeout=timeout)
        except RpcFailure as exc:
            if self.peer.closed:
                raise AcpClientError(await self._gone(f"{method} failed: the agent closed the connection")) from None
            raise AcpClientError(f"{method} failed: {exc.message} (code {exc.code})") from None
        except TransportClosed:
            raise AcpClientError(await self._gone(f"{method} failed: the agent's stdin is closed")) from None
        except TimeoutError:
            raise AcpClientError(f"{method} timed out after {timeout} s") from None

    async def _gone(self, message: str) -> str:
        with anyio.move_on_after(0.5):  # let the exit status and the last stderr arrive
            await self.process.wait()
            await anyio.sleep(0.02)
        code = self.process.returncode
        tail = self.stderr_text().strip().splitlines()[-5:]
        detail = f" (exit status {code})" if code is not None else ""
        return message + detail + (": " + " | ".join(tail) if tail else "")

    async def prompt(
        self, text: str, *, on_text: Callable[[str], Any] | None = None, cancel_grace: float = 2.0
    ) -> PromptResult:
        """Send one text prompt and wait for its stop reason. Never raises for agent-side
        failures: an RPC error or a lost connection is ``stop_reason="error"``.

        If the caller is cancelled, the request itself is not withdrawn: ``session/cancel``
        goes out and the agent gets ``cancel_grace`` seconds (shielded) to settle, so its
        committed partial output arrives in ``self.text``; then the cancellation propagates."""
        if self.session_id is None:
            raise AcpClientError("prompt before start()")
        assert self._tg is not None
        return await _prompt_as_service(
            self._start_service, lambda: self._prompt(text, on_text), self.cancel, cancel_grace
        )

    async def _prompt(self, text: str, on_text: Callable[[str], Any] | None) -> PromptResult:
        assert self.session_id is not None
        self._text = []
        self._on_text = on_text
        self._cancel_sent = False
        try:
            raw = await self._call(
                "session/prompt",
                _prompt_params(self.session_id, text),
            )
        except AcpClientError as exc:
            return PromptResult("error", self.text, self.session_id, str(exc))
        finally:
            self._on_text = None
        try:
            decoded = msgspec.json.decode(raw, type=wire.PromptResult)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return PromptResult("error", self.text, self.session_id, f"malformed session/prompt result: {exc}")
        return PromptResult(decoded.stop_reason, self.text, self.session_id, meta=_meta_of(decoded))

    async def cancel(self) -> None:
        """``session/cancel`` (best effort) and withdraw pending permission questions."""
        for scope in list(self._permission_scopes):
            scope.cancel()
        if self.session_id is None or self.peer.closed or self._cancel_sent:
            return
        self._cancel_sent = True
        with suppress(TransportClosed, OSError):
            await self.peer.notify("session/cancel", {"sessionId": self.session_id})

    # ------------------------------------------------------------------ inbound

    def _on_update(self, params: msgspec.Raw | None) -> None:
        try:
            note = msgspec.json.decode(params or b"{}", type=wire.LenientSessionNotification)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return
        update = note.update
        extra = self._sessions.get(note.session_id)
        if extra is not None:
            if update is not None:
                extra._on_update(update)
            return
        if note.session_id != self.session_id or update is None:
            return
        _take_text(update, self._text, self._on_text)

    async def _on_permission(self, rid: Any, params: msgspec.Raw | None) -> Any:
        try:
            p = msgspec.json.decode(params or b"{}", type=wire.LenientPermissionParams)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise RpcFailure(-32602, f"Invalid params: {exc}") from None
        call = p.tool_call or wire.LenientToolCall()
        ask = PermissionAsk(
            session_id=p.session_id,
            tool_call_id=call.tool_call_id,
            title=call.title,
            kind=call.kind,
            options=[(o.option_id, o.kind) for o in p.options],
        )
        extra = self._sessions.get(p.session_id)
        if extra is not None:
            return await extra._on_permission(ask)
        verdict: str = "cancelled"
        if p.session_id == self.session_id and self.on_permission is not None and not self._cancel_sent:
            verdict = await _ask_policy(self.on_permission, ask, self._permission_scopes)
        elif self.on_permission is None:
            verdict = "reject"
        return _answer(ask, verdict)

    async def _drain_stderr(self, reader: FdReader) -> None:
        try:
            async for chunk in reader:  # until EOF
                self.stderr_tail.append(chunk)
                self._stderr_size += len(chunk)
                while self._stderr_size > self.stderr_limit and len(self.stderr_tail) > 1:
                    self._stderr_size -= len(self.stderr_tail.popleft())
                if self.on_stderr is not None:
                    with suppress(Exception):
                        self.on_stderr(chunk)
        finally:
            reader.close()

    # ------------------------------------------------------------------ shutdown

    async def shutdown(self, *, kill_now: bool = False) -> str:
        """Close stdin; wait ``eof_grace``; SIGTERM the tree; wait ``term_grace``; SIGKILL.
        Idempotent. Returns how it ended ("eof", "sigterm", "sigkill"). Raises if a
        process of the tree survives SIGKILL."""
        if self._shutdown_done:
            if kill_now:
                self.tree.kill_now()  # escalate a shutdown in progress
            with anyio.CancelScope(shield=True):
                await self._shutdown_finished.wait()
            return self.exit_status or "eof"
        self._shutdown_done = True
        try:
            return await self._shutdown(kill_now)
        finally:
            self._shutdown_finished.set()

    async def _shutdown(self, kill_now: bool) -> ExitStatus:
        for scope in list(self._permission_scopes):
            scope.cancel()
        for session in list(self._sessions.values()):
            for scope in list(session._permission_scopes):
                scope.cancel()
        try:
            status = await self.tree.stop(
                self._close_stdin, eof_grace=self.eof_grace, term_grace=self.term_grace, kill_now=kill_now
            )
        except SurvivorsError as exc:
            self.exit_status = exc.status
            raise AcpClientError(str(exc)) from None
        self.exit_status = status
        return status

    def _close_stdin(self) -> None:
        writer = self.peer.writer
        assert isinstance(writer, FdWriter)
        writer.close()


@dataclass(eq=False)
class AcpSession:
    """One session of an ``AcpClient`` connection that may carry many (``new_session``)."""

    client: AcpClient
    session_id: str
    cwd: str
    on_permission: PermissionPolicy | None = None
    permissions: list[tuple[PermissionAsk, str]] = field(default_factory=list)  # (question, verdict)
    closed: bool = False
    _text: list[str] = field(default_factory=list)
    _on_text: Callable[[str], Any] | None = None
    _permission_scopes: set[anyio.CancelScope] = field(default_factory=set)
    _cancel_sent: bool = False

    @property
    def text(self) -> str:
        """Committed agent text received so far for the current prompt."""
        return "".join(self._text)

    async def prompt(
        self, text: str, *, on_text: Callable[[str], Any] | None = None, cancel_grace: float = 2.0
    ) -> PromptResult:
        """Like ``AcpClient.prompt`` for this session: never raises for agent-side failures
        (``stop_reason="error"`` with ``error_kind`` set); a cancelled caller sends
        ``session/cancel`` and waits ``cancel_grace`` (shielded) before propagating."""
        if self.closed:
            raise AcpClientError(f"session {self.session_id} is closed")
        return await _prompt_as_service(
            self.client._start_service, lambda: self._prompt(text, on_text), self.cancel, cancel_grace
        )

    async def _prompt(self, text: str, on_text: Callable[[str], Any] | None) -> PromptResult:
        self._text = []
        self._on_text = on_text
        self._cancel_sent = False
        params = _prompt_params(self.session_id, text)
        sid = self.session_id
        try:
            raw = await self.client.peer.request("session/prompt", params)
        except RpcFailure as exc:
            if self.client.peer.closed:
                msg = await self.client._gone("session/prompt failed: the agent closed the connection")
                return PromptResult("error", self.text, sid, msg, error_kind="closed")
            return PromptResult("error", self.text, sid, exc.message, error_kind="rpc", error_code=exc.code)
        except (TransportClosed, OSError):
            msg = await self.client._gone("session/prompt failed: the agent's stdin is closed")
            return PromptResult("error", self.text, sid, msg, error_kind="closed")
        finally:
            self._on_text = None
        try:
            decoded = msgspec.json.decode(raw, type=wire.PromptResult)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return PromptResult(
                "error", self.text, sid, f"malformed session/prompt result: {exc}", error_kind="malformed"
            )
        return PromptResult(decoded.stop_reason, self.text, sid, meta=_meta_of(decoded))

    async def cancel(self) -> None:
        """``session/cancel`` (best effort, once per prompt) and withdraw pending permission questions."""
        for scope in list(self._permission_scopes):
            scope.cancel()
        if self.client.peer.closed or self._cancel_sent or self.closed:
            return
        self._cancel_sent = True
        with suppress(TransportClosed, OSError):
            await self.client.peer.notify("session/cancel", {"sessionId": self.session_id})

    async def close(self, *, timeout: float | None = 10.0) -> bool:
        """Forget the session; send ``session/close`` first when the agent advertised it.
        True when the agent released it. Never raises for agent-side failures."""
        if self.closed:
            return False
        self.closed = True
        for scope in list(self._permission_scopes):
            scope.cancel()
        released = False
        if self.client.can_close_sessions and not self.client.peer.closed:
            try:
                await self.client.peer.request("session/close", {"sessionId": self.session_id}, timeout=timeout)
                released = True
            except (RpcFailure, TransportClosed, TimeoutError, OSError):
                pass
        self.client._sessions.pop(self.session_id, None)
        return released

    def _on_update(self, update: wire.LenientUpdate) -> None:
        _take_text(update, self._text, self._on_text)

    async def _on_permission(self, ask: PermissionAsk) -> Any:
        verdict: str = "cancelled"
        if self.on_permission is None:
            verdict = "reject"
        elif not self._cancel_sent and not self.closed:
            verdict = await _ask_policy(self.on_permission, ask, self._permission_scopes)
        self.permissions.append((ask, verdict))
        return _answer(ask, verdict)


def _take_text(update: wire.LenientUpdate, text: list[str], on_text: Any) -> None:
    """An answer's text chunk (``agent_message_chunk``) into ``text`` and to ``on_text``; thoughts,
    tool calls, plans, usage…: not the answer."""
    if update.session_update != "agent_message_chunk" or update.content is None:
        return
    if update.content.type == "text" and update.content.text:
        text.append(update.content.text)
        if on_text is not None:
            try:
                on_text(update.content.text)
            except Exception as exc:
                log.warning(f"text callback failed: {exc!r}")


async def _ask_policy(policy: Any, ask: PermissionAsk, scopes: set[anyio.CancelScope]) -> str:
    """The permission policy's verdict on ``ask``, withdrawable meanwhile (a cancel cancels the scopes):
    ``"cancelled"`` when withdrawn, ``"reject"`` when the policy fails (a failing policy closes the gate)."""
    verdict = "cancelled"
    with anyio.CancelScope() as scope:
        scopes.add(scope)
        try:
            verdict = await policy(ask)
        except Exception as exc:
            log.warning(f"permission policy failed: {exc!r}")
            verdict = "reject"
        finally:
            scopes.discard(scope)
    return "cancelled" if scope.cancelled_caught else verdict


def _answer(ask: PermissionAsk, verdict: str) -> Any:
    """The answer to a permission request: the option that matches an allow/reject verdict, else cancelled."""
    option = pick_option(ask.options, verdict) if verdict in ("allow", "reject") else None
    if option is None:
        return _CANCELLED
    return wire.PermissionResult(outcome=wire.PermissionOutcome(outcome="selected", option_id=option))

@asynccontextmanager
async def _single_errors() -> AsyncIterator[None]:
    """Let a lone exception out of the client's task group as itself, not as a group."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


@asynccontextmanager
async def open_client(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str] | None = None,
    on_permission: PermissionPolicy | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
    stderr_limit: int = 64 * 1024,
    max_frame: int = DEFAULT_MAX_FRAME,
    eof_grace: float = 2.0,
    term_grace: float = 2.0,
) -> AsyncIterator[AcpClient]:
    """Spawn ``argv`` in ``cwd`` (its own session and process group) and yield a client.
    On exit, however it is left, the child's whole tree is shut down (``shutdown``)."""
    if not argv:
        raise AcpClientError("empty ACP agent command")
    cwd = os.path.abspath(cwd)
    try:
        child = await spawn(argv, cwd=cwd, env=env)
    except SpawnError as exc:
        raise AcpClientError(f"cannot start the ACP agent {argv[0]!r}: {exc.strerror or exc}") from None
    process, err_r = child.process, child.stderr
    dispatcher = Dispatcher()
    peer = Peer(FdReader(child.stdout), FdWriter(child.stdin), dispatcher, max_frame=max_frame,
                name=f"acp client[{process.pid}]")
    client = AcpClient(
        argv=list(argv),
        cwd=cwd,
        peer=peer,
        process=process,
        on_permission=on_permission,
        stderr_limit=stderr_limit,
        on_stderr=on_stderr,
        eof_grace=eof_grace,
        term_grace=term_grace,
    )
    dispatcher.on_notification("session/update", client._on_update)
    dispatcher.on_request("session/request_permission", client._on_permission)
    try:
        async with _single_errors(), anyio.create_task_group() as tg:
            client._tg = tg
            client._start_service(peer.serve, None, 1.0)
            client._start_service(client._drain_stderr, FdReader(err_r))
            try:
                yield client
            finally:
                try:
                    await client.shutdown()
                finally:
                    peer.stop_reading()
                    client._stop_services()
    finally:
        with anyio.CancelScope(shield=True):
            await peer.reader.aclose()
            await peer.writer.aclose()
            await process.aclose()


async def _prompt_as_service(
    start_service: Callable[[Callable[[], Awaitable[None]]], None],
    prompt: Callable[[], Awaitable[PromptResult]],
    cancel: Callable[[], Awaitable[Any]],
    cancel_grace: float,
) -> PromptResult:
    """Run ``prompt`` in the connection's task group and wait for it. A cancelled caller does not
    withdraw the request: ``cancel()`` goes out and the agent gets ``cancel_grace`` seconds
    (shielded) to settle, so its committed partial output is kept; then the cancellation propagates.
    Shared by ``AcpClient.prompt`` and ``AcpSession.prompt``."""
    done = anyio.Event()
    box: list[PromptResult] = []

    async def run() -> None:
        try:
            box.append(await prompt())
        finally:
            done.set()

    start_service(run)
    try:
        await done.wait()
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await cancel()
            with anyio.move_on_after(cancel_grace):
                await done.wait()
        raise
    return box[0]
