"""ACP round-trip benchmark: dsh's acp-agent (scripted, instant model) vs a minimal echo agent
on the official SDK's agent side, both driven by the same official SDK client in one run.

Prints prompts/s for 200 sequential prompts and for 20 sessions x 20 prompts (concurrent
sessions), and the time from spawn to the initialize answer; then ours/SDK ratios. A last
row drives both agents with dsh's own (msgspec) client instead, which costs less per frame
than the SDK client and so shows more of each agent's own cost.
Goal: throughput >= 2x the SDK agent's, start-up <= 1x.

    python bench/acp_roundtrip.py [--repeat 3]
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
from typing import Any

from _common import SDK_ECHO_AGENT, QuietClient
from acp import connect_to_agent, text_block


async def spawn(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[Any, Any, QuietClient]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, cwd=cwd, env=env, limit=64 * 1024 * 1024,
    )
    client = QuietClient()
    return connect_to_agent(client, proc.stdin, proc.stdout), proc, client


async def measure(name: str, argv: list[str], cwd: str, env: dict[str, str]) -> dict[str, float]:
    t0 = time.perf_counter()
    conn, proc, client = await spawn(argv, cwd, env)
    await conn.initialize(protocol_version=1)
    startup = time.perf_counter() - t0

    sid = (await conn.new_session(cwd=cwd, mcp_servers=[])).session_id
    for _ in range(10):  # warm-up
        await conn.prompt(session_id=sid, prompt=[text_block("warm")])
    t0 = time.perf_counter()
    for i in range(200):
        await conn.prompt(session_id=sid, prompt=[text_block(f"q{i}")])
    sequential = 200 / (time.perf_counter() - t0)

    sids = [(await conn.new_session(cwd=cwd, mcp_servers=[])).session_id for _ in range(20)]

    async def run(s: str) -> None:
        for i in range(20):
            await conn.prompt(session_id=s, prompt=[text_block(f"q{i}")])

    t0 = time.perf_counter()
    await asyncio.gather(*(run(s) for s in sids))
    concurrent = 400 / (time.perf_counter() - t0)
    proc.stdin.close()
    await asyncio.wait_for(proc.wait(), 10)
    await conn.close()
    assert client.chunks >= 610, f"{name}: expected a chunk per prompt, got {client.chunks}"
    return {"startup_ms": startup * 1000, "sequential": sequential, "concurrent": concurrent}


async def measure_fast_client(argv: list[str], cwd: str, env: dict[str, str]) -> float:
    """200 sequential prompts driven by dsh's own msgspec client: a lighter client shows
    more of each server's own cost than the SDK client (pydantic) does."""
    from dsh_acp.client import open_client

    async with open_client(argv, cwd=cwd, env=env) as client:
        await client.start()
        for _ in range(10):
            await client.prompt("warm")
        t0 = time.perf_counter()
        for i in range(200):
            result = await client.prompt(f"q{i}")
            assert result.stop_reason == "end_turn" and result.text, result
        return 200 / (time.perf_counter() - t0)


async def main(repeat: int) -> None:
    work = tempfile.mkdtemp(prefix="dsh-bench-")
    script = Path(work) / "echo.json"
    script.write_text(json.dumps({"default": [{"text": "echo: {prompt}"}]}))
    env = {k: os.environ[k] for k in ("HOME", "PATH", "USER", "LOGNAME", "SHELL", "TERM") if k in os.environ}
    env["DSH_HOME"] = str(Path(work) / "home")
    ours = [sys.executable, "-m", "dsh_core.cli", "run", "--example", "acp-agent",
            "--provider", "scripted", "--model", str(script)]
    sdk = [sys.executable, str(SDK_ECHO_AGENT)]
    results: dict[str, list[dict[str, float]]] = {"dsh": [], "sdk": []}
    for _ in range(repeat):  # interleaved, so drift on the machine hits both alike
        results["dsh"].append(await measure("dsh", ours, work, env))
        results["sdk"].append(await measure("sdk", sdk, work, env))
        results["dsh"][-1]["fast_client"] = await measure_fast_client(ours, work, env)
        results["sdk"][-1]["fast_client"] = await measure_fast_client(sdk, work, env)
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    print(f"ACP round trip, median of {repeat} runs (dsh: acp-agent with the scripted instant model,"
          " writing JSONL session logs; sdk: official SDK echo agent)")
    print(f"{'':40}{'dsh':>12}{'sdk':>12}{'dsh/sdk':>10}")
    rows = [("200 sequential prompts (prompts/s)", "sequential"),
            ("20 sessions x 20 prompts (prompts/s)", "concurrent"),
            ("200 sequential, dsh client (prompts/s)", "fast_client"),
            ("spawn -> initialize answer (ms)", "startup_ms")]
    for label, key in rows:
        d, s = med["dsh"][key], med["sdk"][key]
        print(f"{label:<40}{d:>12.1f}{s:>12.1f}{d / s:>9.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    asyncio.run(main(parser.parse_args().repeat))
