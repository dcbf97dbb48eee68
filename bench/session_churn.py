"""Session churn: N sessions opened, prompted once and closed (``session/close``) on one
``dsh run --example acp-agent`` connection, driven by the official SDK client. Prints the
agent's RSS at the start (after a warm-up), every 20% of the way and at the end, and the
per-session growth; a second pass without close shows what close gives back.

    python bench/session_churn.py [-n 10000] [--warm 500] [--no-close-pass N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from dsh_testing import spawn_acp


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def churn(n: int, warm: int, close: bool) -> None:
    from acp import text_block

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        script = tmp_path / "script.json"
        script.write_text(json.dumps({"default": [{"text": "PONG"}], "repeat_default": True}))
        work = tmp_path / "work"
        work.mkdir()
        async with spawn_acp(script, cwd=work, env={"DSH_HOME": str(tmp_path / "home")}, check=False) as run:
            await run.conn.initialize(protocol_version=1)

            async def one() -> None:
                sid = (await run.conn.new_session(cwd=str(work), mcp_servers=[])).session_id
                await run.conn.prompt(session_id=sid, prompt=[text_block("ping")])
                if close:
                    await run.conn.close_session(session_id=sid)

            for _ in range(warm):
                await one()
            start = rss_kib(run.proc.pid)
            label = "with close" if close else "without close"
            print(f"[{label}] after {warm} warm-up sessions: RSS {start / 1024:.1f} MiB", flush=True)
            t0 = time.monotonic()
            for i in range(1, n + 1):
                await one()
                if i % max(1, n // 5) == 0:
                    print(f"[{label}] {i:>6} sessions: RSS {rss_kib(run.proc.pid) / 1024:.1f} MiB", flush=True)
            end = rss_kib(run.proc.pid)
            dt = time.monotonic() - t0
            print(f"[{label}] {n} sessions in {dt:.1f}s: RSS {start / 1024:.1f} -> {end / 1024:.1f} MiB, "
                  f"{(end - start) * 1024 / n:.0f} bytes/session", flush=True)
            await run.close_stdin()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10_000)
    ap.add_argument("--warm", type=int, default=500)
    ap.add_argument("--no-close-pass", type=int, default=2_000, help="sessions in the comparison pass (0: skip)")
    args = ap.parse_args()
    asyncio.run(churn(args.n, args.warm, close=True))
    if args.no_close_pass:
        asyncio.run(churn(args.no_close_pass, args.warm, close=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
