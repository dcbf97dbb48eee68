"""Remembered approvals without a process: which requests a rule may answer, and what a log
gives back (the real-stdio tests are in test_approvals_acp.py)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from dsh_acp_transport.approvals import CLEARED, RULE, ApprovalRules, approvals_command, options_for, rememberable

from dsh_core.types import ApprovalRequest, Note


class _Agent:
    def __init__(self) -> None:
        self.emitted: list[Any] = []
        self.rules = ApprovalRules()

    def emit(self, event: Any) -> None:
        self.emitted.append(event)

    def state(self, cls: type) -> Any:
        assert cls is ApprovalRules
        return self.rules


def _req(agent: Any = None, tool: str = "bash", tier: str | None = "workspace-write", **kw: Any) -> ApprovalRequest:
    return ApprovalRequest(agent=agent, tool_name=tool, call_id="call_1", reason="why", tier=tier, **kw)


def test_only_a_plain_escalation_of_the_session_itself_is_rememberable():
    assert rememberable(_req())
    assert not rememberable(_req(tier=None))  # a hook's ask: no tier
    assert not rememberable(_req(choices=("Switch to workspace-write", "Keep planning")))  # plan mode's exit
    assert not rememberable(_req(delegate="fix the tests"))  # a subagent's call, asked through its parent


def test_a_rule_answers_its_own_tool_and_tier_only():
    agent = _Agent()
    agent.rules.remember(agent, "bash", "workspace-write", "allow")
    assert agent.rules.decide(_req()) == "allowed-once"
    assert agent.rules.decide(_req(tier="danger-full-access")) is None  # never wider
    assert agent.rules.decide(_req(tool="write")) is None
    assert agent.rules.decide(_req(delegate="child")) is None
    agent.rules.remember(agent, "bash", "danger-full-access", "reject")
    assert agent.rules.decide(_req(tier="danger-full-access")) == "rejected"
    assert [(e.kind, e.data) for e in agent.emitted] == [
        (RULE, {"tool": "bash", "tier": "workspace-write", "decision": "allow"}),
        (RULE, {"tool": "bash", "tier": "danger-full-access", "decision": "reject"})]


def test_the_option_names_say_tool_tier_and_scope_without_control_characters():
    names = [o.name for o in options_for(_req(tool="b\x1b[2Jash", tier="danger-full-access"))]
    assert names[1].startswith("Always allow b") and names[1].endswith(" in danger-full-access for this session")
    assert all("\x1b" not in n for n in names)


def test_a_log_gives_back_its_rules_after_the_last_clear_but_no_unconfined_allow():
    rules = ApprovalRules()
    rules.fold([
        Note(kind=RULE, data={"tool": "bash", "tier": "read-only", "decision": "allow"}),
        Note(kind=CLEARED, data={}),
        Note(kind=RULE, data={"tool": "bash", "tier": "workspace-write", "decision": "allow"}),
        Note(kind=RULE, data={"tool": "bash", "tier": "danger-full-access", "decision": "allow"}),
        Note(kind=RULE, data={"tool": "write", "tier": "danger-full-access", "decision": "reject"}),
        Note(kind=RULE, data={"tool": "edit", "tier": "workspace-write", "decision": "always"}),  # not a decision
        Note(kind=RULE, data={"tool": 3, "tier": "workspace-write", "decision": "allow"}),
    ])
    assert rules.rules == {("bash", "workspace-write"): "allow", ("write", "danger-full-access"): "reject"}
    assert rules.not_restored == [("bash", "danger-full-access")]


def test_the_command_lists_clears_and_refuses_other_words():
    agent = _Agent()
    command = approvals_command()

    async def main() -> None:
        assert (await command.run(agent, "")).reply.startswith("No remembered approvals")
        agent.rules.remember(agent, "bash", "workspace-write", "allow")
        assert "- always allow `bash` in workspace-write" in (await command.run(agent, "")).reply
        assert (await command.run(agent, "clear")).reply.startswith("Forgot 1 remembered approval;")
        assert agent.rules.rules == {} and agent.emitted[-1].kind == CLEARED
        with pytest.raises(ValueError, match="usage"):
            await command.run(agent, "everything")

    anyio.run(main)
