"""`dsh batch --ray` against a real Ray head: the same 200 mixed tasks give the same results
as the local engine, sharded over two actors. Run by `tox -e ray`, which starts the head on
127.0.0.1 with 2 CPUs and sets DSH_RAY_ADDRESS (this file is not collected by the default
suite: Ray is an optional extra)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import batchkit
from batchkit import MIXED_SCRIPT, REPO, comparable, expected, mixed_tasks, read_results, write_jsonl

ADDRESS = os.environ.get("DSH_RAY_ADDRESS", "")


def run_batch(*args, home, **kw):
    """batchkit.run_batch with Ray's own settings passed on (RAY_AUTH_MODE=token: Ray >= 2.5x
    clusters use token authentication, and a client must say so)."""
    env = kw.pop("env", None) or batchkit.batch_env(home)
    env.update({k: v for k, v in os.environ.items() if k.startswith("RAY_")})
    return batchkit.run_batch(*args, home=home, env=env, **kw)


@pytest.fixture
def setup(tmp_path: Path):
    assert ADDRESS, "tox -e ray sets DSH_RAY_ADDRESS to the head it started"
    script = tmp_path / "script.json"
    script.write_text(json.dumps(MIXED_SCRIPT))
    home = tmp_path / "home"
    home.mkdir()
    return tmp_path, home, ("-e", "acp-testkit", "--provider", "scripted", "--model", str(script))


def test_200_tasks_on_ray_match_the_local_engine(setup):
    tmp, home, args = setup
    tasks = mixed_tasks(200, tmp / "work")
    tasks_file = write_jsonl(tmp / "tasks.jsonl", tasks)
    local_out, ray_out = tmp / "local.jsonl", tmp / "ray.jsonl"
    local = run_batch(tasks_file, local_out, *args, "-j", "8", home=home, cwd=tmp, timeout=300)
    assert local.returncode == 1, local.stderr.decode()[-2000:]
    ray = run_batch(tasks_file, ray_out, *args, "-j", "8", "--ray", ADDRESS, "--ray-actors", "2", "--json",
                    home=home, cwd=tmp, timeout=600)  # fmt: skip
    assert ray.returncode == 1, ray.stderr.decode()[-4000:]
    by_local = {r["id"]: comparable(r) for r in read_results(local_out)}
    by_ray = {r["id"]: comparable(r) for r in read_results(ray_out)}
    assert len(read_results(ray_out)) == 200 and by_ray == by_local
    assert by_ray == {t["id"]: expected(t) for t in tasks}
    summary = json.loads(ray.stdout)
    assert summary["engine"] == f"ray {ADDRESS}" and (summary["ok"], summary["failed"]) == (120, 80)
    # both actors took work (each owns its own agent processes)
    pids = Counter(r["agent"]["pid"] for r in read_results(ray_out))
    assert len(pids) >= 2
    # resume works the same: nothing left to run
    again = run_batch(tasks_file, ray_out, *args, "--ray", ADDRESS, "--json", home=home, cwd=tmp, timeout=300)
    assert json.loads(again.stdout)["skipped"] == 200


def test_readme_example_on_a_fresh_local_ray_instance(tmp_path: Path):
    """`--ray` without an address starts (and stops) a local instance: the README's 20 tasks."""
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"id": f"q{i:02d}", "prompt": "ping" if i % 2 else f"task {i}"} for i in range(20)])
    home = tmp_path / "home"
    home.mkdir()
    demo = REPO / "examples" / "acp-agent" / "demo.json"
    out = tmp_path / "results.jsonl"
    proc = run_batch(tasks, out, "--provider", "scripted", "--model", str(demo), "--ray", home=home, cwd=tmp_path,
                     timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-4000:]
    results = {r["id"]: r for r in read_results(out)}
    assert len(results) == 20
    for i in range(20):
        want = "PONG" if i % 2 else f"dsh demo (scripted, keyless) received: task {i}"
        assert (results[f"q{i:02d}"]["status"], results[f"q{i:02d}"]["text"]) == ("ok", want)


def test_relative_paths_mean_where_dsh_batch_runs(setup):
    """A relative --model, --example or task-level model/example names a file where `dsh batch`
    runs, not in the Ray actor's working directory."""
    tmp, home, _ = setup  # setup wrote tmp/script.json (the mixed script)
    shutil.copytree(REPO / "tests" / "examples" / "acp-testkit", tmp / "ex")
    (tmp / "pong.json").write_text(json.dumps({"default": [{"text": "PONG from a relative script"}]}))
    tasks = write_jsonl(tmp / "tasks.jsonl", [
        {"id": "defaults", "prompt": "hi"},
        {"id": "task-level", "prompt": "answer me", "example": "ex", "model": "script.json"},
    ])
    out = tmp / "out.jsonl"
    proc = run_batch(tasks, out, "-e", "ex", "--provider", "scripted", "--model", "pong.json", "--ray", ADDRESS,
                     "--ray-actors", "1", home=home, cwd=tmp, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-4000:]
    results = {r["id"]: (r["status"], r["text"]) for r in read_results(out)}
    assert results == {"defaults": ("ok", "PONG from a relative script"), "task-level": ("ok", "answer to answer me")}
