"""Tiers, fail-closed, and one-shot escalation through the real approval seam."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from dsh_sandbox_tools import confine, sandbox_for
from sandbox_helpers import Answer, FakeModelPlugin, Session, mechanisms, running_host, text

from dsh_core import ConfigError, diag
from dsh_core.compose import Composition
from dsh_core.contracts import AgentSpec
from dsh_core.host import make_plugin_manager, open_host, register_plugin
from dsh_core.types import ApprovalAsked, ApprovalDecided

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_read_only_blocks_writes_even_inside_root(mechanism: str, root: Path) -> None:
    async with running_host("read-only", mechanism) as host:
        s = Session(host, root)
        out = await s.call("bash", description="test command", command=f"echo x > {root}/a")
        assert text(out).endswith("[exit code: 1]")
        assert "[sandbox: file access denied under read-only mode]" in text(out)
        assert 'sandbox_permissions="workspace-write" or "danger-full-access"' in text(out)
        ok = await s.call("bash", description="test command", command="echo x > /dev/null && cat /etc/hostname >/dev/null && echo fine")
        assert not ok.is_error and "fine" in text(ok)
        w = await s.call("write", file_path="a", content="x")
        assert w.code == "SANDBOX_DENIED" and "read-only" in text(w)
    assert not (root / "a").exists()


async def test_danger_full_access_does_not_confine(root: Path, outside: Path) -> None:
    # mechanism "none": there is no sandbox at all, and danger-full-access needs none.
    async with running_host("danger-full-access", "none") as host:
        s = Session(host, root)
        out = await s.call("bash", description="test command", command=f"echo x > {outside}/a && echo done")
        assert not out.is_error and "done" in text(out), text(out)
        w = await s.call("write", file_path=str(outside / "b"), content="y")
        assert not w.is_error, text(w)
        assert "sandbox_permissions" not in str(host.tools["bash"].spec.parameters)
        bad = await s.call("bash", description="test command", command="true", sandbox_permissions="danger-full-access", justification="x")
        assert bad.code == "INVALID_ARGUMENTS"
    assert (outside / "a").read_text() == "x\n"
    assert (outside / "b").read_text() == "y"


@pytest.mark.parametrize("mode", ["workspace-write", "read-only"])
async def test_fail_closed_when_no_sandbox(mode: str, root: Path) -> None:
    async with running_host(mode, "none") as host:
        s = Session(host, root)
        out = await s.call("bash", description="test command", command=f"touch {root}/ran")
    assert out.code == "SANDBOX_UNAVAILABLE"
    assert f'sandbox mode "{mode}" is requested but no sandbox backend is usable on this host; ' \
           "refusing to run the command unconfined" in text(out)
    assert not (root / "ran").exists()


async def test_start_up_says_on_stderr_when_no_sandbox_is_usable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(diag.handler, "spent", 0)  # the budget is per process; earlier tests may have spent it
    async with running_host("workspace-write", "none"):
        pass
    err = capsys.readouterr().err
    assert "dsh: sandbox-tools: no sandbox mechanism is usable (" in err, err
    assert 'bash will refuse to run commands in "workspace-write" mode (sandbox unavailable)' in err
    # It is a diag.warn, so it is bounded like every other diagnostic: once the budget is spent, silence.
    monkeypatch.setattr(diag.handler, "spent", diag.BUDGET)
    async with running_host("workspace-write", "none"):
        pass
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_escalation_allowed_runs_once_and_is_not_remembered(mechanism: str, root: Path, outside: Path) -> None:
    async with running_host(mechanism=mechanism) as host:
        answer = Answer("allowed-once")
        host.approvals.add_answerer(answer)
        s = Session(host, root)
        out = await s.call("bash", description="test command", command=f"echo x > {outside}/a", sandbox_permissions="danger-full-access",
                           justification="write the report where the user asked")
        assert not out.is_error, text(out)
        assert (outside / "a").read_text() == "x\n"
        assert len(answer.requests) == 1
        req = answer.requests[0]
        assert req.agent is s.agent and req.tool_name == "bash" and req.call_id == "c1"
        assert req.reason == "escalate sandbox to danger-full-access: write the report where the user asked"
        # the next call, without escalation, is confined again: no grant remembered
        again = await s.call("bash", description="test command", command=f"echo y > {outside}/b")
        assert "[exit code: 1]" in text(again) and "file access denied" in text(again)
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
        out = await s.call("bash", description="test command", command=f"touch {root}/ran; echo x > {outside}/a",
                           sandbox_permissions="danger-full-access", justification="because")
        decided = [e for e in s.events if isinstance(e, ApprovalDecided)]
    assert out.is_error and out.code == code
    assert words in text(out) and "nothing was run" in text(out)
    assert not (root / "ran").exists() and not (outside / "a").exists()
    assert decided[0].outcome == (outcome or "unavailable")


async def test_an_escalation_a_policy_refuses_says_so(root: Path, outside: Path) -> None:
    """A ``dsh_check_approval`` verdict answers before anybody is asked: the model is told a
    policy refused, not that the user did (the user was never shown the question)."""
    from dsh_core import hookimpl

    class Policy:
        @hookimpl
        def dsh_check_approval(self, request):
            return "deny"

    async with running_host(plugins={"deny-all": Policy()}) as host:
        answer = Answer("allowed-once")
        host.approvals.add_answerer(answer)
        s = Session(host, root)
        out = await s.call("bash", description="test command", command=f"touch {root}/ran; echo x > {outside}/a",
                           sandbox_permissions="danger-full-access", justification="because")
        decided = [e for e in s.events if isinstance(e, ApprovalDecided)]
    assert out.code == "ESCALATION_REJECTED"
    assert 'an approval policy refused escalating this command to "danger-full-access"' in text(out)
    assert answer.requests == [] and not (root / "ran").exists()
    assert (decided[0].outcome, decided[0].answered_by) == ("rejected", "policy")


async def test_file_escalation(root: Path, outside: Path) -> None:
    async with running_host("read-only") as host:
        answer = Answer("allowed-once")
        host.approvals.add_answerer(answer)
        s = Session(host, root)
        out = await s.call("write", file_path="a.txt", content="hi", sandbox_permissions="workspace-write",
                           justification="save the result")
        assert not out.is_error, text(out)
        # workspace-write (escalated) still does not reach outside the root
        out = await s.call("write", file_path=str(outside / "a"), content="hi", sandbox_permissions="workspace-write",
                           justification="save it")
        assert out.code == "SANDBOX_DENIED"
        answer.outcome = "rejected"
        out = await s.call("write", file_path="b.txt", content="hi", sandbox_permissions="danger-full-access",
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
        out = await Session(host, root).call("bash", description="test command", command=f"touch {root}/ran", **args)
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


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_hosts_in_one_process_each_keep_their_own_sandbox(
    mechanism: str, monkeypatch: pytest.MonkeyPatch, root: Path, outside: Path,
) -> None:
    # Three hosts at once: read-only, then danger-full-access, then one that does not mount
    # sandbox-tools at all (code mode may still ask it to confine a program). Each is confined by
    # its own configuration, never by the host configured last.
    monkeypatch.setenv("DSH_SANDBOX_MECHANISM", mechanism)  # the bare host's default settings use it too
    pm = make_plugin_manager()
    register_plugin(pm, FakeModelPlugin(), "fake-model")
    bare_comp = Composition(name="bare", path=Path("/nonexistent/example.toml"), plugins=("fake-model",))
    async with (
        running_host("read-only", mechanism, **{"max-output-bytes": 1111}) as ro,
        running_host("danger-full-access", mechanism, **{"max-output-bytes": 2222}) as full,
        open_host(bare_comp, pm=pm, provider="fake", model="m") as bare,
    ):
        assert "bash" not in bare.tools
        for host, mode, limit in ((ro, "read-only", 1111), (full, "danger-full-access", 2222)):
            sb = sandbox_for(host)
            assert (sb.settings.mode, sb.settings.max_output_bytes) == (mode, limit)
            assert host.tools["bash"].sb is sb and host.tools["write"].sb is sb
            assert f'in the "{mode}" sandbox' in host.tools["bash"].spec.description
            assert f"Current DSH file policy: {mode}." in host.system_prompt(AgentSpec(cwd=str(root), provider="fake", model="m"))
            assert (await confine(["true"], host=host, cwd=str(root))).mode == mode

        denied = await Session(ro, root).call("bash", description="test command", command=f"echo ro > {outside}/ro")
        assert "[exit code: 1]" in text(denied) and "file access denied under read-only mode" in text(denied), text(denied)
        allowed = await Session(full, root).call("bash", description="test command", command=f"echo full > {outside}/full && echo done")
        assert not allowed.is_error and "done" in text(allowed), text(allowed)

        # The bare host gets the default tier (workspace-write), confined by the real mechanism.
        confined = await confine(["bash", "-c", f"echo bare > {outside}/bare"], host=bare, cwd=str(root))
        assert (confined.mode, confined.mechanism) == ("workspace-write", mechanism)
        proc = await anyio.run_process(confined.argv, env=confined.env, cwd=str(root), check=False)
        assert proc.returncode != 0 and confined.denial in proc.stderr.decode(), proc.stderr
    assert not (outside / "ro").exists() and not (outside / "bare").exists()
    assert (outside / "full").read_text() == "full\n"
