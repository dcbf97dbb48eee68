"""`dsh doctor` as a user runs it: a real subprocess on this machine, with bubblewrap on PATH
and hidden from it, with the sandbox disabled, with a plugin missing, with and without a key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dsh_deepseek_model._config import find_api_key
from dsh_sandbox_tools import _landlock_exec
from dsh_sandbox_tools.testing import probe_cached, require_mechanism

from dsh_testing import REPO, minimal_env

SECRET = "sk-doctor-test-0123456789abcdef"


def doctor(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, str]:
    full = minimal_env(**{"DSH_HOME": str(tmp_path / "home"), "DEEPSEEK_API_KEY": "", **env})
    proc = subprocess.run(
        [sys.executable, "-m", "dsh_core.cli", "doctor", *args], capture_output=True, text=True, timeout=60,
        env=full, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stdout, proc.stderr


def checks(stdout: str) -> dict[str, dict[str, str]]:
    return {c["subject"]: c for c in json.loads(stdout)["checks"]}


def without_bwrap(tmp_path: Path) -> str:
    """A PATH on which bwrap is not found (dsh is run as `python -m`, by absolute path)."""
    bare = tmp_path / "bin-without-bwrap"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    return str(bare)


def test_with_bubblewrap_the_sandbox_is_bubblewrap_and_acp_agent_can_serve(tmp_path):
    # the sandbox tests' own probe: installed is not enough (Ubuntu 24.04's AppArmor, unprivileged
    # containers), it must start; skips with the reason when it cannot
    require_mechanism("bwrap")
    code, out, err = doctor(tmp_path, "--json")
    assert code == 0, out + err
    report = json.loads(out)
    assert report["example"] == "acp-agent" and report["can_serve"] is True
    found = checks(out)
    assert found["sandbox"]["status"] == "ok" and found["sandbox"]["detail"].startswith("bubblewrap confines bash")
    assert found["plugins"]["status"] == "ok" and found["route"]["detail"].startswith("deepseek / deepseek-flash")
    home = tmp_path / "home"
    assert found["data dir"]["detail"].startswith(f"{home} (DSH_HOME; created on first use), ")
    assert " free" in found["data dir"]["detail"] and not home.exists()  # the doctor looks, never writes


def test_without_bubblewrap_the_real_probe_falls_back_to_landlock_or_fails(tmp_path):
    code, out, err = doctor(tmp_path, "--json", PATH=without_bwrap(tmp_path))
    sandbox = checks(out)["sandbox"]
    assert "bwrap: not installed (Debian package: bubblewrap)" in sandbox["detail"]
    assert "apt-get install -y bubblewrap" in sandbox["fix"]
    abi = _landlock_exec.abi_version()  # what this kernel offers, asked directly
    if abi >= 1:
        assert (code, sandbox["status"]) == (0, "ok" if abi >= 3 else "warn"), out + err
        assert sandbox["detail"].startswith(f"Landlock ABI {abi} confines bash in workspace-write mode")
        assert "not confined by Landlock: chmod/chown/touch of files outside" in sandbox["detail"]
        assert "to confine metadata too" in sandbox["fix"]
    else:
        assert (code, sandbox["status"]) == (1, "fail"), out + err
        assert sandbox["detail"].startswith("none usable")


def test_with_no_usable_mechanism_acp_agent_cannot_serve(tmp_path):
    code, out, err = doctor(tmp_path, DSH_SANDBOX_MECHANISM="none", PATH=without_bwrap(tmp_path))
    assert code == 1, out + err
    lines = out.splitlines()
    (line,) = [x for x in lines if x.split()[1:2] == ["sandbox"]]
    assert line.split()[0] == "fail" and "bash refuses every command in workspace-write mode" in line
    assert lines[-1] == "acp-agent: cannot serve on this machine (exit 1)"
    assert len(lines) <= 24  # one screen


def test_a_missing_plugin_fails_the_example_and_names_the_pip_command(tmp_path):
    examples = tmp_path / "examples" / "needs-more"
    examples.mkdir(parents=True)
    (examples / "example.toml").write_text(
        '[example]\nfront-door = "acp-stdio"\nplugins = ["acp-transport", "scripted-model", "no-such-plugin"]\n'
        '[route]\nprovider = "scripted"\nmodel = "x.json"\n'
    )
    code, out, err = doctor(tmp_path, "--json", "--example", "needs-more", DSH_EXAMPLES_PATH=str(tmp_path / "examples"))
    assert code == 1, out + err
    report = json.loads(out)
    plugins = checks(out)["plugins"]
    assert plugins["status"] == "fail" and "not installed: no-such-plugin" in plugins["detail"]
    # not a plugin this project ships: the hint names no made-up distribution, it says what to look for
    assert plugins["fix"].startswith(f"{sys.executable} -m pip install <the distribution that provides it>")
    assert "entry point named 'no-such-plugin' in group 'dsh'" in plugins["fix"]
    by_name = {e["name"]: e for e in report["examples"]}
    assert by_name["needs-more"]["missing"] == ["no-such-plugin"]
    assert by_name["needs-more"]["install"] == [plugins["fix"]]
    assert by_name["acp-agent"]["missing"] == []  # every example is listed, with what it lacks
    # The scripted route's missing script is reported, not a crash.
    assert checks(out)["route"]["status"] == "fail" and "no script at 'x.json'" in checks(out)["route"]["detail"]
    code, text, _ = doctor(tmp_path, "--example", "needs-more", DSH_EXAMPLES_PATH=str(tmp_path / "examples"))
    assert "no-such-plugin*" in text and "entry point named 'no-such-plugin'" in text


def test_missing_shipped_plugins_are_fixed_by_the_checkouts_requirements_file():
    from dsh_core.host import install_fix

    fix = install_fix(["compaction", "todo"])  # this is a source checkout: one short line for both
    assert fix == f"cd {REPO} && {sys.executable} -m pip install -r requirements.txt"
    listed = {line.split()[1] for line in (REPO / "requirements.txt").read_text().splitlines()
              if line.startswith("-e ")}
    shipped = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "plugins").glob("*/pyproject.toml")}
    assert listed == {"."} | shipped - {"plugins/testing"}  # everything dsh ships; the test kit is the tests'


def test_the_key_is_reported_present_or_absent_never_shown(tmp_path):
    code, out, err = doctor(tmp_path, "--json")
    key = checks(out)["deepseek key"]
    if find_api_key(cwd=tmp_path) is None:  # no .env with a key in the checkout either
        assert key["status"] == "warn" and "DEEPSEEK_API_KEY is not set" in key["detail"]
        assert code == 0  # the example serves without a key (the keyless route works); prompts on DeepSeek fail
    else:
        assert key["status"] == "ok" and "found in a .env file" in key["detail"]
    code, out, err = doctor(tmp_path, "--json", DEEPSEEK_API_KEY=SECRET)
    key = checks(out)["deepseek key"]
    assert key["status"] == "ok" and key["detail"].startswith("DEEPSEEK_API_KEY is set")
    code, text, err2 = doctor(tmp_path, DEEPSEEK_API_KEY=SECRET)
    assert SECRET not in out + err + text + err2


def test_doctor_reports_the_isolation_each_mechanism_gives(tmp_path):
    """Landlock ABI, signal scoping and pid isolation (issue 22): what the kernel gives, what is
    missing, with the real probe; DSH_LANDLOCK_MAX_ABI=5 stands for a kernel before signal scoping."""
    abi = _landlock_exec.abi_version()
    if abi < 1:
        pytest.skip("this kernel has no Landlock")
    bare = without_bwrap(tmp_path)
    _, out, _ = doctor(tmp_path, "--json", PATH=bare)
    iso = checks(out)["sandbox-isolation"]
    assert iso["detail"].startswith(f"Landlock ABI {abi}; capabilities dropped")
    if _landlock_exec.signal_scoped(abi):
        assert iso["status"] == "ok" and "signal and abstract-socket scoping" in iso["detail"]
        assert "missing: pid namespace" in iso["detail"]
    _, out, _ = doctor(tmp_path, "--json", PATH=bare, DSH_LANDLOCK_MAX_ABI="5")
    iso = checks(out)["sandbox-isolation"]
    assert iso["status"] == "warn" and "missing: signal scoping (needs Landlock ABI 6" in iso["detail"]
    assert "can signal (kill, stop) dsh" in iso["detail"] and "bubblewrap" in iso["fix"]
    if probe_cached("bwrap").runner is not None:  # bubblewrap installed and able to start
        _, out, _ = doctor(tmp_path, "--json")
        iso = checks(out)["sandbox-isolation"]
        assert iso["status"] == "ok" and iso["detail"].startswith("pid namespace")


def test_a_key_stored_by_login_is_reported_by_where_it_is(tmp_path):
    creds = tmp_path / "config" / "credentials"
    creds.mkdir(parents=True, mode=0o700)
    (creds / "deepseek-api-key").write_text(SECRET + "\n")
    (creds / "deepseek-api-key").chmod(0o600)
    code, out, err = doctor(tmp_path, "--json", DSH_CONFIG_HOME=str(tmp_path / "config"),
                            PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring")
    key = checks(out)["deepseek key"]
    assert code == 0 and key["status"] == "ok" and str(creds / "deepseek-api-key") in key["detail"]
    assert SECRET not in out + err
