"""Where a program's 100 gathered reads spend their time: the procedure behind the reads row.

``floor_code_mode.py`` row 3 compares 100 reads through one program with 100 native reads of one
message, alternating in one session. This plays the same turns (``floor_code_mode.reads``) and
splits each program turn by timestamps taken in the host, at these points:

    call      the run_code tool call (its ToolCallEvent)
    execute   the run starts (``_Run.execute``: ``go`` is sent; the program went to the ready
              process before, while the host confirmed its confinement)
    1st msg   the host takes in the first message of the program (its calls)
    1st call  the first nested call starts (its CodeDispatchStart)
    last call the last nested call ends (its CodeDispatch)
    done      the program's ``done`` is read
    end       the run is over (``execute`` returns: every process of it gone)
    result    the run_code result (its ToolResultEvent)

and prints, per turn and as medians, the phases between them beside the native turn's span.
From ``execute`` to ``1st msg`` is what is left of the program process's start (it was woken by
the program and compiled it meanwhile; then ``go``, its event loop, its first call, which leaves
at once); ``1st msg`` to ``1st call`` the host taking in that call; ``call`` to ``execute`` and
``done`` to ``result`` the host's own fixed parts.

(The reads are of files the kernel has cached: the read tool answers them in the event loop,
no worker thread; session 18 removed the ``--no-thread`` experiment that showed what this
does.)

    python bench/profile_code_reads.py [--rounds 11]

The hooks are monkeypatches of code-mode's private ``_Run`` (this script only): when they
fail to apply, the code moved; adjust them here.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from typing import Any

import anyio
import floor_code_mode as fcm

from dsh_core.types import CodeDispatch, CodeDispatchStart, ToolCallEvent, ToolResultEvent

PHASES = ("call>execute", "execute>1st msg", "1st msg>1st call", "calls", "last call>done", "done>end",
          "end>result")


def _instrument(marks: dict[str, float]) -> None:
    import dsh_code_mode.runtime as rt

    execute, succeed, handle = rt._Run.execute, rt._Run.succeed, rt._Run._handle

    async def timed_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        marks["execute"] = time.time()
        try:
            return await execute(self, *args, **kwargs)
        finally:
            marks["end"] = time.time()

    def timed_succeed(self: Any, value: Any) -> None:
        marks["done"] = time.time()
        succeed(self, value)

    def timed_handle(self: Any, line: bytes, calls: Any) -> None:
        marks.setdefault("1st msg", time.time())
        handle(self, line, calls)

    rt._Run.execute = timed_execute  # type: ignore[method-assign]
    rt._Run.succeed = timed_succeed  # type: ignore[method-assign]
    rt._Run._handle = timed_handle  # type: ignore[method-assign]


async def measure(rounds: int) -> tuple[list[list[float]], list[float]]:
    marks: dict[str, float] = {}
    _instrument(marks)
    split: list[list[float]] = []
    turn = fcm._turn

    async def split_turn(host: Any, agent: Any, prompt: str, n: int) -> tuple[float, list[Any]]:
        marks.clear()
        span, events = await turn(host, agent, prompt, n)
        if prompt.startswith("code "):
            call = next(e.time for e in events if isinstance(e, ToolCallEvent))
            result = max(e.time for e in events if isinstance(e, ToolResultEvent))
            first = min(e.time for e in events if isinstance(e, CodeDispatchStart))
            last = max(e.time for e in events if isinstance(e, CodeDispatch))
            points = [call, marks["execute"], marks["1st msg"], first, last, marks["done"], marks["end"], result]
            split.append([(b - a) * 1000 for a, b in itertools.pairwise(points)] + [span])
        return span, events

    fcm._turn = split_turn  # type: ignore[assignment]
    try:
        with fcm.scratch("dsh-profile-reads-") as (tmp, workspace):
            out = await fcm.reads(tmp, workspace, rounds, small=None)
    finally:
        fcm._turn = turn  # type: ignore[assignment]
    return split[1:], out["native"]  # the first code turn is the warm-up round's


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    split, native = anyio.run(measure, args.rounds)
    print(f"100 reads through one program, split (ms; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs)")
    print("  " + "  ".join(f"{p:>16}" for p in (*PHASES, "span")))
    for row in split:
        print("  " + "  ".join(f"{x:16.2f}" for x in row))
    medians = [statistics.median(col) for col in zip(*split, strict=True)]
    print("  " + "  ".join(f"{x:16.2f}" for x in medians) + "  (medians)")
    fixed = sum(medians) - medians[PHASES.index("calls")] - medians[-1]
    print(f"native span: median {statistics.median(native):.2f} ms ({', '.join(f'{x:.1f}' for x in native)})")
    print(f"fixed part of a run (every phase but the calls): {fixed:.2f} ms; code/native "
          f"{medians[-1] / statistics.median(native):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
