"""Subagent figures (issue 31), each printed beside its goal and a peer measured in the same run:

- start cost: spawn to the child's first model request, in-process (``spawn``), goal <= 5 ms,
  against subagent-acp's process child (``acp``: a fresh ``dsh run`` over ACP);
- fork cache: the share of a fork child's first prompt served from the parent's prefix cache
  (the loopback fake DeepSeek server counts it), goal >= 90%, against a fresh ``spawn`` child's
  first prompt in the same session;
- scale: memory per idle continuable child, 100 of them in one host, goal <= 200 KB each,
  against one process child's RSS;
- teardown: SIGKILL of ``dsh run --example acp-agent`` while its background children run
  sandboxed commands, goal 0 processes left, with the number that were running.

    python bench/subagents.py [--starts 200] [--children 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins" / "deepseek-model" / "tests"))

from fake_deepseek import FakeDeepSeek, Turn  # noqa: E402

from dsh_core.compose import load_composition  # noqa: E402
from dsh_core.contracts import AgentSpec, new_id  # noqa: E402
from dsh_core.host import open_host  # noqa: E402
from dsh_core.protocols import SubagentRequest  # noqa: E402
from dsh_core.types import TextBlock, UserMessage  # noqa: E402
from dsh_testing import memory_host  # noqa: E402

EXAMPLES = {"DSH_EXAMPLES_PATH": str(ROOT / "examples")}


def rss_kb(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _first_requests(host: Any) -> dict[str, float]:
    """session id -> perf_counter() of its first model request (the scripted provider, patched)."""
    seen: dict[str, float] = {}
    model = host.models["scripted"]
    original = model.stream

    def stream(request: Any) -> Any:
        seen.setdefault(request.session_id, time.perf_counter())
        return original(request)

    model.stream = stream
    return seen


async def start_cost(work: Path, n: int) -> list[float]:
    """ms from ``provider.start`` to the child's first model request, ``spawn`` in a host of the
    acp-agent composition (its system prompt, instructions, hooks and tools are built per child)."""
    script = work / "start.json"
    script.write_text(json.dumps({"default": [{"text": "ok"}]}))
    times = []
    shipped = load_composition("acp-agent")
    config = {**shipped.config, "subagents": {"max-running": n + 1}}
    async with open_host(dataclasses.replace(shipped, config=config), provider="scripted", model=str(script)) as host:
        seen = _first_requests(host)
        parent = host.create_agent(AgentSpec(cwd=str(work), provider="scripted", model=str(script)))
        spawn = host.subagent_providers["spawn"]
        for i in range(n):
            request = SubagentRequest(prompt=f"task {i}", description="bench", parent=parent, cwd=str(work), depth=1,
                                      call_id=f"call_{i}", continuable=False)
            t0 = time.perf_counter()
            run = await spawn.start(request)
            while run.session_id not in seen:
                await asyncio.sleep(0)
            times.append((seen[run.session_id] - t0) * 1000)
            await run.result()
            await run.dispose()
    return times


async def acp_start_cost(work: Path, n: int) -> list[float]:
    """ms from ``provider.start`` to the process child's first model request (its script marks a
    file as that call starts), subagent-acp's ``acp`` provider."""
    script = work / "acp.json"
    script.write_text(json.dumps({"default": [{"text": "ok"}]}))
    times = []
    async with memory_host(script, plugins=("scripted-model", "subagent-acp", "subagents")) as host:
        parent = host.create_agent(AgentSpec(cwd=str(work), provider="scripted", model=str(script)))
        acp = host.subagent_providers["acp"]
        for i in range(n):
            mark = work / f"acp-first-{i}"
            script.write_text(json.dumps({"default": [{"mark": mark.name, "text": "ok"}]}))
            request = SubagentRequest(prompt=f"task {i}", description="bench", parent=parent, cwd=str(work), depth=1,
                                      call_id=f"call_{i}")
            t0 = time.perf_counter()
            run = await acp.start(request)
            while not mark.exists():
                await asyncio.sleep(0.0005)
            times.append((time.perf_counter() - t0) * 1000)
            await run.result()
            await run.dispose()
    return times


async def fork_cache(work: Path) -> tuple[tuple[int, int], tuple[int, int]]:
    """(prompt, cache-hit) tokens of a fork child's first request and of a spawn child's, after a
    tool-heavy first turn, through the deepseek-model adapter and the loopback fake."""
    for i in range(12):
        (work / f"m{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j}\n\n" for j in range(12)))
    fake = FakeDeepSeek(keepalive_every_s=0.05).start()
    os.environ["DEEPSEEK_BASE_URL"] = fake.base_url
    os.environ["DEEPSEEK_API_KEY"] = fake.api_key  # the fake's own dummy key
    turns = [Turn(reasoning=f"look at m{i}", tool_calls=[("read", json.dumps({"path": f"m{i}.py"}))]) for i in range(12)]
    turns.append(Turn(content="Read every module."))
    turns.append(Turn(tool_calls=[("subagent_fork", json.dumps({"description": "recall", "prompt": "Which module has f3_4?"}))]))
    turns.append(Turn(content="m3.py"))  # the fork child
    turns.append(Turn(tool_calls=[("subagent", json.dumps({"description": "fresh", "prompt": "Which module has f3_4?",
                                                           "run_in_background": False}))]))
    turns.append(Turn(content="I would have to look."))  # the spawn child
    turns.append(Turn(content="done"))
    fake.push(*turns)
    shipped = load_composition("acp-agent")
    config = {**shipped.config, "deepseek-model": {"deadline": 20.0, "dotenv": False,
                                                    "retry": {"max-retries": 0, "base-delay": 0.01}}}
    try:
        async with open_host(dataclasses.replace(shipped, config=config), provider="deepseek",
                             model="deepseek-flash") as host:
            agent = host.create_agent(AgentSpec(cwd=str(work), provider="deepseek", model="deepseek-flash"))
            for text in ("Read every module.", "Ask a fork, then a fresh subagent, which module has f3_4."):
                agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text=text)]))
                await agent.wait_idle()
    finally:
        fake.stop()
    chats = fake.chat_requests
    fork, spawn = chats[14], chats[16]  # 13 calls of turn 1, the parent's fork call, then the child's
    for r in (fork, spawn):
        assert r.status == 200, r.status
    return (fork.prompt_tokens, fork.cache_hit_tokens), (spawn.prompt_tokens, spawn.cache_hit_tokens)


async def idle_children(work: Path, n: int) -> tuple[float, float]:
    """(KB of Python heap, KB of RSS) per idle continuable child: one message spawns ``n``
    background children, each answers and stays idle (its agent, its open log, its history).
    The heap figure (tracemalloc: what the children's objects hold) is the one against the goal;
    RSS grows in allocator arenas and pages, so it is shown beside it."""
    script = work / "fan.json"
    script.write_text(json.dumps({"rules": [
        {"when": "^fan out", "steps": [{"tools": [{"name": "subagent", "args": {"description": f"c{i}",
                                                                                 "prompt": f"child {i}"}}
                                                  for i in range(n)]}, {"text": "started"}]},
        {"when": "^warm", "steps": [{"tool": "subagent", "args": {"description": "w", "prompt": "child w"}},
                                    {"text": "warm"}]}],
        "default": [{"text": "done"}]}))
    config = {"subagents": {"max-running": n + 10}}
    async with memory_host(script, plugins=("scripted-model", "jsonl-persistence", "subagents"), config=config) as host:
        parent = host.create_agent(AgentSpec(cwd=str(work), provider="scripted", model=str(script)))

        async def settle(text: str, count: int) -> None:
            parent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text=text)]))
            await parent.wait_idle()
            while len(parent.children) < count or any(c.busy for c in parent.children):
                await asyncio.sleep(0.01)

        await settle("warm up", 1)  # imports and first-use caches, not per-child cost
        gc.collect()
        tracemalloc.start()
        heap0, rss0 = tracemalloc.get_traced_memory()[0], rss_kb()
        await settle("fan out", n + 1)
        gc.collect()
        heap1, rss1 = tracemalloc.get_traced_memory()[0], rss_kb()
        tracemalloc.stop()
        assert all(not c.busy for c in parent.children)
    return (heap1 - heap0) / 1024 / n, (rss1 - rss0) / n


def child_process_rss(work: Path) -> int:
    """KB of RSS of one idle ``dsh run --example acp-agent`` (what an ``acp`` child costs)."""
    script = work / "idle.json"
    script.write_text(json.dumps({"default": [{"text": "ok"}]}))
    env = {**os.environ, **EXAMPLES, "DSH_HOME": str(work / "home-rss")}
    proc = subprocess.Popen([sys.executable, "-m", "dsh_core.cli", "run", "--example", "acp-agent", "--provider",
                             "scripted", "--model", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, cwd=work)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}\n')
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                                 "params": {"cwd": str(work), "mcpServers": []}}).encode() + b"\n")
    proc.stdin.flush()
    proc.stdout.readline()
    proc.stdout.readline()
    kb = rss_kb(proc.pid)
    proc.stdin.close()
    proc.wait(10)
    return kb


def teardown_kill(work: Path, n: int = 6) -> tuple[int, int]:
    """(sandboxed commands that ran, processes left) after SIGKILL of dsh mid-fan-out."""
    marker = f"{time.time_ns() % 10**9}"
    script = work / "kill.json"
    script.write_text(json.dumps({"rules": [
        {"when": "^fan out", "steps": [{"tools": [{"name": "subagent", "args": {"description": f"c{i}",
                                                                                 "prompt": f"child {i}"}}
                                                  for i in range(n)]}, {"text": "started"}]},
        {"when": "^child", "steps": [{"tool": "bash", "args": {"description": "Run the command", "command": f"sleep 600.{marker}", "timeout": 600}},
                                     {"text": "done"}]}]}))
    env = {**os.environ, **EXAMPLES, "DSH_HOME": str(work / "home-kill")}
    proc = subprocess.Popen([sys.executable, "-m", "dsh_core.cli", "run", "--example", "acp-agent", "--provider",
                             "scripted", "--model", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, cwd=work)
    assert proc.stdin is not None and proc.stdout is not None
    frames = [{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}},
              {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": str(work), "mcpServers": []}}]
    for f in frames:
        proc.stdin.write(json.dumps(f).encode() + b"\n")
        proc.stdin.flush()
        proc.stdout.readline()
    sid = json.loads(Path(work / "home-kill" / "sessions").glob("*.jsonl").__next__().read_text().splitlines()[0])["id"]
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
                                 "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "fan out"}]}}).encode()
                     + b"\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    running = 0
    while time.monotonic() < deadline and (running := len(_with_marker(marker))) < n:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    time.sleep(1.0)  # what dies with its parent has died by now
    left = _with_marker(marker)
    for pid in left:  # never leave them behind, whatever the figure says
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return running, len(left)


def _with_marker(marker: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"sleep 600.{marker}" in cmd and "bash" not in cmd.split()[0] and "-c" not in cmd.split():
            found.append(int(d.name))
    return found


def pct(xs: list[float], p: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=200, help="in-process spawns to time (default 200)")
    ap.add_argument("--acp-starts", type=int, default=5, help="process children to time (default 5)")
    ap.add_argument("--children", type=int, default=100, help="idle children for the memory figure (default 100)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["DSH_HOME"] = str(root / "home")
        os.environ.update(EXAMPLES)
        for name in ("start", "acp", "fork", "idle", "kill", "rss"):
            (root / name).mkdir()
        spawn = await start_cost(root / "start", args.starts)
        acp = await acp_start_cost(root / "acp", args.acp_starts)
        (fp, fh), (sp, sh) = await fork_cache(root / "fork")
        per_child, per_child_rss = await idle_children(root / "idle", args.children)
        process_kb = child_process_rss(root / "rss")
        running, left = teardown_kill(root / "kill")
    print(f"{'figure':<44} {'dsh':>14} {'peer':>16} {'goal':>10}")
    print(f"{'start: spawn → first model request (median)':<44} {statistics.median(spawn):>11.2f} ms "
          f"{statistics.median(acp):>13.0f} ms {'<= 5 ms':>10}")
    print(f"{'start: p95':<44} {pct(spawn, 0.95):>11.2f} ms {pct(acp, 0.95):>13.0f} ms")
    print(f"{'fork: first prompt from the prefix cache':<44} {fh / fp:>13.1%} {sh / sp:>15.1%}  {'>= 90%':>9}")
    print(f"{'  (tokens: cache hit / prompt)':<44} {fh:>6}/{fp:<7} {sh:>7}/{sp:<8}")
    print(f"{f'scale: heap per idle child ({args.children})':<44} {per_child:>11.0f} KB {process_kb:>13,} KB "
          f"{'<= 200 KB':>10}")
    print(f"{'  (RSS growth per idle child)':<44} {per_child_rss:>11.0f} KB")
    print(f"{'teardown: processes left after SIGKILL':<44} {left:>14} {f'of {running} running':>16} {'0':>10}")
    print("peers: start and RSS against subagent-acp's process child (dsh run --example acp-agent over ACP); fork "
          "against a fresh spawn child's first request in the same session")
    goals = [statistics.median(spawn) <= 5, fh / fp >= 0.9, per_child <= 200, left == 0]
    print("goals met" if all(goals) else f"goals missed: {[n for n, ok in zip(('start', 'fork', 'scale', 'teardown'), goals, strict=True) if not ok]}")


if __name__ == "__main__":
    asyncio.run(main())
