"""Where an acp-agent's CPU per text prompt goes: a repeatable cProfile of a real agent process.

The procedure (run it before and after a change to the prompt path):

1. Start ``dsh run --example acp-agent --provider scripted`` (instant model, JSONL session log on,
   exactly what bench/floor_prompt_cpu.py measures) as a subprocess, through a small bootstrap
   that installs a ``cProfile.Profile`` switched on by SIGUSR1 and dumped by SIGUSR2. Nothing in
   dsh itself knows about profiling. The profiler's clock is the process's CPU time, not the
   wall clock, so time the process spends preempted on a busy machine is not counted (a
   wall-clock profile blames whatever syscall was running when the scheduler took the CPU).
2. Drive it with raw JSON-RPC lines: ``initialize``, ``session/new``, ``--warmup`` prompts
   (imports, caches, first-use paths: not in the profile), SIGUSR1, then ``--prompts`` text
   prompts in a row on the one session, SIGUSR2.
3. Print the own time summed by package (dsh_core, each plugin's package, anyio, pluggy, the
   stdlib's asyncio, C builtins), then the top functions by cumulative time and by own
   (``tottime``) time, per prompt.

How to read it:

- ``cumtime/prompt`` (µs) is the time inside a function including what it calls, per prompt.
  The top rows are the event loop and the request handler; read down until the names become
  specific (a plugin's hookimpl, a store's append, an encoder) — those are the costs to attack.
  ``ncalls/prompt`` says how often per prompt it runs: 20 calls of a cheap function per prompt
  is a per-event cost (dispatch, hooks, encoding), 1 call is a per-prompt cost.
- ``tottime/prompt`` is the time in the function's own body: builtins such as
  ``msgspec.json.encode``, ``os.write``, ``select.epoll.poll`` appear here with their true cost.
- cProfile adds a fixed cost per Python call, so call-heavy code (pluggy's hook calling, small
  helpers) looks up to ~2x heavier than it is; compare shares, not absolute µs, with
  bench/floor_prompt_cpu.py (no profiler) giving the real figure.
- ``calls per prompt`` does not depend on the machine's load (the µs do): the agent's CPU is
  almost all the interpreter running Python (``perf`` puts the kernel at ~6%), so fewer Python
  calls per prompt is the figure to drive down, and to compare before/after on a shared machine.
- ``--bash``: the tool turn instead (the procedure behind the ``tool_calls`` row): each prompt
  is a turn of one sandboxed ``bash`` call ``true`` (the scripted model calls the tool, then
  answers), the command server warm. Before the profile, the agent's process CPU (no profiler)
  is read around alternating blocks of text turns and bash turns: the CPU a tool turn adds over
  a text turn, per turn. The command server and its reapers are other processes and are not in
  these figures (their wall time is what ``floor_tool_calls.py`` adds back).
- ``--out FILE`` keeps the raw stats for ``python -m pstats FILE`` (``callers <name>`` shows who
  calls a hot function; ``sort tottime`` / ``stats 40``) or snakeviz.

    python bench/profile_prompt.py [--prompts 500] [--warmup 50] [--top 35] [--out prof.pstats]
    python bench/profile_prompt.py --bash --prompts 300 [--mechanism landlock|bwrap]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import sys
import tempfile
from pathlib import Path

BOOTSTRAP = """
import cProfile, os, runpy, signal, sys, time
out = os.environ.pop("DSH_BENCH_PROFILE_OUT")
prof = cProfile.Profile(time.process_time)  # CPU time: a busy machine's preemption is not counted
def start(*_):
    prof.enable()
    os.write(2, b"profiling\\n")
def stop(*_):
    prof.disable()
    prof.dump_stats(out)
    os.write(2, b"dumped\\n")
def cpu(*_):
    os.write(2, b"cpu %.9f\\n" % time.process_time())
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
signal.signal(signal.SIGWINCH, cpu)
sys.argv = ["dsh", *sys.argv[1:]]
runpy.run_module("dsh_core.cli", run_name="__main__", alter_sys=True)
"""
SCRIPT = {"default": [{"text": "echo: {prompt}"}], "repeat_default": True}
# --bash: a prompt "bash" is a turn of one sandboxed `bash true`, any other a text turn
BASH_SCRIPT = {
    "rules": [{"when": "^bash", "steps": [{"tool": "bash", "args": {"command": "true", "description": "noop"}},
                                          {"text": "done"}]}],
    "default": [{"text": "done"}],
}


async def call(proc: asyncio.subprocess.Process, rid: int, method: str, params: dict) -> dict:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n")
    await proc.stdin.drain()
    while True:
        frame = json.loads(await proc.stdout.readline())
        if frame.get("id") == rid and "method" not in frame:
            if "error" in frame:
                raise RuntimeError(f"{method}: {frame['error']}")
            return frame["result"]


async def wait_for(proc: asyncio.subprocess.Process, marker: bytes) -> bytes:
    """The first stderr line starting with ``marker``."""
    assert proc.stderr is not None
    while True:
        line = await proc.stderr.readline()
        if not line:
            raise RuntimeError("agent exited before " + marker.decode())
        if line.strip().startswith(marker):
            return line.strip()


async def cpu_now(proc: asyncio.subprocess.Process) -> float:
    """The agent process's CPU time so far (s), read inside it (SIGWINCH)."""
    proc.send_signal(signal.SIGWINCH)
    return float((await wait_for(proc, b"cpu ")).split()[1])


async def profile(prompts: int, warmup: int, out: Path, work: Path, bash: bool = False) -> dict[str, float]:
    script = work / "script.json"
    script.write_text(json.dumps(BASH_SCRIPT if bash else SCRIPT))
    env = {k: os.environ[k] for k in ("HOME", "PATH", "USER", "LOGNAME", "SHELL", "TERM") if k in os.environ}
    env["DSH_HOME"] = str(work / "home")
    env["DSH_BENCH_PROFILE_OUT"] = str(out)
    if "DSH_SANDBOX_MECHANISM" in os.environ:
        env["DSH_SANDBOX_MECHANISM"] = os.environ["DSH_SANDBOX_MECHANISM"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BOOTSTRAP, "run", "--example", "acp-agent", "--provider", "scripted",
        "--model", str(script), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=work, env=env, limit=1 << 24,
    )
    rid = 0
    await call(proc, rid, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    rid += 1
    sid = (await call(proc, rid, "session/new", {"cwd": str(work), "mcpServers": []}))["sessionId"]
    text = [{"type": "text", "text": "ping"}]
    prompt = [{"type": "text", "text": "bash"}] if bash else text
    for _ in range(warmup):
        for p in ([text, prompt] if bash else [prompt]):
            rid += 1
            await call(proc, rid, "session/prompt", {"sessionId": sid, "prompt": p})
    cpu: dict[str, float] = {"text": 0.0, "bash": 0.0}
    if bash:  # process CPU, no profiler: alternating blocks of text and bash turns
        block = max(1, prompts // 5)
        for _ in range(5):
            for kind, p in (("text", text), ("bash", prompt)):
                before = await cpu_now(proc)
                for _ in range(block):
                    rid += 1
                    await call(proc, rid, "session/prompt", {"sessionId": sid, "prompt": p})
                cpu[kind] += (await cpu_now(proc) - before) / (5 * block)
    proc.send_signal(signal.SIGUSR1)
    await wait_for(proc, b"profiling")
    for _ in range(prompts):
        rid += 1
        await call(proc, rid, "session/prompt", {"sessionId": sid, "prompt": prompt})
    proc.send_signal(signal.SIGUSR2)
    await wait_for(proc, b"dumped")
    assert proc.stdin is not None
    proc.stdin.close()
    await asyncio.wait_for(proc.wait(), 20)
    return cpu


def package(file: str) -> str:
    """A profile entry's package: ``dsh_core``, a plugin's package, a library's, ``builtins``."""
    if file == "~":
        return "builtins (C functions: syscalls, msgspec, …)"
    parts = Path(file).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    for anchor in ("plugins", "dsh_core"):
        if anchor in parts:
            i = parts.index(anchor)
            return parts[i + 2] if anchor == "plugins" and len(parts) > i + 2 else anchor
    return "stdlib " + Path(file).stem if "python3" in file else file


def report(path: Path, prompts: int, top: int) -> None:
    stats = pstats.Stats(str(path))
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in entries.values())  # all own time = profiled CPU

    def name(key: tuple[str, int, str]) -> str:
        file, line, func = key
        if file == "~":
            return func
        parts = Path(file).parts
        short = "/".join(parts[-2:]) if len(parts) > 1 else file
        return f"{short}:{line}({func})"

    calls = sum(v[1] for v in entries.values())
    python_calls = sum(v[1] for k, v in entries.items() if k[0] != "~")
    print(f"profiled: {prompts} prompts, {total / prompts * 1e6:.0f} µs/prompt of own time under cProfile")
    print(f"calls per prompt: {calls / prompts:.0f} ({python_calls / prompts:.0f} to Python functions; "
          "the same on a busy machine: a count to compare before/after)")
    by_package: dict[str, float] = {}
    for key, value in entries.items():
        by_package[package(key[0])] = by_package.get(package(key[0]), 0.0) + value[2]
    print(f"\nown time by package, per prompt (share of {total / prompts * 1e6:.0f} µs)")
    for pkg, own in sorted(by_package.items(), key=lambda kv: kv[1], reverse=True)[:top]:
        print(f"  {own / prompts * 1e6:10.1f} {own / total:7.1%}  {pkg}")
    for title, idx in (("cumulative", 3), ("own (tottime)", 2)):
        print(f"\ntop {top} by {title} time, per prompt")
        print(f"  {'µs/prompt':>10} {'calls/prompt':>12}  function")
        ranked = sorted(entries.items(), key=lambda kv: kv[1][idx], reverse=True)[:top]
        for key, (_cc, nc, _tt, _ct, _callers) in ranked:
            value = entries[key][idx]
            print(f"  {value / prompts * 1e6:10.1f} {nc / prompts:12.2f}  {name(key)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--out", type=Path, help="keep the raw pstats file here")
    ap.add_argument("--bash", action="store_true", help="profile turns of one sandboxed `bash true` call")
    ap.add_argument("--mechanism", choices=["landlock", "bwrap"], help="with --bash: the sandbox mechanism")
    args = ap.parse_args()
    if args.mechanism:
        os.environ["DSH_SANDBOX_MECHANISM"] = args.mechanism
    with tempfile.TemporaryDirectory(prefix="dsh-profile-") as d:
        out = args.out.resolve() if args.out else Path(d) / "prompt.pstats"
        cpu = asyncio.run(profile(args.prompts, args.warmup, out, Path(d), bash=args.bash))
        if args.bash:
            print(f"agent process CPU per turn (no profiler): text {cpu['text'] * 1e3:.3f} ms, "
                  f"bash {cpu['bash'] * 1e3:.3f} ms, the tool turn adds {(cpu['bash'] - cpu['text']) * 1e3:.3f} ms\n")
        report(out, args.prompts, args.top)


if __name__ == "__main__":
    main()
