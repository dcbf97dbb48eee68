"""Where a session's memory goes: the real acp-agent subprocess (``dsh run --example acp-agent``,
scripted instant model, JSONL logs on) run under tracemalloc, driven by the official SDK client
exactly as bench/floor_session_memory.py drives it. After the warm-up and again after N sessions
(each prompted once) the child writes a tracemalloc snapshot and a count of live objects by
type (after a full gc); this script prints the growth per session grouped by file:line, by
type, and the biggest allocation tracebacks.

    python bench/profile_session_memory.py [-n 1000] [--frames 8] [--top 30]

The child is this same file run as ``--child -- <dsh args>``: it starts tracemalloc, installs a
SIGUSR1 handler that dumps the snapshot to $DSH_MEMPROF_OUT.<k>, then runs ``dsh`` in-process.
tracemalloc slows the child; the RSS figure printed beside it is inflated by tracemalloc's own
bookkeeping, so take the RSS figure from bench/floor_session_memory.py.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import os
import pickle
import signal
import sys
import tempfile
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

REPO = HERE.parent


def child(argv: list[str]) -> None:
    """Run dsh with tracemalloc on; on SIGUSR1 dump (snapshot, counts by type) to the next file."""
    tracemalloc.start(int(os.environ.get("DSH_MEMPROF_FRAMES", "8")))
    out = os.environ["DSH_MEMPROF_OUT"]
    seq = [0]

    def dump(signum: int, frame: object) -> None:
        gc.collect()
        counts: collections.Counter[str] = collections.Counter()
        sizes: collections.Counter[str] = collections.Counter()
        for o in gc.get_objects():
            t = type(o)
            name = f"{t.__module__}.{t.__qualname__}"
            counts[name] += 1
            with contextlib.suppress(TypeError):
                sizes[name] += sys.getsizeof(o)
        snap = tracemalloc.take_snapshot()
        path = f"{out}.{seq[0]}"
        seq[0] += 1
        with open(path + ".tmp", "wb") as f:
            pickle.dump((snap, dict(counts), dict(sizes)), f)
        os.replace(path + ".tmp", path)

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["dsh", *argv]
    from dsh_core.cli import entry

    entry()


def short(filename: str) -> str:
    for root in (str(REPO) + "/", "/site-packages/", "/lib/python3"):
        if root in filename:
            return filename.split(root, 1)[1]
    return filename


async def profile(n: int, frames: int, top: int, keep: Path | None = None) -> None:
    import floor_session_memory as fsm

    with tempfile.TemporaryDirectory(prefix="dsh-memprof-") as d:
        work = Path(d)
        argv, env = fsm.setup(work)
        ws = work / "ws"
        ws.mkdir()
        dsh_args = argv["dsh"][3:]  # after "python -m dsh_core.cli"
        env = {**env, "DSH_MEMPROF_OUT": str(work / "snap"), "DSH_MEMPROF_FRAMES": str(frames)}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--", *dsh_args]
        taken: dict[str, tuple] = {}
        rss: dict[str, int] = {}

        async def mark(label: str, pid: int) -> None:
            k = len(taken)
            rss[label] = fsm.rss_kib(pid)
            os.kill(pid, signal.SIGUSR1)
            path = Path(f"{work / 'snap'}.{k}")
            for _ in range(6000):
                if path.exists():
                    break
                await asyncio.sleep(0.05)
            with open(path, "rb") as f:
                taken[label] = pickle.load(f)

        per = await fsm.drive(cmd, ws, env, n, marks=mark)
        if keep:  # the raw (snapshot, counts, sizes) pairs, for a closer look in a REPL
            keep.mkdir(parents=True, exist_ok=True)
            for label, data in taken.items():
                with open(keep / f"{label}.pickle", "wb") as f:
                    pickle.dump(data, f)

    (s0, c0, z0), (s1, c1, z1) = taken["base"], taken["end"]
    print(f"acp-agent under tracemalloc ({frames} frames), {n} sessions each prompted once after {fsm.WARM} warm-up")
    print(f"RSS growth per session (inflated by tracemalloc): {per:.1f} KiB")
    filt = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            tracemalloc.Filter(False, __file__)]
    s0, s1 = s0.filter_traces(filt), s1.filter_traces(filt)
    total = sum(st.size_diff for st in s1.compare_to(s0, "filename"))
    print(f"traced Python heap growth per session: {total / n / 1024:.2f} KiB\n")

    print(f"top {top} by file:line (bytes per session, blocks per session)")
    for st in s1.compare_to(s0, "lineno")[:top]:
        fr = st.traceback[0]
        print(f"  {st.size_diff / n:9.0f} B  {st.count_diff / n:6.2f}  {short(fr.filename)}:{fr.lineno}")

    print(f"\ntop {top} by file (bytes per session)")
    for st in s1.compare_to(s0, "filename")[:top]:
        print(f"  {st.size_diff / n:9.0f} B  {short(st.traceback[0].filename)}")

    print(f"\ntop {top} live gc-tracked objects by type (count per session, shallow bytes per session)")
    grown = sorted(((c1.get(k, 0) - c0.get(k, 0), k) for k in c1), reverse=True)[:top]
    for dc, k in grown:
        print(f"  {dc / n:7.2f}  {(z1.get(k, 0) - z0.get(k, 0)) / n:8.0f} B  {k}")

    print(f"\ntop {min(top, 12)} allocation tracebacks (bytes per session)")
    for st in s1.compare_to(s0, "traceback")[: min(top, 12)]:
        print(f"  {st.size_diff / n:9.0f} B  {st.count_diff / n:6.2f} blocks")
        for fr in reversed(st.traceback):
            print(f"        {short(fr.filename)}:{fr.lineno}")


def main() -> None:
    if "--child" in sys.argv:
        child(sys.argv[sys.argv.index("--") + 1 :])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1000, help="sessions between the snapshots (default 1000)")
    ap.add_argument("--frames", type=int, default=8, help="traceback depth tracemalloc keeps (default 8)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--keep", type=Path, default=None, help="write base.pickle/end.pickle here")
    args = ap.parse_args()
    asyncio.run(profile(args.n, args.frames, args.top, args.keep))


if __name__ == "__main__":
    main()
