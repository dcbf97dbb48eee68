"""Interception points: the typed decisions of ``dsh_session_start``, ``dsh_prompt_submit``,
``dsh_before_tool``, ``dsh_after_tool`` and ``dsh_before_stop`` (see ``hookspecs.py``), and the
spine's most-restrictive fold of several plugins' answers.

Hooks decide, objects act: a hookimpl answers synchronously, either with a decision (a Struct
below, cheap native policy) or with a ``Pending`` object whose ``async decide()`` the agent awaits
inside the turn (a hook bridge runs its commands there, so cancelling the turn cancels them).
Every implementation is called (pluggy's order) and the answers awaited one after another; the agent
folds the answers: ``deny`` > ``ask`` > ``allow`` for tools, any ``block`` wins for prompts,
results and stops, and context texts accumulate in order. Above all of these, any answer may
``halt``: the turn stops right after that point (Claude Code's ``continue: false``).

Context is only ever appended after what the model already saw (a message, or text after a
tool result), never rewritten, so the provider's prefix cache keeps hitting.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import msgspec

T = TypeVar("T", covariant=True)

Verdict = Literal["allow", "ask", "deny"]

# The model-visible texts when a plugin blocks without giving a reason.
BLOCKED_PROMPT = "blocked by UserPromptSubmit hook"
BLOCKED_TOOL = "blocked by PreToolUse hook"
BLOCKED_RESULT = "blocked by PostToolUse hook"
BLOCKED_STOP = "continue: blocked by Stop hook"
# The result of a call that did not run because an interception point stopped the turn.
HALTED_TOOL = "not run: a hook stopped the turn"


class _Decision(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """What every decision can say besides its own verdict: ``halt`` stops the session's current
    turn right after this point, whatever else is decided (it takes precedence: a ``Stop`` block
    does not continue, an ``allow`` does not run the call). The turn ends with ``turn/end`` reason
    ``stopped`` (``blocked`` when it stops before the prompt is admitted: the prompt stays out of the
    history as with a block); calls not yet started are answered ``Error: not run: …`` (code
    ``STOPPED``), calls already running finish and are answered. ``halt_reason`` is for the user,
    never shown to the model: the loop records it in a ``note`` (kind ``turn/stopped``)."""

    halt: bool = False
    halt_reason: str | None = None


class SessionStart(_Decision):
    """``dsh_session_start``: ``context`` texts shown to the model once, after the first prompt
    this agent runs (each in a ``<system-reminder>`` block)."""

    context: list[str] = []


class PromptSubmit(_Decision):
    """``dsh_prompt_submit``: ``block`` (a reason) keeps the prompt out of the history and ends the
    turn at once (``turn/end`` reason ``blocked``; the ACP door answers ``end_turn`` with no text);
    ``context`` texts are appended after the prompt (each in a ``<system-reminder>`` block)."""

    block: str | None = None
    context: list[str] = []


class BeforeTool(_Decision):
    """``dsh_before_tool``: ``deny`` answers the call with ``Error: <reason>`` without running it;
    ``ask`` goes to the approval seam (over ACP a one-shot ``session/request_permission``) and runs
    the call only if allowed once; ``allow`` has no objection (it grants nothing: the tool's own
    sandbox tier and approvals still apply)."""

    decision: Verdict | None = None
    reason: str | None = None


class BeforeStop(_Decision):
    """``dsh_before_stop``: ``block`` (a reason) refuses to let the turn end: the reason is
    appended as a user message (source ``hook``) and the turn takes another step."""

    block: str | None = None


@runtime_checkable
class Pending(Protocol[T]):
    """A decision that needs I/O: the agent awaits ``decide()`` inside the turn's cancel scope."""

    async def decide(self) -> T | None: ...


async def settle(answers: list[Any]) -> list[Any]:
    """Resolve the hook's answers in order: decisions as they are, ``Pending`` ones awaited one
    after another (serially: a plugin's processes never overlap another's). None is dropped."""
    out: list[Any] = []
    for answer in answers:
        if isinstance(answer, Pending):
            answer = await answer.decide()
        if answer is not None:
            out.append(answer)
    return out


_ORDER: tuple[Verdict, ...] = ("allow", "ask", "deny")  # least to most restrictive


def fold_before_tool(answers: list[BeforeTool]) -> BeforeTool:
    """deny > ask > allow; the reasons given for the winning verdict, joined by blank lines."""
    given = [a.decision for a in answers if a.decision]
    if not given:
        return BeforeTool()
    verdict = max(given, key=_ORDER.index)
    reasons = [a.reason for a in answers if a.decision == verdict and a.reason]
    return BeforeTool(decision=verdict, reason="\n\n".join(reasons) or None)


def reminder(text: str) -> str:
    return f"<system-reminder>\n{text}\n</system-reminder>"
