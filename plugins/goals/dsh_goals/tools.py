"""``create_goal``, ``get_goal`` and ``update_goal``: the original harness's schemas, result
value (compact JSON of ``{"goal": …, "activation": …}``), authority rules and error texts.

Authority: ``create_goal``, and ``update_goal`` edit/pause/resume, need a *direct human turn*
(the running turn's prompt came from the person, on a top-level session); ``complete`` and
``blocked`` are also allowed in the goal's own current round (an autonomous turn the round
driver started). ``blocked`` from a round needs at least ``blocked-after-rounds`` rounds. When
a round marks its goal complete or blocked, a wrap-up instruction follows the tool result: the
model writes its closing message and the run ends."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from dsh_core import FunctionTool
from dsh_core.types import TextBlock, ToolOutput

from . import domain
from .domain import GoalError, GoalState

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent, ToolContext

    from . import GoalsConfig

ACTIONS = ("edit", "pause", "resume", "complete", "blocked")

CREATE_DESCRIPTION = (
    "Create this session's one goal: a completion objective that persists in the session and is worked on in "
    "autonomous goal rounds, for when the person's request is long-running work. You may infer that intent; the "
    "person need not say \"create a goal\". Not for work one turn finishes. Only a direct request from the person "
    "may create a goal (not a goal round, not a subagent).")
GET_DESCRIPTION = (
    "Read this session's current goal: its exact id and revision, objective, phase, rounds completed, round limit, "
    "the blocker when there is one, and whether another round is armed. Call it before update_goal.")
UPDATE_DESCRIPTION = (
    "Change the goal at its exact current revision. edit, pause and resume need a direct request from the person "
    "on a top-level session; complete and blocked are also allowed inside an automatic round of the current goal. "
    "blocked is refused before the configured number of rounds; you judge that the same condition held across "
    "those rounds, and say what it is in blocked_reason.")

CREATE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "objective": {"type": "string",
                      "description": "The concrete objective to complete, taken from the person's request."},
        "max_goal_rounds": {"type": "number",
                            "description": "Optional limit on automatic rounds: a positive whole number."},
    },
    "required": ["objective"],
    "additionalProperties": False,
}
GET_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
UPDATE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "goal_id": {"type": "string", "description": "The exact id get_goal returned."},
        "revision": {"type": "number", "description": "The exact revision get_goal returned (a positive number)."},
        "action": {"type": "string", "enum": list(ACTIONS), "description": "edit | pause | resume | complete | blocked"},
        "objective": {"type": "string", "description": "The new objective; only with action edit."},
        "max_goal_rounds": {"type": "number", "description": "The new round limit; only with action edit."},
        "blocked_reason": {"type": "string",
                           "description": "The concrete blocking condition; required with action blocked, only then."},
    },
    "required": ["goal_id", "revision", "action"],
    "additionalProperties": False,
}

_GROUNDING = ("Say only what earlier rounds and tool results in this session show; where a detail is not in the "
              "session, say so rather than making it up. ")


def wrapup(objective: str, blocked_reason: str | None = None) -> str:
    """The instruction that follows a round's complete/blocked: write the closing message now."""
    head = f"Objective: {json.dumps(objective, ensure_ascii=False)}\n"
    if blocked_reason is None:
        return ("<goal_complete>\n" + head
                + "The goal is marked complete and this autonomous run is ending. Write your closing message to the "
                "user now: the outcome, what was done and how it was checked, and where the results are (files, "
                "commits, other artifacts). " + _GROUNDING
                + "Mention anything the user should review or do next. Speak to the user directly. Call no more "
                "tools in this run; further work waits for the user's next instruction.\n</goal_complete>")
    return ("<goal_blocked>\n" + head + f"Blocked: {json.dumps(blocked_reason, ensure_ascii=False)}\n"
            + "The goal is marked blocked and this autonomous run is ending. Write your closing message to the user "
            "now: what is done so far, the concrete blocking condition and what you tried, and exactly what you need "
            "from the user to go on. " + _GROUNDING
            + "Speak to the user directly. Call no more tools in this run; further work waits for the user's next "
            "instruction.\n</goal_blocked>")


def state(session: Agent) -> GoalState:
    return session.state(GoalState)


def answer(st: GoalState) -> ToolOutput:
    return ToolOutput.text(json.dumps(st.view(), ensure_ascii=False, separators=(",", ":")))


def direct_human(session: Agent, st: GoalState, turn: int) -> bool:
    """The running turn's prompt came from the person, on a top-level session."""
    at, sources = st.turn_sources
    return session.spec.parent is None and session.spec.depth == 0 and at == turn and "user" in sources


def goal_round(st: GoalState, turn: int) -> bool:
    """The running turn is the current goal's own current round."""
    g, running = st.goal, st.round_turn
    return (g is not None and running is not None and running == (turn, g["id"], g["revision"], st.rounds))


def _require_human(session: Agent, st: GoalState, turn: int) -> None:
    if not direct_human(session, st, turn):
        raise GoalError("this goal operation requires a direct human turn on a top-level agent",
                        code="GOAL_TOOL_AUTHORITY_REQUIRED")


def _text(value: Any) -> str | None:
    """An optional text argument; "" counts as absent (a strict-schema filler)."""
    return value if isinstance(value, str) and value != "" else None


def _cap(value: Any) -> Any:
    """An optional round cap; 0 counts as absent (a strict-schema filler)."""
    return None if value is None or (value == 0 and not isinstance(value, bool)) else value


def _steer(ctx: ToolContext, goal_id: str, revision: int, action: str, objective: str | None, cap: Any,
           reason: str | None) -> None:
    """edit, pause, resume: a person's changes."""
    session, st = ctx.agent, state(ctx.agent)
    _require_human(session, st, ctx.turn)
    if action == "edit":
        if reason is not None:
            raise GoalError("blocked_reason is valid only with action blocked", code="GOAL_TOOL_INVALID_UPDATE")
        domain.commit(session, st, domain.edit(st, goal_id, revision, objective, cap))
        return
    if objective is not None or cap is not None or reason is not None:
        raise GoalError("objective and max_goal_rounds are valid only with action edit; blocked_reason is valid only "
                        "with action blocked", code="GOAL_TOOL_INVALID_UPDATE")
    domain.commit(session, st, (domain.pause if action == "pause" else domain.resume)(st, goal_id, revision))


def _finish(ctx: ToolContext, config: GoalsConfig, goal_id: str, revision: int, action: str,
            objective: str | None, cap: Any, reason: str | None) -> None:
    """complete, blocked: a person's, or the goal's own current round's (then the wrap-up follows)."""
    session, st = ctx.agent, state(ctx.agent)
    in_round = not direct_human(session, st, ctx.turn)
    if in_round and not goal_round(st, ctx.turn):
        raise GoalError("complete and blocked require a direct human turn or the current goal round",
                        code="GOAL_TOOL_AUTHORITY_REQUIRED")
    if objective is not None or cap is not None:
        raise GoalError("objective and max_goal_rounds are valid only with action edit",
                        code="GOAL_TOOL_INVALID_UPDATE")
    if action == "complete" and reason is not None:
        raise GoalError("blocked_reason is valid only with action blocked", code="GOAL_TOOL_INVALID_UPDATE")
    if action == "blocked" and (reason is None or not reason.strip()):
        raise GoalError("blocked_reason is required with action blocked", code="GOAL_TOOL_INVALID_UPDATE")
    threshold = config.blocked_after_rounds
    if action == "blocked" and in_round and st.rounds < threshold:
        raise GoalError(f"blocked requires at least {threshold} consecutive goal rounds; current round is "
                        f"{st.rounds}", code="GOAL_TOOL_BLOCK_THRESHOLD")
    change = (domain.complete(st, goal_id, revision) if action == "complete"
              else domain.block(st, goal_id, revision, "model-reported", reason or ""))
    domain.commit(session, st, change)
    if in_round:  # the round ends here: the model says so to the person, once
        session.splice([TextBlock(text=wrapup(change.goal["objective"], reason if action == "blocked" else None))])


def make_tools(config: GoalsConfig) -> list[FunctionTool]:
    async def get_goal(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return answer(state(ctx.agent))

    async def create_goal(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        st = state(ctx.agent)
        _require_human(ctx.agent, st, ctx.turn)
        domain.commit(ctx.agent, st, domain.create(st, args.get("objective"), args.get("max_goal_rounds"),
                                                   config.default_max_goal_rounds))
        return answer(st)

    async def update_goal(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        goal_id, revision, action = args.get("goal_id"), args.get("revision"), args.get("action")
        if not isinstance(goal_id, str) or not goal_id or goal_id != goal_id.strip() or not domain.positive_whole(
                revision):
            raise GoalError("goal_id must be non-empty and revision must be a positive safe integer",
                            code="GOAL_TOOL_INVALID_UPDATE")
        number = int(revision)  # a positive whole number (checked above)
        given = (_text(args.get("objective")), _cap(args.get("max_goal_rounds")), _text(args.get("blocked_reason")))
        if action in ("edit", "pause", "resume"):
            _steer(ctx, goal_id, number, action, *given)
        elif action in ("complete", "blocked"):
            _finish(ctx, config, goal_id, number, action, *given)
        else:
            raise GoalError(f"action must be one of {', '.join(ACTIONS)}", code="GOAL_TOOL_INVALID_UPDATE")
        return answer(state(ctx.agent))

    return [
        FunctionTool("get_goal", GET_DESCRIPTION, GET_PARAMETERS, get_goal, parallel_safe=True, kind="read"),
        FunctionTool("create_goal", CREATE_DESCRIPTION, CREATE_PARAMETERS, create_goal, kind="other"),
        FunctionTool("update_goal", UPDATE_DESCRIPTION, UPDATE_PARAMETERS, update_goal, kind="other"),
    ]
