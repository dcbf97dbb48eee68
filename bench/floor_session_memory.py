"""Memory per extra session: RSS growth per session of the real acp-agent subprocess
(``dsh run --example acp-agent``, scripted instant model, JSONL session logs on) against the
official SDK's echo agent (``_common.SDK_ECHO_AGENT``), both driven by the same SDK client in one
run: after a warm-up, N sessions are opened and each prompted once; the figure is the RSS growth
over those N sessions divided by N. Goal: <= 16 KiB per session.

    python bench/floor_session_memory.py [--quick] [-n 1000] [--rounds 3]

``rows(quick)`` is the row group bench/floors.py prints (quick: 200 sessions, one round).
bench/profile_session_memory.py says where the memory goes (tracemalloc in the same subprocess).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from _common import SDK_ECHO_AGENT, QuietClient

GOAL_KIB = 16.0
FIGURE = "memory per extra session ({n:,} sessions, each prompted once)"
WARM = 30  # sessions before the baseline: first-use caches, imports, arenas



def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def setup(work: Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The two agents' command lines (dsh, sdk) and the environment both run in."""
    script = work / "echo.json"
    script.write_text(json.dumps({"default": [{"text": "echo: {prompt}"}], "repeat_default": True}))
    env = {k: os.environ[k] for k in ("HOME", "PATH", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "PYTHONPATH")
           if k in os.environ}
    env["DSH_HOME"] = str(work / "home")  # JSONL session logs go here (jsonl-persistence is on)
    argv = {
        "dsh": [sys.executable, "-m", "dsh_core.cli", "run", "--example", "acp-agent",
                "--provider", "scripted", "--model", str(script)],
        "sdk": [sys.executable, str(SDK_ECHO_AGENT)],
    }
    return argv, env


async def drive(argv: list[str], cwd: Path, env: dict[str, str], n: int,
                marks: Callable[[str, int], Awaitable[None]] | None = None) -> float:
    """RSS KiB per session over ``n`` sessions opened and prompted once each, after ``WARM``.

    ``marks(label, pid)`` is awaited at "base" (after the warm-up) and "end" (after the n
    sessions): the profile takes its tracemalloc snapshots there."""
    from acp import connect_to_agent, text_block

    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, cwd=str(cwd), env=env, limit=64 * 1024 * 1024,
    )
    client = QuietClient()
    conn = connect_to_agent(client, proc.stdin, proc.stdout)
    try:
        await conn.initialize(protocol_version=1)

        async def one() -> None:
            sid = (await conn.new_session(cwd=str(cwd), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text_block("ping")])

        for _ in range(WARM):
            await one()
        if marks:
            await marks("base", proc.pid)
        base = rss_kib(proc.pid)
        for _ in range(n):
            await one()
        end = rss_kib(proc.pid)
        if marks:
            await marks("end", proc.pid)
        assert client.chunks >= n + WARM, f"expected a chunk per prompt, got {client.chunks}"
        return (end - base) / n
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:  # pragma: no cover
            proc.kill()
            await proc.wait()
        await conn.close()


async def measure(n: int, rounds: int) -> dict[str, float]:
    """Median KiB per session for dsh and the SDK echo agent, alternated round by round."""
    got: dict[str, list[float]] = {"dsh": [], "sdk": []}
    with tempfile.TemporaryDirectory(prefix="dsh-mem-") as d:
        work = Path(d)
        argv, env = setup(work)
        ws = work / "ws"
        ws.mkdir()
        for _ in range(rounds):
            for name in ("dsh", "sdk"):
                got[name].append(await drive(argv[name], ws, env, n))
    return {k: statistics.median(v) for k, v in got.items()}


def rows(quick: bool = False, n: int | None = None, rounds: int | None = None) -> list[dict]:
    n = n or (200 if quick else 1000)
    rounds = rounds or (1 if quick else 3)
    med = asyncio.run(measure(n, rounds))
    dsh, sdk = med["dsh"], med["sdk"]
    return [{
        "figure": FIGURE.format(n=n),
        "dsh": f"{dsh:.1f} KiB",
        "floor": f"SDK echo {sdk:.1f} KiB ({dsh / sdk:.1f}x)" if sdk >= 1 else f"SDK echo {sdk:.1f} KiB",
        "goal": f"<= {GOAL_KIB:.0f} KiB",
        "met": dsh <= GOAL_KIB,
    }]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200 sessions, one round")
    ap.add_argument("-n", type=int, default=None, help="sessions per run (default 1000; quick 200)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds, median (default 3; quick 1)")
    args = ap.parse_args()
    for row in rows(args.quick, args.n, args.rounds):
        met = {True: "met", False: "MISSED", None: ""}[row["met"]]
        print(f"{row['figure']:<62} dsh {row['dsh']:>10}   {row['floor']:<28} goal {row['goal']}  {met}")


if __name__ == "__main__":
    main()
