"""A key ``dsh auth login`` stored in a file is unreadable by confined code (issue 45 item 4).

``dsh auth login`` keeps the key in ``$DSH_CONFIG_HOME/credentials`` when no OS keyring is usable.
Bubblewrap puts an empty tmpfs over that directory; Landlock alone (the machine without bubblewrap,
as root too) grants reads on everything beside the way down to it and never on it. Each confined
path goes through its own launch: ``bash`` and a hook through the session's command server, a
terminal's shell and ``run_code``'s warm runtime through the launcher; each runs through a real
``dsh`` over ACP, once per mechanism. The config home is outside every writable root, as a
person's ``~/.config/dsh`` is.
"""

from __future__ import annotations

import json
import secrets
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from acp import text_block
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

pytestmark = pytest.mark.anyio

KEY = "sk-stored-by-login-5e1d07c2a9"
EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")


@pytest.fixture
def config_home() -> Iterator[Path]:
    d = Path("/var/tmp") / f"dsh-test-config-{secrets.token_hex(4)}"
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def store(config_home: Path) -> Path:
    """What ``dsh auth login`` leaves when it has no keyring: an owner-only file in credentials/."""
    creds = config_home / "credentials"
    creds.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = creds / "deepseek-api-key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    return key


def _bash(command: str) -> dict:
    return {"tool": "bash", "args": {"command": command, "description": "probe"}}


def looted(work: Path, name: str) -> str:
    text = (work / name).read_text()  # the attempt ran: it wrote what it got, an error at best
    assert KEY not in text, f"{name}: {text}"
    return text


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_bash_a_hook_and_a_terminal_cannot_read_the_stored_key(acp_agent, scripted, mechanism, config_home):
    require_mechanism(mechanism)
    key = store(config_home)
    work: Path = acp_agent.work
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.json").write_text(json.dumps({"hooks": {"UserPromptSubmit": [{"hooks": [
        {"type": "command", "command": f"cat {key} > loot-hook.txt 2>&1; cat /proc/self/root{key} >> loot-hook.txt 2>&1"}]}]}}))
    (work / "link").symlink_to(key)  # a symlink planted in the workspace reaches the same file
    steps = {"default": [
        _bash(f"cat {key} > loot-bash.txt 2>&1; cat link >> loot-bash.txt 2>&1; "
              f"cp {key} copy >> loot-bash.txt 2>&1; ln {key} hard >> loot-bash.txt 2>&1; "
              f"mv {key.parent} moved >> loot-bash.txt 2>&1; cat /etc/hostname >> loot-bash.txt"),
        {"tool": "terminal_open", "args": {"type": "shell"}},
        {"tool": "terminal_send", "args": {"sessionId": "pty-1", "text": f"cat {key} > loot-term.txt 2>&1; echo sent"}},
        {"text": "done"}]}
    env = {"DSH_SANDBOX_MECHANISM": mechanism, "DSH_CONFIG_HOME": str(config_home), "DSH_EXAMPLES_PATH": EXAMPLES}
    async with acp_agent(scripted(steps), example="acp-extended", env=env) as run:
        sid = await run.start()
        reply = await run.conn.prompt(session_id=sid, prompt=[text_block("try")])
        assert reply.stop_reason == "end_turn"
    looted(work, "loot-hook.txt")
    bash = looted(work, "loot-bash.txt")
    assert bash.strip().endswith(Path("/etc/hostname").read_text().strip()), bash  # reading elsewhere still works
    # nothing copied, linked or moved into the workspace carries it either
    assert [p for p in work.rglob("*") if p.is_file() and not p.is_symlink() and KEY in p.read_text(errors="replace")] == []
    looted(work, "loot-term.txt")
    assert key.read_text() == KEY + "\n"  # and it is still there for dsh


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_run_code_cannot_read_the_stored_key(acp_agent, scripted, mechanism, config_home):
    require_mechanism(mechanism)
    key = store(config_home)
    program = textwrap.dedent(f'''
        try:
            got = open({str(key)!r}).read()
        except OSError as exc:
            got = type(exc).__name__
        return {{"key": got, "hostname": open("/etc/hostname").read().strip()}}
    ''')
    step = {"tool": "run_code", "args": {"code": program, "description": "read the key"}}
    env = {"DSH_SANDBOX_MECHANISM": mechanism, "DSH_CONFIG_HOME": str(config_home),
           "DSH_PERMISSION_MODE": "workspace-write"}
    async with acp_agent(scripted({"default": [step, {"text": "{tool_result}"}]}), example="code-mode", env=env) as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("read")])
        (answer,) = run.client.text(sid)
    assert KEY not in answer, answer
    assert "Error" in answer and Path("/etc/hostname").read_text().strip() in answer, answer


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_key_stored_while_the_session_runs_is_hidden_too(acp_agent, scripted, mechanism, config_home):
    """The command server was confined before the credentials directory existed (nor its parent).
    Landlock: a key stored afterwards lands in a new entry of a directory on the way to it, which
    that server's commands cannot read. Bubblewrap: / is bound live, so the directory is made
    (empty, owner-only) before the server starts and the tmpfs covers it."""
    require_mechanism(mechanism)
    key = config_home / "credentials" / "deepseek-api-key"
    script = {"rules": [
        {"when": "^first", "steps": [_bash("echo started > first.txt"), {"text": "first"}]},
        {"when": "^second", "steps": [_bash(f"cat {key} > loot-later.txt 2>&1"), {"text": "second"}]}]}
    env = {"DSH_SANDBOX_MECHANISM": mechanism, "DSH_CONFIG_HOME": str(config_home)}
    work: Path = acp_agent.work
    async with acp_agent(scripted(script), env=env) as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("first")])
        assert (work / "first.txt").read_text() == "started\n"
        store(config_home)
        await run.conn.prompt(session_id=sid, prompt=[text_block("second")])
    assert ("Permission denied" if mechanism == "landlock" else "No such file") in looted(work, "loot-later.txt")
