"""The escape suite: under workspace-write every attempt to write outside the root fails,
with bubblewrap and with Landlock separately; the same operations succeed inside the root
and in the temp dir."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import anyio
import pytest
from sandbox_helpers import Session, host_alive_with, mechanisms, running_host, text

pytestmark = pytest.mark.anyio

# Each command tries to create or change something in {OUT} (or /dev/shm, $HOME).
ESCAPES = {
    "absolute-path": "echo x > {OUT}/a",
    "dotdot": "echo x > {REL_OUT}/a",
    "planted-dir-symlink": "ln -s {OUT} link && echo x > link/a",
    "planted-file-symlink": "ln -s {OUT}/victim vl && echo pwned > vl",
    "hard-link": "ln {OUT}/victim hl; echo pwned >> hl",
    "proc-self-root": "echo x > /proc/self/root{OUT}/a",
    "proc-self-cwd": "cd {OUT} && echo x > /proc/self/cwd/a",
    "dev-shm": "echo x > /dev/shm/dsh-escape-{RAND}",
    "home-dotfile": "echo x > $HOME/.dsh-escape-{RAND}",
    "cd-then-write": "cd {OUT} && echo x > a",
    # these two try after the call has returned: their shell carries {TOKEN} (its $0) for its whole
    # life, and the test waits until no process carries it (see LATE)
    "background-outlives-call": "sh -c 'sleep 0.3; echo x > {OUT}/a' {TOKEN} >/dev/null 2>&1 &",
    "setsid-daemon": "setsid sh -c 'sleep 0.3; echo x > {OUT}/a' {TOKEN} >/dev/null 2>&1 < /dev/null &",
    "setuid-su": "su root -c 'echo x > {OUT}/a'",
    "bash-c-nesting": "bash -c \"bash -c 'echo x > {OUT}/a'\"",
    "python-one-liner": "python3 -c \"open('{OUT}/a', 'w').write('x')\"",
    "perl-one-liner": "perl -e 'open(my $f, \">\", \"{OUT}/a\") or die \"$!\"; print $f \"x\"'",
    "mv-out": "echo x > f && mv f {OUT}/a",
    "cp-out": "cp /etc/hostname {OUT}/a",
    "mkdir-out": "mkdir {OUT}/d",
    "rm-victim": "rm -f {OUT}/victim",
    "truncate-victim": "truncate -s 0 {OUT}/victim",
    "dd-victim": "printf Z | dd of={OUT}/victim conv=notrunc 2>&1",
    "rename-victim-in": "mv {OUT}/victim stolen",
    "tee-out": "echo x | tee {OUT}/a",
    "symlink-out": "ln -s /etc/passwd {OUT}/sl",
    "mkfifo-out": "mkfifo {OUT}/fifo",
    "remount-rw": "mount -o remount,rw / 2>&1; echo x > {OUT}/a",
    "remount-bind-rw": "mount -o remount,bind,rw / 2>&1; echo x > {OUT}/a",
    "remount-rw-new-userns": "unshare -rm sh -c 'mount -o remount,bind,rw / ; echo x > {OUT}/a' 2>&1",
    "bind-over-outside": "mount --bind . {OUT} 2>&1; echo x > a; echo x > {OUT}/a",
    "new-userns-mount": "unshare -rm sh -c 'mount -t tmpfs none {OUT} && echo x > {OUT}/a' 2>&1",
}

LATE = ("background-outlives-call", "setsid-daemon")

INSIDE = {
    "absolute-path": "echo x > {ROOT}/a && cat {ROOT}/a",
    "dotdot-inside": "mkdir -p sub && echo x > sub/../b && cat b",
    "symlink-inside": "echo 1 > t && ln -s t l && echo x > l && cat t",
    "nested-dirs": "mkdir -p d/e/f && echo x > d/e/f/g && cat d/e/f/g",
    "python-one-liner": "python3 -c \"open('p', 'w').write('x\\n')\" && cat p",
    "git-metadata": "mkdir -p .git/objects && echo x > .git/objects/o && cat .git/objects/o",
    "temp-dir": "echo x > /tmp/dsh-inside-{RAND} && cat /tmp/dsh-inside-{RAND} && rm /tmp/dsh-inside-{RAND}",
    "dev-null": "echo x > /dev/null && echo x",
    "stdout-stderr-reopen": "echo x > /dev/stderr",
}


def fill(template: str, root: Path, out: Path, rand: str, token: str = "") -> str:
    return template.format(OUT=out, ROOT=root, REL_OUT=os.path.relpath(out, root), RAND=rand, TOKEN=token)


@pytest.mark.parametrize("mechanism", mechanisms())
@pytest.mark.parametrize("attempt", sorted(ESCAPES))
async def test_escape_fails(mechanism: str, attempt: str, root: Path, outside: Path) -> None:
    rand = secrets.token_hex(4)
    token = f"dsh-escape-{rand}"
    home_file = Path(os.path.expanduser(f"~/.dsh-escape-{rand}"))
    shm_file = Path(f"/dev/shm/dsh-escape-{rand}")
    try:
        async with running_host(mechanism=mechanism) as host:
            s = Session(host, root)
            out = await s.call("bash", description="test command", command=fill(ESCAPES[attempt], root, outside, rand, token))
            if attempt in LATE:  # wait until the attempt was made or its shell is gone
                with anyio.fail_after(10):
                    while host_alive_with(token):
                        await anyio.sleep(0.02)
        assert sorted(os.listdir(outside)) == ["victim"], text(out)
        assert (outside / "victim").read_text() == "original\n", text(out)
        assert not home_file.exists()
        assert not shm_file.exists()
    finally:
        home_file.unlink(missing_ok=True)
        shm_file.unlink(missing_ok=True)


@pytest.mark.parametrize("mechanism", mechanisms())
@pytest.mark.parametrize("case", sorted(INSIDE))
async def test_inside_root_and_temp_succeed(mechanism: str, case: str, root: Path) -> None:
    async with running_host(mechanism=mechanism) as host:
        s = Session(host, root)
        out = await s.call("bash", description="test command", command=fill(INSIDE[case], root, root, secrets.token_hex(4)))
    assert not out.is_error, text(out)
    assert text(out).strip().endswith("x"), text(out)


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_denied_write_says_so_and_offers_escalation(mechanism: str, root: Path, outside: Path) -> None:
    async with running_host(mechanism=mechanism) as host:
        out = await Session(host, root).call("bash", description="test command", command=f"echo x > {outside}/a")
    t = text(out)
    assert not out.is_error  # the command's outcome, reported by its markers
    assert t.endswith("\n[exit code: 1]") and t.startswith("[stderr]\n")
    assert "[sandbox: file access denied under workspace-write mode]" in t
    assert 'sandbox_permissions="danger-full-access"' in t


# ------------------------------------------------------------------ file tools, same roots in-process


async def test_file_tools_refuse_escapes(root: Path, outside: Path) -> None:
    (root / "dirlink").symlink_to(outside)
    (root / "filelink").symlink_to(outside / "victim")
    os.link(outside / "victim", root / "hardlink")
    (root / "sub").mkdir()
    async with running_host() as host:
        s = Session(host, root)
        attempts = [
            str(outside / "a"),
            os.path.relpath(outside / "a", root),
            "sub/../../" + os.path.relpath(outside / "a", root.parent),
            "dirlink/a",
            "filelink",
            "hardlink",
            f"/proc/self/root{outside}/a",
            "/proc/self/cwd/../../../" + str(outside).lstrip("/") + "/a",
            f"~/.dsh-escape-{secrets.token_hex(4)}",
            "/dev/shm/dsh-escape-file-tool",
        ]
        for p in attempts:
            out = await s.call("write", file_path=p, content="pwned")
            assert out.is_error and out.code == "SANDBOX_DENIED", (p, text(out))
            assert "escalation available" in text(out)
        # edit through a symlink that leads outside, after reading it
        assert not (await s.call("read", file_path="filelink")).is_error
        out = await s.call("edit", file_path="filelink", old_string="original", new_string="pwned")
        assert out.code == "SANDBOX_DENIED", text(out)
    assert sorted(os.listdir(outside)) == ["victim"]
    assert (outside / "victim").read_text() == "original\n"
    assert not Path("/dev/shm/dsh-escape-file-tool").exists()


async def test_file_tools_write_inside_root_and_temp(root: Path) -> None:
    tmp_target = Path("/tmp") / f"dsh-file-tool-{secrets.token_hex(4)}" / "t.txt"
    (root / "t").write_text("1")
    (root / "inlink").symlink_to(root / "t")
    try:
        async with running_host() as host:
            s = Session(host, root)
            for p in ["a.txt", str(root / "b" / "c.txt"), "b/../d.txt", "inlink", str(tmp_target), ".git/config"]:
                out = await s.call("write", file_path=p, content="ok")
                assert not out.is_error, (p, text(out))
        assert (root / "a.txt").read_text() == "ok"
        assert (root / "b" / "c.txt").read_text() == "ok"
        assert (root / "d.txt").read_text() == "ok"
        assert (root / "t").read_text() == "ok"
        assert tmp_target.read_text() == "ok"
    finally:
        shutil.rmtree(tmp_target.parent, ignore_errors=True)


@pytest.mark.parametrize(
    "mechanism",
    [
        "bwrap",
        pytest.param("landlock", marks=pytest.mark.xfail(
            strict=True, reason="documented gap (plugins/sandbox-tools/README.md, \"Landlock: the stored key, and what it cannot confine\"): "
                                "Landlock (ABI ≤ 7) has no right for chmod/chown/utimes; install bubblewrap")),
    ],
)
async def test_metadata_changes_outside(mechanism: str, root: Path, outside: Path) -> None:
    before = (outside / "victim").stat()
    async with running_host(mechanism=mechanism) as host:
        await Session(host, root).call("bash", description="test command", command=f"chmod 600 {outside}/victim; touch -d 2000-01-01 {outside}/victim")
    after = (outside / "victim").stat()
    assert (after.st_mode, after.st_mtime) == (before.st_mode, before.st_mtime)


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_a_key_stored_by_login_is_hidden_from_commands(mechanism: str, root: Path) -> None:
    from dsh_core.paths import credentials_home

    creds = credentials_home()
    creds.mkdir(parents=True, exist_ok=True)
    (creds / "deepseek-api-key").write_text("sk-stored-by-login-0451\n")
    async with running_host(mechanism=mechanism) as host:
        out = await Session(host, root).call("bash", description="test command", command=f"cat {creds}/deepseek-api-key; ls -a {creds}")
    assert "sk-stored-by-login" not in text(out)  # an empty directory in its place


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_workdir_runs_inside_the_workspace_and_never_leads_out(mechanism: str, root: Path, outside: Path) -> None:
    """``workdir`` moves the command within the workspace; its confinement stays the workspace's,
    and a workdir outside it (absolute, ``..``, a planted symlink) is refused before anything runs."""
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "link-out").symlink_to(outside)
    async with running_host(mechanism=mechanism) as host:
        s = Session(host, root)
        out = await s.call("bash", description="Show where it runs", command="pwd && echo in > ../made",
                           workdir="sub/deep")
        assert text(out) == f"{root}/sub/deep\n", text(out)
        assert (root / "sub" / "made").read_text() == "in\n"
        out = await s.call("bash", description="Show where it runs", command="pwd", workdir=str(root / "sub"))
        assert text(out) == f"{root}/sub\n"
        # inside the workspace the sandbox is unchanged: a write outside it is still denied
        out = await s.call("bash", description="Write outside", command=f"echo x > {outside}/a", workdir="sub")
        assert "[sandbox: file access denied under workspace-write mode]" in text(out), text(out)
        for workdir in (str(outside), "..", "sub/../..", "link-out", "/"):
            out = await s.call("bash", description="Leave the workspace", command="echo x > a; pwd", workdir=workdir)
            assert out.is_error and out.code == "WORKDIR_OUTSIDE", (workdir, text(out))
            assert text(out).startswith(f"Error: workdir {workdir!r} is outside the session workspace {root}")
        out = await s.call("bash", description="Missing dir", command="pwd", workdir="nope")
        assert out.is_error and out.code == "NO_CWD"
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert not (root.parent / "a").exists()


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_stderr_is_its_own_section_and_signals_are_named(mechanism: str, root: Path) -> None:
    async with running_host(mechanism=mechanism) as host:
        s = Session(host, root)
        out = await s.call("bash", description="Write both streams", command="echo out; echo err >&2; exit 2")
        assert text(out) == "out\n[stderr]\nerr\n[exit code: 2]" and not out.is_error
        out = await s.call("bash", description="Print nothing", command="true")
        assert text(out) == "(no output)"
        out = await s.call("bash", description="Kill itself", command="printf partial; kill -KILL $$")
        assert text(out) == "partial\n[killed by signal: SIGKILL]" and not out.is_error
        out = await s.call("bash", description="", command="true")
        assert out.code == "INVALID_ARGUMENTS" and text(out) == "Error: argument 'description' must be a non-empty string"
        out = await s.call("bash", description="Bad timeout", command="true", timeoutMs=0)
        assert out.code == "INVALID_ARGUMENTS" and "invalid timeoutMs" in text(out)
