"""What a confined hook costs: a PreToolUse hook that runs ``true`` in front of every bash call.

The hook runs confined like the session's bash (a hook file can arrive with a cloned
repository). Measured in the same run, on the acp-agent composition with the real sandbox:

1. a turn of N bash calls (``true``) without hooks — the peer: what a confined fork+exec
   through the session's command server costs;
2. the same turn with ``.claude/settings.json`` holding a PreToolUse hook ``true``.

The difference per call is what the hook adds; goal <= 5 ms (issue 28: a hook under Landlock
used to start ``python -I -S _landlock_exec.py`` first, 21 ms over the wire). ``hook/result``
``durationMs`` (the hook's own wall time as the runner measures it) is printed too.

    python bench/hook_cost.py [--calls N] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from dsh_core.compose import load_composition
from dsh_core.contracts import AgentSpec, new_id
from dsh_core.host import open_host
from dsh_core.types import TextBlock, UserMessage

GOAL_MS = 5.0


async def _turn(workspace: Path, calls: int, tmp: Path) -> tuple[float, list[dict[str, Any]]]:
    steps = [{"tool": "bash", "args": {"command": "true", "description": "noop"}} for _ in range(calls)]
    script = tmp / f"script-{new_id()}.json"
    script.write_text(json.dumps({"default": [*steps, {"text": "done"}]}))
    composition = load_composition("acp-agent")
    composition = dataclasses.replace(composition, config={**composition.config, "jsonl-persistence": {}})
    async with open_host(composition, provider="scripted", model=str(script)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
        # warm: the session's command server starts on its first call, outside the timing
        agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text="warm")]))
        await agent.wait_idle()
        started = time.perf_counter()
        agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text="go")]))
        await agent.wait_idle()
        elapsed = time.perf_counter() - started
        path = host.session_store.path_for(agent.session_id)
        await agent.dispose()
    records = [json.loads(line) for line in Path(path).read_text().splitlines()]
    return elapsed / calls * 1000, [r for r in records if r.get("type") == "hook/result"]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dsh-bench-hooks-") as d:
        tmp = Path(d)
        os.environ.setdefault("DSH_HOME", str(tmp / "home"))
        plain, hooked = tmp / "plain", tmp / "hooked"
        plain.mkdir()
        (hooked / ".claude").mkdir(parents=True)
        (hooked / ".claude" / "settings.json").write_text(json.dumps(
            {"hooks": {"PreToolUse": [{"matcher": "bash", "hooks": [{"type": "command", "command": "true"}]}]}}))
        without, with_, durations = [], [], []
        for _ in range(args.repeat):
            ms, _ = await _turn(plain, args.calls, tmp)
            without.append(ms)
            ms, results = await _turn(hooked, args.calls, tmp)
            with_.append(ms)
            durations += [r["durationMs"] for r in results]
        base, hook = statistics.median(without), statistics.median(with_)
        added = hook - base
        mech = os.environ.get("DSH_SANDBOX_MECHANISM", "auto (bubblewrap, else Landlock)")
        print(f"hook cost, {args.calls} bash calls a turn, median of {args.repeat} turns, mechanism {mech}")
        print(f"  bash `true` per call, no hook (peer)        {base:8.2f} ms")
        print(f"  bash `true` per call, PreToolUse `true`     {hook:8.2f} ms")
        print(f"  added by the confined hook                  {added:8.2f} ms   goal <= {GOAL_MS:g} ms  "
              f"{'ok' if added <= GOAL_MS else 'MISSED'}")
        if durations:
            print(f"  hook/result durationMs (median, p90)        {statistics.median(durations):8.1f} / "
                  f"{sorted(durations)[int(len(durations) * 0.9)]:.1f} ms")


if __name__ == "__main__":
    asyncio.run(main())
