"""Tiers, fail-closed, and one-shot escalation through the real approval seam."""

from __future__ import annotations

from pathlib import Path

import pytest
from sandbox_helpers import Answer, Session, mechanisms, running_host, text

from dsh_core import ConfigError
from dsh_core.types import ApprovalAsked, ApprovalDecided

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_read_only_blocks_writes_even_inside_root(mechanism: str, root: Path) -> None:
    async with running_host("read-only", mechanism) as host:
        s = Session(host, root)
        out = await s.call("bash", command=f"echo x > {root}/a")
        assert out.is_error
        assert "[sandbox: file access denied under read-only mode]" in text(out)
        assert 'sandbox_permissions="workspace-write" or "danger-full-access"' in text(out)
        ok = await s.call("bash", command="echo x > /dev/null && cat /etc/hostname >/dev/null && echo fine")
        assert not ok.is_error and "fine" in text(ok)
        w = await s.call("write", path="a", content="x")
        assert w.code == "SANDBOX_DENIED" and "read-only" in text(w)
    assert not (root / "a").exists()


async def test_danger_full_access_does_not_confine(root: Path, outside: Path) -> None:
    # mechanism "none": there is no sandbox at all, and danger-full-access needs none.
    async with running_host("danger-full-access", "none") as host:
        s = Session(host, root)
        out = await s.call("bash", command=f"echo x > {outside}/a && echo done")
        assert not out.is_error and "done" in text(out), text(out)
        w = await s.call("write", path=str(outside / "b"), content="y")
        assert not w.is_error, text(w)
        assert "sandbox_permissions" not in str(host.tools["bash"].spec.parameters)
        bad = await s.call("bash", command="true", sandbox_permissions="danger-full-access", justification="x")
        assert bad.code == "INVALID_ARGUMENTS"
    assert (outside / "a").read_text() == "x\n"
    assert (outside / "b").read_text() == "y"


@pytest.mark.parametrize("mode", ["workspace-write", "read-only"])
async def test_fail_closed_when_no_sandbox(mode: str, root: Path) -> None:
    async with running_host(mode, "none") as host:
        s = Session(host, root)
        out = await s.call("bash", command=f"touch {root}/ran")
    assert out.code == "SANDBOX_UNAVAILABLE"
    assert f'sandbox mode "{mode}" is requested but no sandbox backend is usable on this host; ' \
           "refusing to run the command unconfined" in text(out)
    assert not (root / "ran").exists()


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_escalation_allowed_runs_once_and_is_not_remembered(mechanism: str, root: Path, outside: Path) -> None:
    async with running_host(mechanism=mechanism) as host:
        answer = Answer("allowed-once")
        host.approvals.add_answerer(answer)
        s = Session(host, root)
        out = await s.call("bash", command=f"echo x > {outside}/a", sandbox_permissions="danger-full-access",
                           justification="write the report where the user asked")
        assert not out.is_error, text(out)
        assert (outside / "a").read_text() == "x\n"
        assert len(answer.requests) == 1
        req = answer.requests[0]
        assert req.agent is s.agent and req.tool_name == "bash" and req.call_id == "c1"
        assert req.reason == "escalate sandbox to danger-full-access: write the report where the user asked"
        # the next call, without escalation, is confined again: no grant remembered
        again = await s.call("bash", command=f"echo y > {outside}/b")
        assert again.is_error and "file access denied" in text(again)
        assert not (outside / "b").exists()
        assert len(answer.requests) == 1
        asked = [e for e in s.events if isinstance(e, ApprovalAsked)]
        decided = [e for e in s.events if isinstance(e, ApprovalDecided)]
        assert len(asked) == 1 and asked[0].call_id == "c1" and asked[0].tool_name == "bash"
        assert len(decided) == 1 and decided[0].outcome == "allowed-once"


@pytest.mark.parametrize(
    ("outcome", "code", "words"),
    [
        ("rejected", "ESCALATION_REJECTED", 'the user rejected escalating this command to "danger-full-access"'),
        ("cancelled", "ESCALATION_CANCELLED", 'approval for escalating to "danger-full-access" was cancelled'),
        (None, "APPROVAL_UNAVAILABLE", "requires approval, but no approval channel is available"),
    ],
)
async def test_escalation_not_allowed_runs_nothing(outcome, code, words, root: Path, outside: Path) -> None:
    async with running_host() as host:
        host.approvals.add_answerer(Answer(outcome))
        s = Session(host, root)
        out = await s.call("bash", command=f"touch {root}/ran; echo x > {outside}/a",
                           sandbox_permissions="danger-full-access", justification="because")
        decided = [e for e in s.events if isinstance(e, ApprovalDecided)]
    assert out.is_error and out.code == code
    assert words in text(out) and "nothing was run" in text(out)
    assert not (root / "ran").exists() and not (outside / "a").exists()
    assert decided[0].outcome == (outcome or "unavailable")


async def test_file_escalation(root: Path, outside: Path) -> None:
    async with running_host("read-only") as host:
        answer = Answer("allowed-once")
        host.approvals.add_answerer(answer)
        s = Session(host, root)
        out = await s.call("write", path="a.txt", content="hi", sandbox_permissions="workspace-write",
                           justification="save the result")
        assert not out.is_error, text(out)
        # workspace-write (escalated) still does not reach outside the root
        out = await s.call("write", path=str(outside / "a"), content="hi", sandbox_permissions="workspace-write",
                           justification="save it")
        assert out.code == "SANDBOX_DENIED"
        answer.outcome = "rejected"
        out = await s.call("write", path="b.txt", content="hi", sandbox_permissions="danger-full-access",
                           justification="x")
        assert out.code == "ESCALATION_REJECTED"
        assert 'the user rejected escalating this file operation to "danger-full-access"' in text(out)
    assert (root / "a.txt").read_text() == "hi"
    assert not (root / "b.txt").exists() and not (outside / "a").exists()


@pytest.mark.parametrize(
    "args",
    [
        {"sandbox_permissions": "danger-full-access"},
        {"justification": "why"},
        {"sandbox_permissions": "danger-full-access", "justification": "   "},
        {"sandbox_permissions": "workspace-write", "justification": "not wider"},
        {"sandbox_permissions": "root", "justification": "x"},
    ],
)
async def test_escalation_arguments_validated_before_asking(args, root: Path) -> None:
    async with running_host() as host:
        answer = Answer("allowed-once")
        host.approvals.add_answerer(answer)
        out = await Session(host, root).call("bash", command=f"touch {root}/ran", **args)
    assert out.code == "INVALID_ARGUMENTS", text(out)
    assert not answer.requests and not (root / "ran").exists()


async def test_schema_offers_only_wider_tiers(root: Path) -> None:
    async with running_host("read-only") as host:
        props = host.tools["bash"].spec.parameters["properties"]
        assert props["sandbox_permissions"]["enum"] == ["workspace-write", "danger-full-access"]
        assert "sandbox_permissions" in host.tools["write"].spec.parameters["properties"]
        assert "sandbox_permissions" in host.tools["edit"].spec.parameters["properties"]
        assert "sandbox_permissions" not in host.tools["read"].spec.parameters["properties"]
    async with running_host() as host:
        assert host.tools["bash"].spec.parameters["properties"]["sandbox_permissions"]["enum"] == [
            "danger-full-access"
        ]
        agent = Session(host, root).agent
        assert 'Current DSH file policy: workspace-write.' in agent.system
        assert f'"{root}"' in agent.system


async def test_env_mode_and_bad_config(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.setenv("DSH_PERMISSION_MODE", "read-only")
    async with running_host("workspace-write") as host:
        assert "Current DSH file policy: read-only." in Session(host, root).agent.system
    monkeypatch.setenv("DSH_PERMISSION_MODE", "yolo")
    with pytest.raises(ConfigError, match="DSH_PERMISSION_MODE"):
        async with running_host():
            pass
