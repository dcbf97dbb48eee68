"""The delegation tools, with the original harness's names and argument shapes:

- ``subagent {description, prompt, run_in_background?}`` — a fresh child (the configured
  provider, ``spawn`` by default), continuable, named by its session id; in the background by
  default: the call answers ``started subagent <id>`` at once (no job: a continuable child is
  outside the job cap), and when the child has done all it was given, this agent is told in the
  original harness's words (``Background subagent <id> finished …``), in a turn of its own when
  it is idle. ``run_in_background: false`` waits, answers the child's final text and disposes it.
- ``subagent_fork {description, prompt}`` — a child that starts from this conversation
  (``fork``), in the foreground, one-shot; ``run_in_background: true`` is refused.
- ``send_message {subagent_id, message}`` (direct children), ``interrupt_agent {agent_id}`` and
  ``list_agents {scope}`` (children or every descendant) — steer and see this agent's children.
- ``report {output}`` — offered only inside a continuable child: tell the parent now (it wakes).

A child that did not complete is an error result with its stop reason, the diagnostic and
the partial text; never partial output passed off as an answer."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import anyio

from dsh_core import ToolError
from dsh_core.display import one_line
from dsh_core.history import recorded_events
from dsh_core.paths import dir_inside
from dsh_core.protocols import Agent, SubagentRequest, ToolContext, new_id
from dsh_core.tools import FunctionTool
from dsh_core.types import SubagentResult, SubagentSettled, SubagentStarted, ToolOutput

from .runs import Delegations, Entry, RecordedRun, Registry, tree_of

log = logging.getLogger("dsh.subagents")

CANCEL_GRACE = 2.0  # seconds a cancelled foreground child gets to settle (its partial text)
CODES = {"aborted": "ABORTED", "max-tokens": "SUBAGENT_MAX_TOKENS"}
# how a foreground run that did not complete is told (the original's headlines)
HEADLINES = {
    "aborted": "subagent run was cancelled",
    "error": "subagent run failed",
    "max-tokens": "subagent run hit its token limit before finishing",
    "refusal": "subagent declined the task",
}
# the first line of a background child's settlement notice, after "Background subagent <id>"
SETTLED = {
    "completed": "finished and will do no further work unless you send it more.",
    "aborted": "was stopped before it finished.",
    "max-tokens": "ran out of room before it finished.",
    "refusal": "declined the task.",
    "error": "failed before it finished.",
}
FORK_NO_BACKGROUND = "run_in_background is disabled for this tool instance (enableRunInBackground: false)"


def unavailable(rid: Any) -> ToolError:
    return ToolError(f'subagent "{rid}" is unavailable', code="NOT_RESUMABLE")


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
    events = await recorded_events(agent)
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


def outcome_text(result: SubagentResult) -> str:
    """A run that did not complete as the model reads it: the headline, the diagnostic, what it had said."""
    head = HEADLINES.get(result.stop, f"subagent run ended abnormally ({result.stop})")
    diagnostic = f"\nDiagnostic: {result.diagnostic}" if result.diagnostic else ""
    partial = f"\nPartial output before the run ended:\n{result.text}" if result.text else ""
    return f"{head}{diagnostic}{partial}"


def notice_text(entry: Entry, result: SubagentResult) -> str:
    """A background child has done all it was given: how it ended and its closing message."""
    head = f"Background subagent {entry.run.id} " + SETTLED.get(
        result.stop, f"ended abnormally ({result.stop}) before it finished.")
    if not result.text:
        return f"{head}\nIt left no closing message."
    return f"{head}\nIts closing message:\n{result.text}"


def as_output(result: SubagentResult) -> ToolOutput:
    if result.completed:
        return ToolOutput.text(result.text)
    return ToolOutput.text(f"Error: {outcome_text(result)}", is_error=True, code=CODES.get(result.stop, "SUBAGENT_FAILED"))


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
        elif not getattr(run, "pending", 0):  # more queued for it: it is not done yet
            parent.notify(notice_text(entry, result), wake=True)


class Delegate:
    """What ``subagent`` and ``subagent_fork`` share: checks, caps, start, settle, wait."""

    def __init__(self, *, provider: str, continuable: bool, background_default: bool, allow_background: bool,
                 max_depth: int, max_running: int) -> None:
        self.provider = provider
        self.continuable = continuable
        self.background_default = background_default
        self.allow_background = allow_background
        self.max_depth = max_depth
        self.max_running = max_running

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        parent = ctx.agent
        prompt, description = args.get("prompt"), args.get("description")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ToolError("`prompt` must be a non-empty string.", code="INVALID_ARGUMENTS")
        if not isinstance(description, str) or not description.strip():
            description = prompt.strip().splitlines()[0]
        background = args.get("run_in_background", self.background_default if self.allow_background else False)
        if not isinstance(background, bool):
            raise ToolError("`run_in_background` must be true or false.", code="INVALID_ARGUMENTS")
        if background and not self.allow_background:
            raise ToolError(FORK_NO_BACKGROUND, code="INVALID_ARGUMENTS")
        depth = parent.spec.depth + 1
        if depth > self.max_depth:
            raise ToolError(f"subagent depth {depth} exceeds maxDepth {self.max_depth}", code="DEPTH_LIMIT")
        registry = registry_of(ctx.host)
        if registry.closed:
            raise ToolError("the host is shutting down.", code="SUBAGENT_FAILED")
        tree = tree_of(parent)
        running = registry.running(tree)
        if running >= self.max_running:
            raise ToolError(f"{running} subagents are running in this session (the cap is "
                            f"{self.max_running}): wait for one to finish, or do the task yourself.",
                            code="SUBAGENT_LIMIT")
        provider = ctx.host.subagent_providers.get(self.provider)
        if provider is None:
            raise ToolError(f"no subagent provider {self.provider!r} is mounted.", code="SUBAGENT_FAILED")
        mine = await recall(parent)
        holder = Holder()
        # A foreground run is one-shot whatever the tool (as the original's: it is collected and
        # disposed; no report tool, nothing to continue).
        continuable = self.continuable and background
        request = SubagentRequest(prompt=prompt, description=description, parent=parent, cwd=parent.cwd, depth=depth,
                                  call_id=ctx.call_id, continuable=continuable, on_settled=holder.settled)
        registry.reserve(tree, 1)
        try:
            run = await provider.start(request)
        except Exception as exc:
            log.warning(f"starting a {self.provider} subagent failed: {exc!r}")
            raise ToolError(f"the subagent did not start: {exc}", code="SUBAGENT_FAILED") from None
        finally:
            registry.reserve(tree, -1)
        # awaited: a foreground call tells the first turn's end; a background child's comes as a notice
        entry = Entry(run=run, parent=parent, provider=self.provider, description=description, call_id=ctx.call_id,
                      continuable=continuable, background=background, awaited=not background)
        registry.entries.add(entry)
        mine.runs[run.id] = entry
        parent.emit(SubagentStarted(id=run.id, provider=self.provider, description=description, call_id=ctx.call_id,
                                    session=run.session_id, background=background))
        holder.bind(entry)
        if background:
            return ToolOutput.text(f"started subagent {run.id}")
        return await self._wait(entry, registry, mine)

    async def _wait(self, entry: Entry, registry: Registry, mine: Delegations) -> ToolOutput:
        """A foreground run: its answer, then it is disposed (as the original: nothing is left
        to list or continue)."""
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
            registry.entries.discard(entry)
            mine.runs.pop(run.id, None)
            with anyio.CancelScope(shield=True):
                await run.dispose()
        return as_output(result)


def _task_parameters(prompt: str, **more: dict[str, Any]) -> dict[str, Any]:
    """The schema both delegation tools share: a short ``description`` and the ``prompt``, then ``more``."""
    return {
        "type": "object",
        "properties": {
            "description": {"type": "string", "description": "A short (3-5 word) description of the task."},
            "prompt": {"type": "string", "description": prompt},
            **more,
        },
        "required": ["description", "prompt"],
        "additionalProperties": False,
    }


SUBAGENT_PARAMETERS = _task_parameters(
    "The complete task for the subagent. It does not see this conversation: say everything it needs.",
    run_in_background={
        "type": "boolean",
        "description": "true (the default): return at once with the subagent's id; you are told when it "
                       "finishes. false: wait for its answer.",
    },
)

FORK_PARAMETERS = _task_parameters(
    "What the fork should do. It starts from this conversation as it stood before your current turn, so it "
    "knows what you know.",
)


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
    mine = await recall(ctx.agent)
    entry = mine.runs.get(rid) if isinstance(rid, str) else None  # direct children only
    if entry is None or not entry.continuable:
        raise unavailable(rid)
    if isinstance(entry.run, RecordedRun):
        try:
            await resume(entry, registry_of(ctx.host))
        except Exception as exc:
            log.warning(f"resuming subagent {entry.run.id} failed: {exc!r}")
            raise unavailable(rid) from None
    follow_up = getattr(entry.run, "follow_up", None)
    if follow_up is None or (entry.agent is not None and entry.agent.disposed):
        raise unavailable(rid)
    try:
        follow_up(message)
    except Exception as exc:
        log.warning(f"subagent {entry.run.id} did not take a message: {exc!r}")
        raise unavailable(rid) from None
    entry.awaited = False
    return ToolOutput.text(f"message queued as the next turn for subagent {entry.run.id}")


async def interrupt_agent(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    rid = args.get("agent_id")
    await recall(ctx.agent)
    entry = find(ctx.agent, rid)
    if entry is None:
        raise ToolError(f'subagent "{rid}" is unavailable', code="NOT_FOUND")
    interrupt = getattr(entry.run, "interrupt", None)
    if interrupt is not None:
        interrupt()
    elif entry.run.status == "running":
        entry.run.cancel()
    # an agent between turns: an accepted no-op
    return ToolOutput.text(f"interrupt requested for agent {entry.run.id}")


async def list_agents(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    scope = args.get("scope", "children")
    if scope not in ("children", "descendants"):
        raise ToolError("`scope` must be \"children\" or \"descendants\".", code="INVALID_ARGUMENTS")
    await recall(ctx.agent)
    deep = scope == "descendants"
    lines = []
    for depth, e in descendants(ctx.agent, deep=deep):
        if not e.continuable:  # a one-shot child takes no send_message: never listed
            continue
        at = f" parent={e.parent.session_id} depth={depth}" if deep else ""
        lines.append(f"{e.run.id} [{e.run.status}]{at} — {one_line(e.description, 200)}")
    return ToolOutput.text("\n".join(lines) if lines else "(no subagents)")


async def report(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    output = args.get("output")
    if not isinstance(output, str) or not output.strip():
        raise ToolError("`output` must be a non-empty string.", code="INVALID_ARGUMENTS")
    entry = registry_of(ctx.host).of_agent(ctx.agent)
    if entry is None or entry.parent.disposed:
        raise ToolError("direct parent is not live; report was not delivered", code="PARENT_UNAVAILABLE")
    entry.parent.notify(f"Background subagent {entry.run.id} reported:\n{output}", wake=True)
    return ToolOutput.text(f"report accepted by the agent that started you as message {new_id()}")


SEND_MESSAGE = FunctionTool(
    "send_message",
    "Give one of your continuable subagents more to do: the message becomes its next turn (queued if it is busy). "
    "You are told when it has finished.",
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
    "List your continuable subagents (scope \"children\", the default) or every one below you (\"descendants\"): "
    "running, idle, or ready (done; send_message continues it).",
    {"type": "object", "properties": {
        "scope": {"type": "string", "enum": ["children", "descendants"]},
    }, "additionalProperties": False},
    list_agents, parallel_safe=True, kind="read",
)
REPORT = FunctionTool(
    "report",
    "Tell the agent that started you something now: call it once with your self-contained result before you "
    "finish, and earlier for a finding that changes what it should do. It does not see your transcript. "
    "Reporting does not end your turn.",
    {"type": "object", "properties": {
        "output": {"type": "string", "description": "What to tell it: conclusions, and the paths that matter."},
    }, "required": ["output"], "additionalProperties": False},
    report, parallel_safe=True, kind="think",
)
