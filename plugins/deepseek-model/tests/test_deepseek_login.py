"""Login from the editor: ``dsh auth login`` (on a real pseudo-terminal: the key is not echoed;
and from stdin), checked against the loopback fake DeepSeek, stored in the OS keyring (the real
keyring library, with a test backend) or else a 0600 file; acp-editor's ``authMethods`` and
ACP's auth-required error until a key is found, over real stdio with the official SDK client.
The key never reaches a frame, stderr, a session log or the process environment."""

from __future__ import annotations

import json
import os
import pty
import select
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_deepseek import FakeDeepSeek, Turn

from dsh_testing import REPO, spawn_acp

acp = pytest.importorskip("acp")

pytestmark = pytest.mark.anyio

EDITOR = REPO / "examples" / "acp-editor" / "example.toml"


def _dsh(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh_core.cli", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=60)


@pytest.fixture
def base_env(fake: FakeDeepSeek, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPSEEK_API_KEY", "DEEPSEEK_BASE_URL")}
    env.update(DSH_HOME=str(tmp_path / "home"), DSH_CONFIG_HOME=str(tmp_path / "config"),
               DEEPSEEK_BASE_URL=fake.base_url, PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring")
    return env


def test_login_from_stdin_checks_the_key_and_stores_it_owner_only(fake: FakeDeepSeek, base_env, tmp_path: Path):
    refused = _dsh("auth", "login", "--stdin", env=base_env, stdin="sk-wrong\n")
    assert refused.returncode == 1 and "refused this key" in refused.stderr
    assert not (tmp_path / "config").exists() or not any((tmp_path / "config").rglob("*api-key"))
    done = _dsh("auth", "login", "--stdin", env=base_env, stdin=fake.api_key + "\n")
    assert done.returncode == 0, done.stderr
    assert fake.requests[-1].path.endswith("/models")
    assert fake.requests[-1].headers["Authorization"] == f"Bearer {fake.api_key}"
    path = tmp_path / "config" / "credentials" / "deepseek-api-key"
    assert path.read_text().strip() == fake.api_key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    status = _dsh("auth", "status", env=base_env)
    assert str(path) in status.stdout and fake.api_key not in status.stdout + status.stderr + done.stderr
    path.chmod(0o644)  # a key file others can read is not used
    assert "No key is stored" in _dsh("auth", "status", env=base_env).stdout
    path.chmod(0o600)
    out = _dsh("auth", "logout", env=base_env)
    assert out.returncode == 0 and not path.exists()


def test_login_prefers_the_os_keyring(fake: FakeDeepSeek, base_env, tmp_path: Path):
    env = {**base_env, "PYTHON_KEYRING_BACKEND": "dsh_testkit.keyring_backend.DirKeyring",
           "DSH_TEST_KEYRING": str(tmp_path / "keyring")}
    done = _dsh("auth", "login", "--stdin", env=env, stdin=fake.api_key + "\n")
    assert done.returncode == 0 and "OS keyring" in done.stderr
    assert not (tmp_path / "config" / "credentials" / "deepseek-api-key").exists()
    assert [p.read_text() for p in (tmp_path / "keyring").iterdir()] == [fake.api_key]
    assert "OS keyring" in _dsh("auth", "status", env=env).stdout
    _dsh("auth", "logout", env=env)
    assert list((tmp_path / "keyring").iterdir()) == []


def test_the_terminal_login_an_editor_runs_does_not_echo_the_key(fake: FakeDeepSeek, base_env, tmp_path: Path):
    """``dsh run --example acp-editor --login`` (what ACP terminal auth runs), on a real pty."""
    leader, follower = pty.openpty()

    def controlling_tty() -> None:
        os.setsid()
        import fcntl
        import termios
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([sys.executable, "-m", "dsh_core.cli", "run", "--example", "acp-editor", "--login"],
                            stdin=follower, stdout=follower, stderr=follower, env={**base_env, "DSH_EXAMPLES_PATH": str(REPO / "examples")},
                            preexec_fn=controlling_tty, close_fds=True)
    os.close(follower)
    seen = bytearray()

    def read_until(marker: bytes, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while marker not in seen:
            assert time.monotonic() < end, seen.decode(errors="replace")
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    seen.extend(os.read(leader, 4096))
                except OSError:
                    break

    read_until(b"DeepSeek API key: ")
    os.write(leader, fake.api_key.encode() + b"\r")
    read_until(b"Logged in")
    assert proc.wait(30) == 0
    os.close(leader)
    assert fake.api_key.encode() not in seen  # typed, never shown
    assert (tmp_path / "config" / "credentials" / "deepseek-api-key").read_text().strip() == fake.api_key


async def test_acp_editor_asks_for_login_until_a_key_is_stored(fake: FakeDeepSeek, base_env, tmp_path: Path):
    examples = tmp_path / "examples" / "editor-no-dotenv"
    examples.mkdir(parents=True)
    (examples / "example.toml").write_text(EDITOR.read_text() + "\n[config.deepseek-model]\ndotenv = false\n"
                                           '\n[config.session-controls]\ntitles = "prompt"\n')
    work = tmp_path / "work"
    work.mkdir()
    env = {k: base_env[k] for k in ("DSH_HOME", "DSH_CONFIG_HOME", "DEEPSEEK_BASE_URL", "PYTHON_KEYRING_BACKEND")}
    env["DSH_EXAMPLES_PATH"] = str(examples.parent)
    fake.push(Turn(content="logged in and answering"))
    async with spawn_acp(None, cwd=work, env=env, example="editor-no-dotenv") as run:
        init = await run.conn.initialize(
            protocol_version=1,
            client_capabilities=acp.schema.ClientCapabilities(auth=acp.schema.AuthCapabilities(terminal=True)))
        (method,) = init.auth_methods
        assert (method.id, method.type, method.args) == ("deepseek-api-key", "terminal", ["--login"])
        with pytest.raises(acp.RequestError) as needed:
            await run.conn.new_session(cwd=str(work), mcp_servers=[])
        assert needed.value.code == -32000 and "dsh auth login" in str(needed.value.data)
        with pytest.raises(acp.RequestError) as still:
            await run.conn.authenticate(method_id="deepseek-api-key")
        assert still.value.code == -32000

        stored = _dsh("auth", "login", "--stdin", env=base_env, stdin=fake.api_key + "\n")  # the terminal login
        assert stored.returncode == 0

        assert await run.conn.authenticate(method_id="deepseek-api-key") is not None
        sid = (await run.conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        resp = await run.conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        assert resp.stop_reason == "end_turn" and "".join(run.client.text(sid)) == "logged in and answering"  # streamed
        assert fake.chat_requests[-1].headers["Authorization"] == f"Bearer {fake.api_key}"
        assert await run.close_stdin() == 0
    secret = fake.api_key.encode()
    assert secret not in bytes(run.stdout) and secret not in bytes(run.stderr)
    assert all(secret not in p.read_bytes() for p in (tmp_path / "home").rglob("*") if p.is_file())


async def test_without_terminal_support_the_method_is_one_authenticate_checks(fake: FakeDeepSeek, base_env,
                                                                            tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    env = {k: base_env[k] for k in ("DSH_HOME", "DSH_CONFIG_HOME", "DEEPSEEK_BASE_URL", "PYTHON_KEYRING_BACKEND")}
    env.update(DSH_EXAMPLES_PATH=str(REPO / "examples"), DEEPSEEK_API_KEY=fake.api_key)
    async with spawn_acp(None, cwd=work, env=env, example="acp-editor") as run:
        init = await run.conn.initialize(protocol_version=1)
        (method,) = init.auth_methods
        assert method.id == "deepseek-api-key" and getattr(method, "type", None) in (None, "agent")
        with pytest.raises(acp.RequestError) as bad:
            await run.conn.authenticate(method_id="nope")
        assert bad.value.code == -32602
        await run.conn.authenticate(method_id="deepseek-api-key")  # the key is in the environment: fine
        assert await run.close_stdin() == 0
    async with spawn_acp(None, cwd=work, env={**env, "DEEPSEEK_API_KEY": ""}) as run:  # acp-agent: unchanged
        init = await run.conn.initialize(protocol_version=1)
        assert init.auth_methods == []
        assert (await run.conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        assert await run.close_stdin() == 0
    assert json.dumps(fake.api_key) not in bytes(run.stdout).decode()


async def test_acp_editor_logout_removes_the_stored_key_as_dsh_auth_logout_does(fake: FakeDeepSeek, base_env,
                                                                                 tmp_path: Path):
    """Issue 42's logout row, over real stdio with the SDK client: acp-editor advertises
    agentCapabilities.auth.logout; ``logout`` removes the stored key, so the next session/new asks
    for a login again. acp-agent advertises nothing and answers logout as an unknown method."""
    examples = tmp_path / "examples" / "editor-no-dotenv"
    examples.mkdir(parents=True)
    (examples / "example.toml").write_text(EDITOR.read_text() + "\n[config.deepseek-model]\ndotenv = false\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: base_env[k] for k in ("DSH_HOME", "DSH_CONFIG_HOME", "DEEPSEEK_BASE_URL", "PYTHON_KEYRING_BACKEND")}
    env["DSH_EXAMPLES_PATH"] = str(examples.parent)
    assert _dsh("auth", "login", "--stdin", env=base_env, stdin=fake.api_key + "\n").returncode == 0
    key = tmp_path / "config" / "credentials" / "deepseek-api-key"
    assert key.exists()
    async with spawn_acp(None, cwd=work, env=env, example="editor-no-dotenv") as run:
        init = await run.conn.initialize(protocol_version=1)
        assert init.agent_capabilities.auth.logout is not None  # advertised: {}
        assert (await run.conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        answer = await run.conn._conn.send_request("logout", {})  # the SDK has no helper for it yet
        assert answer["_meta"]["dsh"]["removedFrom"] == [str(key)]
        assert not key.exists()  # gone, as after `dsh auth logout`
        with pytest.raises(acp.RequestError) as needed:
            await run.conn.new_session(cwd=str(work), mcp_servers=[])
        assert needed.value.code == -32000  # log in again
        again = await run.conn._conn.send_request("logout", {})
        assert again["_meta"]["dsh"]["removedFrom"] == []  # nothing left to remove: still an answer
        assert await run.close_stdin() == 0
    assert fake.api_key.encode() not in bytes(run.stdout) + bytes(run.stderr)
    assert _dsh("auth", "status", env=base_env).stdout.startswith("No key is stored")
    async with spawn_acp(None, cwd=work, env=env, example="acp-agent") as run:
        init = await run.conn.initialize(protocol_version=1)
        assert init.agent_capabilities.auth is None or init.agent_capabilities.auth.logout is None
        with pytest.raises(acp.RequestError) as unknown:
            await run.conn._conn.send_request("logout", {})
        assert unknown.value.code == -32601
        assert await run.close_stdin() == 0
