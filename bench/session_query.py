"""session_search over 1,000 logged sessions, through a real host's tool path, beside bash's
``grep -r`` over the same logs (the sandboxed bash tool, the same host, the same session):

1. the first search, which builds the SQLite FTS5 index from nothing (cold);
2. a search on an up-to-date index (warm: it only stats the logs);
3. a search after one log grew by a turn (the index reads on from where it stopped);
4. ``bash {command: "grep -rl NEEDLE <sessions>"}``, and ``grep -r`` printing the matching lines.

Each log is a realistic session (prompts, answers, tool calls and results, ~20 events, ~8 KB);
the needle is in three of them. Medians of ``--repeat`` runs.

    python bench/session_query.py [--sessions 1000] [--repeat 15] [--mechanism auto|bwrap|landlock]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from _common import Caller, bench_host

from dsh_core.types import (
    AssistantMessage,
    AssistantMessageEvent,
    SessionHeader,
    TextBlock,
    ToolCallBlock,
    ToolCallEvent,
    ToolResultEvent,
    ToolResultMessage,
    UserMessage,
    UserMessageEvent,
)

NEEDLE = "quokka-teleport-7781"
WORDS = ["build", "test", "deploy", "parser", "cache", "index", "server", "client", "request", "response", "error",
         "retry", "timeout", "config", "module", "function", "class", "method", "import", "export", "value", "string",
         "number", "list", "map", "queue", "thread", "lock", "file", "path", "directory", "commit", "branch", "merge",
         "review", "patch", "bug", "fix", "feature", "release", "version", "schema", "table", "query"]


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Writer:
    """One log, its events numbered and timed as an agent would."""

    def __init__(self, store, sid: str, cwd: str, t0: float) -> None:
        self.log = store.open(SessionHeader(id=sid, cwd=cwd, provider="scripted", model="m"))
        self.seq, self.t0 = 0, t0

    def __call__(self, ev) -> None:
        self.seq += 1
        ev.seq, ev.time = self.seq, self.t0 + self.seq
        self.log.append(ev)


async def write_logs(store, cwd: str, sessions: int, rng: random.Random) -> None:
    needles = set(rng.sample(range(sessions), 3))
    for i in range(sessions):
        add = Writer(store, f"bench{i:05d}", cwd, 1_700_000_000.0 + i * 60)
        add(UserMessageEvent(message=UserMessage(id=f"u{i}", content=[TextBlock(text=text(rng, 30))])))
        for step in range(1, 7):
            call = f"call_{step}"
            args = json.dumps({"command": f"grep -rn {rng.choice(WORDS)} src/ | head"})
            add(AssistantMessageEvent(turn=1, step=step, finish="tool-calls", message=AssistantMessage(
                id=f"a{i}-{step}",
                content=[TextBlock(text=text(rng, 25)), ToolCallBlock(id=call, name="bash", arguments=args)])))
            add(ToolCallEvent(turn=1, step=step, call_id=call, name="bash", arguments=args))
            body = text(rng, 120) + (f" {NEEDLE} " if i in needles and step == 3 else " ") + text(rng, 40)
            add(ToolResultEvent(turn=1, step=step, result=ToolResultMessage(call_id=call, name="bash",
                                                                              content=[TextBlock(text=body)])))
        add(AssistantMessageEvent(turn=1, step=7, message=AssistantMessage(id=f"z{i}",
                                                                       content=[TextBlock(text=text(rng, 40))])))
        await add.log.close()


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):8.1f} ms"


async def main(sessions: int, repeat: int, mechanism: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        home, work = Path(d) / "home", Path(d) / "work"
        work.mkdir()
        os.environ["DSH_HOME"] = str(home)
        plugins = ("scripted-model", "jsonl-persistence", "sandbox-tools", "session-query")
        async with bench_host(work, plugins, {"sandbox-tools": {"mechanism": mechanism}}) as (host, agent):
            store = host.session_store
            t0 = time.perf_counter()
            await write_logs(store, str(work), sessions, random.Random(7))
            size = sum(p.stat().st_size for p in store.root.iterdir())
            print(f"{sessions} logged sessions, {size / 1e6:.1f} MB of JSONL, written in {time.perf_counter() - t0:.1f} s")
            session = Caller(agent)

            async def call(name: str, args: dict) -> tuple[float, str]:
                took, out = await session.call(name, args)
                return took, out.content[0].text

            await call("bash", {"description": "Run the command", "command": "true"})  # the session's command server starts once
            cold, found = await call("session_search", {"query": NEEDLE})
            assert found.startswith("Session search results (3):"), found[:200]
            warm = [(await call("session_search", {"query": NEEDLE}))[0] for _ in range(repeat)]
            grown = []
            extra = store.open(SessionHeader(id="bench00000", cwd=str(work)))
            for r in range(repeat):
                extra.append(UserMessageEvent(seq=1000 + r, time=time.time(),
                                              message=UserMessage(id=f"x{r}", content=[TextBlock(text="one more turn")])))
                grown.append((await call("session_search", {"query": NEEDLE}))[0])
            await extra.close()
            grep_l, grep_r = [], []
            for _ in range(repeat):
                took, out = await call("bash", {"description": "Run the command", "command": f"grep -rl {NEEDLE} {store.root}"})
                assert len(out.strip().splitlines()) == 3, out
                grep_l.append(took)
                grep_r.append((await call("bash", {"description": "Run the command", "command": f"grep -r {NEEDLE} {store.root} | wc -l"}))[0])
            print(f"session_search, cold (builds the index)   {cold:8.1f} ms")
            print(f"session_search, warm                      {med(warm)}")
            print(f"session_search, after one log grew        {med(grown)}")
            print(f"bash grep -rl over the same logs          {med(grep_l)}")
            print(f"bash grep -r (matching lines)             {med(grep_r)}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--mechanism", default="auto")
    a = p.parse_args()
    asyncio.run(main(a.sessions, a.repeat, a.mechanism))
