"""The load rows of the one benchmark (issue 45, item 5; ``bench/floors.py`` imports ``rows``):
64 sessions x 50 tool calls (bash, read, subagent) at once in one acp-agent process over real
stdio, beside the peer — the same sessions and calls with one prompt in flight at a time, so a
call's latency is what it costs alone on this machine. Load and peer alternate; medians of three
rounds (``quick``: 8 x 10, one round). The goal of item 5 is that everything holds (every call
answered and right, every log whole, no descriptor or process left, the process still serving)
and that the figures are reported; ``met`` says whether everything held. The details, per kind
and per moment: ``bench/load.py``."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

from dsh_testing.load import LoadReport, run_load


def load(sessions: int, calls: int, *, at_once: bool) -> LoadReport:
    with tempfile.TemporaryDirectory(prefix="dsh-load-") as d:  # subagents' cap lifted: see bench/load.py
        return asyncio.run(run_load(Path(d), sessions, calls, at_once=at_once))


def rows(quick: bool = False) -> list[dict]:
    sessions, calls, rounds = (8, 10, 1) if quick else (64, 50, 3)
    p99, peer_p99, rss, peer_rss, problems = [], [], [], [], []
    fds, procs = "", ""
    for _ in range(rounds):
        peer = load(sessions, calls, at_once=False)
        report = load(sessions, calls, at_once=True)
        peer_p99.append(peer.pct(0.99))
        p99.append(report.pct(0.99))
        peer_rss.append(peer.peak_rss_kib / 1024)
        rss.append(report.peak_rss_kib / 1024)
        problems += peer.problems + report.problems
        fds = f"fds {report.fds['before']}→{report.fds['after']}"
        procs = f"processes {report.processes['before']}→{report.processes['after']}"
    held = not problems
    size = f"{sessions} sessions x {calls} calls"
    ratio = statistics.median(p99) / statistics.median(peer_p99)
    state = "all answered and logged" if held else f"{len(problems)} problems: {problems[0][:80]}"
    return [
        {"figure": f"load: {size}, p99 call latency",
         "dsh": f"{statistics.median(p99):.0f} ms ({ratio:.1f}x the peer; {state}; {fds}, {procs})",
         "floor": f"{statistics.median(peer_p99):.0f} ms (same calls, one prompt at a time)",
         "goal": "every call answered, nothing lost or left behind; p99 reported", "met": held},
        {"figure": f"load: {size}, peak RSS",
         "dsh": f"{statistics.median(rss):.1f} MiB",
         "floor": f"{statistics.median(peer_rss):.1f} MiB (same calls, one prompt at a time)",
         "goal": "reported", "met": None},
    ]


if __name__ == "__main__":
    import json
    import sys

    for row in rows(quick="--quick" in sys.argv):
        print(json.dumps(row, ensure_ascii=False))
