"""dsh plugin ``schedule``: reminders a session sets for itself — ``schedule_create`` (after a
delay, at a time, or every N seconds), ``schedule_list``, ``schedule_delete`` — with the original's
arguments, JSON results and error codes.

A due reminder is told to the session as the original's ``[SCHEDULE REMINDER]`` framing through
``Agent.notify(..., wake=True)``, once the session is idle: an autonomous turn answers it. The
reminders live in the session's log (``note`` events of kind ``schedule/change``: create, delete,
dispatch), so a resumed session has them again, and an overdue one fires when it resumes. Each
top-level session has its own (a subagent gets no tools), at most ``max-active`` at a time; the
timer is a task of the session and ends with it. People see them with ``/schedules``. See README.md.
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from msgspec import Meta

from dsh_core import FunctionTool, config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.history import recorded_events
from dsh_core.protocols import CommandResult, SlashCommand
from dsh_core.types import Note, ToolOutput

from .domain import (
    ScheduleInputError,
    ScheduleLogError,
    Schedules,
    create_record,
    framing,
    next_every,
    parse_utc,
    selector_problem,
    utc,
    view,
)

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import Agent, Host, Tool

PLUGIN = "schedule"
KIND = "schedule/change"  # the note kind of every durable record
SOURCE = "schedule"  # the user-message source a fired reminder carries
MIN_EVERY = 300  # the original's floor for every_seconds


class ScheduleConfig(PluginConfig):
    """[config.schedule]"""

    max_active: Annotated[int, Meta(ge=1, le=1000, description="active reminders one session may hold")] = 20
    min_every_seconds: Annotated[int, Meta(ge=1, description="the shortest every_seconds interval")] = MIN_EVERY


def now_ms() -> int:
    return int(time.time() * 1000)


def _json(value: Any) -> ToolOutput:
    """A result as the original renders its values: compact JSON (JSON.stringify)."""
    return ToolOutput.text(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def _error(code: str, message: str) -> ToolOutput:
    """The original's error value, marked an error result (its code upper-cased, dsh's convention)."""
    text = json.dumps({"code": code, "message": message}, ensure_ascii=False, separators=(",", ":"))
    return ToolOutput.text(text, is_error=True, code=code.upper())


@dataclass
class SessionSchedules:
    """One session's reminders (its state slot) and the wake-up of its timer."""

    folded: Schedules = field(default_factory=Schedules)
    loaded: bool = False
    corrupt: bool = False
    changed: anyio.Event = field(default_factory=anyio.Event)
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    def poke(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


def schedules_of(session: Agent) -> SessionSchedules:
    found: SessionSchedules = session.state(SessionSchedules)
    return found


async def load(session: Agent) -> SessionSchedules:
    """Fold the session's log once (a resumed session's reminders are in it; a new one has none)."""
    mine = schedules_of(session)
    if mine.loaded:
        return mine
    mine.loaded = True
    try:
        for ev in await recorded_events(session):
            if isinstance(ev, Note) and ev.kind == KIND:
                mine.folded.apply(ev.data)
    except ScheduleLogError:
        mine.corrupt = True
    return mine


# --------------------------------------------------------------------------- the tools (the original's)

CREATE_DESCRIPTION = (
    "Set a reminder for this session. Give a prompt that is not empty and pick exactly one way to time it: "
    "after_seconds (a delay, a positive safe integer), at (a date-time with an explicit offset, or an object of "
    "local date and time plus zone), or every_seconds (a repeat interval, a safe integer no smaller than {min}). "
    "A repeating reminder keeps to the rhythm set at its creation; occurrences that were missed are dropped, and "
    "an overdue rule delivers just its most recent one. Reminders belong to this session: one fires on time only "
    "while the session is running, and otherwise waits as overdue until the session is resumed."
)
LIST_DESCRIPTION = ("Show the reminders still active in this session, oldest first, each with its exact id, its "
                    "target time in UTC, whether it is scheduled or overdue, and how it is delivered (session-local).")
DELETE_DESCRIPTION = ("Remove an active reminder from this session, naming it by the exact id that schedule_create "
                      "or schedule_list gave. An id that is unknown or whose reminder is already done gives "
                      "deleted false.")


def create_schema(min_every: int) -> dict[str, Any]:
    return {"type": "object", "properties": {
        "prompt": {"type": "string", "description": "What the reminder should say once its time has come."},
        "after_seconds": {"type": "number", "description": "Wait this many seconds first (a positive safe integer)."},
        "every_seconds": {"type": "number",
                          "description": f"Repeat at a fixed rate, every this many seconds (a safe integer, {min_every} or more)."},
        "at": {"description": "A fixed moment: an RFC 3339 string that carries its offset, or a local date and time with an IANA zone named.",
               "oneOf": [{"type": "string"}, {"type": "object", "additionalProperties": False, "properties": {
                   "date": {"type": "string"}, "time": {"type": "string"}, "time_zone": {"type": "string"}},
                   "required": ["date", "time", "time_zone"]}]},
    }, "required": ["prompt"]}


class ScheduleTools:
    def __init__(self, config: ScheduleConfig) -> None:
        self.config = config

    async def create(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        problem = selector_problem(args)
        if problem is not None:
            return _error(*problem)
        mine = await load(ctx.agent)
        async with mine.lock:
            if mine.corrupt:
                return _error("corrupt_schedule_log", "The session schedule log is corrupt.")
            if len(mine.folded.active) >= self.config.max_active:
                return _error("too_many_schedules", f"This session already has {self.config.max_active} active "
                              "reminders, its limit; delete one with schedule_delete first.")
            try:
                record = create_record(mine.folded.allocate(), args["prompt"], args, now_ms(),
                                       self.config.min_every_seconds)
            except ScheduleInputError as exc:
                return _error(exc.code, exc.message)
            change = {"version": 1, "operation": "create", "schedule": record}
            ctx.agent.emit(Note(kind=KIND, data=change))  # durable first: the log is the truth
            mine.folded.apply(change)
            mine.poke()
            return _json(view(record, now_ms()))

    async def list(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        mine = await load(ctx.agent)
        if mine.corrupt:
            return _error("corrupt_schedule_log", "The session schedule log is corrupt.")
        now = now_ms()
        return _json([view(r, now) for r in mine.folded.active.values()])

    async def delete(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        sid = args.get("id")
        if not isinstance(sid, str) or not sid or sid.strip() != sid:
            return _error("invalid_rule", "schedule_delete id must be non-empty without surrounding whitespace.")
        mine = await load(ctx.agent)
        async with mine.lock:
            if mine.corrupt:
                return _error("corrupt_schedule_log", "The session schedule log is corrupt.")
            if sid not in mine.folded.active:
                return _json({"id": sid, "deleted": False, "code": "schedule_not_found"})
            change = {"version": 1, "operation": "delete", "id": sid}
            ctx.agent.emit(Note(kind=KIND, data=change))
            mine.folded.apply(change)
            mine.poke()
            return _json({"id": sid, "deleted": True})

    def tools(self) -> builtins.list[Tool]:
        return [
            FunctionTool("schedule_create", CREATE_DESCRIPTION.format(min=self.config.min_every_seconds),
                         create_schema(self.config.min_every_seconds), self.create),
            FunctionTool("schedule_list", LIST_DESCRIPTION, {"type": "object", "properties": {}}, self.list,
                         parallel_safe=True, kind="read"),
            FunctionTool("schedule_delete", DELETE_DESCRIPTION, {"type": "object", "properties": {
                "id": {"type": "string", "description": "The reminder's id in this session, exactly as given."}}, "required": ["id"]},
                self.delete),
        ]


# --------------------------------------------------------------------------- the session's timer


class ScheduleSource:
    """The tools of one top-level session, and its timer: a task of the session (``ToolSource``)
    that sleeps until the earliest target, waits for the session to be idle, then tells it the
    due reminders (waking it) and records the dispatch. It ends when the session is disposed."""

    name = PLUGIN

    def __init__(self, tools: ScheduleTools) -> None:
        self.tools = tools

    async def serve(self, session: Agent, ready: Callable[[], None]) -> None:
        session.publish_tools(self.name, self.tools.tools())
        mine = await load(session)
        ready()
        while not session.disposed:
            changed = mine.changed
            target = None if mine.corrupt else mine.folded.next_target()
            if target is None:
                await changed.wait()
                continue
            delay = (target - now_ms()) / 1000
            if delay > 0:
                with anyio.move_on_after(min(delay, 3600)):  # the clock is read again after every wake
                    await changed.wait()
                continue
            await session.wait_idle()  # a reminder opens a later turn; it never steers the running one
            await self.fire(session, mine)

    @staticmethod
    async def fire(session: Agent, mine: SessionSchedules) -> None:
        async with mine.lock:
            accepted = now_ms()
            due = mine.folded.due(accepted)
            if not due or session.disposed:
                return
            text = framing(due, accepted)
            for record in due:
                change: dict[str, Any] = {"version": 1, "operation": "dispatch", "id": record["id"]}
                if record["kind"] == "every":
                    change["acceptedAt"] = utc(accepted)
                session.emit(Note(kind=KIND, data=change))
                mine.folded.apply(change)
            session.notify(text, source=SOURCE, wake=True)


# --------------------------------------------------------------------------- for people


async def _list_command(session: Agent, text: str) -> CommandResult:
    mine = await load(session)
    if not mine.folded.active:
        return CommandResult(reply="No reminders are set in this session.")
    now = now_ms()
    rows = []
    for r in mine.folded.active.values():
        when = r["scheduledAt"] + (" (overdue)" if parse_utc(r["scheduledAt"]) <= now else "")
        rule = {"after": f"after {r.get('afterSeconds')} s", "at": "at a time",
                "every": f"every {r.get('everySeconds')} s"}[r["kind"]]
        rows.append(f"- {r['id']}: {when}, {rule}: {r['prompt']}")
    return CommandResult(reply="Reminders of this session:\n" + "\n".join(rows))


# --------------------------------------------------------------------------- hooks


dsh_config_type = config_type_hook(PLUGIN, ScheduleConfig)


@hookimpl
def dsh_session_tools(session: Agent, host: Host) -> ScheduleSource | None:
    if session.spec.parent is not None:  # the original installs on root agents only
        return None
    return ScheduleSource(ScheduleTools(host.config_for(ScheduleConfig)))


@hookimpl
def dsh_slash_commands(session: Agent, host: Host) -> list[SlashCommand] | None:
    if session.spec.parent is not None:
        return None
    return [SlashCommand(name="schedules", description="List the reminders this session has set (schedule_create)",
                         run=_list_command)]


__all__ = ["KIND", "ScheduleConfig", "ScheduleSource", "ScheduleTools", "Schedules", "next_every"]
