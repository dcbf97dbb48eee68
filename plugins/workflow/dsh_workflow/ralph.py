"""``ralph {objective, max_rounds}``: a fixed loop of fresh agents on one objective. Each round
is a new one-shot child that sees the objective and what earlier rounds reported (not their
conversations), works in the workspace, and answers ``{"done": bool, "summary": str}``; the
loop ends when one says the objective is met, or after ``max_rounds``."""

from __future__ import annotations

from typing import Any

from dsh_core import ToolError
from dsh_core.display import cut
from dsh_core.protocols import ToolContext
from dsh_core.types import Note, ToolOutput

from .members import Caps, Members, Tripped

REPORT = {
    "type": "object",
    "properties": {
        "done": {"type": "boolean", "description": "true when the objective is met"},
        "summary": {"type": "string", "description": "what you did, and what remains if anything"},
    },
    "required": ["done", "summary"],
}
SUMMARY_CHARS = 2000  # of each earlier round's summary in the next round's prompt


def round_prompt(objective: str, n: int, rounds: int, reports: list[str]) -> str:
    lines = [f"Objective: {objective}", "", f"You are round {n} of at most {rounds}: a fresh agent working on this "
             "objective in the workspace, after the rounds before you."]
    if reports:
        lines += ["", "What the earlier rounds reported:"] + [f"- round {i}: {r}" for i, r in enumerate(reports, 1)]
    lines += ["", "Do the next part of the work. When you stop, report whether the objective is now met."]
    return "\n".join(lines)


async def run_ralph(args: dict[str, Any], ctx: ToolContext, caps: Caps, max_rounds: int) -> ToolOutput:
    objective, rounds = args.get("objective"), args.get("max_rounds", min(5, max_rounds))
    if not isinstance(objective, str) or not objective.strip():
        raise ToolError("ralph needs `objective`: what the rounds work toward", code="INVALID_ARGUMENTS")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or not 1 <= rounds <= max_rounds:
        raise ToolError(f"`max_rounds` must be a whole number from 1 to {max_rounds}", code="INVALID_ARGUMENTS")
    members = Members(ctx=ctx, caps=Caps(max_agents=rounds, concurrency=1, max_depth=caps.max_depth,
                                         provider=caps.provider), kind="ralph")
    ctx.emit(Note(kind="ralph/start", data={"objective": cut(objective, 2000), "maxRounds": rounds,
                                             "callId": ctx.call_id}))
    reports: list[str] = []
    met: int | None = None
    try:
        for n in range(1, rounds + 1):
            report = await members.ask(round_prompt(objective, n, rounds, reports), schema=REPORT, label=f"round {n}")
            if report is None:
                reports.append(f"(failed: {members.problem or 'no report'})")
                continue
            reports.append(cut(" ".join(str(report["summary"]).split()), SUMMARY_CHARS))
            if report["done"] is True:
                met = n
                break
    except Tripped as exc:
        raise ToolError(f"ralph stopped: {exc}", code="RALPH_ABORTED") from None
    finally:
        ctx.emit(Note(kind="ralph/end", data={"rounds": len(reports), "met": met is not None}))
    body = "\n".join(f"round {i}: {r}" for i, r in enumerate(reports, 1))
    if met is not None:
        return ToolOutput.text(f"objective met in round {met} of {rounds}.\n{body}")
    return ToolOutput.text(f"objective not met after {rounds} round{'s' if rounds != 1 else ''}.\n{body}",
                           is_error=True, code="RALPH_EXHAUSTED")
