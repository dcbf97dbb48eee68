"""The seams of the spine as ``typing.Protocol`` classes, and the values handed across them.

Plugins return objects that satisfy these from their hooks; the spine never imports a plugin,
and a plugin never needs the concrete loop (``dsh_core.agent``) or host (``dsh_core.host``):
``Agent`` and ``Host`` here are exactly what front doors, tools, policies and hook
implementations use of them. Each seam has one to three async methods; everything that does
I/O is async and runs inside the host's anyio task group.

The small values that cross the seams live here too — ``AgentSpec`` (what a new agent is
pinned to), ``ToolContext`` (what a tool gets), ``HistoryContext`` (what a history policy
sees), ``Finding`` (what a doctor check reports) and ``new_id`` — because they and the
Protocols refer to each other (an agent has a spec, a spec names its parent agent, a tool's
context holds its agent): one module, so the contract has no import circle.
``dsh_core.contracts`` re-exports the four that doors and tools hold.

This module imports only ``types`` from the spine: it is the bottom of the contract
(``types``/``errors`` → ``protocols`` → ``contracts`` → ``hookspecs``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import anyio
import anyio.abc
import msgspec
import pluggy

from .config import PluginConfig
from .types import (
    ApprovalOutcome,
    ApprovalRequest,
    CodeRunResult,
    ContentBlock,
    DurableEvent,
    FileChange,
    HistoryView,
    ImageBlock,
    LiveText,
    McpServer,
    ModelDelta,
    ModelInfo,
    ModelRequest,
    RetryPolicy,
    SessionHeader,
    SessionSettings,
    SubagentResult,
    ToolOutput,
    ToolProgress,
    ToolSpec,
    UserMessage,
)

T = TypeVar("T")
C = TypeVar("C", bound=PluginConfig)


def new_id(prefix: str = "") -> str:
    """An unguessable id (128 bits from the OS CSPRNG)."""
    return prefix + os.urandom(16).hex()  # what secrets.token_hex(16) returns, without its three calls


@runtime_checkable
class ModelProvider(Protocol):
    """A provider of exact routes ``(name, model)``.

    ``resolve`` is a catalogue lookup (no I/O); it raises ``RouteError`` for a model it
    will not serve. ``stream`` yields deltas and raises ``ModelError`` on failure; it is an async
    generator (``async def`` with ``yield``), because the agent closes it with ``aclose`` however
    the loop ends. Cancellation of the calling task must close the underlying stream at once.

    Optional: ``forget(session_id)``, called by ``Agent.dispose``, lets a provider that keeps
    per-session state drop it (a long-lived process closes sessions by the thousand); and
    ``models()``, the routes a session may switch to (a model picker offers them, and a resumed
    session takes back only a model listed there); ``cost(model, usage, at)``, what one call
    of ``model`` reporting ``usage`` cost at epoch time ``at`` (a ``Cost``, or None: unpriced);
    and the login a front door may offer: ``credential_problem()`` (None when the provider has
    its credential, else what a person should do), ``auth_methods()`` (``AuthMethod``s) and
    ``login()`` (interactive, on the terminal ``dsh run --login`` runs in; returns an exit code)
    and ``logout()`` (removes the stored credential, as ``dsh auth logout`` does; returns where
    it was removed from, empty when none was stored; blocking, so a door runs it in a thread).
    """

    name: str
    retry_policy: RetryPolicy

    def resolve(self, model: str) -> ModelInfo: ...

    def stream(self, request: ModelRequest) -> AsyncGenerator[ModelDelta, None]: ...


@runtime_checkable
class HistoryPolicy(Protocol):
    """Rewrites an agent's model history (offered by ``dsh_history_policy``); compaction is one.

    Both methods get a ``HistoryContext`` (below: the agent, the history as a read-only
    view, the request prefix, the previous call's reported prompt tokens) and return a whole
    replacement history, or None to keep it. ``prepare`` runs before every model call of a turn
    (keep the no-op path cheap: O(messages appended since the last call));
    ``recover`` runs once per model call that failed with ``CONTEXT_WINDOW_EXCEEDED`` — a
    replacement is retried once, None fails the turn with the provider's error. Optional:
    ``compact(ctx)``, a rewrite a person asked for between turns (``Agent.compact_history``). A policy
    records what it did as durable events (``agent.emit``); it must never leave a half-rewritten
    history (cancellation propagates, the history stays as it was). A policy that compacts
    honours ``agent.settings.auto_compact``: False, ``prepare`` and ``recover`` compact nothing
    (``compact`` still does: a person asked).
    """

    async def prepare(self, ctx: HistoryContext) -> Sequence[Any] | None: ...

    async def recover(self, ctx: HistoryContext, error: Exception) -> Sequence[Any] | None: ...


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call. ``run`` returns a ToolOutput or raises ``ToolError``."""

    spec: ToolSpec

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput: ...


Observer = Callable[["Agent", DurableEvent], None]
"""Called synchronously with ``(agent, event)`` for each durable event, in order (``Agent.subscribe``)."""


@runtime_checkable
class Agent(Protocol):
    """One session's agent, as front doors, tools, policies and hooks use it (never the concrete loop).

    This is the whole surface a plugin may rely on; ``dsh_core.agent.Agent`` satisfies it
    (``tests/test_architecture.py``), and a ``dsh_make_agent`` wrapper must too.
    """

    @property
    def session_id(self) -> str: ...

    @property
    def cwd(self) -> str: ...

    @property
    def spec(self) -> AgentSpec:
        """What the agent was built from (``extra`` is scratch space plugins share per session)."""

    @property
    def host(self) -> Host: ...

    @property
    def provider(self) -> ModelProvider:
        """The provider of the session's route (a policy may call it, e.g. to summarise)."""

    @property
    def route(self) -> ModelInfo:
        """The session's *current* exact route (a session may switch models)."""

    @property
    def history(self) -> HistoryView:
        """The model history as the next request would carry it (read-only, O(1))."""

    @property
    def settings(self) -> SessionSettings:
        """The session's own choices (model, effort, mode, auto-compaction; None: the composition's default)."""

    def configure(self, *, model: str | None = None, effort: str | None = None, mode: str | None = None,
                  auto_compact: bool | None = None, by: str = "client", tell_model: str = "") -> list[str]:
        """Change the session's settings (None: unchanged); returns the names that changed. A
        ``model`` must resolve on the session's provider (``RouteError``), an ``effort`` be one of
        the route's ``efforts`` (``ValueError``); ``auto_compact`` switches the history policy's
        own compaction on or off; a change is recorded (``settings/changed``) and
        applies from the next model request, before which ``tell_model`` is appended to the
        history (the prefix, and the provider's cache, stay as they were)."""

    @property
    def tools(self) -> Mapping[str, Tool]:
        """Every tool of the agent, offered to the model or not (``call_tool`` reaches them all)."""

    @property
    def busy(self) -> bool:
        """A turn runs or the inbox holds messages."""

    @property
    def disposed(self) -> bool: ...

    def state(self, cls: type[T], factory: Callable[[], T] | None = None) -> T:
        """This session's plugin state of type ``cls``: created by ``factory`` (default ``cls()``)
        on first use, the same object afterwards, dropped with the session (``dsh_core.state``)."""

    def describe_state(self) -> dict[str, str]:
        """Every state slot of this session as ``{module.Class: bounded repr}`` (debug dumps)."""

    children: list[Agent]
    """Live subagents, oldest first; a child adds itself to its parent's list and leaves it when disposed."""

    def submit(self, message: UserMessage) -> None:
        """Publish ``user/message`` and queue it for the next turn; never blocks. Raises
        ``AgentDisposed`` after ``dispose``, ``SessionLogFailed`` once the log cannot be written."""

    def cancel(self, kind: str = "user") -> None:
        """Abort the running turn and drop unclaimed messages; idempotent, returns at once."""

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Observe every durable event; returns the unsubscribe function."""

    def watch(self, listener: Callable[[Any, LiveText], None]) -> Callable[[], None]:
        """See the model's text as it is written (``LiveText``: not durable, may still be cut,
        cancelled or retried); returns the unwatch function. Costs nothing while none watches."""

    def watch_progress(self, listener: Callable[[Any, ToolProgress], None]) -> Callable[[], None]:
        """See what running tool calls show of themselves (``ToolProgress``: the tail of a
        command's output; not durable); returns the unwatch function."""

    @property
    def progress_watched(self) -> bool:
        """Whether anyone watches tool progress: when not, tools gather none (it costs nothing)."""

    def progress(self, piece: ToolProgress) -> None:
        """Hand a running call's progress to its watchers (``ToolContext.progress`` calls it)."""

    def emit(self, event: DurableEvent) -> None:
        """Record a durable event (a tool's or policy's own, e.g. compaction) and publish it."""

    def splice(self, content: list[ContentBlock]) -> None:
        """Show the model ``content`` as a user message after this step's tool results."""

    def notify(self, text: str, *, source: str = "notice", unless: Callable[[], bool] | None = None,
               wake: bool = False) -> None:
        """Tell the model ``text`` as a user-role message (``source``) appended before its next
        request, in this turn or the next one (a subagent's settlement, a job's end).
        ``unless``: checked when that request is built; true drops the notice (a tool result has
        told the model the same since, e.g. a job's end read with ``job_output``).
        ``wake``: an idle agent starts an autonomous turn for it at once (``TurnStart.autonomous``);
        a busy one reads it at its next request, or in a new autonomous turn if the running turn
        ends first. Off when the composition sets ``[config.agent] wake = false`` and once the
        agent's teardown began (a ``disposed`` cancel)."""

    def completed_history(self) -> list[Any]:
        """The committed history up to the last completed turn (what a fork starts from)."""

    async def compact_history(self) -> bool:
        """Have the history policy compact now, between turns (True: the history was rewritten);
        ``ValueError`` while a turn runs or when no policy compacts on request."""

    def offer(self, names: list[str], *, hint: str = "") -> None:
        """Offer only ``names`` to the model; other tools stay callable through ``call_tool``."""

    def publish_tools(self, source: str, tools: Sequence[Tool]) -> list[str]:
        """Replace the tools ``source`` (a ``ToolSource``'s name) gives this session with ``tools``;
        returns the names taken. A name the host's tools or another source already hold is
        skipped (reported on stderr). The next model request carries the new set (an unchanged
        set leaves the request, and so the provider's prefix cache, as it was); a call already
        running keeps its tool. While only some tools are ``offer``ed, new ones are callable
        through ``call_tool`` but not offered."""

    def parallel_safe(self, name: str) -> bool:
        """Whether calls of tool ``name`` may overlap."""

    async def call_tool(
        self, name: str, arguments: str | dict[str, Any], *, call_id: str, turn: int, step: int,
        raw: str | None = None,
    ) -> ToolOutput:
        """Run one call through the normal tool path (approvals, errors mapped to results);
        ``raw``: a dict's JSON text when the caller has it (else the dict is encoded for the hooks)."""

    def restore(self, events: list[DurableEvent], *, fork_of: str | None = None) -> None:
        """Rebuild a fresh, idle agent's conversation from a recorded log (session resume); with
        ``fork_of`` (that log's session id), start a new session from its committed history instead."""

    async def wait_idle(self, unless: Any = None) -> None:
        """Return when no turn runs and the inbox is empty (quiescence), or once ``unless`` (a
        ``dsh_core.state.Flag``) is set."""

    async def dispose(self) -> None:
        """Cancel, wait for quiescence, dispose children (child first), close the log."""


@runtime_checkable
class Approvals(Protocol):
    """The host's approval seam (``host.approvals``): policy verdict first, then answerers newest-first."""

    def add_answerer(self, answerer: Answerer) -> Callable[[], None]:
        """Let ``answerer`` answer requests it owns; returns the function that removes it."""

    async def request(self, req: ApprovalRequest) -> ApprovalOutcome:
        """Ask once; nothing is remembered."""


@runtime_checkable
class Host(Protocol):
    """One composition at run time, as plugins, front doors and the agent loop use it.

    ``dsh_core.host.Host`` satisfies it (``tests/test_architecture.py``); hooks receive it as ``host``.
    """

    @property
    def pm(self) -> pluggy.PluginManager: ...

    @property
    def direct(self) -> Any:
        """Hooks by name (``host.direct.dsh_prompt_submit(...)``) called with pluggy's semantics
        but without its call machinery: the turn loop's per-prompt interception points."""

    @property
    def config(self) -> dict[str, dict[str, Any]]:
        """Each plugin's table from the example (``[config.<plugin>]``) with overrides merged."""

    @property
    def default_provider(self) -> str | None: ...

    @property
    def default_model(self) -> str | None: ...

    @property
    def models(self) -> Mapping[str, ModelProvider]: ...

    @property
    def tools(self) -> Mapping[str, Tool]: ...

    @property
    def front_doors(self) -> Mapping[str, FrontDoor]: ...

    @property
    def approvals(self) -> Approvals: ...

    @property
    def agents(self) -> AbstractSet[Agent]:
        """Every live agent of this host (subagents included)."""

    @property
    def session_store(self) -> SessionStore: ...

    @property
    def attachment_store(self) -> AttachmentStore | None: ...

    @property
    def subagent_providers(self) -> Mapping[str, SubagentProvider]:
        """The subagent providers by name (``dsh_register_subagent_providers``)."""

    @property
    def confinement(self) -> Confinement | None:
        """How plugins run confined processes (``dsh_confinement``); None when no plugin provides it."""

    @property
    def search_providers(self) -> Mapping[str, SearchProvider]:
        """The web search providers by name (``dsh_register_search_providers``)."""

    @property
    def jobs(self) -> Jobs | None:
        """The background job registry (``dsh_jobs``); None when no plugin provides it (then no
        tool offers to run anything in the background)."""

    @property
    def spill_limit(self) -> int:
        """Bytes of a tool result the model sees before the rest goes to a spill file."""

    @property
    def spill_root(self) -> Path: ...

    @property
    def task_group(self) -> anyio.abc.TaskGroup:
        """The group that owns every task of the host (raises ``DshError`` when not running)."""

    def provider(self, name: str) -> ModelProvider:
        """The provider named ``name``, or ``RouteError`` with the way out."""

    def config_for(self, cls: type[C]) -> C:
        """The plugin config of type ``cls`` (a ``dsh_core.config.PluginConfig`` Struct the plugin
        declared with ``dsh_config_type``), decoded once from the example; defaults without a table."""

    def state(self, cls: type[T], factory: Callable[[], T] | None = None) -> T:
        """This host's plugin state of type ``cls`` (per composition, e.g. a plugin's settings or
        its live children), created by ``factory`` (default ``cls()``) on first use."""

    def describe_state(self) -> dict[str, str]:
        """Every state slot of this host as ``{module.Class: bounded repr}`` (debug dumps)."""

    def check_route(self, provider: str | None = None, model: str | None = None) -> tuple[str, str]:
        """The exact route (defaults filled in), resolved now: ``RouteError`` if not served."""

    def system_prompt(self, spec: AgentSpec) -> str: ...

    def observe(self, agent: Agent, event: DurableEvent) -> None:
        """Hand a durable event to the ``dsh_session_event`` observers."""

    def create_agent(self, spec: AgentSpec) -> Agent:
        """Build a new session's agent (``dsh_make_agent``) and count it among ``agents``."""

    def forget(self, agent: Agent) -> None:
        """Drop a disposed agent from ``agents``."""


@runtime_checkable
class CommandRegistry(Protocol):
    """Where ``dsh_register_commands`` adds ``dsh <sub>`` subcommands."""

    def add(
        self,
        name: str,
        *,
        help: str,
        setup: Callable[[Any], None],
        run: Callable[[Any], int],
        description: str | None = None,
    ) -> None:
        """``setup(parser)`` adds arguments to the subcommand's argparse parser; ``run(args)`` is its exit code."""


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


@dataclass(frozen=True)
class ConfinedCommand:
    """An argv wrapped so that it runs confined (``Confinement.confine``), with the environment
    it must get. ``mechanism`` is None when the tier is unconfined (danger-full-access)."""

    argv: list[str]
    env: dict[str, str]
    mode: str
    mechanism: str | None
    denial: str = ""  # how a denied write reads under this mechanism (e.g. "Permission denied")


@dataclass(frozen=True)
class ConfinedRun:
    """What a confined one-shot command did (``Confinement.run``): its exit code (None when it was
    killed for its timeout), the first ``output_limit`` bytes of stdout and of stderr."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool


class ReadRecords(dict[str, int]):
    """What one session's file tools have read or written (real path -> the file's mtime in ns
    then): the session's state slot (``agent.state(ReadRecords)``) that read-before-edit checks.
    sandbox-tools' ``read``/``write``/``edit`` keep it; any other editing tool (str-replace-editor)
    keeps and checks the same one, so the families agree on what the session has seen."""


@runtime_checkable
class Confinement(Protocol):
    """Running processes inside a session's sandbox, for any plugin (hooks, code mode, MCP
    servers). Provided through ``dsh_confinement`` (sandbox-tools provides it); ``host.confinement``
    is None when no plugin does, and then nothing may run confined code at all.

    Both methods apply the session's permission tier (or ``mode``), its writable roots and the
    scrubbed environment; with no working mechanism a confined tier raises ``ToolError``
    (``SANDBOX_UNAVAILABLE``), never runs unconfined.
    """

    async def confine(self, argv: list[str], *, cwd: str, mode: str | None = None,
                      session: Agent | None = None) -> ConfinedCommand:
        """``argv`` wrapped to start confined (for a long-lived process the caller spawns and owns,
        in its own process group, killed with it). With ``session``: that session's tier (the mode
        it chose, e.g. plan → read-only, else the deployment's), narrowed to ``mode`` if that is
        narrower, never widened by it; without one: ``mode``, else the deployment's."""

    async def run(
        self, argv: list[str], *, session: Agent, cwd: str, stdin: bytes = b"",
        env: Mapping[str, str] | None = None, timeout_s: float, output_limit: int,
    ) -> ConfinedRun:
        """Run one command to its end through the session's warm confined command server (a fork
        and an exec): ``stdin`` fed then closed, stdout and stderr captured apart, ``env`` on top of
        the scrubbed environment. Cancelling, or the timeout, kills everything the command started;
        when this returns no process of it is alive."""

    async def write_file(self, path: str, data: bytes, *, session: Agent, cwd: str, create: bool) -> int:
        """Write ``data`` over ``path`` (absolute) as the session's own file tools write: in its tier,
        only beneath a writable root of the workspace ``cwd`` (no ``..``, symlink, hard link or
        ``/proc`` path leads out), regular files only. ``create``: a missing file and its missing
        parent directories are made; otherwise the file must exist. Returns the file's new mtime
        (ns). Raises ``errors.WriteDenied`` when the tier refuses the path, ``OSError`` otherwise."""


@runtime_checkable
class Answerer(Protocol):
    """Answers approval requests it owns; returns None to let the next answerer try."""

    async def answer(self, request: ApprovalRequest) -> ApprovalOutcome | None: ...


@runtime_checkable
class FrontDoor(Protocol):
    """A way in: serves until its peer goes away, then brings its agents to rest."""

    name: str

    async def serve(self, host: Host) -> None: ...


@runtime_checkable
class CodeBindings(Protocol):
    """What a program may call: ``names`` are the tools (``tools.<name>`` in the program).

    ``call(name, args)`` is synchronous and must be called in the program's order: it gives
    the call its place in line and its number at once (whatever order tasks then run in), and
    returns an awaitable that runs the call through the host's tool path and yields its
    JSON-compatible result, or raises ``dsh_core.errors.CodeCallError`` (the program sees
    ``ToolCallError``). ``arguments``, when the runtime has it, is ``args`` as the JSON text the
    program sent: recorded as is, never encoded again."""

    names: Sequence[str]

    def call(self, name: str, args: dict[str, Any], arguments: str | None = None) -> Awaitable[Any]: ...


@runtime_checkable
class CodeRuntime(Protocol):
    """Runs one program (code mode). ``language`` names what ``program`` is written in (``python``).

    ``run`` executes ``program`` — the body of an async function: top-level ``await`` and
    ``return`` — with ``bindings`` as its tool API, and returns a ``CodeRunResult`` (output
    lines, return value, or an error with its kind). Setting ``cancel`` (when there is one: a
    caller whose only way to stop a run is to cancel its task passes None) aborts the program
    (error kind ``abort``); cancelling the calling task aborts it too and propagates. Either
    way nothing the program started may survive ``run``. A runtime confines programs in the
    session's tier; one that can narrow it offers ``confined_to(mode) -> CodeRuntime`` (optional:
    the workflow tool runs its scripts ``read-only`` and refuses a runtime without it).
    """

    language: str

    async def run(self, program: str, bindings: CodeBindings, cancel: anyio.Event | None = None) -> CodeRunResult: ...


@runtime_checkable
class ToolSource(Protocol):
    """Tools one session has beyond the host's, which may come and go (an MCP server's):
    offered by ``dsh_session_tools`` when the agent is built.

    ``serve`` runs as a task of the session from its creation: it publishes its tools with
    ``session.publish_tools(name, tools)`` (each call replaces this source's previous set),
    calls ``ready()`` once the first set is published or has failed (the session's first turn
    waits for every source's ``ready``, so it must come within the source's own start-up
    bound), then keeps its tools current until it is cancelled — when the session is
    disposed — and then ends promptly, leaving no process behind. An exception ends the
    source (reported on stderr, counted as ready); the session carries on without it.
    """

    name: str

    async def serve(self, session: Agent, ready: Callable[[], None]) -> None: ...


@dataclass(frozen=True, kw_only=True)
class ClientMcp:
    """Which MCP servers a client may hand a session in ACP ``session/new`` (``dsh_client_mcp``):
    stdio ones always, ``http`` and ``sse`` ones when set. The door advertises exactly this in
    ``mcpCapabilities`` and refuses a server of any other transport."""

    http: bool = False
    sse: bool = False

    def accepts(self, transport: str) -> bool:
        return transport == "stdio" or (transport == "http" and self.http) or (transport == "sse" and self.sse)


@runtime_checkable
class EditorBuffers(Protocol):
    """The files a person has open in their editor (ACP ``fs/read_text_file`` and
    ``fs/write_text_file``), when the front door has them (``AgentSpec.buffers``). Only for files
    inside the session's workspace; the sandbox decides first and the editor never widens it.

    ``read`` gives the editor's text of ``path`` (unsaved edits included), or None: then read the
    disk. ``wrote`` tells the editor a tool wrote ``text`` to ``path`` (after the write succeeded on
    disk), so it shows the change (Zed's review list). Neither raises."""

    async def read(self, path: str) -> str | None: ...

    async def wrote(self, path: str, text: str) -> None: ...


@runtime_checkable
class PersonQuestions(Protocol):
    """Asking the person in front of the editor (ACP ``elicitation/create``, form mode), when the
    front door can (``AgentSpec.questions``). ``schema`` is a flat JSON Schema object whose
    properties are strings (an ``enum``/``oneOf`` makes a choice), numbers, booleans or arrays
    of strings (a multiple choice). Returns ``("accept", answers)``, ``("decline", {})`` or
    ``("cancel", {})``; never raises (an editor that fails to answer is a ``cancel``)."""

    async def ask(self, message: str, schema: dict[str, Any], *, call_id: str | None = None) -> tuple[str, dict[str, Any]]: ...


class AuthMethod(msgspec.Struct, frozen=True, kw_only=True):
    """How a person gives a provider its credential (``ModelProvider.auth_methods``): ``args``
    appended to the agent's own command line start an interactive login in a terminal (ACP
    terminal auth; ``dsh run … --login``)."""

    id: str
    name: str
    description: str = ""
    args: tuple[str, ...] = ("--login",)


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    """One value a ``Control`` may take."""

    value: str
    name: str
    description: str = ""


class Control(msgspec.Struct, frozen=True, kw_only=True):
    """A setting of a session a person may change from a front door (``dsh_session_controls``):
    a model picker, a reasoning effort, a permission mode. ``category`` says which (ACP's words:
    ``model``, ``thought_level``, ``mode``; None: another). ``apply(value)`` changes the session
    (``Agent.configure``) or raises ``ValueError`` with a message a person reads; the door then
    asks the hook again for the new state. A ``boolean`` control is a toggle: its values are
    exactly ``on`` and ``off`` (``BOOLEAN``), which a door may show as a switch."""

    id: str
    name: str
    current: str
    choices: tuple[Choice, ...]
    apply: Callable[[str], None]
    category: str | None = None
    description: str = ""
    boolean: bool = False


BOOLEAN = (Choice(value="on", name="On"), Choice(value="off", name="Off"))
"""The values of a ``boolean`` ``Control``."""


class CommandResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a slash command did: ``reply`` is shown as the answer (no model call); ``prompt``,
    when set, is submitted as the person's prompt instead of the command (a turn runs)."""

    reply: str = ""
    prompt: str | None = None


class SlashCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A ``/name`` a person may type in a front door that offers commands (``dsh_slash_commands``).
    ``run(session, text)`` gets the text typed after the name; it may await (cancelling the
    prompt cancels it) and raise ``ValueError`` to answer with a message instead."""

    name: str
    description: str
    run: Callable[[Agent, str], Awaitable[CommandResult]]
    hint: str | None = None  # what to type after the name (None: nothing)


@runtime_checkable
class DoctorCheck(Protocol):
    """One check ``dsh doctor`` runs (offered through ``dsh_register_doctor_checks``).

    ``run`` looks at the machine (it may spawn a probe or read a file; it must not change
    anything or reveal a secret) and returns a ``dsh_core.doctor.Finding``: ``ok``,
    ``warn``, or ``fail`` when the example cannot serve here, with a ``fix`` to try.
    """

    name: str

    async def run(self) -> Finding: ...


Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Finding:
    """One line of the doctor's report. ``fix`` is a command or step, never a secret."""

    subject: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(kw_only=True)
class SubagentRequest:
    """What a subagent provider is asked to start. ``cwd`` is the parent's or inside it and
    ``depth`` the child's (the parent's + 1); the caller has checked both, and the caps."""

    prompt: str
    description: str
    parent: Agent
    cwd: str
    depth: int
    call_id: str | None = None
    continuable: bool = False  # follow-ups after the first turn (``SubagentRun.follow_up``)
    route: tuple[str, str] | None = None  # (provider, model); None: the parent's route
    tools: tuple[str, ...] | None = None  # the tools offered to the child; None: the parent's
    persona: str | None = None  # a section added to the child's system prompt
    on_settled: Callable[[SubagentRun, SubagentResult], None] | None = None  # each ended turn, at once


@runtime_checkable
class SubagentRun(Protocol):
    """One started child. ``result`` waits for its current turn to end (a continuable child
    settles once per turn); ``cancel`` aborts that turn; ``dispose`` ends the child for good."""

    id: str
    description: str
    session_id: str | None  # the child's session (None: a child that keeps no log here)

    @property
    def status(self) -> Literal["running", "idle", "ready"]:
        """``running`` a turn; ``idle`` between turns (continuable); ``ready`` ended or resumable."""

    async def result(self) -> SubagentResult: ...

    def cancel(self) -> None: ...

    async def dispose(self) -> None: ...


@runtime_checkable
class ContinuableRun(SubagentRun, Protocol):
    """A child that takes more turns: ``follow_up`` queues a message for its next turn (FIFO),
    ``interrupt`` aborts the current turn only (False: none ran)."""

    def follow_up(self, message: str) -> None: ...

    def interrupt(self) -> bool: ...


@runtime_checkable
class SubagentProvider(Protocol):
    """Starts children of one kind, registered by name (``dsh_register_subagent_providers``):
    ``spawn`` (a fresh in-process agent), ``fork`` (one that starts from the parent's
    history), ``acp`` (another ACP agent's process)."""

    name: str

    async def start(self, request: SubagentRequest) -> SubagentRun: ...


@dataclass(frozen=True)
class SearchHit:
    """One web search result: what a provider found for a query."""

    title: str
    url: str
    snippet: str = ""


@runtime_checkable
class SearchProvider(Protocol):
    """A web search service (``dsh_register_search_providers``): the ``web`` plugin offers
    ``web_search`` only when one is registered. Its credentials stay inside it (read from the
    environment when it registers; never in arguments, results or logs)."""

    name: str

    async def search(self, query: str, *, limit: int) -> list[SearchHit]:
        """At most ``limit`` results for ``query``; ``ToolError`` (``SEARCH_FAILED``) with a
        readable reason when the service fails."""


@dataclass(kw_only=True)
class JobEnd:
    """How a job's work ended, as the work reports it: ``completed`` with its ``exit_code`` (zero
    or not), or ``failed`` (it could not run, or died of a signal nobody sent it: ``detail``)."""

    status: Literal["completed", "failed"]
    exit_code: int | None = None
    detail: str | None = None


@runtime_checkable
class JobIO(Protocol):
    """What a job's work writes its output to, and where it learns that a stop was asked."""

    def write(self, data: bytes) -> None:
        """Append output (kept in a file, bounded; never all in memory)."""

    @property
    def stopping(self) -> anyio.Event:
        """Set when ``job_kill`` asks the job to end: stop gracefully (SIGTERM); the registry
        cancels the work if it has not ended after a grace period."""


@runtime_checkable
class Job(Protocol):
    """One background job of a session: its handle, what it is and where it stands."""

    id: str
    kind: str
    title: str

    @property
    def status(self) -> Literal["running", "stopping", "completed", "failed", "killed"]: ...

    async def wait(self) -> None:
        """Return when the job has settled."""

    async def kill(self, reason: str | None = None) -> None:
        """Stop it (gracefully, then by cancelling its work) and return when it has settled
        (``stopping`` meanwhile)."""


@runtime_checkable
class Jobs(Protocol):
    """The host's job registry (``dsh_jobs``; the ``jobs`` plugin provides it): work that keeps
    running after the tool call that started it — a background ``bash`` command, a one-shot
    delegation — owned by its session, capped per session, killed with it, its output kept in a
    file for ``job_output``, its end announced to the model in a notice."""

    def start(self, session: Agent, *, kind: str, title: str, work: Callable[[JobIO], Awaitable[JobEnd]],
              call_id: str | None = None) -> Job:
        """Start ``work(io)`` as a job of ``session`` (a task of the host's group, cancelled when the
        session ends). Over the session's cap, raises ``ToolError`` (``JOB_LIMIT``) naming the cap
        and nothing starts. A ``ToolError`` the work raises settles the job as failed with its text."""

    def of(self, session: Agent) -> Sequence[Job]:
        """The session's jobs, oldest first (settled ones included)."""


@dataclass(kw_only=True)
class AgentSpec:
    """What a new agent is pinned to."""

    cwd: str
    provider: str
    model: str
    session_id: str = field(default_factory=new_id)
    parent: Agent | None = None
    origin: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    mcp_servers: tuple[McpServer, ...] = ()  # what the client handed the session (``ClientMcp``)
    buffers: EditorBuffers | None = None  # the editor's open files, when the front door has them
    questions: PersonQuestions | None = None  # asking the person, when the front door can
    parent_call: str | None = None  # the parent's tool call that started this child
    persona: str | None = None  # a section after the system prompt's (a subagent's role)
    fork: bool = False  # a child that starts from the parent's completed history, system prompt and tools
    # directories beside ``cwd`` that the session's tools may use as ``cwd`` in its sandbox tier (canonical, absolute)
    additional_directories: tuple[str, ...] = ()
    forked_from: str | None = None  # a top-level session forked from this recorded one (its header says so)
    # W3C trace context (traceparent, tracestate) the session's work continues, as a front door
    # received it from its client (ACP: ``_meta`` of session/new); see ``dsh_trace_context``
    trace_context: Mapping[str, str] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        return 0 if self.parent is None else self.parent.spec.depth + 1


@dataclass(kw_only=True)
class ToolContext:
    """What a tool executor may use. ``agent`` is the exact calling agent."""

    agent: Agent
    call_id: str
    tool_name: str
    turn: int
    step: int
    decided_by: str | None = None  # who decided this call's last ``approve``: "policy" or the answerer's name

    @property
    def cwd(self) -> str:
        return self.agent.cwd

    @property
    def session_id(self) -> str:
        return self.agent.session_id

    @property
    def host(self) -> Host:
        return self.agent.host

    @property
    def route(self) -> ModelInfo:
        return self.agent.route

    def emit(self, event: DurableEvent) -> None:
        self.agent.emit(event)

    @property
    def shows_progress(self) -> bool:
        """Whether someone watches this call's progress (a front door that shows it to a person).
        When False, ``progress`` does nothing and a tool should not gather any."""
        return self.agent.progress_watched

    def progress(self, text: str) -> None:
        """Show what this call has done so far (the whole of it to show now, e.g. the tail of a
        command's output), while it runs. Never durable, never seen by the model; the result
        replaces it. Keep it bounded and rare (``dsh_core.progress.output_progress`` does both)."""
        if self.agent.progress_watched:
            self.agent.progress(ToolProgress(call_id=self.call_id, tool_name=self.tool_name, text=text))

    async def approve(
        self,
        reason: str,
        *,
        kind: str | None = None,
        subject: str | None = None,
        args: dict[str, Any] | None = None,
        tier: str | None = None,
        justification: str | None = None,
        choices: tuple[str, str] | None = None,
        change: FileChange | None = None,
    ) -> ApprovalOutcome:
        """Ask the approval seam (one-shot). Returns the outcome; nothing is remembered.
        ``decided_by`` then says who decided (``"policy"``: nobody was asked).

        The keywords describe the call to whoever answers (see ``ApprovalRequest``)."""
        req = ApprovalRequest(
            agent=self.agent, tool_name=self.tool_name, call_id=self.call_id, reason=reason,
            kind=kind, subject=subject, args=args, tier=tier, justification=justification, choices=choices,
            change=change,
        )
        outcome = await self.host.approvals.request(req)
        self.decided_by = req.decided_by
        return outcome

    def splice(self, content: list[ContentBlock]) -> None:
        """Show the model ``content`` (e.g. an image a nested call produced) as a user message
        (source ``tool``) spliced in after this step's tool results, before the next model call."""
        self.agent.splice(content)


@dataclass(kw_only=True)
class HistoryContext:
    """What a ``HistoryPolicy`` sees before a model call (see ``HistoryPolicy``).

    ``metered_tokens`` is the prompt-token count the provider reported for the previous call of
    this history (None when none was reported, or the history was rewritten since) and
    ``metered_messages`` how many of ``history``'s messages that call carried; what follows them
    was appended since and is not yet counted by the provider."""

    agent: Agent
    turn: int
    step: int
    route: ModelInfo
    system: str
    tools: list[Any]
    history: HistoryView
    metered_tokens: int | None = None
    metered_messages: int = 0
