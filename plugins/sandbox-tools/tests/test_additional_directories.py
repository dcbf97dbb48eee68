"""A session's additional directories (``AgentSpec.additional_directories``, an editor's ACP
``additionalDirectories``) are roots beside its workspace in its tier, and nothing more: with the
real mechanism, a write into an added directory works in workspace-write and is refused in
read-only, and one into a sibling directory that was not added is refused in both — by ``bash``,
``write``, a ``workdir`` there, and the Confinement seam other plugins use."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from dsh_sandbox_tools import confine
from sandbox_helpers import Session, mechanisms, running_host, text

from dsh_core.contracts import AgentSpec
from dsh_testing import added_and_sibling_dirs

pytestmark = pytest.mark.anyio


@pytest.fixture
def added_and_sibling():
    """Two directories outside every writable root (not under /tmp): one added, one not."""
    with added_and_sibling_dirs("sandbox-added") as dirs:
        yield dirs


class AddedSession(Session):
    def __init__(self, host, root: Path, added: Path) -> None:
        self.host, self.root, self.n = host, root, 0
        self.agent = host.create_agent(AgentSpec(cwd=str(root), provider="fake", model="m",
                                                 additional_directories=(str(added),)))


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_an_added_directory_is_writable_in_workspace_write_and_its_sibling_is_not(
        mechanism: str, root: Path, added_and_sibling) -> None:
    added, sibling = added_and_sibling
    async with running_host("workspace-write", mechanism) as host:
        s = AddedSession(host, root, added)
        ok = await s.call("bash", description="test command", command=f"echo in > {added}/bash && echo done")
        assert not ok.is_error and "done" in text(ok), text(ok)
        out = await s.call("bash", description="test command", command=f"echo out > {sibling}/bash")
        assert "[sandbox: file access denied under workspace-write mode]" in text(out), text(out)
        assert not (await s.call("write", file_path=f"{added}/tool", content="in")).is_error
        refused = await s.call("write", file_path=f"{sibling}/tool", content="out")
        assert refused.code == "SANDBOX_DENIED" and str(added) in text(refused)  # the roots it names include it
        here = await s.call("bash", description="test command", command="pwd", workdir=str(added))
        assert text(here).startswith(f"{added}\n"), text(here)
        away = await s.call("bash", description="test command", command="pwd", workdir=str(sibling))
        assert away.code == "WORKDIR_OUTSIDE" and "additional directories" in text(away)
        confined = await confine(["bash", "-c", f"echo in > {added}/seam; echo out > {sibling}/seam"], host=host,
                                 cwd=str(root), session=s.agent)
        assert confined.mechanism == mechanism
        await anyio.run_process(confined.argv, env=confined.env, cwd=str(root), check=False)
        # a session without them: the added directory is as closed as any other
        plain = Session(host, root)
        denied = await plain.call("bash", description="test command", command=f"echo x > {added}/plain")
        assert "file access denied" in text(denied), text(denied)
    assert (added / "bash").read_text() == "in\n" and (added / "tool").read_text() == "in"
    assert (added / "seam").read_text() == "in\n"
    assert sorted(p.name for p in sibling.iterdir()) == [] and not (added / "plain").exists()


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_an_added_directory_is_read_only_in_read_only(mechanism: str, root: Path, added_and_sibling) -> None:
    added, _ = added_and_sibling
    (added / "notes").write_text("READ-ME\n")
    async with running_host("read-only", mechanism) as host:
        s = AddedSession(host, root, added)
        read = await s.call("bash", description="test command", command=f"cat {added}/notes")
        assert "READ-ME" in text(read)
        out = await s.call("bash", description="test command", command=f"echo x > {added}/bash")
        assert "file access denied under read-only mode" in text(out), text(out)
        assert (await s.call("write", file_path=f"{added}/tool", content="x")).code == "SANDBOX_DENIED"
    assert sorted(p.name for p in added.iterdir()) == ["notes"]
