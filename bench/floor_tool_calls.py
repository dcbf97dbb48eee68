"""What a sandboxed tool call and a confined hook cost, each beside its floor, in one run.

Rows (per mechanism: Landlock always, bubblewrap too when ``bwrap`` is installed):

1. "sandboxed bash true, turn minus text turn": one session of the acp-agent composition (real
   host, real tool path, JSONL log on, scripted instant model) alternates a turn of one ``bash``
   call ``true`` with a turn of text only; the median difference. Floor: a confined process
   (wrapped by the mechanism's own runner, so the very same ruleset) that times a fork+exec of
   ``bash -c true`` and waits for it. Goal: <= 2x the floor.
2. "a confined PreToolUse hook true, added per tool call": the same bash turn in a second
   session of that host, whose workspace's ``.claude/settings.json`` has a PreToolUse hook
   ``true``, minus the bash turn without it (the three kinds of turn alternate). Floor: that confined process timing ``/bin/sh -c true`` (what the hook runs). Goal: <= 2 ms.

All timings alternate (text, bash, hook turn; floor batches between rounds) and report medians:
the machine may be shared, so read the ratio against the floor measured in the same run.

    python bench/floor_tool_calls.py [--quick] [--under-load]

Profiling the bash path: ``DSH_BENCH_PROFILE=out.prof python bench/floor_tool_calls.py --quick``
writes a cProfile of the host side of the bash turns (read it with ``python -m pstats``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The floor: runs inside the confinement, spawns argv N times, prints the medians in ms.
_FLOOR = r"""
import os, sys, time, json
argv = json.loads(sys.argv[1]); n = int(sys.argv[2]); out = []
exe = argv[0]
env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
null = os.open("/dev/null", os.O_RDWR)
for _ in range(n):
    t = time.perf_counter()
    pid = os.posix_spawn(exe, argv, env, file_actions=[(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, null, 1)], setsid=True)
    os.waitpid(pid, 0)
    out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"""

BASH = shutil.which("bash") or "/bin/bash"
HOOK_GOAL_MS = 2.0
BASH_GOAL_X = 2.0


def _floor(runner: Any, roots: list[str], cwd: str, argv: list[str], n: int) -> list[float]:
    cmd = runner.wrap([sys.executable, "-I", "-S", "-c", _FLOOR, json.dumps(argv), str(n)], roots, cwd)
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])[1:]  # the first spawn warms the page cache


def _script(tmp: Path) -> Path:
    script = tmp / "script.json"
    script.write_text(json.dumps({
        "rules": [
            {"when": "^bash", "steps": [{"tool": "bash", "args": {"command": "true", "description": "noop"}},
                                        {"text": "done"}]},
        ],
        "default": [{"text": "done"}],
    }))
    return script


async def _session_turns(workspaces: dict[str, Path], script: Path, prompts: list[tuple[str, str]],
                         profile: cProfile.Profile | None = None) -> dict[str, list[float]]:
    """One host, one session per workspace; ``prompts``: (workspace name, prompt) in turn order,
    so the turns being compared alternate in time. Times by "<workspace> <prompt>"."""
    from dsh_core.compose import load_composition
    from dsh_core.contracts import AgentSpec, new_id
    from dsh_core.host import open_host
    from dsh_core.types import TextBlock, UserMessage

    composition = load_composition("acp-agent")
    composition = dataclasses.replace(composition, config={**composition.config, "jsonl-persistence": {}})
    times: dict[str, list[float]] = {}
    async with open_host(composition, provider="scripted", model=str(script)) as host:
        agents = {name: host.create_agent(AgentSpec(cwd=str(ws), provider="scripted", model=str(script)))
                  for name, ws in workspaces.items()}
        warm = [(name, p) for name in agents for p in ("bash warm", "text warm")]  # each starts its command server
        for name, prompt in [*warm, *prompts]:
            agent = agents[name]
            on = profile is not None and not prompt.endswith("warm") and prompt.startswith("bash")
            started = time.perf_counter()
            if on:
                profile.enable()
            agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text=prompt)]))
            await agent.wait_idle()
            if on:
                profile.disable()
            if not prompt.endswith("warm"):
                times.setdefault(f"{name} {prompt}", []).append((time.perf_counter() - started) * 1000)
        for agent in agents.values():
            await agent.dispose()
    return times


async def _measure(mechanism: str, rounds: int, turns: int, tmp: Path) -> dict[str, Any]:
    os.environ["DSH_SANDBOX_MECHANISM"] = mechanism
    from dsh_sandbox_tools import mechanisms
    from dsh_sandbox_tools.policy import writable_roots

    probe = await mechanisms.get_runner(mechanism)
    if probe.runner is None:
        raise RuntimeError(f"{mechanism}: {probe.summary()}")
    plain, hooked = tmp / f"plain-{mechanism}", tmp / f"hooked-{mechanism}"
    plain.mkdir()
    (hooked / ".claude").mkdir(parents=True)
    (hooked / ".claude" / "settings.json").write_text(json.dumps(
        {"hooks": {"PreToolUse": [{"matcher": "bash", "hooks": [{"type": "command", "command": "true"}]}]}}))
    script = _script(tmp)
    profile_to = os.environ.get("DSH_BENCH_PROFILE")
    profile = cProfile.Profile() if profile_to else None
    text, bash, hook, fbash, fsh = [], [], [], [], []
    for _ in range(rounds):
        order = [("plain", "text"), ("plain", "bash"), ("hooked", "bash")] * turns
        t = await _session_turns({"plain": plain, "hooked": hooked}, script, order, profile)
        text += t["plain text"]
        bash += t["plain bash"]
        hook += t["hooked bash"]
        roots = writable_roots("workspace-write", str(plain))
        fbash += await asyncio.to_thread(_floor, probe.runner, roots, str(plain), [BASH, "-c", "true"], turns + 1)
        fsh += await asyncio.to_thread(_floor, probe.runner, roots, str(plain), ["/bin/sh", "-c", "true"], turns + 1)
    if profile is not None and profile_to:
        profile.dump_stats(profile_to)
    med = statistics.median
    return {"text": med(text), "bash": med(bash), "hook": med(hook), "floor_bash": med(fbash),
            "floor_sh": med(fsh), "detail": probe.runner.detail or probe.runner.name}


def _busy(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning a CPU each: the "under load" rows (the issue's 8.9 ms)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def rows(quick: bool = False, under_load: bool = False) -> list[dict]:
    """The two figures per mechanism, each beside its floor (see the module's doc); with
    ``under_load``, measured while two busy loops (one per core of the issue's machine) run."""
    mechanisms = ["landlock"] + (["bwrap"] if shutil.which("bwrap") else [])
    busy = _busy(2) if under_load else []
    suffix = ", under load" if under_load else ""
    rounds, turns = (1, 8) if quick else (3, 30)
    out: list[dict] = []
    saved = {k: os.environ.get(k) for k in ("DSH_SANDBOX_MECHANISM", "DSH_HOME")}
    with tempfile.TemporaryDirectory(prefix="dsh-bench-floor-tools-") as d:
        tmp = Path(d)
        os.environ.setdefault("DSH_HOME", str(tmp / "home"))
        try:
            for mech in mechanisms:
                mech_label = mech + suffix
                m = asyncio.run(_measure(mech, rounds, turns, tmp))
                call = m["bash"] - m["text"]
                added = m["hook"] - m["bash"]
                out.append({"figure": f"sandboxed bash true, turn minus text turn ({mech_label})",
                            "dsh": f"{call:.2f} ms", "floor": f"confined bash -c true {m['floor_bash']:.2f} ms "
                            f"({call / m['floor_bash']:.1f}x)", "goal": f"<= {BASH_GOAL_X:g}x floor",
                            "met": call <= BASH_GOAL_X * m["floor_bash"]})
                out.append({"figure": f"a confined PreToolUse hook true, added per tool call ({mech_label})",
                            "dsh": f"{added:.2f} ms", "floor": f"confined sh -c true {m['floor_sh']:.2f} ms",
                            "goal": f"<= {HOOK_GOAL_MS:g} ms", "met": added <= HOOK_GOAL_MS})
        finally:
            for p in busy:
                p.kill()
                p.wait()
            for key, value in saved.items():  # as they were: other rows may run in this process
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--under-load", action="store_true", help="also measure while two busy loops run")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    table = rows(args.quick)
    if args.under_load:
        table += rows(args.quick, under_load=True)
    for row in table:
        met = {True: "ok", False: "MISSED", None: "-"}[row["met"]]
        print(f"{row['figure']:<74} {row['dsh']:>10}   {row['floor']:<38} {row['goal']:<16} {met}")
    print(f"(load average at start {load:.1f})")


if __name__ == "__main__":
    main()
