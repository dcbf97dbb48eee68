"""Load held (issue 45, item 5): 64 sessions in ONE ``dsh run --example acp-agent`` over real
stdio (the official ACP SDK client), each making 50 tool calls — sandboxed ``bash``, ``read`` and a
foreground ``subagent`` in turn, scripted — all sessions at once. Beside it, in the same run, the
peer: the same sessions and calls with one prompt in flight at a time (no other session running),
so each call's latency is what it costs alone on this machine.

Printed for each: call latency p50/p99 (all calls and per kind; from each session's JSONL log,
``tool/result`` time minus ``tool/call`` time), total time, CPU of the dsh process, its peak RSS
(VmHWM), its descriptors and the processes under it before the load (after a warm-up session
closed), under load and after every session closed; and every problem found: a call unanswered or
answered wrong, a log that lacks a call or does not parse, a descriptor or process left behind, a
process that stopped serving (``dsh_testing.load``; the same run at 8 x 10 is
``tests/reliability/test_load.py``).

The acp-agent runs as shipped (subagents' ``max-running`` counts one session's delegation tree,
so 64 sessions delegating at the same moment are all served).

    python bench/load.py [--sessions 64] [--calls 50] [--rounds 1] [--mechanism auto|bwrap|landlock]
                         [--no-peer]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

from dsh_testing.load import LoadReport, run_load


def load(sessions: int, calls: int, *, at_once: bool, mechanism: str = "auto") -> LoadReport:
    env = {} if mechanism == "auto" else {"DSH_SANDBOX_MECHANISM": mechanism}
    with tempfile.TemporaryDirectory(prefix="dsh-load-") as d:
        return asyncio.run(run_load(Path(d), sessions, calls, env=env, at_once=at_once))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--calls", type=int, default=50, help="tool calls per session (bash, read, subagent in turn)")
    ap.add_argument("--rounds", type=int, default=1, help="load and peer alternate this many times")
    ap.add_argument("--mechanism", default="auto")
    ap.add_argument("--no-peer", action="store_true", help="the load only")
    a = ap.parse_args()
    with open("/proc/loadavg") as f:
        print(f"{os.cpu_count()} cores, load average {' '.join(f.read().split()[:3])}")
    bad = 0
    for r in range(a.rounds):
        if not a.no_peer:
            peer = load(a.sessions, a.calls, at_once=False, mechanism=a.mechanism)
            print(f"\nround {r + 1}, peer (one prompt in flight at a time): {peer.summary()}")
            bad += len(peer.problems)
        report = load(a.sessions, a.calls, at_once=True, mechanism=a.mechanism)
        print(f"\nround {r + 1}, load (all sessions at once): {report.summary()}")
        if not a.no_peer:
            print(f"  p99 {report.pct(0.99):.0f} ms vs the peer's {peer.pct(0.99):.0f} ms "
                  f"({report.pct(0.99) / peer.pct(0.99):.1f}x); peak RSS {report.peak_rss_kib / 1024:.1f} MiB "
                  f"vs {peer.peak_rss_kib / 1024:.1f} MiB")
        bad += len(report.problems)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
