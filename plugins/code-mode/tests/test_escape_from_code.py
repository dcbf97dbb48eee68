"""sandbox-tools' escape suite, run from inside run_code: the program's own process is confined like bash."""

from __future__ import annotations

import json
import secrets
import shutil
import textwrap
from pathlib import Path

import pytest
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from conftest import run
from dsh_core.types import ToolResultEvent

pytestmark = pytest.mark.anyio

PROGRAM = '''
import ctypes, os, subprocess
OUT = {out!r}
results = {{}}

def attempt(name, fn):
    try:
        fn()
        results[name] = "done"
    except Exception as exc:
        results[name] = type(exc).__name__

def py_open():
    with open(OUT + "/victim", "w") as f:
        f.write("pwned")

def py_create():
    open(OUT + "/new-by-open", "x").close()

def py_remove():
    os.remove(OUT + "/victim")

def py_rename():
    os.rename(OUT + "/victim", "stolen")

def py_symlink_escape():
    os.symlink(OUT, "link")
    with open("link/via-link", "w") as f:
        f.write("pwned")

def py_proc_root():
    with open("/proc/self/root" + OUT + "/via-proc", "w") as f:
        f.write("pwned")

def shell():
    rc = os.system(f"echo pwned > {{OUT}}/victim 2>/dev/null; echo pwned > {{OUT}}/new-by-system 2>/dev/null")
    if not (os.path.exists(OUT + "/new-by-system")):
        raise PermissionError(rc)

def sub():
    subprocess.run(["sh", "-c", f"echo pwned > {{OUT}}/new-by-subprocess"], check=True, capture_output=True)

def sub_python():
    subprocess.run(["python3", "-c", f"open('{{OUT}}/new-by-python', 'w').write('x')"], check=True,
                   capture_output=True)

def c_open():
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.open((OUT + "/new-by-ctypes").encode(), os.O_WRONLY | os.O_CREAT, 0o644)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "open")
    libc.write(fd, b"pwned", 5)

def c_mount():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"none", b"/", None, 32 | 4096, None) != 0:  # MS_REMOUNT | MS_BIND: make / writable again
        raise OSError(ctypes.get_errno(), "mount")
    open(OUT + "/after-mount", "w").close()

def home_dotfile():
    with open(os.path.expanduser("~/.dsh-code-escape-" + {token!r}), "w") as f:
        f.write("pwned")

for fn in (py_open, py_create, py_remove, py_rename, py_symlink_escape, py_proc_root, shell, sub, sub_python,
           c_open, c_mount, home_dotfile):
    attempt(fn.__name__, fn)

# the same program may write inside the workspace and /tmp
with open("inside.txt", "w") as f:
    f.write("ok")
with open("/tmp/dsh-code-escape-" + {token!r}, "w") as f:
    f.write("ok")
results["inside"] = open("inside.txt").read()
return results
'''

ATTEMPTS = ["py_open", "py_create", "py_remove", "py_rename", "py_symlink_escape", "py_proc_root", "shell", "sub",
            "sub_python", "c_open", "c_mount", "home_dotfile"]


@pytest.fixture
def outside():
    d = Path("/var/tmp") / f"dsh-code-outside-{secrets.token_hex(4)}"
    d.mkdir(parents=True)
    (d / "victim").write_text("original\n")
    yield d.resolve()
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_nothing_outside_the_writable_roots_changes(code_host, workspace, outside, mechanism):
    require_mechanism(mechanism)
    token = secrets.token_hex(4)
    home_file = Path.home() / f".dsh-code-escape-{token}"
    program = textwrap.dedent(PROGRAM.format(out=str(outside), token=token))
    try:
        async with code_host([run(program), {"text": "{tool_result}"}], sandbox={"mechanism": mechanism}) as turn:
            await turn.agent.wait_idle()
        (result,) = turn.of(ToolResultEvent)
        text = result.result.content[0].text
        assert not result.result.is_error, text
        logs, brace, value = text.partition("{\n")  # the shell's complaints come first, as captured output
        results = json.loads(brace + value)
        assert ("Read-only file system" if mechanism == "bwrap" else "Permission denied") in logs
        assert sorted(k for k in results if k != "inside") == sorted(ATTEMPTS)
        assert all(results[a] != "done" for a in ATTEMPTS), results
        assert results["inside"] == "ok"
        assert sorted(p.name for p in outside.iterdir()) == ["victim"]
        assert (outside / "victim").read_text() == "original\n"
        assert not home_file.exists()
        assert (workspace / "inside.txt").read_text() == "ok"
        assert Path(f"/tmp/dsh-code-escape-{token}").read_text() == "ok"
    finally:
        home_file.unlink(missing_ok=True)
        Path(f"/tmp/dsh-code-escape-{token}").unlink(missing_ok=True)


WRITE = '''
import os
try:
    with open("written-by-program.txt", "w") as f:
        f.write("pwned")
    return "wrote"
except OSError as exc:
    return type(exc).__name__
'''


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("session_mode", ["read-only", "plan"])
async def test_a_program_runs_in_the_sessions_own_mode(tmp_path, workspace, mechanism, session_mode):
    """A session that chose a narrower mode (a person's read-only, plan mode) runs its programs in
    it: the warm runtime is confined like bash is for that session, not like the deployment."""
    require_mechanism(mechanism)
    from dsh_core.contracts import AgentSpec
    from dsh_core.types import TextBlock, UserMessage
    from dsh_testing import memory_host

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": [run(WRITE), {"text": "{tool_result}"}], "repeat_default": True}))
    config = {"code-mode": {"mode": "both"}, "sandbox-tools": {"mechanism": mechanism}}
    plugins = ("scripted-model", "sandbox-tools", "code-mode")
    async with memory_host(script, plugins=plugins, config=config) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
        answers = []
        for mode in (session_mode, "workspace-write"):
            agent.configure(mode=mode)
            agent.submit(UserMessage(id=f"u-{mode}", content=[TextBlock(text="go")]))
            await agent.wait_idle()
            answers.append(agent.history[-1].content[0].text)
            if mode == session_mode:
                assert not (workspace / "written-by-program.txt").exists()
    assert answers[0] in ("OSError", "PermissionError"), answers  # read-only file system, or permission denied
    assert answers[1] == "wrote" and (workspace / "written-by-program.txt").read_text() == "pwned"
