"""Start-up and CPU per prompt of ``dsh run --example acp-agent`` (scripted, instant model),
for one or more dsh installations side by side in the same run (e.g. before and after a change).

For each installation (a Python interpreter that has dsh installed; default: this one):

- start-up: spawn to the ``initialize`` answer, median of ``--starts`` spawns;
- CPU per prompt: the agent process's user+system CPU time over ``--prompts`` sequential
  prompts on one session, divided by the count (from ``/proc/<pid>/stat``, so only the agent's
  own work counts, not the client's).

    python bench/startup_cpu.py [--python /old/venv/bin/python ...] [--starts 10] [--prompts 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from floor_prompt_cpu import RawClient  # the same raw JSON-RPC client (bench/ is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = {"default": [{"text": "PONG"}], "repeat_default": True}


async def spawn(python: str, script: Path, cwd: Path, home: Path) -> RawClient:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"), "DSH_HOME": str(home)}
    proc = await asyncio.create_subprocess_exec(
        python, "-m", "dsh_core.cli", "run", "--example", "acp-agent", "--provider", "scripted", "--model", str(script),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        cwd=cwd, env=env, limit=1 << 24,
    )
    return RawClient(proc)


async def measure(python: str, starts: int, prompts: int, tmp: Path) -> tuple[float, float]:
    script = tmp / "script.json"
    script.write_text(json.dumps(SCRIPT))
    times = []
    for _ in range(starts):
        began = time.perf_counter()
        agent = await spawn(python, script, tmp, tmp / "home")
        await agent.call("initialize", {"protocolVersion": 1})
        times.append(time.perf_counter() - began)
        await agent.close()
    agent = await spawn(python, script, tmp, tmp / "home")
    await agent.call("initialize", {"protocolVersion": 1})
    sid = (await agent.call("session/new", {"cwd": str(tmp), "mcpServers": []}))["sessionId"]
    for _ in range(20):  # warm-up
        await agent.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "ping"}]})
    before = agent.cpu_seconds()
    for _ in range(prompts):
        await agent.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "ping"}]})
    cpu = (agent.cpu_seconds() - before) / prompts
    await agent.close()
    return statistics.median(times), cpu


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", help="an interpreter with dsh installed (repeatable); default: this one")
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=500)
    args = ap.parse_args()
    pythons = args.python or [sys.executable]
    print(f"dsh run --example acp-agent (scripted): start-up median of {args.starts}, CPU over {args.prompts} prompts")
    print(f"  {'installation':<48} {'start-up':>10} {'CPU/prompt':>12}")
    for python in pythons:
        with tempfile.TemporaryDirectory(prefix="dsh-bench-start-") as d:
            start, cpu = await measure(python, args.starts, args.prompts, Path(d))
        print(f"  {python:<48} {start * 1000:8.0f} ms {cpu * 1e6:9.0f} µs")


if __name__ == "__main__":
    asyncio.run(main())
