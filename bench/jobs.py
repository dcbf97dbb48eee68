"""Background jobs, through a real host's tool path (bash, job_output), figures beside their goals
and beside a peer measured in the same run:

1. ``job_output`` on a job that wrote 10 MB: time and the Python heap it peaks at
   (tracemalloc), against the naive peer that reads the whole log and bounds it with the spine's
   ``bound`` (what reading "everything since the last read" costs without seeking). Goal: ≤ 50 ms,
   memory bounded (independent of the output's size).
2. Starting a background job (``bash {command: "true", run_in_background: true}``) against a
   foreground ``bash {command: "true"}`` in the same session and sandbox. Goal: no slower.

    python bench/jobs.py [--repeat 30] [--mechanism auto|bwrap|landlock]
"""

from __future__ import annotations

import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

from _common import Caller, bench_host, ms, run_main

from dsh_core.spill import bound

OUTPUT_GOAL_MS = 50.0
MB10 = 10_000_000


async def main(repeat: int, mechanism: str) -> None:
    from dsh_jobs import registry_of

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        config = {"sandbox-tools": {"mechanism": mechanism}, "jobs": {"max-live": repeat + 10}}
        async with bench_host(work, ("scripted-model", "sandbox-tools", "jobs"), config) as (host, agent):
            call = Caller(agent).call

            await call("bash", {"description": "Run the command", "command": "true"})  # the session's command server starts once

            # 1. job_output on 10 MB
            out_times, peaks, naive_times, naive_peaks = [], [], [], []
            for i in range(max(3, repeat // 5)):
                _, started = await call("bash", {"description": "Run the command", "command": f"head -c {MB10} /dev/zero | tr '\\0' x",
                                                 "run_in_background": True})
                jid = started.content[0].text.split()[-1]
                job = registry_of(host).get(agent, jid)
                await job.wait()
                assert job.log.size == MB10
                tracemalloc.start()
                took, out = await call("job_output", {"job_id": jid})
                peaks.append(tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()
                out_times.append(took)
                assert "bytes omitted" in out.content[0].text
                tracemalloc.start()
                t0 = time.perf_counter()
                bound(job.log.path.read_bytes().decode("utf-8", errors="replace"), 30_000, work / f"naive{i}.log")
                naive_times.append(ms(t0))
                naive_peaks.append(tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()

            # 2. start a background job vs a foreground `true`
            fg, bg, whole = [], [], []
            for _ in range(repeat):
                fg.append((await call("bash", {"description": "Run the command", "command": "true"}))[0])
                t0 = time.perf_counter()
                took, started = await call("bash", {"description": "Run the command", "command": "true", "run_in_background": True})
                bg.append(took)
                await registry_of(host).get(agent, started.content[0].text.split()[-1]).wait()
                whole.append(ms(t0))

    med = statistics.median
    print(f"job_output on a job with 10 MB of output ({len(out_times)} runs): median {med(out_times):.2f} ms, "
          f"max {max(out_times):.2f} ms, Python heap peak {max(peaks) / 1e6:.2f} MB  "
          f"(goal <= {OUTPUT_GOAL_MS:.0f} ms: {'met' if med(out_times) <= OUTPUT_GOAL_MS else 'NOT met'})")
    print(f"  peer, read the whole log and bound it: median {med(naive_times):.2f} ms, heap peak "
          f"{max(naive_peaks) / 1e6:.1f} MB")
    print(f"start a background job ({repeat} runs): median {med(bg):.2f} ms; foreground `true`: median "
          f"{med(fg):.2f} ms  (goal: no slower — {'met' if med(bg) <= med(fg) else 'NOT met'}; "
          f"{med(bg) / med(fg):.2f}x)")
    print(f"  and until that job has run and settled (process started, exited, reaped): median {med(whole):.2f} ms")


if __name__ == "__main__":
    run_main(main, __doc__, repeat=30)
