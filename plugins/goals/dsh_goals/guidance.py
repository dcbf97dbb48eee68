"""The goal tools' system-prompt section, in dsh's words, covering what the original harness's
goal section tells the model. The lead wires it through ``dsh_register_guidance`` (name, order,
tools, text); ``guidance_text`` fills in the configured blocked threshold."""

from __future__ import annotations

NAME = "tool:goal"
ORDER = 114
TOOLS = ("create_goal", "get_goal", "update_goal")


def guidance_text(blocked_after: int = 3) -> str:
    return (
        "Use the goal tools for one long-running objective that should be carried to completion in this "
        "session. create_goal may infer that intent from what the person asks, in any language and without "
        "the word \"goal\"; do not create a goal for routine work that one turn finishes. Always call "
        "get_goal before update_goal and copy its exact goal_id and revision. A resumed or forked session "
        "keeps its goal but disarms it: when the person asks to continue or resume, in any wording or "
        "language, call update_goal with action resume to rearm it. Mark a goal complete only when the "
        "objective is actually achieved. Mark it blocked only after the same blocking condition has held "
        f"for at least {blocked_after} consecutive goal rounds, and name that concrete condition in "
        "blocked_reason; difficulty, uncertainty or useful work still to do is not a blocker."
    )


GUIDANCE = guidance_text()
