"""Agent CPU per text prompt: dsh's acp-agent vs the official SDK's echo agent (the floor).

Both agents are subprocesses driven by the same minimal raw JSON-RPC client (one line per
frame, stdlib ``json``), so the client's cost is in neither figure. Per agent: ``initialize``,
``session/new``, a warm-up of prompts, then ``--prompts`` text prompts in a row on one session;
the figure is the agent process's own CPU time (``/proc/<pid>/task/*/schedstat``) over those
prompts divided by their count. dsh runs ``--example acp-agent`` with the scripted instant model
and its JSONL session log on (every event written, as in production). Rounds alternate dsh and
echo so drift on a shared machine hits both alike; the row reports the median of the rounds.

Goal (issue 45): dsh ≤ 1.5x echo.

``--base SRC`` adds a third agent to every round: the same acp-agent run from another source tree
(e.g. ``git archive <commit> | tar -x -C SRC``) through ``PYTHONPATH`` (its ``dsh_core`` and every
``plugins/*`` package ahead of this installation's), for a before/after in one run.

    python bench/floor_prompt_cpu.py [--rounds 3] [--prompts 500] [--quick] [--base SRC]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _common import SDK_ECHO_AGENT

TICKS = os.sysconf("SC_CLK_TCK")
SCRIPT = {"default": [{"text": "echo: {prompt}"}], "repeat_default": True}
GOAL = 1.5


class RawClient:
    """JSON-RPC over a subprocess's stdio, one JSON document per line; notifications are read
    and dropped (each agent sends one agent_message_chunk per prompt)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.next_id = 0
        self.notes = 0

    async def call(self, method: str, params: dict) -> dict:
        rid = self.next_id
        self.next_id += 1
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n")
        await self.proc.stdin.drain()
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"agent closed its stdout during {method}")
            frame = json.loads(line)
            if "method" in frame:
                self.notes += 1
                continue
            if frame.get("id") == rid:
                if "error" in frame:
                    raise RuntimeError(f"{method}: {frame['error']}")
                return frame["result"]

    def cpu_seconds(self) -> float:
        """The process's CPU time: its threads' ``schedstat`` run time (nanoseconds; a thread that
        ended meanwhile is not counted: the agents' threads live on), else ``stat``'s
        utime + stime (clock ticks: 10 ms steps)."""
        try:
            return sum(int((t / "schedstat").read_text().split()[0])
                       for t in Path(f"/proc/{self.proc.pid}/task").iterdir()) / 1e9
        except (OSError, ValueError, IndexError):
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / TICKS

    async def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def commands(work: Path) -> dict[str, list[str]]:
    script = work / "script.json"
    script.write_text(json.dumps(SCRIPT))
    return {
        "dsh": [sys.executable, "-m", "dsh_core.cli", "run", "--example", "acp-agent",
                "--provider", "scripted", "--model", str(script)],
        "echo": [sys.executable, str(SDK_ECHO_AGENT)],
    }


def source_path(src: Path) -> str:
    """PYTHONPATH running dsh from the source tree ``src`` (core and plugins) instead."""
    return os.pathsep.join([str(src), *(str(d) for d in sorted((src / "plugins").iterdir()) if d.is_dir())])


async def cpu_per_prompt(argv: list[str], work: Path, prompts: int, warmup: int, pythonpath: str | None = None) -> float:
    env = {k: os.environ[k] for k in ("HOME", "PATH", "USER", "LOGNAME", "SHELL", "TERM") if k in os.environ}
    env["DSH_HOME"] = str(work / "home")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, cwd=work, env=env, limit=1 << 24,
    )
    client = RawClient(proc)
    try:
        await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        sid = (await client.call("session/new", {"cwd": str(work), "mcpServers": []}))["sessionId"]
        prompt = [{"type": "text", "text": "ping"}]
        for _ in range(warmup):
            await client.call("session/prompt", {"sessionId": sid, "prompt": prompt})
        notes = client.notes
        before = client.cpu_seconds()
        for _ in range(prompts):
            result = await client.call("session/prompt", {"sessionId": sid, "prompt": prompt})
            assert result.get("stopReason") == "end_turn", result
        cpu = client.cpu_seconds() - before
        assert client.notes - notes >= prompts, "expected at least one update per prompt"
        return cpu / prompts
    finally:
        await client.close()


async def measure(rounds: int, prompts: int, warmup: int, base: Path | None = None) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"dsh": [], "echo": []}
    paths: dict[str, str | None] = {"dsh": None, "echo": None}
    if base is not None:
        out["base"], paths["base"] = [], source_path(base.resolve())
    with tempfile.TemporaryDirectory(prefix="dsh-floor-cpu-") as d:
        work = Path(d)
        argvs = commands(work)
        argvs["base"] = argvs["dsh"]
        for _ in range(rounds):  # alternate, so drift on the machine hits each alike
            for name in out:
                out[name].append(await cpu_per_prompt(argvs[name], work, prompts, warmup, paths[name]))
    return out


def rows(quick: bool = False) -> list[dict]:
    rounds, prompts, warmup = (1, 150, 20) if quick else (3, 500, 50)
    got = asyncio.run(measure(rounds, prompts, warmup))
    dsh, echo = statistics.median(got["dsh"]), statistics.median(got["echo"])
    ratio = dsh / echo if echo else float("inf")
    return [{
        "figure": f"agent CPU per text prompt ({prompts} in a row)",
        "dsh": f"{dsh * 1e3:.3f} ms ({ratio:.2f}x)",
        "floor": f"SDK echo {echo * 1e3:.3f} ms",
        "goal": f"≤ {GOAL}x echo",
        "met": None if quick else ratio <= GOAL,
    }]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="the rows(quick=True) smoke size")
    ap.add_argument("--base", type=Path, help="also measure the acp-agent of this source tree (before/after)")
    args = ap.parse_args()
    if args.quick:
        result = rows(quick=True)
    else:
        got = asyncio.run(measure(args.rounds, args.prompts, args.warmup, args.base))
        for name, vals in got.items():
            print(f"  {name:<5} " + "  ".join(f"{v * 1e3:.3f}" for v in vals) + " ms/prompt", file=sys.stderr)
        dsh, echo = statistics.median(got["dsh"]), statistics.median(got["echo"])
        if "base" in got:
            base = statistics.median(got["base"])
            print(f"  base {base * 1e3:.3f} ms ({base / echo:.2f}x echo) → this tree {dsh * 1e3:.3f} ms "
                  f"({dsh / echo:.2f}x echo): {dsh / base:.2f}x base", file=sys.stderr)
        ratio = dsh / echo
        result = [{
            "figure": f"agent CPU per text prompt ({args.prompts} in a row)",
            "dsh": f"{dsh * 1e3:.3f} ms ({ratio:.2f}x)", "floor": f"SDK echo {echo * 1e3:.3f} ms",
            "goal": f"≤ {GOAL}x echo", "met": ratio <= GOAL,
        }]
    for row in result:
        print(f"{row['figure']:<48} {row['dsh']:>20} {row['floor']:>22} {row['goal']:>12}  met={row['met']}")


if __name__ == "__main__":
    main()
