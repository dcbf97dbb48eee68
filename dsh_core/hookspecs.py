"""THE contract between the dsh spine and its plugins.

Every ``dsh_*`` hook is declared here, and nowhere else. Each docstring says who
calls the hook, when, and what a return value means (a test fails on an
undocumented hook). Hooks are synchronous and return promptly: *hooks decide,
objects act*. I/O lives in async methods of the objects hooks return, run inside
the host's anyio task group. An ``async def`` hookimpl is rejected at registration.

Call shapes follow the names: ``register_*`` collects (every plugin may add),
``*_store`` / ``make_*`` pick one (firstresult), ``check_*`` is a verdict where
None means "no opinion", ``*_event`` observes.

The hooks are grouped by the phase in which they are called:

- **registration** — once per host at start-up (``dsh_addhooks``, ``dsh_configure``,
  ``dsh_register_models``, ``dsh_register_search_providers``, ``dsh_register_tools``,
  ``dsh_register_guidance``, ``dsh_register_subagent_providers``, ``dsh_register_front_doors``),
  or by the CLI and ``dsh doctor`` (``dsh_register_commands``, ``dsh_register_doctor_checks``);
- **composition** — once per host, pick the one object that fills a seam or lives as long
  as the host (``dsh_session_store``, ``dsh_attachment_store``, ``dsh_confinement``,
  ``dsh_jobs``, ``dsh_client_mcp``, ``dsh_lifespan``);
- **per-session** — for one agent: building it (``dsh_make_agent``, ``dsh_system_prompt``,
  ``dsh_session_tool_names``, ``dsh_session_tools``, ``dsh_history_policy``, ``dsh_code_runtime``),
  deciding inside its turns (``dsh_check_step``, ``dsh_after_tool``, ``dsh_check_approval``), and
  cleaning up after it (``dsh_session_artifacts``);
- **observation** — see every durable event, change nothing (``dsh_session_event``), or say
  what a door shows a person for it (``dsh_present_event``; ``dsh_present_live`` for the
  model's thinking as it is written, ``dsh_present_progress`` for a running tool call's output
  so far, ``dsh_present_replay`` when a reopened session is shown again), or name the trace
  context work leaving the process continues (``dsh_trace_context``), or tell a recorded
  compaction summary from its framing when a log is read back (``dsh_compaction_summary``);
- **interception** — steer a session at fixed points of its turns, as a hook bridge does
  (``dsh_session_start``, ``dsh_prompt_submit``, ``dsh_before_tool``, ``dsh_before_stop``, and
  ``dsh_after_tool`` above), with typed decisions from ``dsh_core.interception``.

The hooks name the spine's objects by their Protocols (``dsh_core.protocols``: ``Host``,
``Agent``, ``CommandRegistry``…), never by the concrete classes: this module imports
nothing but the contract, and ``hookimpl``, the marker plugins decorate their
implementations with, lives here beside the specs it matches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from .config import PluginConfig
    from .protocols import (
        Agent,
        AgentSpec,
        AttachmentStore,
        ClientMcp,
        CodeRuntime,
        CommandRegistry,
        Confinement,
        Control,
        DoctorCheck,
        FrontDoor,
        HistoryPolicy,
        Host,
        Jobs,
        ModelProvider,
        SearchProvider,
        SessionStore,
        SlashCommand,
        SubagentProvider,
        Tool,
        ToolSource,
    )
    from .types import (
        AfterTool,
        ApprovalRequest,
        DurableEvent,
        Guidance,
        LiveText,
        ToolCallBlock,
        ToolOutput,
        ToolProgress,
        UserMessage,
    )

PROJECT = "dsh"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
"""Decorate a plugin's hook implementations: ``@hookimpl`` (``dsh_core.hookimpl`` is the same marker)."""


def config_type_hook(plugin: str, cls: type[PluginConfig]) -> Callable[[], tuple[str, type[PluginConfig]]]:
    """A plugin's ``dsh_config_type`` hookimpl, declaring ``cls`` as its ``[config.<plugin>]``
    table, in one line at module level: ``dsh_config_type = config_type_hook("todo", TodoConfig)``."""

    @hookimpl
    def dsh_config_type() -> tuple[str, type[PluginConfig]]:
        return plugin, cls

    return dsh_config_type


# -----------------------------------------------------------------------------
# Registration: configure, then offer what a plugin provides (once per host at start-up;
# commands and doctor checks once per CLI run).
# -----------------------------------------------------------------------------


@hookspec(historic=True)
def dsh_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Publish a plugin's own hookspecs.

    Called by the host once per plugin as it is registered (historic: late plugins
    see it too). Call ``pluginmanager.add_hookspecs(module)``. Return value ignored.
    """


@hookspec
def dsh_config_type() -> tuple[str, type[PluginConfig]] | None:
    """Declare this plugin's ``[config.<plugin>]`` table: ``(plugin name, a PluginConfig Struct)``.

    Called once when a composition loads, before ``dsh_configure``. The host decodes the table
    into the Struct (kebab-case keys; an unknown key, a wrong type or an out-of-range value is one
    ``ConfigError`` naming the example file, the plugin, the key, what was expected and what was
    found) and hands it out as ``host.config_for(MyConfig)``. ``dsh config`` prints the schema.
    Every plugin declares one, a plugin with no options an empty Struct (then any key in its
    table is refused, "it takes no options"); a table with keys that no mounted plugin declares
    (a typo, a plugin this example does not mount) is refused at start-up, naming it.
    """


@hookspec(historic=True)
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    """Receive and validate configuration.

    Called by the host once after composition (after every declared table was decoded, see
    ``dsh_config_type``), before any other hook that uses config. A plugin reads its settings
    as its declared type, ``host.config_for(YourConfig)``, and builds its per-host state here;
    what a Struct cannot say (an environment variable, a check against another plugin) raises
    ``dsh_core.ConfigError`` naming the key and the fix. ``config`` maps each plugin's name to
    its raw table from the example's manifest (``[config.<plugin>]``), already checked by its
    declared type; a table no mounted plugin declares was refused before this call. Return
    value ignored.
    """


@hookspec
def dsh_register_models(register: Callable[[ModelProvider], None], host: Host) -> None:
    """Offer model providers.

    Called once by the host at start-up, after ``dsh_configure``; build one provider
    per host (read settings with ``host.config_for(YourConfig)``). Call ``register(provider)``; its ``name``
    is the route's provider part and ``resolve(model)`` declares per-model
    capabilities. Two providers with one name are an error. Return value ignored.
    """


@hookspec
def dsh_register_tools(register: Callable[[Tool], None], host: Host) -> None:
    """Offer tools to every agent of this host.

    Called once by the host at start-up, after ``dsh_configure``. Call ``register(tool)``; tool names are
    unique, and the model sees them in registration order (stable, for prefix
    caching). Return value ignored.
    """


@hookspec
def dsh_register_guidance(register: Callable[[Guidance], None], host: Host) -> None:
    """Offer usage guidance for tools: system-prompt sections (``types.Guidance``) that an agent
    gets only when it has one of the tools a section names.

    Called once by the host at start-up, after ``dsh_register_tools``. Call ``register(section)``
    for each; two sections with one name are an error, and so is a section that names no tool.
    ``Host.system_prompt`` puts the sections of the tools an agent has (the host's, and the
    session tools ``dsh_session_tool_names`` declares for it) after every ``dsh_system_prompt``
    section, by ``order`` and then ``name`` — the same text every time, so the provider's prefix
    cache keeps hitting. Keep the text about how to use the tools well together (what the schema
    of one call cannot say). Return value ignored.
    """


@hookspec
def dsh_register_subagent_providers(register: Callable[[SubagentProvider], None], host: Host) -> None:
    """Offer subagent providers by name (``spawn``, ``fork``, ``acp``…): what starts a child
    agent for a delegating tool (``protocols.SubagentProvider``).

    Called once by the host at start-up, after ``dsh_register_tools``. Call ``register(provider)``;
    two providers with one name are an error. The tools that delegate find them in
    ``host.subagent_providers``. Return value ignored.
    """


@hookspec
def dsh_register_search_providers(register: Callable[[SearchProvider], None], host: Host) -> None:
    """Offer web search providers by name (``protocols.SearchProvider``): a provider plugin
    registers one only when it is configured (its API key is in the environment), so that
    ``web_search`` exists only where it can work.

    Called once by the host at start-up, after ``dsh_configure`` and before
    ``dsh_register_tools`` (the web plugin reads ``host.search_providers`` to decide). Call
    ``register(provider)``; two providers with one name are an error. Return value ignored.
    """


@hookspec
def dsh_register_front_doors(register: Callable[[FrontDoor], None], host: Host) -> None:
    """Offer front doors by name (``acp-stdio``, ``stream-json``…).

    Called once by the host at start-up, after ``dsh_configure`` (read your settings
    with ``host.config_for(YourConfig)``). Call ``register(door)`` for each door; the
    example's ``front-door`` key picks one. Return value ignored.
    """


@hookspec
def dsh_register_commands(commands: CommandRegistry) -> None:
    """Add ``dsh <sub>`` subcommands.

    Called by the CLI while it builds its argument parser, on a plugin manager that
    holds the spine's builtins and every installed dsh plugin (commands are
    discoverable without an example). Call ``commands.add(name, help=…, setup=…,
    run=…)``; ``run(args) -> int`` is the exit code. Return value ignored.
    """


@hookspec
def dsh_register_doctor_checks(register: Callable[[DoctorCheck], None], host: Host) -> None:
    """Offer checks to ``dsh doctor`` (does this machine serve the example?).

    Called by ``dsh doctor`` once, on a host built for the example being checked from
    its installed plugins: configured and its registries filled, but never started (no
    lifespan, no task group, no agent). Call ``register(check)`` with objects that have a
    ``name`` and ``async run() -> dsh_core.doctor.Finding`` (see ``protocols.DoctorCheck``);
    the doctor runs them in order after its own checks. A ``fail`` finding makes it exit 1.
    Return value ignored.
    """


# -----------------------------------------------------------------------------
# Composition: once per host, pick the one object that fills a seam, or live as long as the host.
# -----------------------------------------------------------------------------


@hookspec(firstresult=True)
def dsh_session_store(host: Host) -> SessionStore | None:
    """Pick the durable session store.

    Called once by the host at start-up. First non-None wins; the spine's default
    (trylast) keeps logs in memory only.
    """


@hookspec(firstresult=True)
def dsh_attachment_store(host: Host) -> AttachmentStore | None:
    """Pick the content-addressed attachment store.

    Called once by the host at start-up. First non-None wins; the default is None:
    no store, so nothing claims image support.
    """


@hookspec(firstresult=True)
def dsh_confinement(host: Host) -> Confinement | None:
    """Provide how processes run confined (sandbox-tools: bubblewrap or Landlock).

    Called once by the host at start-up, after ``dsh_configure``. First non-None wins; the
    default is None, and then ``host.confinement`` is None: a plugin that needs confinement
    (hooks, code mode) refuses to run, never runs unconfined.
    """


@hookspec(firstresult=True)
def dsh_jobs(host: Host) -> Jobs | None:
    """Provide the background job registry (``protocols.Jobs``; the ``jobs`` plugin does).

    Called once by the host at start-up, after ``dsh_configure`` and before
    ``dsh_register_tools`` (a tool offers ``run_in_background`` only when ``host.jobs`` is
    set). First non-None wins; the default is None: nothing runs in the background.
    """


@hookspec(firstresult=True)
def dsh_client_mcp(host: Host) -> ClientMcp | None:
    """Say whether this composition takes MCP servers from the client (ACP ``session/new``
    ``mcpServers``), and of which transports (``protocols.ClientMcp``).

    Called by a front door when it answers ``initialize`` and when a client hands it servers.
    First non-None wins; None (the default) means servers from a client are refused
    (``-32602``, ACP-3) and ``mcpCapabilities`` stays unset. The servers a door accepts reach
    the session as ``AgentSpec.mcp_servers``, for the plugin that answered to serve them
    (``dsh_session_tools``).
    """


@hookspec
def dsh_session_controls(session: Agent, host: Host) -> list[Control] | None:
    """Offer settings of ``session`` a person may change from a front door (``protocols.Control``:
    a model picker, a reasoning effort, a permission mode), with their current values.

    Called by a front door that shows sessions to people each time it shows the settings (a
    session opens, one changes); every implementation's list is offered, in order. A door
    that gets none offers none (acp-agent). Must be cheap and must not block.
    """


@hookspec
def dsh_slash_commands(session: Agent, host: Host) -> list[SlashCommand] | None:
    """Contribute ``/name`` commands to ``session`` (``protocols.SlashCommand``): compaction's
    ``/compact``, a status line, a skill.

    Called by a front door configured to offer commands (ACP: ``[config.acp-transport]
    commands``) when a session opens and when a prompt starts with ``/``; every
    implementation's list is offered (the first of a name wins). Must not block.
    """


@hookspec
def dsh_lifespan(host: Host) -> AbstractAsyncContextManager[Any] | None:
    """Provide an async context manager that lives as long as the host.

    Called once by the host at start-up. Managers are entered in call order inside
    the host's task group and exited in reverse. Return None for nothing.
    """


# -----------------------------------------------------------------------------
# Per-session: for one agent, building it, then deciding inside its turns.
# -----------------------------------------------------------------------------


@hookspec(firstresult=True)
def dsh_make_agent(spec: AgentSpec, host: Host) -> Agent | None:
    """Build the agent for a new session.

    Called by ``Host.create_agent``. The first non-None result wins; the spine's
    default (trylast) builds ``dsh_core.agent.Agent``. A wrapper (``hookwrapper``/
    ``wrapper=True``) may decorate the result.
    """


@hookspec
def dsh_system_prompt(spec: AgentSpec, host: Host) -> str | None:
    """Contribute a section of an agent's system prompt.

    Called by the agent service once when it creates an agent (``spec.cwd`` is the
    session's directory, ``spec.session_id`` its id). Return a string
    (a section) or None. The spine's base section comes first, then the plugins'
    sections in registration order, then the tool guidance (``dsh_register_guidance``). The
    result is stable for the session's life, so the provider's prefix cache keeps hitting.
    """


@hookspec
def dsh_session_tool_names(spec: AgentSpec, host: Host) -> list[str] | None:
    """Name the session tools (``dsh_session_tools``) an agent built from ``spec`` will have, as far
    as they are known before it is built: a continuable child's ``report``.

    Called by ``Host.system_prompt`` once per agent, before the agent exists (so before its
    sources publish anything). Every implementation's names are collected; None for none. Only
    the guidance sections (``dsh_register_guidance``) use them: a section about a session tool
    reaches exactly the agents that get that tool. A source whose tools are discovered at run time
    (an MCP server's) names none.
    """


@hookspec
def dsh_session_tools(session: Agent, host: Host) -> ToolSource | None:
    """Offer a source of tools for ``session`` alone, beyond the host's (``dsh_register_tools``):
    an MCP client's servers, configured or handed over by the client (``session.spec.mcp_servers``).

    Called by the agent once, when it is built (every plugin may add one; None for none). Each
    source's ``serve`` runs as the session's task until the session is disposed; it publishes
    tools with ``session.publish_tools`` and the first turn waits until each source is
    ready (see ``protocols.ToolSource``). Tools published so go through the same paths as the
    host's: arguments checked, ``dsh_before_tool``, approvals, ``dsh_after_tool``, events.
    """


@hookspec(firstresult=True)
def dsh_history_policy(session: Agent, host: Host) -> HistoryPolicy | None:
    """Pick the object that may rewrite ``session``'s model history (compaction).

    Called by the agent once, when it is built. First non-None wins; None (the default)
    means the history is only ever appended to. The policy's ``prepare`` runs before each
    model call and its ``recover`` after a context-length error (``CONTEXT_WINDOW_EXCEEDED``);
    either may return a replacement history, which the agent adopts whole (a new list: views
    handed to earlier calls stay valid). Rewriting is the policy's alone and should be rare,
    so everything between rewrites stays append-only and the provider's prefix cache keeps
    hitting. See ``protocols.HistoryPolicy``.
    """


@hookspec(firstresult=True)
def dsh_code_runtime(session: Agent, host: Host) -> CodeRuntime | None:
    """Pick the runtime that runs one program of code mode (``run_code``) for ``session``.

    Called by the code-mode plugin each time a program of that session is to run (keep it
    cheap: the session gives the cwd and the route). First non-None wins; code-mode's own default (trylast) is a
    fresh fork per run of the session's warm Python process, confined by the sandbox ``bash`` uses. A runtime
    declares its ``language`` (the prompt's API is rendered for it) and implements
    ``run(program, bindings, cancel=None)`` (see ``protocols.CodeRuntime``: ``cancel``, when given, aborts the run).
    """


@hookspec(firstresult=True)
def dsh_check_step(session: Agent, turn: int, step: int) -> Literal["stop"] | None:
    """Say whether a turn may make its next model call.

    Called by the agent loop before each model call of a turn (``step`` counts them from 1).
    ``"stop"`` ends the turn now with reason ``max-steps`` (the ACP door answers
    ``max_turn_requests``); what was answered so far is already committed, and every tool call
    already has its result. None (no opinion) lets the call go ahead. First non-None wins.
    """


@hookspec
def dsh_after_tool(session: Agent, call: ToolCallBlock, output: ToolOutput) -> AfterTool | None:
    """Decide what follows one tool result the model is about to see.

    Called by the agent's tool path once per tool call after the tool ran, before the result is
    committed: for the model's calls after the spine bounded the result (``dsh_core.spill``: over
    ``host.spill_limit`` bytes, the model gets head, tail and the spill file's path), and for the
    nested calls a program makes through ``Agent.call_tool`` (code mode; ``call.id`` is
    ``<parent>:code:<n>``; the result is whole, as the program reads it). ``call`` has the raw
    JSON ``arguments``; ``output`` is the result — read it, never mutate it. Return an
    ``AfterTool`` (or a ``Pending`` one, see *interception* below) or None. Every implementation
    is called (registration order) and the loop folds the answers: all ``context`` texts are
    appended after the result, each in a ``<system-reminder>`` block — for a nested call, whose
    result only the program reads, as one message after the step's tool results (append-only:
    nothing earlier is rewritten, so the prefix cache keeps hitting); any ``block`` replaces the
    result's content with the joined feedback and marks it an error (a program sees the error);
    any ``halt`` stops the turn once the step's calls are answered. Hooks decide; the loop applies.
    """


@hookspec(firstresult=True)
def dsh_check_approval(
    request: ApprovalRequest,
) -> Literal["allow", "deny", "ask"] | None:
    """Give a policy verdict on an approval request before anyone is asked.

    Called by the approval service for every request. ``"allow"``/``"deny"`` decide
    at once (one-shot, nothing remembered); ``"ask"`` or None (no opinion) go on to
    the answerers (front doors), tried newest first; none answering → unavailable.
    """


@hookspec
def dsh_session_artifacts(session_id: str, host: Host) -> list[Path] | None:
    """Name the files a plugin keeps for one session besides its log (e.g. spill files).

    Called by a front door when a client deletes a recorded session that is not open
    (ACP ``session/delete``). Return the paths (files or directories) to remove, or None;
    the caller removes them after the session's log. Do no I/O here. Collects every result.
    """


# -----------------------------------------------------------------------------
# Observation: see what happened, change nothing.
# -----------------------------------------------------------------------------


@hookspec
def dsh_session_event(session: Agent, event: DurableEvent) -> None:
    """Observe every durable event, after it is appended to the session log.

    Called synchronously by the agent for each event, in order. Must not block or
    raise (an exception is logged to stderr and swallowed). Return value ignored. An
    implementation that reads only some event types says which with ``dsh_core.state.reads``
    (``@reads(TurnEnd)`` under ``@hookimpl``): the others never reach it. (Hook wrappers, and
    hook calls traced by ``DSH_TRACE_PLUGINS``, see every event, as pluggy calls them.)
    """


@hookspec
def dsh_trace_context(session: Agent, call_id: str | None) -> dict[str, str] | None:
    """Name the W3C trace context (``traceparent``, ``tracestate``) that work done in another
    process on behalf of ``session``'s tool call ``call_id`` continues.

    Called by a plugin that hands a tool call's work to another process, synchronously, just
    before it sends the request: subagent-acp puts the answer in ``_meta`` of the child's
    ``session/new`` (the ACP convention for trace context), and the child's ACP door hands it to
    the new agent as ``AgentSpec.trace_context``. A tracing plugin (otel) returns the context of
    that call's span; None: no opinion. Every result is merged (later keys win). Must not block
    or raise.
    """


@hookspec(firstresult=True)
def dsh_compaction_summary(message: UserMessage) -> str | None:
    """Say whether ``message`` is a compaction summary this plugin committed, and what its summary
    call answered.

    Called by whoever reads a recorded session back and must tell the compactor's own output
    from the framing it committed it in: replay-model, once for each ``compaction/summary``
    event of a log it derives model calls from. Return the text the summary call produced (the
    message's text without the plugin's framing) when the message is such a summary; None when it
    is not yours. First non-None wins; with no answer the message's whole text is used. Pure and
    cheap: no I/O.
    """


@hookspec
def dsh_present_event(session: Agent, event: DurableEvent) -> list[Any] | None:
    """Say what else a front door shows a person for one durable event of ``session``, beyond
    what the door itself sends (committed text): a tool call's card, a thought, a plan.

    Called by a front door that shows sessions to people, synchronously, for each event of a
    session it serves, in order, before the door's own output for that event. Returns the
    door's update objects — for the ACP door, session updates from ``dsh_acp.wire``
    (``ToolCallStart``, ``ToolCallProgress``, ``ThoughtChunk``, ``PlanUpdate``) — which it
    sends in the order returned, behind what is already queued; None for nothing. A door with
    no implementation of this hook sends exactly what it did without it (acp-agent, ACP-6/12).
    Must not block or raise.
    """


@hookspec
def dsh_present_live(session: Agent, piece: LiveText) -> list[Any] | None:
    """Say what a front door that streams live text (ACP: ``[config.acp-transport] stream =
    "live"``) shows of a piece of the model's *thinking* as it is written (``piece.reasoning``;
    the door sends the answer's text itself). Returns the door's update objects (ACP:
    ``ThoughtChunk``) or None. Called synchronously, in order; must not block or raise. An
    implementation that shows a message's thinking live should not show it again when the message
    commits (``dsh_present_event``).
    """


@hookspec
def dsh_present_progress(session: Agent, progress: ToolProgress) -> list[Any] | None:
    """Say what a front door that shows sessions to people shows of a running tool call's
    progress (``types.ToolProgress``, which a tool reports through ``ToolContext.progress``: the
    tail of a command's output so far, already bounded in size and rate by the tool).

    Called by such a door synchronously, in order, for each piece of ``session``'s calls, between
    the call's ``tool/call`` and its ``tool/result`` events. A door subscribes to progress
    (``Agent.watch_progress``) only when this hook has an implementation, so without one tools
    gather none (acp-agent). Progress is never durable: nothing of it reaches the session log or
    the model. Returns the door's update objects (ACP: a ``ToolCallProgress`` of the call's card,
    whose content the next piece, and finally the result, replaces) or None. Must not block or
    raise.
    """


@hookspec
def dsh_present_replay(session: Agent, event: DurableEvent) -> list[Any] | None:
    """Say what a front door shows of one *recorded* event of ``session`` when it shows a
    reopened session again (ACP ``session/load``), beyond the text the door replays itself: a tool
    call's card with its final status and output, the model's thoughts, the plan.

    Called by such a door synchronously, for each event of the session's log in order, before
    the door's own replay of that event and before it answers the load; the session is restored
    and no turn runs. Unlike ``dsh_present_event`` it shows what happened then, not now, from the
    log alone: no file is read (a diff of then cannot be rebuilt from the disk of now: what a
    card showed must have been recorded when it was shown), nothing is counted into the live
    session's state, no notice of the moment (a failed server, a retry) is repeated. Returns the
    door's update objects or None. A door with no implementation replays what it did without it.
    Must not block or raise.
    """


# -----------------------------------------------------------------------------
# Interception: the points a hook bridge (plugins hooks-claude-code, hooks-codex) or any native plugin sits on
# to steer a session: session start, prompt submit, before a tool, after a tool (``dsh_after_tool``
# above) and before a turn stops. Each is called synchronously by the agent loop with every
# implementation (pluggy's order: the last registered first); an implementation answers with a typed decision from
# ``dsh_core.interception`` (or ``types.AfterTool``), or with a ``Pending`` object whose async
# ``decide()`` the agent awaits inside the turn (its cancel scope: cancelling the turn cancels the
# work), or None (no opinion). ``dsh_after_tool`` accepts a ``Pending`` the same way. The loop
# folds the answers most-restrictively (see ``dsh_core.interception``); any answer may also ``halt``
# the turn right after its point (``turn/end`` reason ``stopped``); a plugin that writes
# durable records of its work uses ``session.emit`` (the ``hook/invoked``/``hook/result`` events).
# -----------------------------------------------------------------------------

if TYPE_CHECKING:  # pragma: no cover
    from .interception import BeforeStop, BeforeTool, Pending, PromptSubmit, SessionStart
    from .types import UserMessage


@hookspec
def dsh_session_start(session: Agent, source: str, turn: int) -> SessionStart | Pending[SessionStart] | None:
    """Add context when a session starts serving.

    Called by the agent loop once per agent object, at the start of its first turn (``turn``),
    before ``dsh_prompt_submit``; ``source`` is ``startup`` for a new session and ``resume`` for
    one rebuilt from its log. Context texts are appended after that turn's prompt.
    """


@hookspec
def dsh_prompt_submit(
    session: Agent, messages: list[UserMessage], turn: int
) -> PromptSubmit | Pending[PromptSubmit] | None:
    """Admit (or reject) the user messages a turn has just claimed, or add context to them.

    Called by the agent loop at the start of every turn, after ``turn/start``, before the first
    model call. Any ``block`` keeps the messages out of the model's history and ends the turn
    with reason ``blocked`` (nothing is sent to the model); so does any ``halt`` here or at
    ``dsh_session_start`` (then this point is not called); ``context`` texts are appended after
    the messages.
    """


@hookspec
def dsh_before_tool(
    session: Agent, name: str, args: dict[str, Any], call_id: str, turn: int, step: int
) -> BeforeTool | Pending[BeforeTool] | None:
    """Allow, deny or ask about one tool call before it runs.

    Called by the agent's tool path (``Agent.call_tool``) for every call whose tool exists and
    whose arguments decoded — the model's calls and the nested calls of a program (code mode;
    their ``call_id`` is ``<parent>:code:<n>``) alike. Folded deny > ask > allow: ``deny`` answers
    ``Error: <reason>`` (code ``BLOCKED``) without running the tool; ``ask`` asks the approval seam
    once (over ACP a ``session/request_permission``) and runs the call only when allowed.
    ``args`` is the decoded arguments: read them, never mutate them. ``halt`` (any answer) wins
    over every verdict: the call does not run and the turn stops once the step's calls are answered.
    """


@hookspec
def dsh_before_stop(
    session: Agent, turn: int, step: int, continued: int
) -> BeforeStop | Pending[BeforeStop] | None:
    """Let a turn end, or make it take another step.

    Called by the agent loop when a step asked for no tool call (the turn would complete);
    ``continued`` counts how often this turn was already made to continue. Any ``block`` appends
    its reason as a user message (source ``hook``) and runs another step; the step budget
    (``dsh_check_step``) still applies, so a hook that always blocks ends at ``max-steps``. Any
    ``halt`` wins over the blocks: the turn ends with reason ``stopped``.
    """
