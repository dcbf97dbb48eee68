"""The delegation tools, with the original harness's names and argument shapes:

- ``subagent {description, prompt, run_in_background?, cwd?}`` — a fresh child (the configured
  provider, ``spawn`` by default), continuable; in the background by default: the call answers
  ``started subagent <id>`` at once and the child's outcome reaches this agent as one notice in
  its next request. With a job registry (the jobs plugin), that first turn is a background job
  too (kind ``subagent``): ``job_output`` reads its answer, ``job_kill`` stops it, and the job's
  notice is the one notice. ``run_in_background: false`` waits and answers the child's final text.
- ``subagent_fork {description, prompt}`` — a child that starts from this conversation
  (``fork``), in the foreground, one-shot.
- ``send_message {subagent_id, message}``, ``interrupt_agent {agent_id}``,
  ``list_agents {scope}`` — steer and see this agent's own children and their descendants.
- ``report {message}`` — offered only inside a continuable child: tell the parent now.

A child that did not complete is an error result with its stop reason, the diagnostic and
the partial text; never partial output passed off as an answer."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio

from dsh_core import ToolError
from dsh_core.display import one_line
from dsh_core.paths import dir_inside
from dsh_core.protocols import Agent, JobEnd, JobIO, SubagentRequest, ToolContext
from dsh_core.tools import FunctionTool
from dsh_core.types import SubagentResult, SubagentSettled, SubagentStarted, ToolOutput

from .runs import Delegations, Entry, RecordedRun, Registry

log = logging.getLogger("dsh.subagents")

CANCEL_GRACE = 2.0  # seconds a cancelled foreground child gets to settle (its partial text)
CODES = {"aborted": "ABORTED", "max-tokens": "SUBAGENT_MAX_TOKENS"}


def registry_of(host: Any) -> Registry:
    registry: Registry = host.state(Registry)
    return registry


def delegations_of(agent: Agent) -> Delegations:
    registry = registry_of(agent.host)
    found: Delegations = agent.state(Delegations, lambda: Delegations(registry))
    return found


async def recall(agent: Agent) -> Delegations:
    """The session's children, with those its log names from before a restart (continuable
    spawns, listed ``ready``: ``send_message`` brings one back). Read once per session object."""
    mine = delegations_of(agent)
    if mine.loaded:
        return mine
    mine.loaded = True
    try:
        _, events = await agent.host.session_store.read(agent.session_id)
    except Exception as exc:  # a store that cannot read back: nothing to recall
        log.debug(f"no recorded children for {agent.session_id}: {exc!r}")
        return mine
    started: dict[str, SubagentStarted] = {}
    last: dict[str, SubagentResult] = {}
    for ev in events:
        if isinstance(ev, SubagentStarted) and ev.provider == "spawn" and ev.session:
            started[ev.id] = ev
        elif isinstance(ev, SubagentSettled):
            last[ev.id] = SubagentResult(stop=ev.stop, text=ev.text, diagnostic=ev.diagnostic)
    recalled = {rid: Entry(run=RecordedRun(rid, ev.description, ev.session or "", last.get(rid)), parent=agent,
                           provider=ev.provider, description=ev.description, call_id=ev.call_id, continuable=True,
                           background=True)
                for rid, ev in started.items() if rid not in mine.runs}
    mine.runs = {**recalled, **mine.runs}
    for rid in recalled:  # new ids never repeat one the lineage has used
        number = rid.rpartition("_")[2]
        if number.isdigit():
            mine.registry.started = max(mine.registry.started, int(number))
    return mine


async def resume(entry: Entry, registry: Registry) -> None:
    """Bring a recorded child back from its own log, as a live continuable run under the same id.
    Its log must name this parent and a cwd inside the parent's (a log is a file: it never widens
    what the child may touch)."""
    parent = entry.parent
    recorded = entry.run
    header, events = await parent.host.session_store.read(recorded.session_id)
    if header.parent_session != parent.session_id:
        raise ValueError("its log names another parent")
    dir_inside(os.path.relpath(os.path.realpath(header.cwd), os.path.realpath(parent.cwd)), parent.cwd)
    provider = parent.host.subagent_providers.get("spawn")
    if provider is None or not hasattr(provider, "revive"):
        raise ValueError("no spawn provider is mounted to resume it")
    holder = Holder()
    request = SubagentRequest(prompt="", description=entry.description, parent=parent, cwd=header.cwd,
                              depth=parent.spec.depth + 1, call_id=entry.call_id, continuable=True,
                              on_settled=holder.settled)
    entry.run = await provider.revive(request, entry.run.id, header.id, events)
    registry.entries.add(entry)
    holder.bind(entry)


def descendants(agent: Agent, *, deep: bool) -> Iterator[tuple[int, Entry]]:
    """(depth below ``agent``, entry) of the children ``agent`` started, and theirs when ``deep``."""
    for entry in list(delegations_of(agent).runs.values()):
        yield 1, entry
        child = entry.agent
        if deep and child is not None and not child.disposed:
            for depth, below in descendants(child, deep=True):
                yield depth + 1, below


def find(agent: Agent, rid: Any) -> Entry | None:
    """The run ``rid`` if ``agent`` is its ancestor (a sibling's or a stranger's child is not found)."""
    if not isinstance(rid, str):
        return None
    return next((e for _, e in descendants(agent, deep=True) if e.run.id == rid), None)


def label(entry: Entry) -> str:
    return f'{entry.run.id} "{one_line(entry.description, 80)}"'


def outcome_text(result: SubagentResult) -> str:
    """A failed run as the model reads it: stop reason, why, and what it had said."""
    head = f"[subagent {result.stop}]" + (f" {result.diagnostic}" if result.diagnostic else "")
    return f"{head}\npartial output:\n{result.text or '(none)'}"


def notice_text(entry: Entry, result: SubagentResult) -> str:
    head = f"[subagent {label(entry)} {result.stop}]"
    if result.completed:
        return f"{head}\n{result.text or '(no output)'}"
    return f"{head} {result.diagnostic or ''}".rstrip() + f"\npartial output:\n{result.text or '(none)'}"


def as_output(result: SubagentResult) -> ToolOutput:
    if result.completed:
        return ToolOutput.text(result.text or "(the subagent gave no answer)")
    return ToolOutput.text(outcome_text(result), is_error=True, code=CODES.get(result.stop, "SUBAGENT_FAILED"))


class Holder:
    """Settles a run's turns for its parent: one ``subagent/settled`` each, and a notice unless a
    tool call is waiting for that turn. A turn that ends before the entry is bound waits for it."""

    def __init__(self) -> None:
        self.entry: Entry | None = None
        self.early: list[SubagentResult] = []

    def bind(self, entry: Entry) -> None:
        self.entry = entry
        early, self.early = self.early, []
        for result in early:
            self.settled(entry.run, result)

    def settled(self, run: Any, result: SubagentResult) -> None:
        entry = self.entry
        if entry is None:
            self.early.append(result)
            return
        parent = entry.parent
        if parent.disposed:
            return
        parent.emit(SubagentSettled(id=entry.run.id, call_id=entry.call_id, stop=result.stop,
                                    text=result.text[-4000:], diagnostic=result.diagnostic))
        if entry.awaited:
            entry.awaited = False  # the waiting call answers with it
        else:
            parent.notify(notice_text(entry, result))


class Delegate:
    """What ``subagent`` and ``subagent_fork`` share: checks, caps, start, settle, wait."""

    def __init__(self, *, provider: str, continuable: bool, background_default: bool, allow_background: bool,
                 max_depth: int, max_live: int) -> None:
        self.provider = provider
        self.continuable = continuable
        self.background_default = background_default
        self.allow_background = allow_background
        self.max_depth = max_depth
        self.max_live = max_live

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        parent = ctx.agent
        prompt, description = args.get("prompt"), args.get("description")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ToolError("`prompt` must be a non-empty string.", code="INVALID_ARGUMENTS")
        if not isinstance(description, str) or not description.strip():
            description = prompt.strip().splitlines()[0]
        background = args.get("run_in_background", self.background_default) if self.allow_background else False
        if not isinstance(background, bool):
            raise ToolError("`run_in_background` must be true or false.", code="INVALID_ARGUMENTS")
        try:
            cwd = dir_inside(args.get("cwd"), parent.cwd)
        except ValueError as exc:
            raise ToolError(f"{exc}.", code="INVALID_ARGUMENTS") from None
        depth = parent.spec.depth + 1
        if depth > self.max_depth:
            raise ToolError(f"subagent depth limit reached (this agent is at depth {parent.spec.depth}, the limit is "
                         f"{self.max_depth}); do the task yourself.", code="DEPTH_LIMIT")
        registry = registry_of(ctx.host)
        if registry.closed:
            raise ToolError("the host is shutting down.", code="SUBAGENT_FAILED")
        if registry.live >= self.max_live:
            raise ToolError(f"{registry.live} subagents are live in this process (running or idle; the cap is "
                         f"{self.max_live}): give an idle one more with send_message, or do the task yourself.",
                         code="SUBAGENT_LIMIT")
        provider = ctx.host.subagent_providers.get(self.provider)
        if provider is None:
            raise ToolError(f"no subagent provider {self.provider!r} is mounted.", code="SUBAGENT_FAILED")
        mine = await recall(parent)
        holder = Holder()
        request = SubagentRequest(prompt=prompt, description=description, parent=parent, cwd=cwd, depth=depth,
                                  call_id=ctx.call_id, continuable=self.continuable, on_settled=holder.settled)
        registry.reserved += 1
        try:
            run = await provider.start(request)
        except Exception as exc:
            log.warning(f"starting a {self.provider} subagent failed: {exc!r}")
            raise ToolError(f"the subagent did not start: {exc}", code="SUBAGENT_FAILED") from None
        finally:
            registry.reserved -= 1
        jobs = getattr(ctx.host, "jobs", None) if background else None
        # awaited: a tool call (foreground) or the job (background, with a job registry) tells the
        # first turn's end; the notice of a plain background turn comes from Holder.settled
        entry = Entry(run=run, parent=parent, provider=self.provider, description=description, call_id=ctx.call_id,
                      continuable=self.continuable, background=background,
                      awaited=not background or jobs is not None)
        registry.entries.add(entry)
        mine.runs[run.id] = entry
        parent.emit(SubagentStarted(id=run.id, provider=self.provider, description=description, call_id=ctx.call_id,
                                    session=run.session_id, background=background))
        if jobs is not None:
            try:
                job = jobs.start(parent, kind="subagent", title=f"{run.id} {description}", work=first_turn(run),
                                 call_id=ctx.call_id)
            except ToolError:  # over the session's job cap: the child does not run either
                registry.entries.discard(entry)
                mine.runs.pop(run.id, None)
                with anyio.CancelScope(shield=True):
                    run.cancel()
                    await run.dispose()
                raise
        holder.bind(entry)
        if jobs is not None:
            return ToolOutput.text(
                f"started subagent {run.id}, its first turn as background job {job.id}: job_output "
                f'{{"job_id": "{job.id}"}} reads its answer (wait: true waits for it), job_kill stops it, and you get '
                "a notice when it ends. send_message gives it more to do afterwards; list_agents shows it.")
        if background:
            return ToolOutput.text(
                f"started subagent {run.id}. It works in the background; when its turn ends you get its outcome "
                "as a notice. send_message gives it more to do, interrupt_agent stops its turn, list_agents "
                "shows it.")
        return await self._wait(entry, registry, mine)

    async def _wait(self, entry: Entry, registry: Registry, mine: Delegations) -> ToolOutput:
        run = entry.run
        try:
            try:
                result = await run.result()
            except anyio.get_cancelled_exc_class():
                # The parent's turn was cancelled: so is the child's; its partial text still answers the call.
                with anyio.CancelScope(shield=True):
                    run.cancel()
                    result = SubagentResult(stop="aborted", diagnostic="the subagent did not settle in time")
                    with anyio.move_on_after(CANCEL_GRACE):
                        result = await run.result()
                    entry.awaited = False
                return as_output(result)
        finally:
            if not self.continuable:  # one-shot: it ends with its answer
                registry.entries.discard(entry)
                mine.runs.pop(run.id, None)
                with anyio.CancelScope(shield=True):
                    await run.dispose()
        return as_output(result)


def first_turn(run: Any) -> Callable[[JobIO], Awaitable[JobEnd]]:
    """A background child's first turn as a job's work: its answer is the job's output; job_kill
    (``io.stopping``) aborts the turn; cancelling the job (its session ending) cancels it too."""

    async def work(io: JobIO) -> JobEnd:
        async with anyio.create_task_group() as tg:

            async def stop_when_asked() -> None:
                await io.stopping.wait()
                run.cancel()

            tg.start_soon(stop_when_asked)
            try:
                result: SubagentResult = await run.result()
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    run.cancel()
                raise
            tg.cancel_scope.cancel()
        io.write(result.text.encode("utf-8", errors="replace"))
        if result.completed:
            return JobEnd(status="completed")
        return JobEnd(status="failed", detail=result.stop + (f": {result.diagnostic}" if result.diagnostic else ""))

    return work


SUBAGENT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "description": {"type": "string", "description": "A short (3-5 word) description of the task."},
        "prompt": {
            "type": "string",
            "description": "The complete task for the subagent. It does not see this conversation: say everything "
                           "it needs.",
        },
        "run_in_background": {
            "type": "boolean",
            "description": "true (the default): return at once with the subagent's id; its outcome arrives as a "
                           "notice. false: wait for its answer.",
        },
        "cwd": {"type": "string", "description": "Its working directory, inside yours (default: yours)."},
    },
    "required": ["description", "prompt"],
    "additionalProperties": False,
}

FORK_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "description": {"type": "string", "description": "A short (3-5 word) description of the task."},
        "prompt": {
            "type": "string",
            "description": "What the fork should do. It starts from this conversation as it stood before your "
                           "current turn, so it knows what you know.",
        },
    },
    "required": ["description", "prompt"],
    "additionalProperties": False,
}


def subagent_tool(delegate: Delegate, *, name: str = "subagent") -> FunctionTool:
    return FunctionTool(
        name,
        "Start a subagent: a fresh agent with its own context that works on a self-contained task with the same "
        "tools, workspace and permissions as you. By default it runs in the background and you get its result "
        "as a notice when it finishes; set run_in_background to false to wait for its answer. Several calls in "
        "one message run side by side.",
        SUBAGENT_PARAMETERS, delegate, parallel_safe=True, kind="think",
    )


def fork_tool(delegate: Delegate) -> FunctionTool:
    return FunctionTool(
        "subagent_fork",
        "Fork yourself: a subagent that starts from this conversation (before your current turn) and works on "
        "`prompt`; you wait for its answer. Cheaper than subagent for work that needs what you already know.",
        FORK_PARAMETERS, delegate, parallel_safe=True, kind="think",
    )


async def send_message(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    rid, message = args.get("subagent_id"), args.get("message")
    if not isinstance(message, str) or not message.strip():
        raise ToolError("`message` must be a non-empty string.", code="INVALID_ARGUMENTS")
    await recall(ctx.agent)
    entry = find(ctx.agent, rid)
    if entry is None:
        raise ToolError(f"no subagent {rid!r} of yours is live; list_agents shows the ones you can reach.",
                     code="NOT_RESUMABLE")
    if isinstance(entry.run, RecordedRun):
        try:
            await resume(entry, registry_of(ctx.host))
        except Exception as exc:
            log.warning(f"resuming subagent {entry.run.id} failed: {exc!r}")
            raise ToolError(f"subagent {entry.run.id} cannot be resumed from its log: {exc}", code="NOT_RESUMABLE") from None
    follow_up = getattr(entry.run, "follow_up", None)
    if not entry.continuable or follow_up is None:
        raise ToolError(f"subagent {entry.run.id} takes no more messages (it was one-shot).", code="NOT_RESUMABLE")
    if entry.run.status == "ready":
        raise ToolError(f"subagent {entry.run.id} has ended.", code="NOT_RESUMABLE")
    if entry.agent is not None and entry.agent.disposed:
        raise ToolError(f"subagent {entry.run.id} has ended.", code="NOT_RESUMABLE")
    running = entry.run.status == "running"
    try:
        follow_up(message)
    except Exception as exc:
        raise ToolError(f"subagent {entry.run.id} did not take the message: {exc}", code="NOT_RESUMABLE") from None
    entry.awaited = False
    if running:
        return ToolOutput.text(f"queued for {label(entry)}: it takes the message when its current turn ends; its "
                               "outcome arrives as a notice.")
    return ToolOutput.text(f"sent to {label(entry)}; it is working on it and its outcome arrives as a notice.")


async def interrupt_agent(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    rid = args.get("agent_id")
    await recall(ctx.agent)
    entry = find(ctx.agent, rid)
    if entry is None:
        raise ToolError(f"no subagent {rid!r} of yours is live; list_agents shows the ones you can reach.",
                     code="NOT_FOUND")
    interrupt = getattr(entry.run, "interrupt", None)
    if interrupt is not None:
        stopped = interrupt()
    elif entry.run.status == "running":
        entry.run.cancel()
        stopped = True
    else:
        stopped = False
    if not stopped:
        return ToolOutput.text(f"{label(entry)} was not running; nothing to interrupt.")
    return ToolOutput.text(f"interrupted {label(entry)}'s current turn; it stays available for send_message.")


async def list_agents(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    scope = args.get("scope", "children")
    if scope not in ("children", "descendants"):
        raise ToolError("`scope` must be \"children\" or \"descendants\".", code="INVALID_ARGUMENTS")
    await recall(ctx.agent)
    lines = [f"{'  ' * (depth - 1)}{e.run.id}  {e.run.status}  {e.provider}  \"{one_line(e.description, 80)}\""
             for depth, e in descendants(ctx.agent, deep=scope == "descendants")]
    return ToolOutput.text("\n".join(lines) if lines else "no subagents")


async def report(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    message = args.get("message")
    if not isinstance(message, str) or not message.strip():
        raise ToolError("`message` must be a non-empty string.", code="INVALID_ARGUMENTS")
    entry = registry_of(ctx.host).of_agent(ctx.agent)
    if entry is None or entry.parent.disposed:
        raise ToolError("there is no parent agent to report to.", code="NOT_FOUND")
    entry.parent.notify(f"[report from subagent {label(entry)}]\n{message}")
    return ToolOutput.text("reported to your parent agent (it reads it before its next step).")


SEND_MESSAGE = FunctionTool(
    "send_message",
    "Give one of your continuable subagents more to do: the message becomes its next turn (queued if it is busy). "
    "Its outcome arrives as a notice.",
    {"type": "object", "properties": {
        "subagent_id": {"type": "string", "description": "The id `subagent` returned."},
        "message": {"type": "string", "description": "What it should do next."},
    }, "required": ["subagent_id", "message"], "additionalProperties": False},
    send_message, parallel_safe=True, kind="think",
)
INTERRUPT_AGENT = FunctionTool(
    "interrupt_agent",
    "Stop the current turn of one of your subagents (or theirs). It stays available for send_message.",
    {"type": "object", "properties": {
        "agent_id": {"type": "string", "description": "The subagent's id."},
    }, "required": ["agent_id"], "additionalProperties": False},
    interrupt_agent, parallel_safe=True, kind="think",
)
LIST_AGENTS = FunctionTool(
    "list_agents",
    "List your subagents (scope \"children\", the default) or every agent below you (\"descendants\"), each "
    "running, idle (waiting for send_message) or ready (ended).",
    {"type": "object", "properties": {
        "scope": {"type": "string", "enum": ["children", "descendants"]},
    }, "additionalProperties": False},
    list_agents, parallel_safe=True, kind="read",
)
REPORT = FunctionTool(
    "report",
    "Tell the agent that started you something now, before your turn ends (progress, a finding, a question).",
    {"type": "object", "properties": {
        "message": {"type": "string", "description": "What to tell it."},
    }, "required": ["message"], "additionalProperties": False},
    report, parallel_safe=True, kind="think",
)
