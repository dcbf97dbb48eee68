"""subagent-acp: the tool ``subagent_acp`` delegates a text task to another ACP agent in a
fresh process and returns its committed answer. With a roster (``[config.subagent-acp.agents.
<name>]``: a command and a description each) it takes the original's ``subagent`` arguments
plus ``agent``, an enum of the names, one-shot in the foreground or as a job; without one it
keeps ``{task, cwd?}`` and runs ``dsh run --example acp-agent`` on the parent's route.

The child's ``session/request_permission`` goes to the *parent's* approval seam (so under
ACP the parent's client decides, one-shot, fail-closed); only when nobody in the parent
can answer does the static ``permission`` policy apply. A depth limit and a cap on live
children stop runaway delegation; cancelling the parent's turn cancels the child and the
result says ``aborted`` with the partial output; the host's teardown disposes every live
child (stdin EOF, grace, SIGTERM, SIGKILL of its whole process tree). See README.md.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio
import msgspec
from dsh_acp.client import AcpClient, AcpClientError, PermissionAsk, open_client, scrub_env
from msgspec import Meta

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig, decode
from dsh_core.contracts import new_id
from dsh_core.paths import dir_inside
from dsh_core.protocols import JobEnd, SubagentRequest
from dsh_core.types import ApprovalDecided, ApprovalRequest, SubagentResult, ToolOutput, ToolSpec

log = logging.getLogger("dsh.subagent-acp")

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import Host

NAME = "subagent-acp"
TOOL = "subagent_acp"
ENV_COMMAND = "DSH_SUBAGENT_ACP_COMMAND"
ENV_DEPTH = "DSH_SUBAGENT_DEPTH"
ENV_MAX_DEPTH = "DSH_SUBAGENT_MAX_DEPTH"

# ACP stop reason → what the tool result says (the original's mapping).
STOPS = {
    "end_turn": "completed",
    "max_tokens": "stopped: max tokens",  # cut short, not done (also a dsh child's end_turn with turnEnd max-tokens)
    "refusal": "refusal",
    "cancelled": "aborted",
}


@dataclass(frozen=True)
class NamedAgent:
    """One agent of the roster (``[config.subagent-acp.agents.<name>]``): what the model picks by name."""

    name: str
    description: str
    command: tuple[str, ...] | None = None  # None: dsh itself (``example`` on the parent's route)
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_env: tuple[str, ...] | None = None  # None: the plugin's ``inherit-env``
    sandbox: str = "none"  # "session": started through the host's confinement at the session's tier


@dataclass(frozen=True)
class Settings:
    command: tuple[str, ...] | None = None
    example: str = "acp-agent"
    permission: str = "reject"
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_env: tuple[str, ...] = ("DSH_HOME", "DSH_EXAMPLES_PATH", "DSH_SKILLS_USER_ROOTS")
    max_depth: int = 2
    max_live: int = 4
    start_timeout: float = 60.0
    cancel_grace: float = 2.0
    eof_grace: float = 2.0
    term_grace: float = 2.0
    forward_stderr: bool = False
    agents: tuple[NamedAgent, ...] = ()


Seconds = Annotated[float, Meta(gt=0)]


CommandLine = Annotated[list[str] | str | None, Meta(
    description="the agent's whole command (a list, or one shell-quoted line); default: dsh run --example EXAMPLE "
                "on this agent's route")]


def _argv(command: list[str] | str | None) -> tuple[str, ...] | None:
    if command is None:
        return None
    argv = tuple(shlex.split(command) if isinstance(command, str) else command)
    if not argv:
        raise ValueError("command must be a non-empty list of strings or a command line")
    return argv


class AgentEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    """``[config.subagent-acp.agents.<name>]``: one ACP agent the model may delegate to by name."""

    description: Annotated[str, Meta(min_length=1, description=(
        "what this agent is good at, as the model reads it in the tool's description"))]
    command: CommandLine = None
    env: Annotated[dict[str, str], Meta(description="variables set in this agent's environment")] = (
        msgspec.field(default_factory=dict))
    inherit_env: Annotated[list[str] | None, Meta(description=(
        "variables passed on despite the scrubbing (default: the plugin's inherit-env)"))] = None
    sandbox: Annotated[Literal["none", "session"], Meta(description=(
        "\"session\": start it confined like bash, at the session's tier (no write outside the roots); "
        "\"none\": as it is (an agent with a sandbox of its own, and a login under $HOME)"))] = "none"

    def __post_init__(self) -> None:
        _argv(self.command)


class SubagentConfig(PluginConfig):
    """[config.subagent-acp]"""

    command: Annotated[list[str] | str | None, Meta(
        description="the child's whole command (a list, or one shell-quoted line); default: dsh run --example EXAMPLE "
                    "on this agent's route")] = None
    example: Annotated[str, Meta(min_length=1, description="the example the child serves")] = "acp-agent"
    permission: Annotated[Literal["allow", "reject"], Meta(
        description="the answer to a child's permission request nobody in this process can answer")] = "reject"
    env: Annotated[dict[str, str], Meta(description="variables set in the child's environment")] = (
        msgspec.field(default_factory=dict))
    inherit_env: Annotated[list[str], Meta(description="variables passed on despite the scrubbing")] = (
        msgspec.field(default_factory=lambda: list(Settings.inherit_env)))
    max_depth: Annotated[int, Meta(ge=0, description="delegation depth limit")] = 2
    max_live: Annotated[int, Meta(ge=1, description="children running at once")] = 4
    start_timeout: Annotated[Seconds, Meta(description="seconds for a child to answer initialize")] = 60.0
    cancel_grace: Annotated[Seconds, Meta(description="seconds a cancelled child gets to settle")] = 2.0
    eof_grace: Annotated[Seconds, Meta(description="seconds after stdin EOF before SIGTERM")] = 2.0
    term_grace: Annotated[Seconds, Meta(description="seconds after SIGTERM before SIGKILL")] = 2.0
    forward_stderr: Annotated[bool, Meta(description="copy the child's stderr to this process's")] = False
    agents: Annotated[dict[str, AgentEntry], Meta(description=(
        "the roster: ACP agents by name, each with a command and a description; when set, subagent_acp takes the "
        "original's subagent arguments plus `agent` (one of these names)"))] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        _argv(self.command)
        for name in self.agents:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
                raise ValueError(f"agent name {name!r}: letters, digits, '_', '.', '-' only")


dsh_config_type = config_type_hook(NAME, SubagentConfig)


def settings_from(config: SubagentConfig) -> Settings:
    agents = tuple(
        NamedAgent(name=name, description=entry.description.strip(), command=_argv(entry.command), env=dict(entry.env),
                   inherit_env=None if entry.inherit_env is None else tuple(entry.inherit_env), sandbox=entry.sandbox)
        for name, entry in config.agents.items())
    return Settings(
        command=_argv(config.command), agents=agents, example=config.example, permission=config.permission, env=dict(config.env),
        inherit_env=tuple(config.inherit_env), max_depth=config.max_depth, max_live=config.max_live,
        start_timeout=config.start_timeout, cancel_grace=config.cancel_grace, eof_grace=config.eof_grace,
        term_grace=config.term_grace, forward_stderr=config.forward_stderr,
    )


def parse_settings(config: Mapping[str, Mapping[str, Any]]) -> Settings:
    """Settings from the raw example config (ConfigError naming the key when it is bad)."""
    return settings_from(decode(NAME, SubagentConfig, config.get(NAME), where="example"))


# --------------------------------------------------------------------------- per-host state


@dataclass(eq=False)
class Children:
    """The live ACP children of one host (for the cap and for teardown)."""

    settings: Settings
    live: set[AcpClient] = field(default_factory=set)
    running: int = 0  # reserved before the first await, so concurrent calls respect the cap
    started: int = 0  # runs the `acp` provider started (their ids: acp_1, acp_2…)
    closed: bool = False


def children_of(host: Any) -> Children:
    """The host's live children (its state slot, made with the host's settings on first use)."""
    children: Children = host.state(Children, lambda: Children(settings_from(host.config_for(SubagentConfig))))
    return children


def ambient_depth() -> tuple[int, int | None]:
    """(this process's delegation depth, the max depth an ancestor imposed) from the env."""
    try:
        depth = max(0, int(os.environ.get(ENV_DEPTH, "0")))
    except ValueError:
        depth = 0
    try:
        cap: int | None = int(os.environ[ENV_MAX_DEPTH])
    except (KeyError, ValueError):
        cap = None
    return depth, cap


def beside_python(argv: tuple[str, ...]) -> list[str]:
    """A bare program name found beside this Python first (an agent installed in dsh's own
    environment, or ``python`` itself), else as it is (the child's PATH finds it)."""
    program, *rest = argv
    if os.sep not in program:
        beside = os.path.join(os.path.dirname(sys.executable), program)
        if os.access(beside, os.X_OK):
            return [beside, *rest]
    return [program, *rest]


def child_command(settings: Settings, agent: Any, named: NamedAgent | None = None) -> list[str]:
    if named is not None and named.command is not None:
        return beside_python(named.command)
    override = os.environ.get(ENV_COMMAND, "").strip()
    if override:
        return shlex.split(override)
    if settings.command is not None:
        return list(settings.command)
    route = agent.spec
    return [
        sys.executable, "-m", "dsh_core.cli", "run", "--example", settings.example,
        "--provider", route.provider, "--model", route.model,
    ]  # fmt: skip


# --------------------------------------------------------------------------- the tool

PARAMETERS = {
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "description": "The complete, self-contained task. The subagent does not see this conversation.",
        },
        "cwd": {
            "type": "string",
            "description": "Working directory for the subagent, inside the current one (default: the current one).",
        },
    },
    "required": ["task"],
    "additionalProperties": False,
}


def _result(status: str, text: str, *, error: str | None = None, stop: str | None = None) -> ToolOutput:
    head = f"[subagent {status}" + (f" ({stop})" if stop and STOPS.get(stop) != status else "") + "]"
    if error:
        head += f" {error}"
    body = text if text else "(no output)"
    if status == "aborted":
        body = "partial output:\n" + body
    failed = status in ("aborted", "error")
    return ToolOutput.text(f"{head}\n{body}", is_error=failed, code="ABORTED" if status == "aborted" else (
        "SUBAGENT_FAILED" if failed else None))


class SubagentAcpTool:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.spec = ToolSpec(
            name=TOOL,
            description=(
                "Delegate a self-contained text task to a separate ACP agent (a fresh session in a new "
                "process). It does not see this conversation, so put everything it needs in `task`. "
                "Returns its final answer and how it stopped."
            ),
            parameters=PARAMETERS,
            # Delegations of one message run side by side, as before tools declared scheduling;
            # each child is its own agent and max-live-children bounds them.
            parallel_safe=True,
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        state = children_of(ctx.host)
        task = args.get("task")
        if not isinstance(task, str) or not task.strip():
            return ToolOutput.text("Error: `task` must be a non-empty string.", is_error=True, code="INVALID_ARGUMENTS")
        try:
            cwd = dir_inside(args.get("cwd"), ctx.cwd)
        except ValueError as exc:
            return ToolOutput.text(f"Error: {exc}.", is_error=True, code="INVALID_ARGUMENTS")
        admitted = admit(ctx, state)
        if isinstance(admitted, ToolOutput):
            return admitted
        depth, max_depth = admitted
        return _as_output(await exchange(Caller(ctx.agent, ctx.tool_name, ctx.call_id), state, task, cwd, depth,
                                         max_depth))

def admit(ctx: ToolContext, state: Children) -> tuple[int, int] | ToolOutput:
    """(this agent's depth, the depth limit) when one more child may start; else the error result
    (the depth limit, a closing host, the cap on live children). Nothing is spawned either way."""
    settings = state.settings
    depth, imposed = ambient_depth()
    depth += ctx.agent.spec.depth
    max_depth = settings.max_depth if imposed is None else min(settings.max_depth, imposed)
    if depth + 1 > max_depth:
        return ToolOutput.text(
            f"Error: subagent depth limit reached (this agent is at depth {depth}, the limit is {max_depth}); "
            "do the task yourself.",
            is_error=True,
            code="DEPTH_LIMIT",
        )
    if state.closed:
        return ToolOutput.text("Error: the host is shutting down.", is_error=True, code="SUBAGENT_FAILED")
    if state.running >= settings.max_live:
        return ToolOutput.text(
            f"Error: {state.running} subagents are already running (the cap is {settings.max_live}); "
            "wait for one to finish.",
            is_error=True,
            code="SUBAGENT_LIMIT",
        )
    return depth, max_depth


@dataclass(frozen=True)
class Caller:
    """Who delegates: the agent, and the tool call the child's permission requests are about."""

    agent: Any
    tool_name: str
    call_id: str | None
    who: str = "subagent (ACP)"  # how the approval request names the asking child


@dataclass(frozen=True)
class Outcome:
    """How a child's prompt ended: ``status`` as the tool result says it (``STOPS``), the text,
    an error message, the ACP stop reason."""

    status: str
    text: str
    error: str | None = None
    stop: str | None = None


def _as_output(outcome: Outcome) -> ToolOutput:
    return _result(outcome.status, outcome.text, error=outcome.error, stop=outcome.stop)


async def exchange(caller: Caller, state: Children, task: str, cwd: str, depth: int, max_depth: int,
                   named: NamedAgent | None = None, *, reserved: bool = False) -> Outcome:
    """One child process, one prompt: spawn, initialize, session/new, prompt, shut down. ``named``:
    the roster's agent (its command and environment), else the plugin's default child."""
    settings = state.settings
    argv = child_command(settings, caller.agent, named)
    inherit = settings.inherit_env if named is None or named.inherit_env is None else named.inherit_env
    extra = {**settings.env, **(named.env if named is not None else {}), ENV_DEPTH: str(depth + 1),
             ENV_MAX_DEPTH: str(max_depth)}
    env = scrub_env(inherit=inherit, extra=extra)
    if named is not None and named.sandbox == "session":
        confinement = caller.agent.host.confinement
        if confinement is None:  # never unconfined instead
            return Outcome("error", "", error="this agent runs confined (sandbox = \"session\") and no plugin "
                                              "provides confinement (mount sandbox-tools)")
        try:
            confined = await confinement.confine(argv, cwd=cwd, session=caller.agent)
        except Exception as exc:  # SANDBOX_UNAVAILABLE: no working mechanism
            return Outcome("error", "", error=f"cannot start it confined: {exc}")
        argv = confined.argv
        # the confined environment, plus exactly what this agent was configured to get
        env = {**confined.env, **{k: os.environ[k] for k in inherit if k in os.environ}, **extra}
    forward = None
    if settings.forward_stderr:
        def forward(chunk: bytes) -> None:
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()

    client: AcpClient | None = None
    if not reserved:  # a background call reserved its place when it was admitted
        state.running += 1
    try:
        async with open_client(
            argv,
            cwd=cwd,
            env=env,
            on_permission=policy_for(caller, settings),
            on_stderr=forward,
            eof_grace=settings.eof_grace,
            term_grace=settings.term_grace,
        ) as client:
            state.live.add(client)
            try:
                with anyio.fail_after(settings.start_timeout):
                    await client.start(timeout=None, meta=trace_meta(caller))
                result = await client.prompt(task, cancel_grace=settings.cancel_grace)
            finally:
                state.live.discard(client)
    except anyio.get_cancelled_exc_class():
        # The parent's turn was cancelled: the child got session/cancel and a grace to
        # settle, and is now shut down. The result still reaches the history (the loop
        # re-raises the cancellation at its next checkpoint).
        return Outcome("aborted", client.text if client is not None else "")
    except (AcpClientError, TimeoutError) as exc:
        message = str(exc) or f"the child did not start within {settings.start_timeout} s"
        log.warning(f"child run failed: {message}")
        return Outcome("error", client.text if client is not None else "", error=message)
    finally:
        state.running -= 1
    if result.stop_reason == "error":
        log.warning(f"child run failed: {result.error}")
        return Outcome("error", result.text, error=result.error)
    status = STOPS.get(result.stop_reason, "error")
    turn_end = ((result.meta or {}).get("dsh") or {}).get("turnEnd")
    if status == "completed" and turn_end == "max-tokens":  # a dsh child says why its end_turn came
        return Outcome(STOPS["max_tokens"], result.text, stop="max_tokens")
    return Outcome(status, result.text, stop=result.stop_reason,
                   error=None if status != "error" else f"stop reason {result.stop_reason!r}")


def trace_meta(caller: Caller) -> dict[str, str]:
    """The trace context the child continues (``dsh_trace_context``: a tracing plugin's answer for
    the delegating call), for ``_meta`` of its ``session/new``; empty when nobody traces."""
    meta: dict[str, str] = {}
    try:
        for answer in caller.agent.host.pm.hook.dsh_trace_context(session=caller.agent, call_id=caller.call_id):
            meta.update(answer or {})
    except Exception as exc:  # tracing never costs the delegation
        log.warning(f"dsh_trace_context failed: {exc!r}")
    return meta


def policy_for(ctx: Caller, settings: Settings) -> Any:
    """The child's permission request → the parent's approval seam (one-shot).

    ``unavailable`` with nobody answering (no channel in the parent) → the static
    ``permission`` fallback; ``unavailable`` from a channel that failed → reject."""

    async def policy(ask: PermissionAsk) -> str:
        req = ApprovalRequest(
            agent=ctx.agent,
            tool_name=ctx.tool_name,
            call_id=ctx.call_id,
            reason=f"{ctx.who} asks to run {ask.describe()}",
        )
        req.id = new_id("appr_")
        answered: list[str | None] = []

        def watch(agent: Any, event: Any) -> None:
            if isinstance(event, ApprovalDecided) and event.id == req.id:
                answered.append(event.answered_by)

        unsubscribe = ctx.agent.subscribe(watch)
        try:
            outcome = await ctx.agent.host.approvals.request(req)
        finally:
            unsubscribe()
        if outcome == "allowed-once":
            return "allow"
        if outcome == "cancelled":
            return "cancelled"
        if outcome == "unavailable" and answered and answered[-1] is None:
            return settings.permission  # nobody in the parent can answer: the static policy
        return "reject"

    return policy


# --------------------------------------------------------------------------- the roster

# A one-shot delegation that did not complete, as the original's subagent tools tell it (its
# tool-subagent headlines), and the codes dsh's in-process `subagent` gives the same ends.
HEADLINES = {
    "aborted": "subagent run was cancelled",
    "error": "subagent run failed",
    "max-tokens": "subagent run hit its token limit before finishing",
    "refusal": "subagent declined the task",
}
CODES = {"aborted": "ABORTED", "max-tokens": "SUBAGENT_MAX_TOKENS"}
JOB_KIND = "subagent"  # its jobs are subagent-1, subagent-2… (the original's kind)


def roster_parameters(agents: tuple[NamedAgent, ...], *, background: bool) -> dict[str, Any]:
    """The original's ``subagent`` arguments (``description``*, ``prompt``*, ``run_in_background``
    where jobs exist) plus ``agent``*, an enum of the roster's names."""
    props: dict[str, Any] = {
        "description": {"type": "string", "description": "A short (3-5 word) description of the task, shown while "
                                                         "it runs."},
        "prompt": {"type": "string", "description": "The complete task for the agent. It does not see this "
                                                    "conversation: say everything it needs."},
    }
    if background:
        props["run_in_background"] = {
            "type": "boolean",
            "description": "true: run it as a background job and answer the job's id at once (read it with "
                           "job_output, stop it with job_kill). false, the default: wait for its answer.",
        }
    props["agent"] = {"type": "string", "enum": [a.name for a in agents],
                      "description": "Which agent does the task (the list is in this tool's description)."}
    return {"type": "object", "properties": props, "required": ["description", "prompt", "agent"],
            "additionalProperties": False}


def roster_description(agents: tuple[NamedAgent, ...], *, background: bool) -> str:
    lines = [
        "Delegate a self-contained task to another coding agent, which works in its own process and context and "
        "answers with its final text, not its steps. It does not see this conversation, so give it a complete "
        "prompt. It works in this workspace; what it asks permission for is asked of you.",
        "Waits for the answer by default; with run_in_background true it is a job (job_output, job_kill)."
        if background else "Waits for the answer.",
        "The agents:",
    ]
    lines += [f"- {a.name}: {a.description}" for a in agents]
    return "\n".join(lines)


def roster_output(outcome: Outcome) -> ToolOutput:
    """The answer of a foreground run: the child's text; an end that is not ``completed`` is an
    error result with the original's headline, a diagnostic, and the partial text."""
    stop = SEAM_STOPS.get(outcome.status, "error")
    if stop == "completed":
        return ToolOutput.text(outcome.text)
    diagnostic = f"\nDiagnostic: {outcome.error}" if stop == "error" and outcome.error else ""
    partial = f"\nPartial output before the run ended:\n{outcome.text}" if outcome.text else ""
    return ToolOutput.text(f"Error: {HEADLINES[stop]}{diagnostic}{partial}", is_error=True,
                           code=CODES.get(stop, "SUBAGENT_FAILED"))


def job_end(outcome: Outcome, io: Any) -> JobEnd:
    """A background run's end as its job reports it (the original's one-shot settlement):
    ``completed`` with the answer as the job's output; any other end ``failed`` with the stop and
    the diagnostic, no partial output."""
    stop = SEAM_STOPS.get(outcome.status, "error")
    if stop == "completed":
        io.write(outcome.text.encode())
        return JobEnd(status="completed")
    return JobEnd(status="failed", detail=f"{stop}; diagnostic: {outcome.error}" if outcome.error else stop)


class RosterTool:
    """``subagent_acp {description, prompt, run_in_background?, agent}``: the model picks one of the
    configured ACP agents by name; one-shot, in the foreground unless it asks for a job."""

    def __init__(self, host: Host, agents: tuple[NamedAgent, ...]) -> None:
        self.host = host
        self.agents = {a.name: a for a in agents}
        background = host.jobs is not None
        self.spec = ToolSpec(name=TOOL, description=roster_description(agents, background=background),
                             parameters=roster_parameters(agents, background=background), parallel_safe=True,
                             kind="think")

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        state = children_of(ctx.host)
        named = self.agents.get(args.get("agent"))  # type: ignore[arg-type]
        if named is None:
            return ToolOutput.text(f"Error: `agent` must be one of {', '.join(self.agents)} (not {args.get('agent')!r}).",
                                   is_error=True,
                                   code="INVALID_ARGUMENTS")
        prompt, description = args.get("prompt"), args.get("description")
        if not isinstance(prompt, str) or not prompt.strip():
            return ToolOutput.text("Error: `prompt` must be a non-empty string.", is_error=True,
                                   code="INVALID_ARGUMENTS")
        if not isinstance(description, str) or not description.strip():
            description = prompt.strip().splitlines()[0]
        admitted = admit(ctx, state)
        if isinstance(admitted, ToolOutput):
            return admitted
        depth, max_depth = admitted
        caller = Caller(ctx.agent, ctx.tool_name, ctx.call_id, who=f"subagent {named.name} (ACP)")
        if args.get("run_in_background") is not True:
            return roster_output(await exchange(caller, state, prompt, ctx.cwd, depth, max_depth, named))
        jobs = ctx.host.jobs
        if jobs is None:  # the schema offers run_in_background only where jobs exist
            return ToolOutput.text("Error: background jobs unavailable: mount the jobs plugin.", is_error=True,
                                   code="INVALID_ARGUMENTS")
        cwd = ctx.cwd

        held = [True]  # this call holds a place under max-live until the job's work takes it over

        async def work(io: Any) -> JobEnd:
            outcome = Outcome("aborted", "")
            async with anyio.create_task_group() as tg:
                async def stop_when_asked() -> None:
                    await io.stopping.wait()  # job_kill: the child gets session/cancel and its grace
                    tg.cancel_scope.cancel()

                tg.start_soon(stop_when_asked)
                held[0] = False  # exchange releases the place now
                outcome = await exchange(caller, state, prompt, cwd, depth, max_depth, named, reserved=True)
                tg.cancel_scope.cancel()
            return job_end(outcome, io)

        async def release_if_never_run() -> None:  # a job killed before its work began
            await job.wait()
            if held[0]:
                held[0] = False
                state.running -= 1

        state.running += 1  # its place, held from now: siblings in this message see it
        try:
            job = jobs.start(ctx.agent, kind=JOB_KIND, title=description, work=work, call_id=ctx.call_id)
        except Exception:
            state.running -= 1
            raise
        ctx.host.task_group.start_soon(release_if_never_run, name=f"place of {job.id}")
        return ToolOutput.text(f"started background subagent job {job.id}")


# --------------------------------------------------------------------------- the `acp` provider

# the tool result's status → the seam's stop
SEAM_STOPS = {"completed": "completed", STOPS["max_tokens"]: "max-tokens", "refusal": "refusal", "aborted": "aborted"}


class AcpRun:
    """One child process on the subagent seam (one-shot: one prompt). The exchange is a task of
    the host's task group; ``cancel`` sends the child ``session/cancel`` (its partial text is
    the result), ``dispose`` waits until the process tree is gone."""

    def __init__(self, rid: str, request: SubagentRequest, state: Children, depth: int, max_depth: int) -> None:
        self.id = rid
        self.description = request.description
        self.session_id: str | None = None  # the child keeps its own log, in its own process
        self.request = request
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        self._result: SubagentResult | None = None
        request.parent.host.task_group.start_soon(self._main, state, depth, max_depth, name=f"subagent {rid}")

    async def _main(self, state: Children, depth: int, max_depth: int) -> None:
        caller = Caller(self.request.parent, "subagent", self.request.call_id)
        outcome = Outcome("aborted", "")
        try:
            with self._scope:
                outcome = await exchange(caller, state, self.request.prompt, self.request.cwd, depth, max_depth)
        finally:
            stop = SEAM_STOPS.get(outcome.status, "error")
            diagnostic = outcome.error if stop == "error" else (
                None if stop == "completed" else f"the ACP subagent stopped: {outcome.status}")
            self._result = SubagentResult(stop=stop, text=outcome.text, diagnostic=diagnostic)
            self._done.set()
            if self.request.on_settled is not None:
                try:
                    self.request.on_settled(self, self._result)
                except Exception as exc:
                    log.warning(f"settling {self.id} failed: {exc!r}")

    @property
    def status(self) -> Literal["running", "idle", "ready"]:
        return "ready" if self._done.is_set() else "running"

    async def result(self) -> SubagentResult:
        await self._done.wait()
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        self._scope.cancel()

    async def dispose(self) -> None:
        self._scope.cancel()
        with anyio.CancelScope(shield=True):
            await self._done.wait()


class AcpProvider:
    """``acp``: the child is another ACP agent's process (by default ``dsh run --example
    acp-agent`` on the parent's route), with this plugin's scrubbed environment, permission
    routing, caps and process-tree teardown."""

    name = "acp"

    def __init__(self, host: Host) -> None:
        self.host = host

    async def start(self, request: SubagentRequest) -> AcpRun:
        state = children_of(self.host)
        ambient, imposed = ambient_depth()
        settings = state.settings
        max_depth = settings.max_depth if imposed is None else min(settings.max_depth, imposed)
        depth = ambient + request.depth - 1  # the parent's depth: the child's env says depth + 1
        if depth + 1 > max_depth:
            raise ValueError(f"subagent depth limit reached (the limit is {max_depth})")
        if state.closed:
            raise ValueError("the host is shutting down")
        if state.running >= settings.max_live:
            raise ValueError(f"{state.running} ACP subagents are already running (the cap is {settings.max_live})")
        state.started += 1
        return AcpRun(f"acp_{state.started}", request, state, depth, max_depth)


# --------------------------------------------------------------------------- teardown


@asynccontextmanager
async def _lifespan(host: Host) -> AsyncIterator[None]:
    state = children_of(host)
    try:
        yield
    finally:
        state.closed = True
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for client in list(state.live):
                    tg.start_soon(_dispose, client)


async def _dispose(client: AcpClient) -> None:
    try:
        await client.cancel()
        await client.shutdown()
    except Exception as exc:
        log.warning(f"disposing child {client.pid} failed: {exc}")


# --------------------------------------------------------------------------- hooks


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Any) -> None:
    children_of(host)  # the slot, with the settings the host decoded


@hookimpl
def dsh_register_tools(register: Any, host: Any) -> None:
    agents = children_of(host).settings.agents
    register(RosterTool(host, agents) if agents else SubagentAcpTool(host))


@hookimpl
def dsh_register_subagent_providers(register: Any, host: Any) -> None:
    register(AcpProvider(host))


@hookimpl
def dsh_lifespan(host: Any) -> Any:
    return _lifespan(host)
