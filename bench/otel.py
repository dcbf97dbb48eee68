"""CPU per prompt of ``dsh run`` (scripted, instant model) with the otel plugin unmounted, mounted
with no exporter configured, and mounted exporting to a local OTLP/HTTP sink (which answers 200 and
keeps nothing).

Each prompt is one turn of two model calls and one tool call (``todo_write``): the events a traced
turn turns into an invoke_agent, two chat and one execute_tool span. The compositions are acp-agent
as shipped, and acp-agent plus ``otel`` (written to a temporary examples directory). CPU per prompt
is the agent process's user+system time over ``--prompts`` sequential prompts on one session
(``/proc/<pid>/stat``, as bench/startup_cpu.py measures it), after a warm-up; the configurations
take turns for ``--rounds`` rounds and the median is printed. The target: mounted without an
exporter costs less than 5% more than unmounted. Figures only, no verdict.

    python bench/otel.py [--prompts 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup_cpu import Agent

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = {
    "rules": [{"when": "ping", "steps": [
        {"tool": "todo_write", "args": {"todos": [{"content": "answer", "status": "in_progress"}]},
         "usage": {"inputTokens": 900, "outputTokens": 12}},
        {"text": "PONG", "usage": {"inputTokens": 950, "outputTokens": 2}},
    ]}],
    "default": [{"text": "PONG"}],
    "repeat_default": True,
}


def traced_example(root: Path) -> None:
    """acp-agent with ``otel`` added to its plugins, as ``acp-agent-otel`` under ``root``."""
    text = (ROOT / "examples" / "acp-agent" / "example.toml").read_text()
    plugins = tomllib.loads(text)["example"]["plugins"]
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("plugins = "))
    lines[at] = "plugins = " + json.dumps([*plugins, "otel"])
    d = root / "acp-agent-otel"
    d.mkdir(parents=True)
    (d / "example.toml").write_text("\n".join(lines) + "\n")


class Sink:
    """An OTLP/HTTP endpoint that answers 200 to everything and keeps nothing."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"


async def cpu_per_prompt(example: str, env_extra: dict[str, str], prompts: int, tmp: Path) -> float:
    script = tmp / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"), "DSH_HOME": str(tmp / "home"),
           "DSH_EXAMPLES_PATH": str(tmp / "examples"), **env_extra}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dsh_core.cli", "run", "--example", example, "--provider", "scripted",
        "--model", str(script), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, cwd=tmp, env=env, limit=1 << 24,
    )  # fmt: skip
    agent = Agent(proc)
    await agent.call("initialize", {"protocolVersion": 1})
    sid = (await agent.call("session/new", {"cwd": str(tmp), "mcpServers": []}))["result"]["sessionId"]
    prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "ping"}]}
    for _ in range(20):  # warm-up
        await agent.call("session/prompt", prompt)
    before = agent.cpu_seconds()
    for _ in range(prompts):
        await agent.call("session/prompt", prompt)
    cpu = (agent.cpu_seconds() - before) / prompts
    await agent.close()
    return cpu


def observer_cost(n: int = 200_000) -> float:
    """Seconds the plugin's ``dsh_session_event`` takes per event with no exporter configured (in
    process, on a real host's state slots): the whole of its per-event work when mounted that way."""
    import time

    import dsh_otel

    from dsh_core.state import StateSlots

    class Host:
        def __init__(self) -> None:
            self.slots = StateSlots()

        def state(self, cls: type, factory: object = None) -> object:
            return self.slots.get(cls, factory)  # type: ignore[arg-type]

    class Session:
        host = Host()

    session, event = Session(), object()
    began = time.perf_counter()
    for _ in range(n):
        dsh_otel.dsh_session_event(session, event)  # type: ignore[arg-type]
    return (time.perf_counter() - began) / n


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    sink = Sink()
    configs = {
        "unmounted (acp-agent)": ("acp-agent", {}),
        "mounted, no exporter": ("acp-agent-otel", {}),
        "mounted, exporting to a local sink": ("acp-agent-otel", {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint}),
    }
    figures: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="dsh-bench-otel-") as d:
        tmp = Path(d)
        traced_example(tmp / "examples")
        for _ in range(args.rounds):
            for name, (example, env) in configs.items():
                figures[name].append(await cpu_per_prompt(example, env, args.prompts, tmp))
    print(f"dsh run (scripted; one tool call per prompt): CPU per prompt, median of {args.rounds} rounds "
          f"of {args.prompts} prompts")
    base = statistics.median(figures["unmounted (acp-agent)"])
    for name, values in figures.items():
        cpu = statistics.median(values)
        print(f"  {name:<38} {cpu * 1e6:8.0f} µs  {100 * (cpu - base) / base:+6.1f}%")
    print(f"  in process: the observer, no exporter, {observer_cost() * 1e9:.0f} ns per event "
          "(a prompt here is about ten events)")
    sink.server.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
