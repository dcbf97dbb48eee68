"""``ralph {objective, maxRounds}``: a fixed loop of fresh agents on one objective, as the
original harness runs it. Each round is a new one-shot child that sees the objective, its round
number and the previous round's structured handoff (never a conversation), works in the
workspace, and answers a round report ``{status, summary, evidence, nextSteps, blocker}``. The
loop ends at the first ``complete`` or ``blocked`` report, at the first round whose child fails
(an error result carrying the last good handoff), or after ``maxRounds`` rounds."""

from __future__ import annotations

import json
from typing import Any

from dsh_core import ToolError
from dsh_core.display import cut
from dsh_core.protocols import ToolContext
from dsh_core.types import Note, ToolOutput

from .members import Caps, Members, Tripped

REPORT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["continue", "complete", "blocked"]},
        "summary": {"type": "string"},
        "evidence": {"type": "array", "items": {"type": "string"}},
        "nextSteps": {"type": "array", "items": {"type": "string"}},
        "blocker": {"type": "string"},
    },
    "required": ["status", "summary", "evidence", "nextSteps", "blocker"],
    "additionalProperties": False,
}
KEYS = ("status", "summary", "evidence", "nextSteps", "blocker")
TRUNCATED = "\n… [truncated]"


class BadReport(Exception):
    """A round answered a report of the right shape that breaks the report's rules: the run ends."""


def round_prompt(objective: str, n: int, rounds: int, previous: dict[str, Any] | None) -> str:
    handoff = "(none: you are the first round)" if previous is None else json.dumps(previous, ensure_ascii=False)
    return "\n\n".join([
        "You are a fresh worker in one round of a Ralph loop. You have no parent conversation and no earlier "
        "round's session; this round is the loop's worker, so do not call the ralph tool yourself.",
        "The objective (it does not change between rounds):\n" + objective,
        f"Ralph round: {n} of {rounds}.",
        "The shared workspace and its files are the loop's memory and the source of truth. Look at them before "
        "you act, keep the work already there, do real work within the objective, and check what you change. "
        "The previous round's handoff below is only a short note: confirm it against the workspace.",
        "Previous round's handoff:\n" + handoff,
        "Answer with one report whose strings are trimmed and non-empty. status \"continue\" (with at least one "
        "nextSteps entry) while useful work remains; \"complete\" only with concrete evidence and no nextSteps; "
        "\"blocked\" only when nothing more can be done without a human or a change outside the workspace. "
        "blocker stays \"\" unless the status is blocked.",
    ])


def _trimmed(value: Any) -> bool:
    return isinstance(value, str) and value != "" and value == value.strip()


def check_report(report: dict[str, Any], max_chars: int) -> dict[str, Any]:
    """The report in its canonical key order, or BadReport with the rule it breaks."""
    if not _trimmed(report["summary"]):
        raise BadReport("Ralph round report summary must be non-empty and normalized")
    if not all(_trimmed(v) for v in [*report["evidence"], *report["nextSteps"]]):
        raise BadReport("Ralph round report evidence and nextSteps must contain only non-empty normalized strings")
    if report["blocker"] != report["blocker"].strip():
        raise BadReport("Ralph round report blocker must be a normalized string")
    status = report["status"]
    if status == "continue" and (not report["nextSteps"] or report["blocker"]):
        raise BadReport("a continuing Ralph report needs nextSteps and an empty blocker")
    if status == "complete" and (not report["evidence"] or report["nextSteps"] or report["blocker"]):
        raise BadReport("a complete Ralph report needs evidence, no nextSteps, and an empty blocker")
    if status == "blocked" and not _trimmed(report["blocker"]):
        raise BadReport("a blocked Ralph report needs a concrete blocker")
    canonical = {k: report[k] for k in KEYS}
    size = len(json.dumps(canonical, ensure_ascii=False, separators=(",", ":")))
    if size > max_chars:
        raise BadReport(f"Ralph round report exceeds maxHandoffChars ({size} > {max_chars})")
    return canonical


def bound(text: str, max_chars: int) -> str:
    """At most ``max_chars`` characters, the truncation mark included."""
    if len(text) <= max_chars:
        return text
    if max_chars <= len(TRUNCATED):
        return TRUNCATED[:max_chars]
    return text[: max_chars - len(TRUNCATED)] + TRUNCATED


def _json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False)


def resolve_rounds(requested: Any, ceiling: int) -> int:
    value = ceiling if requested is None else requested
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or not 1 <= value <= 2**53 - 1:
        raise ToolError("Ralph maxRounds must be a positive safe integer", code="INVALID_ARGUMENTS")
    if value > ceiling:
        raise ToolError(f"Ralph maxRounds {int(value)} exceeds the deployment ceiling {ceiling}",
                        code="INVALID_ARGUMENTS")
    return int(value)


async def run_ralph(args: dict[str, Any], ctx: ToolContext, caps: Caps, ceiling: int, *,
                    max_handoff_chars: int, max_result_chars: int) -> ToolOutput:
    objective = args.get("objective")
    objective = objective.strip() if isinstance(objective, str) else ""
    if not objective:
        raise ToolError("Ralph objective must be a non-empty string", code="INVALID_ARGUMENTS")
    rounds = resolve_rounds(args.get("maxRounds"), ceiling)
    members = Members(ctx=ctx, caps=Caps(max_agents=rounds, concurrency=1, max_depth=caps.max_depth,
                                         provider=caps.provider), kind="ralph")
    ctx.emit(Note(kind="ralph/start", data={"objective": cut(objective, 2000), "maxRounds": rounds,
                                             "callId": ctx.call_id}))
    previous: dict[str, Any] | None = None
    status, n = "budget-limited", 0
    try:
        for n in range(1, rounds + 1):
            raw = await members.ask(round_prompt(objective, n, rounds, previous), schema=REPORT,
                                    label=f"Ralph round {n}")
            if raw is None:
                status = "round-failed"
                break
            report = check_report(raw, max_handoff_chars)
            if report["status"] in ("complete", "blocked"):
                status, previous = report["status"], report
                break
            previous = report
    except Tripped as exc:
        status = "stopped"
        raise ToolError(f"Ralph workflow failed: {exc}", code="RALPH_ABORTED") from None
    except BadReport as exc:
        status = "bad-report"
        raise ToolError(f"Ralph workflow failed: {exc}", code="RALPH_BAD_REPORT") from None
    finally:
        ctx.emit(Note(kind="ralph/end", data={"rounds": n, "status": status}))
    plural = f"{n} round{'' if n == 1 else 's'}"
    if status == "round-failed":
        head = f"Ralph round {n} child failed before producing a structured report."
        text = (f"{head}\nNo previous handoff was available." if previous is None
                else f"{head}\nLast successful handoff:\n{_json(previous)}")
        raise ToolError(bound(text, max_result_chars), code="RALPH_ROUND_FAILED")
    assert previous is not None  # a round that did not fail left its report
    head = {"complete": f"Ralph worker reported completion after {plural}.",
            "blocked": f"Ralph worker reported a blocker after {plural}.",
            "budget-limited": f"Ralph reached its {plural} limit; the worker reported work remaining."}[status]
    return ToolOutput.text(bound(f"{head}\nFinal report:\n{_json(previous)}", max_result_chars))
