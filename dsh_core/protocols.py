"""The seams of the spine as ``typing.Protocol`` classes.

Plugins return objects that satisfy these from their hooks; the spine never
imports a plugin. Each seam has one to three async methods; everything that
does I/O is async and runs inside the host's anyio task group.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import anyio

from .types import (
    ApprovalOutcome,
    ApprovalRequest,
    CodeRunResult,
    DurableEvent,
    ImageBlock,
    ModelDelta,
    ModelInfo,
    ModelRequest,
    RetryPolicy,
    SessionHeader,
    ToolOutput,
    ToolSpec,
    UserMessage,
)

if TYPE_CHECKING:  # pragma: no cover
    from .contracts import ToolContext
    from .doctor import Finding
    from .host import Host


@runtime_checkable
class ModelProvider(Protocol):
    """A provider of exact routes ``(name, model)``.

    ``resolve`` is a catalogue lookup (no I/O); it raises ``RouteError`` for a model it
    will not serve. ``stream`` yields deltas and raises ``ModelError`` on failure.
    Cancellation of the calling task must close the underlying stream at once.

    Optional: ``forget(session_id)``, called by ``Agent.dispose``, lets a provider that keeps
    per-session state drop it (a long-lived process closes sessions by the thousand).
    """

    name: str
    retry_policy: RetryPolicy

    def resolve(self, model: str) -> ModelInfo: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]: ...


@runtime_checkable
class HistoryPolicy(Protocol):
    """Rewrites an agent's model history (offered by ``dsh_history_policy``); compaction is one.

    Both methods get a ``dsh_core.agent.HistoryContext`` (the agent, the history as a read-only
    view, the request prefix, the previous call's reported prompt tokens) and return a whole
    replacement history, or None to keep it. ``prepare`` runs before every model call of a turn
    (keep the no-op path cheap: O(messages appended since the last call));
    ``recover`` runs once per model call that failed with ``CONTEXT_WINDOW_EXCEEDED`` — a
    replacement is retried once, None fails the turn with the provider's error. A policy
    records what it did as durable events (``agent.emit``); it must never leave a half-rewritten
    history (cancellation propagates, the history stays as it was).
    """

    async def prepare(self, ctx: Any) -> "Sequence[Any] | None": ...

    async def recover(self, ctx: Any, error: Exception) -> "Sequence[Any] | None": ...


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call. ``run`` returns a ToolOutput or raises ``ToolError``."""

    spec: ToolSpec

    async def run(self, args: dict[str, Any], ctx: "ToolContext") -> ToolOutput: ...


@runtime_checkable
class Agent(Protocol):
    """What front doors program against (never the concrete loop)."""

    session_id: str
    cwd: str

    def submit(self, message: UserMessage) -> None: ...

    def cancel(self, kind: str = "user") -> None: ...

    def subscribe(self, observer: Any) -> Any: ...

    async def wait_idle(self) -> None: ...

    async def dispose(self) -> None: ...


@runtime_checkable
class SessionLog(Protocol):
    """One session's append-only durable log.

    ``append`` writes one whole record without awaiting (a single buffered write of a
    few hundred bytes: cheaper than a task switch) and never reorders.
    """

    def append(self, event: DurableEvent) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class SessionStore(Protocol):
    def open(self, header: SessionHeader) -> SessionLog: ...

    async def list_sessions(self) -> list[SessionHeader]: ...

    async def read(self, session_id: str) -> tuple[SessionHeader, list[DurableEvent]]: ...


@runtime_checkable
class AttachmentStore(Protocol):
    """Content-addressed bytes. ``save_images`` validates every member before writing any."""

    mime_types: Sequence[str]

    async def save_images(self, batch: Sequence[tuple[str, bytes]]) -> list[ImageBlock]: ...

    async def read_image(self, ref: ImageBlock) -> bytes: ...


@runtime_checkable
class Answerer(Protocol):
    """Answers approval requests it owns; returns None to let the next answerer try."""

    async def answer(self, request: ApprovalRequest) -> ApprovalOutcome | None: ...


@runtime_checkable
class FrontDoor(Protocol):
    """A way in: serves until its peer goes away, then brings its agents to rest."""

    name: str

    async def serve(self, host: "Host") -> None: ...


@runtime_checkable
class CodeBindings(Protocol):
    """What a program may call: ``names`` are the tools (``tools.<name>`` in the program).

    ``call(name, args)`` is synchronous and must be called in the program's order: it gives
    the call its place in line and its number at once (whatever order tasks then run in), and
    returns an awaitable that runs the call through the host's tool path and yields its
    JSON-compatible result, or raises ``dsh_core.errors.CodeCallError`` (the program sees
    ``ToolCallError``)."""

    names: Sequence[str]

    def call(self, name: str, args: dict[str, Any]) -> Awaitable[Any]: ...


@runtime_checkable
class CodeRuntime(Protocol):
    """Runs one program (code mode). ``language`` names what ``program`` is written in (``python``).

    ``run`` executes ``program`` — the body of an async function: top-level ``await`` and
    ``return`` — with ``bindings`` as its tool API, and returns a ``CodeRunResult`` (output
    lines, return value, or an error with its kind). Setting ``cancel`` aborts the program
    (error kind ``abort``); cancelling the calling task aborts it too and propagates. Either
    way nothing the program started may survive ``run``.
    """

    language: str

    async def run(self, program: str, bindings: CodeBindings, cancel: anyio.Event) -> CodeRunResult: ...


@runtime_checkable
class DoctorCheck(Protocol):
    """One check ``dsh doctor`` runs (offered through ``dsh_register_doctor_checks``).

    ``run`` looks at the machine (it may spawn a probe or read a file; it must not change
    anything or reveal a secret) and returns a ``dsh_core.doctor.Finding``: ``ok``,
    ``warn``, or ``fail`` when the example cannot serve here, with a ``fix`` to try.
    """

    name: str

    async def run(self) -> "Finding": ...
