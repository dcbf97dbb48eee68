"""The goal of one session: its durable record, its replay fold, its checked changes.

A goal is ``{id, revision, objective, phase, maxGoalRounds, blockedReason?}``; each change
writes the whole new snapshot to the session log as a ``Note`` (kind ``goal/change``, data
``{operation, goal, roundsStarted}``), and each admitted round a ``goal/round`` note
(``{goalId, revision, round}``). Folding a log's notes gives the goal back (``fold``): a
resumed session has its goal, its revision and its round count. Whether the round driver may
start rounds (``armed``) is this process's alone, never in the log: a resumed session's goal
is disarmed until a person resumes it.

Errors are the original harness's texts and codes (``GoalError``)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from dsh_core import ToolError
from dsh_core.types import Note

CHANGE = "goal/change"
ROUND = "goal/round"
PHASES = ("active", "paused", "blocked", "complete")
_KEBAB = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")
SAFE = 2**53 - 1


class GoalError(ToolError):
    """A refused goal read or change: the model sees ``Error: <message>``."""


def positive_whole(value: Any) -> TypeGuard[int | float]:
    """A JSON number that is a positive safe integer (``3`` and ``3.0``, not ``2.5``, ``0``, ``true``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not (isinstance(value, float) and (not math.isfinite(value) or not value.is_integer())) and 1 <= value <= SAFE


@dataclass
class GoalState:
    """One session's goal (its state slot). ``loaded``: the log was folded (or there was none)."""

    goal: dict[str, Any] | None = None
    rounds: int = 0  # rounds admitted for the current goal
    created: int = 0  # goals created in this session (the next id is goal-<created + 1>)
    armed: bool = False
    loaded: bool = False
    # the round driver's bookkeeping (never durable)
    pending: tuple[str, int, int] | None = None  # (goal id, revision, round) queued, not yet admitted
    pending_text: str = ""
    issued: int = 0  # rounds queued in this process (a queued round's notice is dropped once superseded)
    pending_message: str | None = None  # the queued round's message, once the agent published it
    claimed: tuple[int, tuple[str, int, int]] | None = None  # (turn, round) a turn claimed, not yet admitted
    round_turn: tuple[int, str, int, int] | None = None  # (turn, goal id, revision, round) running now
    turn_sources: tuple[int, frozenset[str]] = (0, frozenset())  # the running turn's prompt sources
    sources: dict[str, str] = field(default_factory=dict)  # published, unclaimed message id -> source
    driving: bool = False

    # ------------------------------------------------------------------ reading

    def view(self) -> dict[str, Any]:
        """The value every goal tool answers: ``{"goal": null}`` or the goal and its activation."""
        if self.goal is None:
            return {"goal": None}
        g = self.goal
        shown: dict[str, Any] = {"id": g["id"], "revision": g["revision"], "objective": g["objective"],
                                 "phase": g["phase"], "roundsStarted": self.rounds, "maxGoalRounds": g["maxGoalRounds"]}
        if "blockedReason" in g:
            shown["blockedReason"] = dict(g["blockedReason"])
        return {"goal": shown, "activation": "armed" if self.armed else "disarmed"}

    def current(self, goal_id: str, revision: int) -> dict[str, Any]:
        """The current goal if ``(goal_id, revision)`` names it exactly."""
        g = self.goal
        if g is None:
            raise GoalError("no current goal", code="GOAL_NOT_FOUND")
        if goal_id != g["id"] or revision != g["revision"]:
            raise GoalError(f'stale goal ref "{goal_id}" revision {revision}; current is "{g["id"]}" revision '
                            f'{g["revision"]}', code="GOAL_STALE_REVISION")
        return g

    # ------------------------------------------------------------------ replay

    def apply(self, note: Note) -> None:
        """Fold one durable note (a recorded one on resume, or one just written)."""
        data = note.data
        if note.kind == CHANGE and isinstance(data.get("goal"), dict):
            goal = dict(data["goal"])
            if data.get("operation") == "create":
                self.created += 1
            self.goal = goal
            self.rounds = int(data.get("roundsStarted", 0))
        elif note.kind == ROUND and self.goal is not None and data.get("goalId") == self.goal["id"]:
            self.rounds = max(self.rounds, int(data.get("round", 0)))

    def fold(self, events: Iterable[Any]) -> None:
        for ev in events:
            if isinstance(ev, Note) and ev.kind in (CHANGE, ROUND):
                self.apply(ev)
        self.armed = False  # never inherited from a log
        self.loaded = True


def objective_of(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise GoalError("goal objective must be a non-empty string", code="GOAL_INVALID_OBJECTIVE")
    return value.strip()


def rounds_of(value: Any) -> int:
    if not positive_whole(value):
        raise GoalError("maxGoalRounds must be a positive safe integer", code="GOAL_INVALID_MAX_ROUNDS")
    return int(value)


@dataclass
class Change:
    """One checked change, ready to be written: the note, and the activation after it."""

    operation: str
    goal: dict[str, Any]
    rounds: int
    armed: bool
    extra: dict[str, Any] = field(default_factory=dict)

    def note(self) -> Note:
        return Note(kind=CHANGE, data={"operation": self.operation, "goal": self.goal, "roundsStarted": self.rounds})


def _next(goal: dict[str, Any], phase: str | None = None, **fields: Any) -> dict[str, Any]:
    out = {k: v for k, v in goal.items() if k != "blockedReason"}
    out["revision"] = goal["revision"] + 1
    if phase is not None:
        out["phase"] = phase
    elif "blockedReason" in goal:
        out["blockedReason"] = goal["blockedReason"]
    out.update(fields)
    return out


def _cannot(goal: dict[str, Any], operation: str, allowed: tuple[str, ...]) -> GoalError:
    return GoalError(f'cannot {operation} goal "{goal["id"]}" from phase "{goal["phase"]}"; expected '
                     f"{' or '.join(allowed)}", code="GOAL_INVALID_TRANSITION")


def create(st: GoalState, objective: Any, max_rounds: Any, default_rounds: int) -> Change:
    text = objective_of(objective)
    cap = rounds_of(default_rounds if max_rounds is None else max_rounds)
    g = st.goal
    if g is not None and g["phase"] != "complete":
        raise GoalError(f'goal "{g["id"]}" already exists with phase "{g["phase"]}"', code="GOAL_ALREADY_EXISTS")
    goal = {"id": f"goal-{st.created + 1}", "revision": 1, "objective": text, "phase": "active", "maxGoalRounds": cap}
    return Change("create", goal, 0, True)


def edit(st: GoalState, goal_id: str, revision: int, objective: Any, max_rounds: Any) -> Change:
    g = st.current(goal_id, revision)
    if objective is None and max_rounds is None:
        raise GoalError("goal edit requires objective and/or maxGoalRounds", code="GOAL_INVALID_EDIT")
    fields: dict[str, Any] = {}
    if objective is not None:
        fields["objective"] = objective_of(objective)
    if max_rounds is not None:
        fields["maxGoalRounds"] = rounds_of(max_rounds)
    return Change("edit", _next(g, **fields), st.rounds, st.armed)


def pause(st: GoalState, goal_id: str, revision: int) -> Change:
    g = st.current(goal_id, revision)
    if g["phase"] != "active":
        raise _cannot(g, "pause", ("active",))
    return Change("pause", _next(g, "paused"), st.rounds, False)


def resume(st: GoalState, goal_id: str, revision: int) -> Change:
    g = st.current(goal_id, revision)
    if g["phase"] not in ("active", "paused", "blocked"):
        raise _cannot(g, "resume", ("active", "paused", "blocked"))
    if g["phase"] == "active" and st.armed:
        raise GoalError(f'goal "{g["id"]}" is already active and armed', code="GOAL_INVALID_TRANSITION")
    if st.rounds >= g["maxGoalRounds"]:
        raise GoalError(f'goal "{g["id"]}" exhausted {g["maxGoalRounds"]} goal rounds; increase maxGoalRounds '
                        "before resuming", code="GOAL_INVALID_TRANSITION")
    return Change("resume", _next(g, "active"), st.rounds, True)


def complete(st: GoalState, goal_id: str, revision: int) -> Change:
    g = st.current(goal_id, revision)
    if g["phase"] not in ("active", "paused", "blocked"):
        raise _cannot(g, "complete", ("active", "paused", "blocked"))
    return Change("complete", _next(g, "complete"), st.rounds, False)


def block(st: GoalState, goal_id: str, revision: int, code: str, message: str) -> Change:
    g = st.current(goal_id, revision)
    if g["phase"] != "active":
        raise _cannot(g, "block", ("active",))
    if not _KEBAB.match(code) or not message.strip():
        raise GoalError("goal block reason requires a lower-kebab-case code and a non-empty message",
                        code="GOAL_INVALID_BLOCK_REASON")
    return Change("block", _next(g, "blocked", blockedReason={"code": code, "message": message.strip()}),
                  st.rounds, False)


def commit(session: Any, st: GoalState, change: Change) -> None:
    """Write the change to the session log, then take it (the log first: no state without a record)."""
    note = change.note()
    session.emit(note)
    st.apply(note)
    st.armed = change.armed
