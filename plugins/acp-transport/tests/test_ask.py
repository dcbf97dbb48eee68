"""`dsh ask` as a real subprocess: keyless answers, --json, exit codes, SIGINT, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dsh_acp.client import tree_pids
from dsh_acp.testing import live, peer_command

from dsh_testing import REPO, minimal_env

DEMO = REPO / "examples" / "acp-agent" / "demo.json"
HANG = {"rules": [{"when": "hang", "steps": [{"partial": "half an answer", "mark": "streamed", "delay_ms": 60000}]}]}
WRITE = {
    "rules": [
        {"when": "write", "steps": [
            {"tool": "guarded_write", "args": {"path": "out.txt", "content": "hi"}}, {"text": "{tool_result}"}]}
    ]
}  # fmt: skip


def clean(out: bytes) -> str:
    """stdout as text. The test kit's noisy plugin is installed, so this also proves its
    import-time prints never reach a command's stdout (they go to stderr)."""
    return out.decode()


def ask(*args: str, cwd: Path, home: Path, env: dict[str, str] | None = None, timeout: float = 30):
    e = minimal_env(DSH_HOME=str(home), DSH_EXAMPLES_PATH=str(REPO / "tests" / "examples"), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "dsh_core.cli", "ask", *args],
        cwd=cwd, env=e, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture
def work(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


def test_keyless_demo_answer_on_stdout_only(work, tmp_path):
    r = ask("--provider", "scripted", "--model", str(DEMO), "ping", cwd=work, home=tmp_path / "h")
    assert r.returncode == 0, r.stderr
    assert clean(r.stdout) == "PONG\n"
    assert b"PONG" not in r.stderr


def test_the_readme_command_from_the_repo_root(tmp_path):
    r = ask("--provider", "scripted", "--model", "examples/acp-agent/demo.json", "ping", cwd=REPO, home=tmp_path)
    assert (r.returncode, clean(r.stdout)) == (0, "PONG\n"), r.stderr


def test_json_prints_one_object(work, tmp_path):
    r = ask("--json", "--cwd", str(work), "--provider", "scripted", "--model", str(DEMO), "where?",
            cwd=tmp_path, home=tmp_path / "h")  # fmt: skip
    assert r.returncode == 0, r.stderr
    obj = json.loads(clean(r.stdout))
    assert obj["stopReason"] == "end_turn"
    assert obj["text"] == f"I am working in {work}."
    assert len(obj["sessionId"]) == 32


def test_sigint_cancels_and_exits_130_with_the_partial_answer(work, tmp_path, scripted):
    script = scripted(HANG)
    home = tmp_path / "h"
    e = minimal_env(DSH_HOME=str(home))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_core.cli", "ask", "--provider", "scripted", "--model", str(script), "hang"],
        cwd=work, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while not (work / "streamed").exists():  # the script's mark: the partial is out
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    tree = tree_pids(proc.pid)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 130, err
    assert clean(out) == "half an answer\n"
    assert b"cancelling" in err
    assert live(tree) == []


def test_a_second_sigint_kills_an_agent_that_ignores_cancel(work, tmp_path):
    mark = tmp_path / "mark"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_core.cli", "ask", "--agent-command", peer_command("stubborn"), "go"],
        cwd=work, env=minimal_env(PEER_MARK=str(mark)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while not Path(str(mark) + ".kids").exists() or not mark.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    kids = [int(p) for p in Path(str(mark) + ".kids").read_text().split()]
    agent = int(mark.read_text())
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    assert proc.poll() is None  # still waiting for the agent to honour the cancel
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 130, err
    assert clean(out) == "partial\n"
    assert live([agent, *kids]) == []


def test_timeout_exits_124(work, tmp_path, scripted):
    r = ask("--timeout", "3", "--json", "--provider", "scripted", "--model", str(scripted(HANG)), "hang",
            cwd=work, home=tmp_path / "h")  # fmt: skip
    assert r.returncode == 124, r.stderr
    obj = json.loads(clean(r.stdout))
    assert obj["stopReason"] == "cancelled" and obj["timedOut"] is True and obj["text"] == "half an answer"
    assert b"timed out after 3 s" in r.stderr


def test_failures_exit_non_zero_with_the_message_on_stderr(work, tmp_path):
    r = ask("--example", "no-such-example", "ping", cwd=work, home=tmp_path)
    assert r.returncode == 1
    assert clean(r.stdout) == ""
    assert b"unknown example 'no-such-example'" in r.stderr

    r = ask("--agent-command", "/nonexistent/agent --acp", "ping", cwd=work, home=tmp_path)
    assert r.returncode == 1 and clean(r.stdout) == ""
    assert b"dsh ask: cannot start the ACP agent '/nonexistent/agent': No such file or directory" in r.stderr

    r = ask("--agent-command", peer_command("crash"), "--json", "ping", cwd=work, home=tmp_path)
    assert r.returncode == 1
    obj = json.loads(clean(r.stdout))
    assert obj["stopReason"] == "error" and obj["text"] == "partial" and "exit status 3" in obj["error"]

    r = ask("--cwd", str(work / "missing"), "ping", cwd=work, home=tmp_path)
    assert r.returncode == 2 and b"is not a directory" in r.stderr


def test_other_stop_reasons_exit_3(work, tmp_path):
    r = ask("--agent-command", peer_command("stop:refusal"), "x", cwd=work, home=tmp_path)
    assert r.returncode == 3 and clean(r.stdout) == "text\n"


@pytest.mark.parametrize("approve, written, says", [
    ("allow", True, "wrote out.txt"),
    ("deny", False, "not written: approval rejected"),
    ("ask", False, "not written: approval rejected"),  # no terminal: ask fails closed
])  # fmt: skip
def test_approve_policies(work, tmp_path, scripted, approve, written, says):
    r = ask("--example", "acp-testkit", "--approve", approve, "--provider", "scripted",
            "--model", str(scripted(WRITE)), "write", cwd=work, home=tmp_path / "h")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert clean(r.stdout) == says + "\n"
    assert (work / "out.txt").exists() is written


def test_ask_without_a_tty_draws_no_spinner(work, tmp_path):
    r = ask("--provider", "scripted", "--model", str(DEMO), "ping", cwd=work, home=tmp_path)
    assert "⠋" not in r.stderr.decode() and "\r" not in r.stderr.decode()
    assert os.path.exists(work)


def test_the_subagent_example_delegates_keyless(tmp_path):
    """dsh ask → dsh run (acp-agent-subagent) → dsh run (acp-agent): three ACP hops, keyless."""
    demo = REPO / "examples" / "acp-agent-subagent" / "demo.json"
    r = ask("--example", "acp-agent-subagent", "--provider", "scripted", "--model", str(demo), "delegate",
            cwd=tmp_path, home=tmp_path / "h")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert clean(r.stdout) == "The subagent answered: [subagent completed]\nPONG\n"


def test_spinner_goes_to_a_terminal_stderr_only(work, tmp_path):
    import pty

    master, slave = pty.openpty()
    try:
        e = minimal_env(DSH_HOME=str(tmp_path / "h"))
        r = subprocess.run(
            [sys.executable, "-m", "dsh_core.cli", "ask", "--provider", "scripted", "--model", str(DEMO), "ping"],
            cwd=work, env=e, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, timeout=30,
        )  # fmt: skip
        os.close(slave)
        err = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            err += chunk
    finally:
        os.close(master)
    assert r.returncode == 0
    assert clean(r.stdout) == "PONG\n"
    assert "working" in err.decode(errors="replace") and "\x1b[K" in err.decode(errors="replace")


def test_resume_continues_a_session_and_session_list_shows_it(work, tmp_path):
    """Issue 17: a task continued from the shell with the same methods an orchestrator uses."""
    home = tmp_path / "home"
    demo = ("--provider", "scripted", "--model", str(DEMO))
    first = ask(*demo, "--json", "ping", cwd=work, home=home)
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["sessionId"]
    again = ask(*demo, "--json", "--resume", sid, "where are you?", cwd=work, home=home)
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert out["sessionId"] == sid and out["text"] == f"I am working in {work}."
    log = [json.loads(line) for line in (home / "sessions" / f"{sid}.jsonl").read_text().splitlines()]
    assert [e["type"] for e in log].count("session") == 1
    assert [e["turn"] for e in log if e["type"] == "turn/end"] == [1, 2]
    listed = ask(*demo, "--session-list", cwd=work, home=home)
    assert listed.returncode == 0, listed.stderr
    (row,) = listed.stdout.decode().splitlines()
    sid_col, updated, cwd_col, title = row.split("\t")
    assert (sid_col, cwd_col, title) == (sid, str(work), "ping") and updated.endswith("Z")
    second = ask(*demo, "--json", "a second task", cwd=work, home=home)
    assert second.returncode == 0, second.stderr
    listed = ask(*demo, "--session-list", cwd=work, home=home)
    assert [r.split("\t")[3] for r in listed.stdout.decode().splitlines()] == ["a second task", "ping"]  # newest first
    # `dsh sessions list` (the store, read directly) agrees with ACP's session/list, line for line
    store_view = subprocess.run([sys.executable, "-m", "dsh_core.cli", "sessions", "list"], capture_output=True,
                                env=minimal_env(DSH_HOME=str(home)), timeout=30)
    assert store_view.stdout == listed.stdout, store_view.stderr
    store_json = subprocess.run([sys.executable, "-m", "dsh_core.cli", "sessions", "list", "--json"],
                                capture_output=True, env=minimal_env(DSH_HOME=str(home)), timeout=30)
    assert json.loads(store_json.stdout) == json.loads(ask(*demo, "--session-list", "--json", cwd=work, home=home).stdout)
    as_json = ask(*demo, "--session-list", "--json", "--cwd", str(tmp_path), cwd=work, home=home)
    assert json.loads(as_json.stdout) == []  # the cwd filter: nothing recorded there
    unknown = ask(*demo, "--resume", "nope", "hi", cwd=work, home=home)
    assert unknown.returncode == 1 and b"unknown session" in unknown.stderr
    other = tmp_path / "other"
    other.mkdir()
    moved = ask(*demo, "--resume", sid, "hi", "--cwd", str(other), cwd=work, home=home)
    assert moved.returncode == 1 and b"differs" in moved.stderr


def test_session_list_needs_a_store(work, tmp_path):
    demo = ("--provider", "scripted", "--model", str(DEMO))
    res = ask(*demo, "--example", "acp-nostore", "--session-list", cwd=work, home=tmp_path / "home")
    assert res.returncode == 1 and b"does not offer session/list" in res.stderr
