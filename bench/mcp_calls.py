"""MCP benchmark: what dsh adds to an MCP tool call, against the bare SDK client in the same run.

Both talk to the same server (``plugins/mcp-client/tests/fixture_server.py``, the official SDK,
over stdio), started fresh for each side:

1. Start: from asking for the server to its tools being listed. The SDK: ``Client`` entered
   and ``list_tools``. dsh: ``create_agent`` until the session has the server's tools (the
   mcp-client plugin's link: the same SDK calls, plus publishing the tools to the session).
2. Calls: N sequential ``echo`` calls. The SDK: ``client.call_tool``. dsh: ``agent.call_tool``
   (the whole tool path: argument checks, interception hooks, the call, the result mapped
   to a ToolOutput, after-tool hooks). Printed per call (median of the repeats) and as a ratio.

    python bench/mcp_calls.py [--calls N] [--repeat R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from dsh_core.contracts import AgentSpec
from dsh_testing import memory_host

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = str(ROOT / "plugins" / "mcp-client" / "tests" / "fixture_server.py")
SCRIPT = '{"default": [{"text": "unused"}]}'


async def sdk(calls: int) -> tuple[float, float]:
    started = time.perf_counter()
    async with Client(StdioServerParameters(command=sys.executable, args=[FIXTURE, "stdio"])) as client:
        await client.list_tools()
        start = time.perf_counter() - started
        t0 = time.perf_counter()
        for i in range(calls):
            await client.call_tool("echo", {"text": f"call {i}"})
        return start, (time.perf_counter() - t0) / calls


async def dsh(calls: int, work: Path) -> tuple[float, float]:
    script = work / "script.json"
    script.write_text(SCRIPT)
    config = {"mcp-client": {"servers": [{"name": "fx", "command": sys.executable, "args": [FIXTURE, "stdio"]}]}}
    async with memory_host(script, plugins=("scripted-model", "mcp-client"), config=config) as host:
        started = time.perf_counter()
        agent = host.create_agent(AgentSpec(cwd=str(work), provider="scripted", model=str(script)))
        while "mcp__fx__echo" not in agent.tools:
            await anyio.sleep(0.001)
        start = time.perf_counter() - started
        t0 = time.perf_counter()
        for i in range(calls):
            out = await agent.call_tool("mcp__fx__echo", {"text": f"call {i}"}, call_id=f"c{i}", turn=1, step=1)
            assert not out.is_error, out
        per_call = (time.perf_counter() - t0) / calls
        await agent.dispose()
        return start, per_call


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows: dict[str, list[tuple[float, float]]] = {"sdk": [], "dsh": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):  # alternating, so drift hits both sides alike
            rows["sdk"].append(await sdk(args.calls))
            rows["dsh"].append(await dsh(args.calls, Path(tmp)))
    start = {k: statistics.median(s for s, _ in v) * 1000 for k, v in rows.items()}
    call = {k: statistics.median(c for _, c in v) * 1e6 for k, v in rows.items()}
    print(f"MCP over stdio (fixture server), {args.calls} calls, median of {args.repeat}")
    print(f"  start to tools listed   SDK client {start['sdk']:7.1f} ms   dsh session {start['dsh']:7.1f} ms")
    print(f"  one echo call           SDK client {call['sdk']:7.0f} us   dsh tool path {call['dsh']:7.0f} us"
          f"   ratio {call['dsh'] / call['sdk']:.2f}x   (+{call['dsh'] - call['sdk']:.0f} us a call)")


if __name__ == "__main__":
    anyio.run(main)
