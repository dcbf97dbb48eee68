"""What hiding the stored key costs on Landlock alone (issue 45 item 4).

On a machine without bubblewrap, a key ``dsh auth login`` stored in ``$DSH_CONFIG_HOME/credentials``
is hidden by a ruleset that also handles reads and grants them beside the way down to it (see
plugins/sandbox-tools/README.md, "Landlock: the stored key"). The rules are built when a confined
process starts — a session's command server (``bash``, hooks), a terminal, a language server, the
code runtime — never per call. Measured in the same run, alternating, medians:

1. a sandboxed ``bash true`` (a turn of N calls through the session's warm command server, per
   call) with the key hidden vs with nothing to hide (the credentials directory absent inside the
   workspace, which the launcher leaves alone);
2. building the ruleset (``_landlock_exec.build_ruleset``, what the launcher and the command
   server do once before they restrict themselves: each terminal, language server and code
   runtime start pays it) with the credentials directory hidden vs without, in process.

    python bench/floor_landlock.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _common import env_restored
from dsh_sandbox_tools import _landlock_exec
from dsh_sandbox_tools.mechanisms import probe_cached

from dsh_core.compose import load_composition
from dsh_core.contracts import AgentSpec, new_id
from dsh_core.host import open_host
from dsh_core.types import TextBlock, UserMessage

GOAL_RATIO = 1.1  # hiding the key adds nothing measurable to a call: the rules are built once per server
GOAL_BUILD_MS = 1.0  # against a launcher start of ~40 ms (a Python interpreter) and a command server's life


async def _bash_turn(workspace: Path, script: Path, calls: int) -> float:
    """ms per ``bash true`` in one turn, the session's command server already warm."""
    composition = load_composition("acp-agent")
    composition = dataclasses.replace(composition, config={**composition.config, "jsonl-persistence": {}})
    async with open_host(composition, provider="scripted", model=str(script)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text="warm")]))
        await agent.wait_idle()  # the command server starts (and builds its ruleset) on the first call
        started = time.perf_counter()
        agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text="go")]))
        await agent.wait_idle()
        elapsed = time.perf_counter() - started
        await agent.dispose()
    return elapsed / calls * 1000


def _build_ms(rw: list[str], hidden: list[str]) -> float:
    started = time.perf_counter()
    fd, _abi = _landlock_exec.build_ruleset(rw, ["/dev/null"], hidden)
    elapsed = time.perf_counter() - started
    os.close(fd)
    return elapsed * 1000


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ms"


def rows(quick: bool = False) -> list[dict]:
    if _landlock_exec.abi_version() < 1 or probe_cached("landlock").runner is None:
        note = "this kernel has no working Landlock"
        return [{"figure": "sandboxed bash true, stored key hidden (Landlock)", "dsh": note, "floor": "-",
                 "goal": "-", "met": None}]
    calls, rounds, builds = (10, 1, 50) if quick else (60, 7, 500)
    tmp = Path(tempfile.mkdtemp(prefix="dsh-bench-landlock-"))
    outside = Path(tempfile.mkdtemp(prefix="dsh-bench-config-", dir="/var/tmp"))  # as ~/.config/dsh: no root holds it
    try:
        with env_restored("DSH_SANDBOX_MECHANISM", "DSH_CONFIG_HOME", "DSH_PERMISSION_MODE"):
            workspace = tmp / "work"
            workspace.mkdir()
            creds = outside / "credentials"
            creds.mkdir(mode=0o700)
            (creds / "deepseek-api-key").write_text("sk-bench-not-a-key\n")
            script = tmp / "script.json"
            steps = [{"tool": "bash", "args": {"command": "true", "description": "noop"}} for _ in range(calls)]
            script.write_text(json.dumps({"default": [*steps, {"text": "done"}]}))
            os.environ.update(DSH_SANDBOX_MECHANISM="landlock", DSH_PERMISSION_MODE="workspace-write")
            hidden: list[float] = []
            plain: list[float] = []
            for _ in range(rounds):
                for config, out in ((str(outside), hidden), (str(workspace / "no-config"), plain)):
                    os.environ["DSH_CONFIG_HOME"] = config
                    out.append(asyncio.run(_bash_turn(workspace, script, calls)))
            roots = [str(workspace), "/tmp"]
            b_hidden: list[float] = []
            b_plain: list[float] = []
            for _ in range(builds):
                b_hidden.append(_build_ms(roots, [str(creds)]))
                b_plain.append(_build_ms(roots, []))
            rules = len(_landlock_exec.hide_rules([str(creds)]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)
    bash_ratio = statistics.median(hidden) / statistics.median(plain)
    added = statistics.median(b_hidden) - statistics.median(b_plain)
    return [
        {"figure": "sandboxed bash true, stored key hidden vs nothing to hide (Landlock, per call)",
         "dsh": f"{_fmt(hidden)} ({bash_ratio:.2f}x)", "floor": f"{_fmt(plain)} with nothing hidden",
         "goal": f"≤ {GOAL_RATIO}x", "met": bash_ratio <= GOAL_RATIO},
        {"figure": f"Landlock ruleset build with the key hidden ({rules} read rules) vs without (once per confined process)",
         "dsh": f"{_fmt(b_hidden)} ({added:+.2f} ms)", "floor": f"{_fmt(b_plain)} without",
         "goal": f"≤ +{GOAL_BUILD_MS} ms", "met": added <= GOAL_BUILD_MS},
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round, few calls (< 30 s)")
    for row in rows(ap.parse_args().quick):
        met = {True: "met", False: "NOT met", None: "-"}[row["met"]]
        print(f"{row['figure']}: {row['dsh']}  vs  {row['floor']}  (goal {row['goal']}: {met})")
