"""Remembered approvals (``[config.acp-transport] remember-approvals``, acp-editor): a person who
answers a sandbox escalation with "always" makes a rule for this session, this tool and this
tier, and later requests that match it exactly are answered by the rule without asking.

- Offered only for a request that names a tier (a sandbox escalation: ``bash → danger-full-access``),
  asks for the session's own agent (not a subagent's call, ``delegate``) and brings no answers of
  its own (``choices``: plan mode's exit_plan_mode stays one-shot). Anything else is one-shot.
- A rule never widens: it answers a request for its own tool and its own tier only, so "always
  allow bash in workspace-write" never answers a request for danger-full-access.
- Rules are notes in the session log (``acp/approval-rule``, ``acp/approval-rules-cleared``),
  folded back on session/resume and session/load. An allow rule for a tier that lifts the
  sandbox (danger-full-access) is not taken from a file, as the session's own full-access mode
  is not (the spine's restore): a log anyone with the data dir can edit must not
  grant unconfined commands; the person chooses it again in this process. Reject rules always are.
- ``/approvals`` lists the session's rules; ``/approvals clear`` forgets them (a note, so a
  resumed session forgets them too).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from dsh_acp import wire
from dsh_acp.display import cut, visible

from dsh_core.protocols import CommandResult, SlashCommand
from dsh_core.types import ApprovalOutcome, ApprovalRequest, Note

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent

RULE = "acp/approval-rule"
CLEARED = "acp/approval-rules-cleared"

Decision = Literal["allow", "reject"]

# Tiers that lift the sandbox: an allow rule for one is not taken from a log (the spine keeps the
# session's own full-access mode out of a restore for the same reason).
UNRESTORED_TIERS = frozenset({"danger-full-access", "full-access"})

# option id -> (outcome, the rule it makes); the once options make none
OPTION_OUTCOMES: dict[str, tuple[ApprovalOutcome, Decision | None]] = {
    "allow-once": ("allowed-once", None),
    "allow-always": ("allowed-once", "allow"),
    "reject-once": ("rejected", None),
    "reject-always": ("rejected", "reject"),
}


def rememberable(request: ApprovalRequest) -> bool:
    """A sandbox escalation of the session's own agent, asked with the usual answers."""
    return bool(request.tier) and request.choices is None and request.delegate is None


def _shown(tool: str, tier: str) -> tuple[str, str]:
    return cut(visible(tool), 40), cut(visible(tier), 40)


def options_for(request: ApprovalRequest) -> list[wire.PermissionOption]:
    """The four answers, named as a person reads them in Zed or Toad."""
    assert request.tier
    tool, tier = _shown(request.tool_name, request.tier)
    return [
        wire.PermissionOption(option_id="allow-once", name="Allow once", kind="allow_once"),
        wire.PermissionOption(option_id="allow-always", name=f"Always allow {tool} in {tier} for this session",
                              kind="allow_always"),
        wire.PermissionOption(option_id="reject-once", name="Reject once", kind="reject_once"),
        wire.PermissionOption(option_id="reject-always", name=f"Always reject {tool} in {tier} for this session",
                              kind="reject_always"),
    ]


class ApprovalRules:
    """One session's remembered approvals (its state slot): (tool, tier) -> allow | reject."""

    def __init__(self) -> None:
        self.rules: dict[tuple[str, str], Decision] = {}
        self.not_restored: list[tuple[str, str]] = []  # allow rules a log held that lift the sandbox

    def decide(self, request: ApprovalRequest) -> ApprovalOutcome | None:
        """The rule's answer to ``request`` (None: no rule matches exactly; ask)."""
        if not rememberable(request):
            return None
        assert request.tier is not None
        decision = self.rules.get((request.tool_name, request.tier))
        if decision is None:
            return None
        return "allowed-once" if decision == "allow" else "rejected"

    def remember(self, agent: Agent, tool: str, tier: str, decision: Decision) -> None:
        """A person's "always": kept here and written to the session log."""
        self.rules[(tool, tier)] = decision
        self.not_restored = [k for k in self.not_restored if k != (tool, tier)]
        agent.emit(Note(kind=RULE, data={"tool": tool, "tier": tier, "decision": decision}))

    def clear(self, agent: Agent) -> int:
        forgotten = len(self.rules)
        self.rules.clear()
        self.not_restored.clear()
        agent.emit(Note(kind=CLEARED, data={"forgotten": forgotten}))
        return forgotten

    def fold(self, events: Iterable[Any]) -> None:
        """The rules a recorded session's log holds (session/resume, session/load)."""
        rules: dict[tuple[str, str], Decision] = {}
        for ev in events:
            if not isinstance(ev, Note):
                continue
            if ev.kind == CLEARED:
                rules.clear()
            elif ev.kind == RULE:
                tool, tier, decision = ev.data.get("tool"), ev.data.get("tier"), ev.data.get("decision")
                if isinstance(tool, str) and isinstance(tier, str) and tool and tier and decision in ("allow", "reject"):
                    rules[(tool, tier)] = decision
        self.rules = {k: d for k, d in rules.items() if not (d == "allow" and k[1] in UNRESTORED_TIERS)}
        self.not_restored = [k for k, d in rules.items() if d == "allow" and k[1] in UNRESTORED_TIERS]

    def listing(self) -> str:
        """The rules as Markdown (an editor folds single newlines)."""
        if not self.rules and not self.not_restored:
            return ("No remembered approvals in this session. When a tool asks for a wider sandbox tier, "
                    "choose \"Always allow …\" or \"Always reject …\" to remember the answer.")
        lines = [f"- always {d} `{tool}` in {tier}" for (tool, tier), d in sorted(self.rules.items())]
        text = "Remembered approvals in this session:\n\n" + "\n".join(lines) if lines else (
            "No remembered approvals in this session.")
        if self.not_restored:
            gone = "\n".join(f"- always allow `{tool}` in {tier}" for tool, tier in self.not_restored)
            text += ("\n\nRecorded, but not restored from the session log (they lift the sandbox; "
                     f"choose them again to keep them):\n\n{gone}")
        if self.rules:
            text += "\n\n`/approvals clear` forgets them."
        return text


def approvals_command() -> SlashCommand:
    async def run(agent: Agent, text: str) -> CommandResult:
        rules = agent.state(ApprovalRules)
        if text == "":
            return CommandResult(reply=rules.listing())
        if text == "clear":
            n = rules.clear(agent)
            return CommandResult(reply=f"Forgot {n} remembered approval{'' if n == 1 else 's'}; "
                                       "every escalation is asked again.")
        raise ValueError("usage: `/approvals` lists this session's remembered approvals, "
                         "`/approvals clear` forgets them")

    return SlashCommand(name="approvals", description="List this session's remembered approvals (clear: forget them)",
                        run=run, hint="clear")
