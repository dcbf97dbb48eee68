"""Code mode beside its peer and its floor, measured in one run (issue 45's two code-mode rows).

1. **A session's first ``run_code``**: the original's recorded code-mode-turn scenario (a new
   session, the prompt ``code please``, one program making two ``bash`` calls, printing a line
   and returning their output), timed as the ``run_code`` tool call to its result, in a session
   of the real ``code-mode`` composition (jsonl log on, the sandbox as probed). The prompt comes
   ``--gap`` seconds after the session was created (a person typing; a real model's own
   latency before it answers with the program would come on top and is not counted). Peer: the
   original's first run of the same scenario, 155 ms (recorded 2026-12, issue 45; the original
   is not built here: it needs Node 22.19+ and a pnpm monorepo with native parts). Goal: <= 0.5x
   the original. Beside it, a later run of the same session (what the first should cost) and the
   first run with the session's warm start turned off (what it cost before).
2. **Session start is not slower**: ``create_agent`` (what ACP ``session/new`` waits for) and
   the prompt's way to the first model request (``user/message`` to ``request/header``), the
   prompt sent at once (the warm start then runs alongside: the worst case), with the warm
   start on vs off, alternating. Goal: on <= 1.1x off (+1 ms).
3. **100 reads through code vs 100 native reads**: one program gathering 100 ``tools.read``
   of small files vs 100 such reads as native tool calls of one assistant message,
   alternating in one ``both-mode`` session, each side timed from its first tool call to its
   last result; every turn reads files of its own (no call repeats: see ``reads``). Goal:
   code <= 1.2x native.

    python bench/floor_code_mode.py [--quick] [--gap S]

``rows(quick)`` is what ``bench/floors.py`` prints; ``quick`` finishes in well under 30 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
from _common import env_restored, reads_rules

from dsh_core.compose import load_composition
from dsh_core.contracts import AgentSpec, new_id
from dsh_core.host import open_host
from dsh_core.types import RequestHeader, TextBlock, ToolCallEvent, ToolResultEvent, UserMessage, UserMessageEvent

ORIGINAL_FIRST_RUN_MS = 155.0  # the original, recorded 2026-12 (issue 45)
ORIGINAL_LABEL = "the original (recorded 2026-12, issue 45)"
FIRST_RUN_GOAL = 0.5  # x the original
START_GOAL = 1.1  # warm start on / off
READS_GOAL = 1.2  # code / native

# The original's code-mode-turn program (examples/acp-agent/tests/snapshots/code-mode-turn).
TURN_PROGRAM = (
    'first = await tools.bash(description="Run the command", command="echo CODE_ONE")\n'
    'second = await tools.bash(description="Run the command", command="echo CODE_TWO")\n'
    'print("captured output")\n'
    'return first["output"].strip() + "+" + second["output"].strip()\n'
)


def _run_code(code: str, description: str) -> dict[str, Any]:
    return {"tool": "run_code", "args": {"code": code, "description": description}}


@contextmanager
def _warm_start(on: bool):
    """The session's warm start (``dsh_code_mode.WarmStart``) as shipped, or turned off (it only says ready)."""
    import dsh_code_mode

    shipped = dsh_code_mode.WarmStart.serve

    async def off(self: Any, session: Any, ready: Callable[[], None]) -> None:
        ready()

    dsh_code_mode.WarmStart.serve = shipped if on else off  # type: ignore[method-assign]
    try:
        yield
    finally:
        dsh_code_mode.WarmStart.serve = shipped  # type: ignore[method-assign]


@asynccontextmanager
async def _host(example: str, tmp: Path, rules: dict[str, list[dict[str, Any]]]) -> AsyncIterator[tuple[Any, str]]:
    script = tmp / f"script-{new_id()}.json"
    script.write_text(json.dumps({"rules": [{"when": f"^{k}$", "steps": v} for k, v in rules.items()]}))
    composition = load_composition(example)
    composition = dataclasses.replace(composition, config={**composition.config, "jsonl-persistence": {}})
    async with open_host(composition, provider="scripted", model=str(script)) as host:
        yield host, str(script)


async def _turn(host: Any, agent: Any, prompt: str, turn: int) -> tuple[float, list[Any]]:
    """Play one prompt; ms from the turn's first tool/call to its last tool/result, and the turn's events."""
    agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text=prompt)]))
    await agent.wait_idle()
    _, events = await host.session_store.read(agent.session_id)
    mine = [e for e in events if getattr(e, "turn", None) == turn]
    failed = [e for e in mine if isinstance(e, ToolResultEvent) and e.result.is_error]
    if failed:
        raise SystemExit(f"a tool call of {prompt!r} failed: {failed[0].result.content}")
    start = min(e.time for e in mine if isinstance(e, ToolCallEvent) and e.turn == turn)
    end = max(e.time for e in mine if isinstance(e, ToolResultEvent) and e.turn == turn)
    return (end - start) * 1000, mine


async def first_runs(tmp: Path, workspace: Path, rounds: int, gap: float) -> dict[str, list[float]]:
    """Per round, alternating warm start on and off: the first run_code of a new session (prompt
    ``gap`` s after the session was made) and a later one; and, in sessions prompted at once,
    create_agent and the way to the first model request."""
    out: dict[str, list[float]] = {k: [] for k in (
        "first-on", "first-off", "later-on", "create-on", "create-off", "request-on", "request-off")}
    rules = {"code please": [_run_code(TURN_PROGRAM, "two commands, one answer"), {"text": "done"}],
             "hello": [{"text": "hi"}]}
    async with _host("code-mode", tmp, rules) as (host, script):
        spec = AgentSpec(cwd=str(workspace), provider="scripted", model=script)
        for variant in ("on", "off"):  # a throwaway session each: imports, the sandbox probe
            with _warm_start(variant == "on"):
                agent = host.create_agent(dataclasses.replace(spec, session_id=new_id()))
                await anyio.sleep(gap)
                await _turn(host, agent, "code please", 1)
                await agent.dispose()
        for _ in range(rounds):
            for variant in ("on", "off"):
                with _warm_start(variant == "on"):
                    # session start: prompted at once, the warm start (if on) running alongside
                    t = time.perf_counter()
                    agent = host.create_agent(dataclasses.replace(spec, session_id=new_id()))
                    out[f"create-{variant}"].append((time.perf_counter() - t) * 1000)
                    agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text="hello")]))
                    await agent.wait_idle()
                    _, events = await host.session_store.read(agent.session_id)
                    asked = next(e.time for e in events if isinstance(e, UserMessageEvent))
                    header = next(e.time for e in events if isinstance(e, RequestHeader))
                    out[f"request-{variant}"].append((header - asked) * 1000)
                    await agent.dispose()
                    # the first program of a session prompted after the gap
                    agent = host.create_agent(dataclasses.replace(spec, session_id=new_id()))
                    await anyio.sleep(gap)
                    span, _ = await _turn(host, agent, "code please", 1)
                    out[f"first-{variant}"].append(span)
                    if variant == "on":
                        later, _ = await _turn(host, agent, "code please", 2)
                        out["later-on"].append(later)
                    await agent.dispose()
    return out


SMALL_READS = 10  # reads of the small turns that split a side's time into per read and per turn


async def reads(tmp: Path, workspace: Path, rounds: int, small: int | None = SMALL_READS) -> dict[str, list[float]]:
    """100 reads, native and through a program, alternating, each turn on files of its own
    (``_common.reads_rules``); with ``small``, also turns of that many reads (``native<small>``,
    ``code<small>``), from which the row splits each side into a cost per call and per turn."""
    rules = reads_rules(workspace, rounds)
    sides = ["native", "code"]
    if small:
        rules.update(reads_rules(workspace, rounds, small))
        sides += [f"native{small}", f"code{small}"]
    out: dict[str, list[float]] = {side: [] for side in sides}
    async with _host("both-mode", tmp, rules) as (host, script):
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=script))
        turn = 0
        for i in range(rounds + 1):  # the first round warms up (the sandbox probe, first reads)
            for side in (sides[::-1] if i % 2 else sides):
                turn += 1
                span, _ = await _turn(host, agent, f"{side} {i}", turn)
                if i:
                    out[side].append(span)
        await agent.dispose()
    return out


@contextmanager
def scratch(prefix: str) -> Iterator[tuple[Path, Path]]:
    """A scratch directory and its workspace, both gone afterwards; meanwhile ``DSH_HOME`` (the
    session logs) is inside it and the permission mode workspace-write unless one is set."""
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        tmp = Path(d)
        with env_restored("DSH_HOME", "DSH_PERMISSION_MODE"):
            os.environ["DSH_HOME"] = str(tmp / "home")
            os.environ.setdefault("DSH_PERMISSION_MODE", "workspace-write")
            workspace = tmp / "work"
            workspace.mkdir()
            yield tmp, workspace


async def measure(quick: bool, gap: float) -> dict[str, list[float]]:
    with scratch("dsh-floor-code-") as (tmp, workspace):
        out = await first_runs(tmp, workspace, 2 if quick else 5, gap)
        out.update(await reads(tmp, workspace, 3 if quick else 7))
    return out


def rows(quick: bool = False, gap: float | None = None) -> list[dict[str, Any]]:
    """Each: {"figure", "dsh", "floor", "goal", "met"}; dsh and its peer/floor from one run."""
    gap = (0.5 if quick else 1.0) if gap is None else gap
    m = anyio.run(measure, quick, gap)
    med = {k: statistics.median(v) for k, v in m.items()}
    first = med["first-on"] / ORIGINAL_FIRST_RUN_MS
    start_on = med["create-on"] + med["request-on"]
    start_off = med["create-off"] + med["request-off"]
    ratio = med["code"] / med["native"]
    n = len(m["first-on"])

    def split(side: str) -> str:
        """A side's turn as a cost per read and the rest (its fixed part), from the medians of
        its 100-read and SMALL_READS-read turns."""
        per = (med[side] - med[f"{side}{SMALL_READS}"]) / (100 - SMALL_READS)
        return f"{per * 1000:.0f} us a read + {med[side] - 100 * per:.1f} ms a turn"

    return [
        {"figure": f"a session's first run_code (code-mode-turn, prompt {gap:g} s after session/new)",
         "dsh": f"{med['first-on']:.1f} ms (a later run {med['later-on']:.1f} ms; warm start off "
                f"{med['first-off']:.1f} ms; median of {n})",
         "floor": f"{ORIGINAL_LABEL} {ORIGINAL_FIRST_RUN_MS:.0f} ms",
         "goal": f"<= {FIRST_RUN_GOAL}x: {first:.2f}x", "met": first <= FIRST_RUN_GOAL},
        {"figure": "session start with the warm start: create_agent + prompt to first model request",
         "dsh": f"{start_on:.1f} ms ({med['create-on']:.1f} + {med['request-on']:.1f})",
         "floor": f"warm start off {start_off:.1f} ms ({med['create-off']:.1f} + {med['request-off']:.1f})",
         "goal": f"<= {START_GOAL}x off (+1 ms): {start_on / start_off:.2f}x",
         "met": start_on <= START_GOAL * start_off + 1.0},
        {"figure": "100 reads through code vs 100 native reads (one message)",
         "dsh": f"{med['code']:.1f} ms (median of {len(m['code'])}; {split('code')})",
         "floor": f"native {med['native']:.1f} ms ({split('native')})",
         "goal": f"<= {READS_GOAL}x: {ratio:.2f}x", "met": ratio <= READS_GOAL},
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gap", type=float, default=None, help="seconds between session/new and the prompt")
    args = parser.parse_args()
    t = time.perf_counter()
    result = rows(args.quick, args.gap)
    load = os.getloadavg()[0]
    print(f"code mode vs its floor and peer (load {load:.2f} on {os.cpu_count()} CPUs, "
          f"DSH_PERMISSION_MODE={os.environ.get('DSH_PERMISSION_MODE', 'workspace-write')}, "
          f"{time.perf_counter() - t:.0f} s)")
    for r in result:
        verdict = {True: "meets", False: "MISSES", None: ""}[r["met"]]
        print(f"- {r['figure']}\n    dsh   {r['dsh']}\n    peer  {r['floor']}\n    goal  {r['goal']} -> {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
