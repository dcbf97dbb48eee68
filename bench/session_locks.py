"""Cost of a session's life on the durable store: open (header written, cross-process lock taken)
and close (lock given back), in-process, for N sessions; and the bare lock acquire.

    python bench/session_locks.py [-n 1000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import anyio
from dsh_jsonl_persistence.store import JsonlStore

from dsh_core.types import SessionHeader


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dsh-bench-locks-") as d:
        store = JsonlStore(Path(d) / "sessions")
        store.root.mkdir(parents=True)
        started = time.perf_counter()
        for i in range(args.n):
            store.locks.acquire(f"bare-{i}")
        acquire = (time.perf_counter() - started) / args.n
        started = time.perf_counter()
        for i in range(args.n):
            log = store.open(SessionHeader(id=f"s{i}"))
            await log.close()
        cycle = (time.perf_counter() - started) / args.n
    print(f"session locks, {args.n} sessions: lock acquire {acquire * 1e6:.1f} µs; "
          f"open (header + lock) and close {cycle * 1e6:.0f} µs per session")


if __name__ == "__main__":
    anyio.run(main)
