"""The round driver: while the session's goal is active and armed, each time a turn ends and the
agent is idle, it starts the next round as an autonomous turn (``Agent.notify(prompt,
source="goal", wake=True)``), until the goal is complete, blocked, paused or out of rounds.

- A round is *admitted* at the first model call of the turn that claimed its prompt (the
  message, source ``goal``; ``dsh_check_step`` step 1): the ``goal/round`` note is written and
  that turn is the goal's current round (so it may mark the goal complete or blocked).
- Out of rounds: the goal is blocked (``round-limit``,
  ``Goal reached its configured limit of N rounds.``) and no turn starts.
- A turn that ends aborted (the person cancelled) pauses an active goal. One that ends in an
  error, at the output limit, blocked by a hook or stopped disarms it (a person resumes it).
- Nothing is replayed on resume: a resumed session's goal is disarmed (``domain``)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from dsh_core.state import reads
from dsh_core.types import InboxClaimed, Note, TurnEnd, UserMessageEvent

from . import domain
from .domain import GoalState
from .tools import state

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent

log = logging.getLogger("dsh.goals")

SOURCE = "goal"


def round_prompt(goal: dict[str, Any], n: int) -> str:
    """The prompt of round ``n`` (kept in the session's history)."""
    return ("<goal_round>\n"
            f"Objective: {json.dumps(goal['objective'], ensure_ascii=False)}\n"
            f"Round: {n}/{goal['maxGoalRounds']}\n\n"
            "Keep working toward the objective in this same session. The workspace, tool results and the "
            "session's recorded state are the truth: look at them rather than assuming earlier narration still "
            "holds. Make real progress and check the result. Before you claim completion, gather evidence that "
            "the whole objective is met, read the current goal, and mark it complete. If work remains, leave the "
            "goal active for the next round. Follow the goal tools' guidance before reporting a blocker.\n"
            "</goal_round>")


def armed_goal(st: GoalState) -> dict[str, Any] | None:
    g = st.goal
    return g if g is not None and g["phase"] == "active" and st.armed else None


@reads(UserMessageEvent, InboxClaimed, TurnEnd)
def observe(session: Agent, event: Any) -> None:
    """Follow the session's events: which messages a turn claimed (whose prompt it runs), whether
    it claimed the queued round, and how it ended. Only these three types reach it (``reads``)."""
    if isinstance(event, UserMessageEvent):
        st = session.state(GoalState)
        message = event.message
        st.sources[message.id] = message.source
        if (st.pending is not None and message.source == SOURCE
                and "".join(getattr(b, "text", "") for b in message.content) == st.pending_text):
            st.pending_message = message.id
    elif isinstance(event, InboxClaimed):
        st = session.state(GoalState)
        st.turn_sources = (event.turn, frozenset(st.sources.get(i, "") for i in event.message_ids))
        if st.pending_message is not None and st.pending_message in event.message_ids:
            st.claimed = (event.turn, st.pending) if st.pending is not None else None
        st.sources.clear()
    elif isinstance(event, TurnEnd):
        turn_ended(session, event)


def admit(session: Agent, turn: int, step: int) -> None:
    """Before the first model call of the turn that claimed the queued round: the round is
    admitted (``goal/round`` in the log) and this turn is the goal's current round, unless the
    goal changed since the round was queued."""
    if step != 1:  # a turn's later steps (a tool turn's answer): not even the state's lookup
        return
    st = state(session)
    claimed = st.claimed
    if claimed is None or claimed[0] != turn:
        return
    st.claimed = st.pending = st.pending_message = None
    _, (goal_id, revision, n) = claimed
    g = armed_goal(st)
    if g is None or (g["id"], g["revision"], st.rounds + 1) != (goal_id, revision, n):
        return
    session.emit(Note(kind=domain.ROUND, data={"goalId": goal_id, "revision": revision, "round": n}))
    st.rounds = n
    st.round_turn = (turn, goal_id, revision, n)


def turn_ended(session: Agent, ev: TurnEnd) -> None:
    """After a turn: pause or disarm as its end says, then (when still armed) drive."""
    st = state(session)
    was_round = st.round_turn is not None and st.round_turn[0] == ev.turn
    st.round_turn = None
    unclaimed = st.pending
    if st.claimed is not None and st.claimed[0] == ev.turn:  # it ended before its first step
        st.claimed = None
    g = st.goal
    if ev.reason == "aborted":
        st.pending = st.pending_message = None
        if g is not None and g["phase"] == "active" and (st.armed or was_round or unclaimed):
            st.armed = False  # at once: nothing wakes it; the pause is recorded just after this event
            session.host.task_group.start_soon(_pause, session, g["id"], g["revision"],
                                               name=f"goal pause {session.session_id[:8]}")
        return
    if ev.reason in ("error", "max-tokens", "blocked", "stopped", "disposed"):
        st.pending = st.pending_message = None
        st.armed = False
        return
    if unclaimed is not None and not was_round:
        # another turn read the queued round, or none claimed it: queue it again (the old one is dropped)
        st.pending = st.pending_message = None
    if armed_goal(st) is not None:
        schedule(session)


def schedule(session: Agent) -> None:
    st = state(session)
    if st.driving or session.disposed:
        return
    st.driving = True
    session.host.task_group.start_soon(_drive, session, name=f"goal rounds {session.session_id[:8]}")


async def _pause(session: Agent, goal_id: str, revision: int) -> None:
    """A cancelled round pauses its goal (still that revision, still active). Not written from
    inside the observation of the turn's end: every observer sees ``turn/end`` before the change."""
    st = state(session)
    g = st.goal
    if session.disposed or g is None or (g["id"], g["revision"], g["phase"]) != (goal_id, revision, "active"):
        return
    try:
        domain.commit(session, st, domain.pause(st, goal_id, revision))
    except Exception as exc:  # e.g. the log failed: the goal stays disarmed
        log.warning(f"session {session.session_id}: pausing its goal failed: {exc!r}")


async def _drive(session: Agent) -> None:
    st = state(session)
    try:
        # The round's turn may start as soon as the agent is idle: a front door ends a prompt's
        # interval when autonomous work begins after its turn (the ACP door's _interval_end).
        await session.wait_idle()
        g = armed_goal(st)
        if g is None or st.pending is not None or session.disposed:
            return
        if st.rounds >= g["maxGoalRounds"]:
            domain.commit(session, st, domain.block(st, g["id"], g["revision"], "round-limit",
                                                    f"Goal reached its configured limit of {g['maxGoalRounds']} rounds."))
            return
        n = st.rounds + 1
        st.pending, st.pending_text = (g["id"], g["revision"], n), round_prompt(g, n)
        st.issued += 1
        issued = st.issued
        # dropped if a later round was queued instead, or the goal stopped, before it is read
        session.notify(st.pending_text, source=SOURCE, wake=True,
                       unless=lambda: st.issued != issued or armed_goal(st) is None)
    except Exception as exc:  # a driver's failure disarms the goal; it never takes the agent down
        log.warning(f"goal round driver of session {session.session_id} failed: {exc!r}")
        st.pending = None
        st.armed = False
    finally:
        st.driving = False
