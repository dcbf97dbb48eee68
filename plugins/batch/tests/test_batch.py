"""`dsh batch` as a real subprocess driving real `dsh run` agents over stdio (local engine):
exact results for mixed outcomes, SIGINT and SIGKILL then resume, an agent killed
mid-batch, bad task lines, --retry-failed, the live bar on a terminal."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from batchkit import (
    MIXED_SCRIPT,
    batch_argv,
    batch_env,
    comparable,
    expected,
    mixed_tasks,
    read_results,
    run_batch,
    scripted_batch,
    wait_for_lines,
    write_jsonl,
)
from dsh_acp.proctree import _stat


def alive(pids) -> list[int]:
    return [p for p in pids if (s := _stat(p)) is not None and s[0] != "Z"]


def wait_gone(pids, seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture
def setup(tmp_path: Path):
    return scripted_batch(tmp_path, MIXED_SCRIPT)


def test_200_mixed_tasks_exact_results(setup):
    tmp, home, args = setup
    tasks = mixed_tasks(200, tmp / "work")
    tasks_file = write_jsonl(tmp / "tasks.jsonl", tasks)
    out = tmp / "results.jsonl"
    proc = run_batch(tasks_file, out, *args, "-j", "8", "--sessions-per-agent", "4", "--recycle-after", "30", "--json",
                     home=home, cwd=tmp)  # fmt: skip
    assert proc.returncode == 1, proc.stderr.decode()[-3000:]  # finished, with failures
    assert b"dsh batch: 200/200 finished (120 ok, 80 failed)" in proc.stderr  # plain line: stderr is no tty
    results = read_results(out)
    by_id = {r["id"]: r for r in results}
    assert len(results) == len(by_id) == 200
    for task in tasks:
        assert comparable(by_id[task["id"]]) == expected(task), task
        assert by_id[task["id"]]["attempts"] == 1
    # allowed writes happened, in the task's own cwd; denied ones wrote nothing
    assert sorted(p.parent.name for p in (tmp / "work").rglob("out.txt")) == sorted(
        Path(t["cwd"]).name for t in tasks if t.get("approve") == "allow"
    )
    assert not (tmp / "out.txt").exists()
    summary = json.loads(proc.stdout)
    assert (summary["ok"], summary["failed"], summary["interrupted"]) == (120, 80, 0)
    assert summary["failures"] == {"agent_error": 40, "timeout": 40}
    assert summary["tokens"] == 40 * 10 and summary["exitStatus"] == 1
    # one fresh session per task, several per process; dsh advertises session/close (issue 17),
    # so each session is closed when it settles and no process is recycled after 30 sessions
    assert len({r["sessionId"] for r in results}) == 200
    per_pid = Counter(r["agent"]["pid"] for r in results)
    assert max(per_pid.values()) > 30 and len(per_pid) >= 2
    assert not wait_gone(per_pid)  # no agent outlives the batch
    # the session id leads to the log
    sid = by_id["t0000"]["sessionId"]
    show = subprocess.run(
        [*batch_argv(tasks_file, out)[:3], "sessions", "show", sid], env=batch_env(home), capture_output=True, timeout=60
    )
    assert show.returncode == 0 and b"answer to answer 0" in show.stdout, show.stderr
    # a re-run has nothing left to do
    again = run_batch(tasks_file, out, *args, "--json", home=home, cwd=tmp)
    assert json.loads(again.stdout)["skipped"] == 200 and json.loads(again.stdout)["ran"] == 0
    assert out.read_bytes().count(b"\n") == 200


def _waiting_tasks(tmp: Path, n: int = 200) -> Path:
    return write_jsonl(tmp / "tasks.jsonl", [{"id": f"w{i:03d}", "prompt": f"wait {i}"} for i in range(n)])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_interrupt_half_way_then_resume_runs_every_id_exactly_once(setup, sig):
    tmp, home, args = setup
    tasks_file = _waiting_tasks(tmp)
    out = tmp / "results.jsonl"
    proc = subprocess.Popen(batch_argv(tasks_file, out, *args, "-j", "8"), cwd=tmp, env=batch_env(home),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for_lines(out, 100, proc)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = read_results(out)
    ids = [r["id"] for r in before]
    assert len(ids) == len(set(ids)) and 100 <= len(ids) < 200
    pids = {r["agent"]["pid"] for r in before}
    if sig == signal.SIGINT:
        assert proc.returncode == 130, stderr.decode()[-2000:]
        interrupted = [r for r in before if r["status"] == "interrupted"]
        assert interrupted, "the tasks in flight are recorded"
        for r in interrupted:  # cancelled in flight, committed text so far (none: the answer comes after the wait)
            assert (r["stopReason"], r["error"]["class"]) == ("cancelled", "interrupted")
        assert all(r["status"] == "ok" for r in before if r["status"] != "interrupted")
        assert not alive(pids), "Ctrl-C shuts the agents down before exiting"
    else:
        assert proc.returncode == -signal.SIGKILL
        assert all(r["status"] == "ok" for r in before)
        assert not wait_gone(pids), "orphaned agents exit on stdin EOF"
    kept = {r["id"]: r for r in before if r["status"] == "ok"}

    again = run_batch(tasks_file, out, *args, "-j", "8", "--json", home=home, cwd=tmp)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    assert json.loads(again.stdout)["skipped"] == len(kept)
    after = read_results(out)
    assert sorted(r["id"] for r in after) == [f"w{i:03d}" for i in range(200)]  # every id exactly once
    assert all(r["status"] == "ok" and r["text"] == f"waited for wait {int(r['id'][1:])}" for r in after)
    for r in after:  # what was done before is kept as it was, not run again
        if r["id"] in kept:
            assert r == kept[r["id"]]


def test_killed_agent_fails_only_its_own_tasks_which_rerun_on_a_fresh_process(setup):
    tmp, home, args = setup
    tasks_file = _waiting_tasks(tmp, 60)
    out = tmp / "results.jsonl"
    proc = subprocess.Popen(batch_argv(tasks_file, out, *args, "-j", "8", "--sessions-per-agent", "4"), cwd=tmp,
                            env=batch_env(home), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for_lines(out, 8, proc)
        victim = read_results(out)[0]["agent"]["pid"]
        os.kill(victim, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    results = read_results(out)
    assert sorted(r["id"] for r in results) == [f"w{i:03d}" for i in range(60)]
    assert all(r["status"] == "ok" and r["text"] == f"waited for wait {int(r['id'][1:])}" for r in results)
    retried = [r for r in results if r["attempts"] > 1]
    assert 1 <= len(retried) <= 4, "only the sessions in flight on the killed process (at most 4)"
    for r in retried:
        assert r["attempts"] == 2 and len(r["retried"]) == 1
        first = r["retried"][0]
        # In flight on the victim (agent_crashed, naming it), or leased to it in the instant before its
        # death was noticed, so its session never began (agent_start): either way the victim's task.
        assert first["class"] in ("agent_crashed", "agent_start"), first
        if first["class"] == "agent_crashed":
            assert first["agent"]["pid"] == victim
        assert r["agent"]["pid"] != victim
    assert all(r["retried"] == [] for r in results if r["attempts"] == 1)
    assert b"retrying on a fresh agent" in stderr


def test_bad_task_lines_are_reported_by_number_and_skipped(setup):
    tmp, home, args = setup
    lines = [
        json.dumps({"id": "a", "prompt": "answer a"}),
        "",
        "{not json",
        json.dumps({"id": "b"}),
        json.dumps({"id": "c", "prompt": "answer c", "timeout": 3}),
        json.dumps({"id": "a", "prompt": "answer again"}),
        json.dumps({"id": "d", "prompt": "answer d", "approve": "ask"}),
        json.dumps({"id": "e", "prompt": "answer e", "timeout_s": 0}),
        json.dumps(["id", "f"]),
        json.dumps({"id": "g", "prompt": "answer g"}),
    ]
    tasks_file = tmp / "tasks.jsonl"
    tasks_file.write_text("\n".join(lines) + "\n")
    out = tmp / "results.jsonl"
    proc = run_batch(tasks_file, out, *args, "--json", home=home, cwd=tmp)
    err = proc.stderr.decode()
    assert proc.returncode == 1
    for n, why in [(3, "not a JSON object"), (4, "`prompt`"), (5, "unknown key `timeout`"),
                   (6, "duplicate id 'a' (first on line 1)"), (7, "approve"), (8, "timeout_s"), (9, "")]:  # fmt: skip
        assert f"tasks.jsonl:{n}: invalid task, skipped: " in err and why in err, (n, err)
    assert "tasks.jsonl:2:" not in err and "tasks.jsonl:1:" not in err and "tasks.jsonl:10:" not in err
    assert sorted(r["id"] for r in read_results(out)) == ["a", "g"]
    assert json.loads(proc.stdout)["invalidLines"] == 7


def test_retry_failed_reruns_failures_only_and_keeps_one_line_per_id(setup):
    tmp, home, args = setup
    tasks_file = write_jsonl(tmp / "tasks.jsonl", [{"id": "ok", "prompt": "answer"}, {"id": "bad", "prompt": "fail"}])
    out = tmp / "results.jsonl"
    assert run_batch(tasks_file, out, *args, home=home, cwd=tmp).returncode == 1
    first = {r["id"]: r for r in read_results(out)}
    assert first["bad"]["status"] == "failed"
    # the model is fixed; a plain re-run keeps the failure, --retry-failed reruns it
    fixed = tmp / "fixed.json"
    fixed.write_text(json.dumps({"default": [{"text": "fixed"}]}))
    fixed_args = ("-e", "acp-testkit", "--provider", "scripted", "--model", str(fixed))
    assert run_batch(tasks_file, out, *fixed_args, home=home, cwd=tmp).returncode == 1
    assert read_results(out) == list(first.values())
    proc = run_batch(tasks_file, out, *fixed_args, "--retry-failed", home=home, cwd=tmp)
    assert proc.returncode == 0, proc.stderr.decode()
    after = {r["id"]: r for r in read_results(out)}
    assert len(read_results(out)) == 2
    assert after["ok"] == first["ok"] and (after["bad"]["status"], after["bad"]["text"]) == ("ok", "fixed")


def test_live_bar_on_a_terminal(setup):
    tmp, home, args = setup
    tasks_file = write_jsonl(tmp / "tasks.jsonl", [{"id": f"x{i}", "prompt": f"wait {i}"} for i in range(6)])
    out = tmp / "results.jsonl"
    main, sub = pty.openpty()
    try:
        env = batch_env(home, COLUMNS="160", TERM="xterm")
        proc = subprocess.Popen(batch_argv(tasks_file, out, *args, "-j", "2"), cwd=tmp, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=sub)  # fmt: skip
        os.close(sub)
        chunks = []
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=60)
    finally:
        os.close(main)
    screen = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0 and proc.stdout.read() == b""
    assert "dsh batch" in screen and "6/6" in screen and "━" in screen  # rich's bar, count, …
    assert "tokens" in screen and "ETA" in screen and "running" in screen
    assert "\x1b[" in screen  # drawn live (cursor control), not plain lines
    assert "ok" in screen and "already done (skipped)" in screen  # the summary table


def test_an_agent_that_cannot_start_stops_the_batch_with_one_message(setup):
    """20 tasks on a provider the example does not have: dsh refuses it at start-up (exit status 2),
    which a fresh agent would repeat, so the batch says so once and stops instead of trying each of 20 tasks 3 times."""
    tmp, home, _ = setup
    tasks_file = write_jsonl(tmp / "tasks.jsonl", [{"id": f"q{i:02d}", "prompt": "ping"} for i in range(20)])
    out = tmp / "results.jsonl"
    proc = run_batch(tasks_file, out, "-e", "acp-testkit", "--provider", "nope", "--model", "x", "-j", "4",
                     "--json", home=home, cwd=tmp)  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.count("no agent can start, so the batch stops") == 1, err
    assert "no model provider 'nope'" in err and "retrying" not in err
    done = read_results(out)
    assert 1 <= len(done) <= 4 and {r["error"]["class"] for r in done} == {"agent_start"}  # only the tries in flight
    assert all(r["attempts"] == 1 for r in done)


def test_a_directory_as_the_tasks_file_says_so(setup):
    tmp, home, args = setup
    proc = run_batch(tmp, tmp / "out.jsonl", *args, home=home, cwd=tmp)
    assert proc.returncode == 2
    assert f"{tmp} is a directory; give the tasks file" in proc.stderr.decode()
