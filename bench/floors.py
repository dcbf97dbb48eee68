"""Every figure of issue 45 beside its floor or peer, in one run.

Each row group is one module, ``bench/floor_<part>.py``, exposing ``rows(quick=False)``: it
measures dsh *and* the floor or peer in the same call (alternating, medians of rounds), so a
loaded machine slows both sides. This script runs every group and prints one table:

    python bench/floors.py            # the full sizes (several minutes on a 2-core machine)
    python bench/floors.py --quick    # small sizes, for a smoke run (CI runs this once)
    python bench/floors.py --only prompt_cpu,code_mode --json out.json

The goals hold in the median of three runs on a quiet machine; a single run on a busy one says
less (the README's table says which load each figure was taken under).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GROUPS = ("prompt_cpu", "session_memory", "tool_calls", "code_mode", "landlock", "load")
KEYS = ("figure", "dsh", "floor", "goal", "met")


def load(group: str) -> Any:
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return importlib.import_module(f"floor_{group}")


def run(groups: list[str], quick: bool) -> list[dict[str, Any]]:
    table: list[dict[str, Any]] = []
    for group in groups:
        started = time.perf_counter()
        print(f"[{group}] measuring…", file=sys.stderr, flush=True)
        for row in load(group).rows(quick=quick):
            missing = [k for k in KEYS if k not in row]
            if missing:
                raise SystemExit(f"bench/floor_{group}.py: a row lacks {missing}: {row}")
            table.append({"group": group, **row})
        print(f"[{group}] {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return table


def render(table: list[dict[str, Any]]) -> str:
    marks = {True: "met", False: "MISSED", None: "—"}
    lines = ["| figure | dsh | floor or peer | goal | |", "|---|---|---|---|---|"]
    lines += [f"| {r['figure']} | {r['dsh']} | {r['floor']} | {r['goal']} | {marks[r['met']]} |" for r in table]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a measurement")
    parser.add_argument("--only", default="", help=f"comma-separated groups of {', '.join(GROUPS)}")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    groups = [g.strip() for g in args.only.split(",") if g.strip()] or list(GROUPS)
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        parser.error(f"unknown group(s): {', '.join(unknown)}")
    table = run(groups, args.quick)
    load_avg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{'quick run' if args.quick else 'run'} on {os.cpu_count()} CPUs, load average {load_avg}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print(render(table))
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
