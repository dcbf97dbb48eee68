"""`dsh batch` benchmark: the local engine against Ray, and scaling with concurrency.

1. 1,000 instant scripted tasks (acp-agent example, keyless) with the local engine and with
   `--ray` on a local Ray instance (a fresh one, or DSH_RAY_ADDRESS), both at concurrency 8
   with 4 sessions per agent process (Ray: 2 actors). Prints tasks/s (engine start-up
   excluded) and Ray's overhead per task.
2. Scaling: concurrency 1, 2, 4, 8, 16 with a scripted model that takes 200 ms per call
   (40 x concurrency tasks each); speed-up against concurrency 1.
   Goal: >= 0.8 x linear up to 16, since the work is waiting.

    python bench/batch.py [--tasks 1000] [--no-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(tmp: Path, name: str, n: int, script: dict, *extra: str) -> dict:
    tasks = tmp / f"{name}.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"{name}-{i}", "prompt": f"task {i}"}) + "\n" for i in range(n)))
    model = tmp / f"{name}.json"
    model.write_text(json.dumps(script))
    out = tmp / f"{name}.out.jsonl"
    env = dict(os.environ, DSH_HOME=str(tmp / "home"))
    argv = [sys.executable, "-m", "dsh_core.cli", "batch", str(tasks), "--out", str(out), "--json",
            "--provider", "scripted", "--model", str(model), *extra]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, stdin=subprocess.DEVNULL, timeout=900)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"bench: `dsh batch` {name} failed ({proc.returncode}):\n{proc.stderr.decode()[-3000:]}")
    summary = json.loads(proc.stdout)
    assert summary["ok"] == n, summary
    summary["wall"] = wall
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--levels", default="1,2,4,8,16")
    args = ap.parse_args()
    instant = {"default": [{"text": "done: {prompt}"}]}
    waiting = {"default": [{"delay_ms": 200, "text": "done: {prompt}"}]}
    with tempfile.TemporaryDirectory(prefix="dsh-bench-batch-") as d:
        tmp = Path(d)
        print(f"dsh batch: {args.tasks} instant scripted tasks (acp-agent, keyless), concurrency 8, 4 sessions per agent")
        local = run(tmp, "local", args.tasks, instant, "-j", "8", "--sessions-per-agent", "4")
        rows = [("local", local)]
        if not args.no_ray:
            address = os.environ.get("DSH_RAY_ADDRESS")
            ray = run(tmp, "ray", args.tasks, instant, "-j", "8", "--sessions-per-agent", "4", "--ray-actors", "2",
                      "--ray", *([address] if address else []))  # fmt: skip
            rows.append((f"ray ({address or 'fresh local instance'}, 2 actors)", ray))
        print(f"{'':44}{'tasks/s':>10}{'run s':>10}{'wall s':>10}")
        for label, s in rows:
            print(f"{label:44}{s['tasksPerSecond']:>10.1f}{s['seconds']:>10.2f}{s['wall']:>10.2f}")
        if len(rows) == 2:
            per_task_ms = (rows[1][1]["seconds"] - local["seconds"]) / args.tasks * 1000
            print(
                f"Ray overhead: {per_task_ms:+.2f} ms of batch time per task at concurrency 8 "
                f"({rows[1][1]['tasksPerSecond'] / local['tasksPerSecond']:.2f}x local throughput); "
                f"start-up (ray.init + actors) {rows[1][1]['wall'] - rows[1][1]['seconds'] - (local['wall'] - local['seconds']):.1f} s more"
            )
        print()
        levels = [int(x) for x in args.levels.split(",")]
        print("scaling: scripted model taking 200 ms per call, 40 x concurrency tasks, 4 sessions per agent")
        print(f"{'concurrency':>12}{'tasks':>8}{'tasks/s':>10}{'speed-up':>10}{'of linear':>11}")
        base = None
        worst = 1.0
        for c in levels:
            s = run(tmp, f"scale{c}", 40 * c, waiting, "-j", str(c), "--sessions-per-agent", "4")
            rate = s["tasksPerSecond"]
            base = base or rate / levels[0]
            speedup = rate / base
            worst = min(worst, speedup / c)
            print(f"{c:>12}{40 * c:>8}{rate:>10.2f}{speedup:>10.2f}{speedup / c:>10.0%}")
        verdict = "MEETS" if worst >= 0.8 else "MISSES"
        print(f"goal: >= 0.8 x linear up to {levels[-1]} -> {verdict} (worst {worst:.0%})")


if __name__ == "__main__":
    main()
