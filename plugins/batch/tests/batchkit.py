"""Shared by the batch tests, the Ray tests and bench/batch.py: scripted task lists with
known outcomes, a `dsh batch` subprocess runner, and the expected result of each task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
TEST_EXAMPLES = REPO / "tests" / "examples"

USAGE = {"inputTokens": 7, "outputTokens": 3}
# The scripted model of the mixed batch: one rule per outcome.
MIXED_SCRIPT = {
    "rules": [
        {"when": "^answer", "steps": [{"text": "answer to {prompt}", "usage": USAGE}]},
        {"when": "^wait", "steps": [{"delay_ms": 100, "text": "waited for {prompt}", "usage": USAGE}]},
        {"when": "^fail", "steps": [{"error": "auth"}]},
        {"when": "^slow", "steps": [{"partial": "thinking", "delay_ms": 60000}]},
        {"when": "^guarded", "steps": [
            {"tool": "guarded_write", "args": {"path": "out.txt", "content": "x"}},
            {"text": "tool said: {tool_result}"},
        ]},
    ]
}  # fmt: skip
KINDS = ("answer", "fail", "slow", "guarded-deny", "guarded-allow")


def mixed_tasks(n: int, workdir: Path) -> list[dict[str, Any]]:
    """n tasks cycling through every outcome; allowed writes each get their own cwd."""
    tasks = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        task: dict[str, Any] = {"id": f"t{i:04d}", "prompt": f"{kind.split('-')[0]} {i}"}
        if kind == "slow":
            task["timeout_s"] = 0.3
        if kind == "guarded-allow":
            cwd = workdir / f"w{i}"
            cwd.mkdir(parents=True, exist_ok=True)
            task["cwd"] = str(cwd)
            task["approve"] = "allow"
        tasks.append(task)
    return tasks


def expected(task: dict[str, Any]) -> dict[str, Any]:
    """What the result line must say, from the script and the task alone."""
    kind = task["prompt"].split()[0]
    full_usage = dict(USAGE)  # as the session log records it
    if kind in ("answer", "wait"):
        verb = "answer to" if kind == "answer" else "waited for"
        return {"status": "ok", "stopReason": "end_turn", "text": f"{verb} {task['prompt']}", "error": None,
                "usage": full_usage, "permissions": []}  # fmt: skip
    if kind == "fail":
        return {"status": "failed", "stopReason": "error", "text": "",
                "error": ("agent_error", -32603, "Internal error: turn failed: simulated provider error (HTTP 401)"),
                "usage": None, "permissions": []}  # fmt: skip
    if kind == "slow":
        return {"status": "failed", "stopReason": "cancelled", "text": "thinking",
                "error": ("timeout", None, "timed out after 0.3 s; the session was cancelled"),
                "usage": None, "permissions": []}  # fmt: skip
    allowed = task.get("approve") == "allow"
    return {"status": "ok", "stopReason": "end_turn",
            "text": "tool said: " + ("wrote out.txt" if allowed else "not written: approval rejected"),
            "error": None, "usage": None,
            # the title is the one the agent's permission request shows (acp-transport permission.py)
            "permissions": [{"toolCallId": "call_1", "title": "guarded_write: out.txt",
                             "verdict": "allow" if allowed else "reject"}]}  # fmt: skip


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    """A result line without what legitimately varies between runs (ids, pids, timings)."""
    err = result["error"]
    return {
        "status": result["status"],
        "stopReason": result["stopReason"],
        "text": result["text"],
        "error": None if err is None else (err["class"], err.get("code"), err["message"]),
        "usage": result["usage"],
        "permissions": result["permissions"],
    }


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def batch_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER") if k in os.environ}
    env.update(DSH_HOME=str(home), DSH_EXAMPLES_PATH=str(TEST_EXAMPLES), **extra)
    return env



def scripted_batch(tmp_path: Path, script: dict[str, Any]) -> tuple[Path, Path, tuple[str, ...]]:
    """A batch's set-up: its directory, a fresh ``home`` in it, and the route arguments that run
    ``acp-testkit`` on a scripted model playing ``script``."""
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    home = tmp_path / "home"
    home.mkdir()
    return tmp_path, home, ("-e", "acp-testkit", "--provider", "scripted", "--model", str(path))

def batch_argv(tasks: Path, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "dsh_core.cli", "batch", str(tasks), "--out", str(out), *args]


def run_batch(tasks: Path, out: Path, *args: str, home: Path, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None):
    return subprocess.run(
        batch_argv(tasks, out, *args), cwd=cwd, env=env or batch_env(home), capture_output=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            count = path.read_bytes().count(b"\n")
            if count >= n:
                return count
        if proc.poll() is not None:
            raise AssertionError(f"dsh batch exited ({proc.returncode}) before {n} results")
        time.sleep(0.02)
    raise AssertionError(f"fewer than {n} results after {timeout} s")
