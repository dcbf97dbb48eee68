"""How to delegate well: the system-prompt sections (``dsh_register_guidance``) of ``subagent``
(with ``send_message``, ``list_agents`` and ``interrupt_agent``) and of ``report``, the session tool
of a continuable child alone (``dsh_session_tool_names`` names it for that child, so the section
is in that child's prompt and nobody else's)."""

from __future__ import annotations

from dsh_core.types import Guidance

_WHAT = (
    "Hand subagent a task that stands on its own and can be described completely in its prompt (a search "
    "through many files, an independent change, a review), since it does not see this conversation; "
    "subagent_fork starts from this conversation instead, for work that needs what you already know. "
)
_AFTER = (
    "A subagent stays available after it answers: send_message gives it a follow-up task, list_agents "
    "shows which of yours are running or idle, and interrupt_agent stops the turn of one whose work no "
    "longer matters."
)


def subagent(*, background: bool) -> Guidance:
    """``subagent``'s section; ``background``: the tool runs children in the background unless told
    otherwise (``[config.subagents] background``)."""
    when = (
        "Run subagents in the background, as they are by default: start independent ones together in "
        "one message and keep working while they run; a notice brings each one's outcome and final "
        "message when it ends. Set run_in_background to false only when your next step needs that "
        "subagent's answer. "
        if background
        else "A subagent call waits for its answer unless you set run_in_background to true; do that for "
        "independent tasks, start them together in one message and keep working while they run: a "
        "notice brings each one's outcome and final message when it ends. "
    )
    return Guidance(name="tool:subagent", order=117, tools=("subagent",), text=_WHAT + when + _AFTER)


REPORT_SECTION = Guidance(
    name="tool:report",
    order=118,  # last: after every section a child can carry
    tools=("report",),
    text="You are a subagent: another agent started you for a task. Before you finish, deliver your result "
    "with the report tool, once, complete and self-contained: that agent shares your workspace but not "
    "your conversation, tool results or reasoning, so a closing \"done\" gives it nothing to use. Report "
    "earlier too when you find something that changes what it should do next; reporting does not end "
    "your turn.",
)
