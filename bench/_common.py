"""What the tool-path benchmarks share: a scripted model that only answers ``ok``, an in-process host
with the plugins under test, and a timed tool call through the agent's real tool path.

    async with bench_session(work, ("scripted-model", "sandbox-tools", "jobs"), config) as s:
        took, out = await s.call("bash", {"command": "true"})   # ms, the ToolOutput (an error raises)

Run the benchmarks as ``python bench/<name>.py``: this directory is then first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from dsh_core.contracts import AgentSpec
from dsh_testing import memory_host

# The official SDK's minimal echo agent: the floors' peer (prompt CPU, session memory, round trip)
# and a subagent-acp child. It is kept once, in the agent-subagent scenario's workspace (a recorded
# workspace, copied into the scenario's run as it is), and run from there.
SDK_ECHO_AGENT = (Path(__file__).resolve().parents[1] / "plugins" / "subagent-acp" / "snapshots" / "acp-subagents"
                  / "agent-subagent" / "workspace" / "echo_agent.py")


class QuietClient:
    """An SDK client's side for a benchmark: counts the updates, answers nothing else."""

    def __init__(self) -> None:
        self.chunks = 0

    async def session_update(self, session_id: str, update: Any, **kw: Any) -> None:
        self.chunks += 1

    async def request_permission(self, *a: Any, **kw: Any) -> Any:  # pragma: no cover
        raise RuntimeError("not expected")

    def on_connect(self, conn: Any) -> None:
        pass


@contextmanager
def env_restored(*names: str) -> Iterator[None]:
    """On the way out, put ``names`` back in ``os.environ`` as they were (unset if they were)."""
    saved = {k: os.environ.get(k) for k in names}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ms(t0: float) -> float:
    """Milliseconds since ``t0`` (a ``time.perf_counter()`` reading)."""
    return (time.perf_counter() - t0) * 1000


def ok_script(work: Path) -> Path:
    """A scripted-model script in ``work`` whose model says ``ok`` (the tools are called directly)."""
    script = work / "s.json"
    script.write_text(json.dumps({"default": [{"text": "ok"}]}))
    return script


def text_of(out: Any) -> str:
    return "".join(getattr(b, "text", "") for b in out.content)


class Caller:
    """Timed tool calls on one or more agents; call ids count across them all."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.n = 0

    async def call(self, name: str, args: dict, agent: Any = None) -> tuple[float, Any]:
        """Run one tool call as the loop does; its time in ms and its output. An error result raises."""
        self.n += 1
        t0 = time.perf_counter()
        out = await (agent or self.agent).call_tool(name, args, call_id=f"c{self.n}", turn=1, step=1)
        took = ms(t0)
        assert not out.is_error, text_of(out)
        return took, out


@asynccontextmanager
async def bench_host(work: Path, plugins: tuple[str, ...], config: dict[str, Any]) -> AsyncIterator[tuple[Any, Any]]:
    """An in-process host with ``plugins`` (the scripted model first) and one agent in ``work``."""
    script = ok_script(work)
    async with memory_host(script, plugins=plugins, config=config) as host:
        yield host, new_agent(host, work)


def new_agent(host: Any, work: Path) -> Any:
    script = work / "s.json"
    return host.create_agent(AgentSpec(cwd=str(work), provider="scripted", model=str(script)))


@asynccontextmanager
async def bench_session(work: Path, plugins: tuple[str, ...], config: dict[str, Any]) -> AsyncIterator[Caller]:
    """``bench_host`` with a ``Caller`` on its agent (``.agent``, ``.call``)."""
    async with bench_host(work, plugins, config) as (_, agent):
        yield Caller(agent)


def run_main(main: Callable[[int, str], Coroutine[Any, Any, None]], doc: str, repeat: int) -> None:
    """The command line of a tool-path benchmark: ``--repeat N`` (default ``repeat``) and
    ``--mechanism auto|bwrap|landlock``, then ``main(repeat, mechanism)``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=repeat)
    ap.add_argument("--mechanism", default="auto", choices=["auto", "bwrap", "landlock"])
    a = ap.parse_args()
    asyncio.run(main(a.repeat, a.mechanism))


# One program gathering N reads of the files under {DIR} (bench/floor_code_mode.py, bench/code_mode.py).
READS_PROGRAM = (
    "import asyncio\n"
    'got = await asyncio.gather(*[tools.read(file_path=f"{DIR}/f{i}.txt") for i in range({N})])\n'
    'return sum(r["total_lines"] for r in got)\n'
)


def reads_rules(workspace: Path, rounds: int, n: int = 100) -> dict[str, list[dict[str, Any]]]:
    """Scripted-model rules ``"native <r>"`` and ``"code <r>"`` for rounds 0..``rounds``: 100 reads
    as native calls of one message, or one program gathering them (``n`` other than 100: rules
    ``"native<n> <r>"`` and ``"code<n> <r>"`` of ``n`` reads). Every turn reads files no other
    turn reads (a directory of its own under ``workspace/reads``, same contents): the session's
    repeat guard (plugin ``guards``: a reminder after the 3rd, 5th and 8th identical call) would
    otherwise fire on some rounds only, and differently on the two sides."""
    rules: dict[str, list[dict[str, Any]]] = {}
    tag = "" if n == 100 else str(n)
    for r in range(rounds + 1):
        for side in ("native", "code"):
            rel = f"reads/{side}{tag}{'-' if tag else ''}{r}"
            (workspace / rel).mkdir(parents=True)
            for i in range(n):
                (workspace / rel / f"f{i}.txt").write_text("".join(f"line {j} of file {i}\n" for j in range(50)))
            program = READS_PROGRAM.replace("{DIR}", rel).replace("{N}", str(n))
            first: dict[str, Any] = (
                {"tools": [{"name": "read", "args": {"file_path": f"{rel}/f{i}.txt"}} for i in range(n)]}
                if side == "native" else
                {"tool": "run_code", "args": {"code": program, "description": f"read {n} files"}})
            rules[f"{side}{tag} {r}"] = [first, {"text": "ok"}]
    return rules
