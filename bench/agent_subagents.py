"""Other ACP agents as subagents (subagent-acp's roster), through a real host's tool path, beside
bash doing the same work in the same run:

1. ``subagent_acp {agent: "echo", …}``: a fresh process of the official ACP SDK's echo agent
   (``_common.SDK_ECHO_AGENT``), initialize, session/new, one prompt, its answer, then the whole
   teardown (stdin EOF, the process tree gone) — the time from the call to its result.
2. ``bash``: the same three requests piped into the same agent from a sandboxed shell (no
   permission routing, no cancellation, no teardown checks) — what the exchange costs bare.

The difference is what the roster's supervision costs per delegation (a real agent's own start
and model work dwarf both).

    python bench/agent_subagents.py [--repeat 20] [--mechanism auto|bwrap|landlock]
"""

from __future__ import annotations

import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from _common import SDK_ECHO_AGENT, bench_session, run_main, text_of

ECHO = SDK_ECHO_AGENT


DRIVER = """
import json, subprocess, sys
echo, cwd = sys.argv[1], sys.argv[2]
p = subprocess.Popen([sys.executable, echo], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
def ask(i, method, params):
    p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\\n")
    p.stdin.flush()
    while True:
        m = json.loads(p.stdout.readline())
        if m.get("method") == "session/update":
            print(m["params"]["update"]["content"]["text"])
        if m.get("id") == i:
            return m["result"]
ask(1, "initialize", {"protocolVersion": 1})
sid = ask(2, "session/new", {"cwd": cwd, "mcpServers": []})["sessionId"]
ask(3, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]})
p.stdin.close(); p.wait()
"""


def piped_exchange(cwd: str) -> str:
    """One shell command: a few lines of Python pipe initialize, session/new and a prompt into the
    echo agent and print its answer (what bash would run to use the agent without the roster)."""
    return " ".join(shlex.quote(x) for x in (sys.executable, "-c", DRIVER, str(ECHO), cwd))


async def main(repeat: int, mechanism: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        config = {
            "sandbox-tools": {"mechanism": mechanism},
            "subagent-acp": {"max-depth": 1, "agents": {"echo": {"command": [sys.executable, str(ECHO)],
                                                                 "description": "echoes"}}},
        }
        async with bench_session(work, ("scripted-model", "sandbox-tools", "subagent-acp"), config) as session:

            async def call(name: str, args: dict) -> tuple[float, str]:
                took, out = await session.call(name, args)
                return took, text_of(out)

            delegate = {"description": "echo", "prompt": "hello", "agent": "echo"}
            shell = {"description": "Pipe the exchange into the echo agent", "command": piped_exchange(str(work))}
            _, text = await call("subagent_acp", delegate)  # warm the page cache and the command server
            assert text == "echo: hello", text
            _, text = await call("bash", shell)
            assert text.startswith("echo: hello"), text
            roster, bash = [], []
            for _ in range(repeat):
                roster.append((await call("subagent_acp", delegate))[0])
                bash.append((await call("bash", shell))[0])

    def line(name: str, xs: list[float]) -> str:
        xs = sorted(xs)
        return (f"{name:<44} median {statistics.median(xs):7.1f} ms   p95 {xs[int(0.95 * (len(xs) - 1))]:7.1f} ms"
                f"   ({len(xs)} runs)")

    print(line("subagent_acp {agent: echo} (spawn → answer → reaped)", roster))
    print(line("bash: the same exchange piped into the agent", bash))
    print(f"supervision overhead: {statistics.median(roster) - statistics.median(bash):+.1f} ms median per delegation")


if __name__ == "__main__":
    run_main(main, __doc__, repeat=20)
