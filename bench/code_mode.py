"""Code-mode benchmark: what one program costs and saves, against the native path in the same run.

Everything but (3) runs in one long session per mode, as a model that writes many small
programs would: the session's warm confined runtime is started by its first program, and
every later program is a fork of it.

1. An empty ``run_code`` end to end through the agent (the run_code tool call to its result:
   hand the program to the warm runtime, fork, run, collect). Goal <= 30 ms (median). Also
   printed: the first program of a session (it starts the warm runtime) and an empty program
   that uses asyncio (its loop is the cost that is left).
2. 100 ``read`` calls made by one program (``asyncio.gather``) vs the same 100 calls as
   native tool calls of one assistant message, alternating in one session. Goal: code <=
   1.2x native. And 10 calls of a parallel-safe tool that waits 200 ms (a network fetch,
   say) from one program vs one such call. Goal: the ten take <= 2x the one (they overlap).
3. Model calls and prompt tokens of a scripted 10-file task (read each file, then edit it)
   done natively, one tool call per step, vs in one program — through the deepseek-model
   plugin against the loopback fake DeepSeek server (a real HTTP server; token counts are
   the fake's). Prints the saving.

The workspace sandbox is the real one (bubblewrap or Landlock, as probed).

    python bench/code_mode.py [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins" / "deepseek-model" / "tests"))

from _common import reads_rules  # noqa: E402
from fake_deepseek import FakeDeepSeek, Turn  # noqa: E402

from dsh_core import FunctionTool, hookimpl  # noqa: E402
from dsh_core.compose import load_composition  # noqa: E402
from dsh_core.contracts import AgentSpec, new_id  # noqa: E402
from dsh_core.host import make_plugin_manager, open_host  # noqa: E402
from dsh_core.types import TextBlock, ToolCallEvent, ToolResultEvent, UserMessage  # noqa: E402

EMPTY_GOAL_MS = 30.0
RATIO_GOAL = 1.2
OVERLAP_GOAL = 2.0
SLOW_S = 0.2
FILES = 10


class SlowTool:
    """A bench-only plugin: ``slow_fetch``, parallel-safe, answers after ``SLOW_S`` (an I/O-bound tool)."""

    @hookimpl
    def dsh_register_tools(self, register: Callable[[Any], None], host: Any) -> None:
        async def slow_fetch(args: dict[str, Any], ctx: Any) -> str:
            await anyio.sleep(SLOW_S)
            return f"fetched {args.get('n', 0)}"

        register(FunctionTool("slow_fetch", "Wait a fixed time, then answer (a bench stand-in for a fetch).",
                              {"type": "object", "properties": {"n": {"type": "integer"}}}, slow_fetch,
                              parallel_safe=True))


def _run_code(code: str) -> dict[str, Any]:
    return {"tool": "run_code", "args": {"code": textwrap.dedent(code), "description": "bench"}}


@asynccontextmanager
async def _session(example: str, workspace: Path, rules: dict[str, list[dict[str, Any]]],
                   tmp: Path) -> AsyncIterator[Callable[[str], Awaitable[float]]]:
    """One session of the example's real composition (plus ``slow_fetch``) whose model plays
    ``rules[prompt]``; yields ``turn(prompt)`` -> ms from the turn's first tool/call to its last tool/result."""
    script = tmp / f"script-{new_id()}.json"
    script.write_text(json.dumps({"rules": [{"when": f"^{k}$", "steps": v} for k, v in rules.items()]}))
    composition = load_composition(example)
    composition = dataclasses.replace(composition, plugins=(*composition.plugins, "bench-slow"),
                                      config={**composition.config, "jsonl-persistence": {}})
    pm = make_plugin_manager()
    pm.register(SlowTool(), name="bench-slow")
    async with open_host(composition, provider="scripted", model=str(script), pm=pm) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="scripted", model=str(script)))
        turns = 0

        async def turn(prompt: str) -> float:
            nonlocal turns
            turns += 1
            agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text=prompt)]))
            await agent.wait_idle()
            _, events = await host.session_store.read(agent.session_id)
            mine = [e for e in events if isinstance(e, ToolCallEvent | ToolResultEvent) and e.turn == turns]
            failed = [e for e in mine if isinstance(e, ToolResultEvent) and e.result.is_error]
            if failed:  # a figure of failed calls is no figure (the arguments once went stale unnoticed)
                raise SystemExit(f"a tool call of {prompt!r} failed: {failed[0].result.content}")
            start = min(e.time for e in mine if isinstance(e, ToolCallEvent))
            end = max(e.time for e in mine if isinstance(e, ToolResultEvent))
            return (end - start) * 1000

        yield turn


async def empty_runs(workspace: Path, tmp: Path, repeat: int) -> tuple[float, list[float], list[float]]:
    rules = {"empty": [_run_code("pass"), {"text": "ok"}],
             "empty-asyncio": [_run_code("import asyncio\nawait asyncio.sleep(0)"), {"text": "ok"}]}
    async with _session("code-mode", workspace, rules, tmp) as turn:
        first = await turn("empty")
        plain, with_asyncio = [], []
        for _ in range(repeat):
            plain.append(await turn("empty"))
            with_asyncio.append(await turn("empty-asyncio"))
    return first, plain, with_asyncio


async def reads_and_overlap(workspace: Path, tmp: Path, repeat: int) -> dict[str, list[float]]:
    """100 reads, native and through a program, each turn on files of its own (``_common.reads_rules``),
    and one vs ten overlapping slow calls."""
    rules: dict[str, list[dict[str, Any]]] = {
        "one-slow": [_run_code("await tools.slow_fetch(n=0)"), {"text": "ok"}],
        "ten-slow": [_run_code("import asyncio\nawait asyncio.gather(*[tools.slow_fetch(n=i) for i in range(10)])"),
                     {"text": "ok"}],
    }
    rules.update(reads_rules(workspace, repeat))
    names = ("native", "code", "one-slow", "ten-slow")
    out: dict[str, list[float]] = {k: [] for k in names}
    async with _session("both-mode", workspace, rules, tmp) as turn:
        for r in range(repeat + 1):  # round 0 warms up: the warm runtime, the probe, first reads
            for name in names:
                span = await turn(f"{name} {r}" if name in ("native", "code") else name)
                if r:
                    out[name].append(span)
    return out


def _task_native() -> list[Turn]:
    turns = []
    for i in range(FILES):
        turns.append(Turn(reasoning=f"Read module {i}.", tool_calls=[("read", json.dumps({"file_path": f"src/m{i}.py"}))]))
        turns.append(Turn(reasoning=f"Mark module {i} reviewed.", tool_calls=[("edit", json.dumps(
            {"file_path": f"src/m{i}.py", "old_string": "# TODO: review", "new_string": "# reviewed"}))]))
    turns.append(Turn(content=f"Reviewed {FILES} modules."))
    return turns


def _task_code() -> list[Turn]:
    program = textwrap.dedent(f'''
        done = []
        for i in range({FILES}):
            path = f"src/m{{i}}.py"
            r = await tools.read(file_path=path)
            if "# TODO: review" in r["text"]:
                await tools.edit(file_path=path, old_string="# TODO: review", new_string="# reviewed")
                done.append(path)
        return f"reviewed {{len(done)}} modules"
    ''')
    return [Turn(reasoning="One program does all of it.",
                 tool_calls=[("run_code", json.dumps({"code": program, "description": "review every module"}))]),
            Turn(content=f"Reviewed {FILES} modules.")]


async def ten_files(tmp: Path, example: str, turns: list[Turn]) -> tuple[int, int, bool]:
    workspace = tmp / f"task-{example}"
    (workspace / "src").mkdir(parents=True)
    for i in range(FILES):
        body = "".join(f"def f{i}_{j}(x):\n    return x * {j}\n\n" for j in range(12))
        (workspace / "src" / f"m{i}.py").write_text(f'"""Module {i}."""\n# TODO: review\n\n' + body)
    fake = FakeDeepSeek(keepalive_every_s=0.05).start()
    os.environ["DEEPSEEK_BASE_URL"] = fake.base_url
    os.environ["DEEPSEEK_API_KEY"] = fake.api_key  # a dummy: the fake's own key
    fake.push(*turns)
    try:
        composition = load_composition(example)
        config = {**composition.config, "deepseek-model": {"dotenv": False, "deadline": 20.0}}
        composition = dataclasses.replace(composition, config=config)
        async with open_host(composition, provider="deepseek", model="deepseek-flash") as host:
            agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="deepseek", model="deepseek-flash"))
            agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text="Review every module in src/.")]))
            await agent.wait_idle()
    finally:
        fake.stop()
    chats = fake.chat_requests
    bad = [r.status for r in chats if r.status != 200]
    if bad:
        raise SystemExit(f"the fake rejected requests: HTTP {bad}")
    done = all("# reviewed" in (workspace / "src" / f"m{i}.py").read_text() for i in range(FILES))
    return len(chats), sum(r.prompt_tokens for r in chats), done


def startup_floor_ms(repeat: int) -> tuple[float, float]:
    """What a run would cost without the warm runtime: a bare ``python -I -S -c pass``, and one importing asyncio."""
    import subprocess
    import time

    def once(code: str) -> float:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", code], check=True)
        return (time.perf_counter() - t) * 1000

    return (statistics.median(once("pass") for _ in range(repeat)),
            statistics.median(once("import asyncio") for _ in range(repeat)))


def _verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


async def main_async(repeat: int) -> int:
    with tempfile.TemporaryDirectory(prefix="dsh-bench-code-") as d:
        tmp = Path(d)
        os.environ["DSH_HOME"] = str(tmp / "home")
        os.environ.setdefault("DSH_PERMISSION_MODE", "workspace-write")
        workspace = tmp / "work"
        (workspace / "reads").mkdir(parents=True)
        first, empty, empty_asyncio = await empty_runs(workspace, tmp, repeat)
        spans = await reads_and_overlap(workspace, tmp, repeat)
        n_calls, n_tokens, n_done = await ten_files(tmp, "acp-agent", _task_native())
        c_calls, c_tokens, c_done = await ten_files(tmp, "code-mode", _task_code())
    floor, floor_asyncio = startup_floor_ms(repeat)
    med_empty, med_asyncio = statistics.median(empty), statistics.median(empty_asyncio)
    med = {k: statistics.median(v) for k, v in spans.items()}
    ratio = med["code"] / med["native"]
    overlap = med["ten-slow"] / med["one-slow"]
    print(f"code mode, median of {repeat} runs in one session (sandbox as probed; "
          f"DSH_PERMISSION_MODE={os.environ['DSH_PERMISSION_MODE']})")
    print(f"(1) empty run_code, tool call -> result          {med_empty:8.1f} ms   goal <= {EMPTY_GOAL_MS:.0f} ms -> "
          f"{_verdict(med_empty <= EMPTY_GOAL_MS)}")
    print(f"    empty program using asyncio                  {med_asyncio:8.1f} ms   (its event loop)")
    print(f"    the session's first program (starts the warm runtime) {first:.1f} ms")
    print(f"    without a warm runtime, a run would start at: python -I -S -c pass {floor:.1f} ms, "
          f"+ import asyncio {floor_asyncio:.1f} ms")
    print(f"(2) 100 reads: native, one message                {med['native']:8.1f} ms")
    print(f"    100 reads: one program (asyncio.gather)       {med['code']:8.1f} ms   code/native {ratio:.2f}x, goal <= "
          f"{RATIO_GOAL}x -> {_verdict(ratio <= RATIO_GOAL)}")
    print(f"    1 call of a {SLOW_S * 1000:.0f} ms parallel-safe tool      {med['one-slow']:8.1f} ms")
    print(f"    10 such calls, one program (gather)           {med['ten-slow']:8.1f} ms   ten/one {overlap:.2f}x, goal <= "
          f"{OVERLAP_GOAL}x -> {_verdict(overlap <= OVERLAP_GOAL)}")
    print(f"(3) {FILES}-file task (read + edit each) through the fake DeepSeek server:")
    print(f"    {'':<28}{'model calls':>12}{'prompt tokens':>15}{'task done':>11}")
    print(f"    {'native, one call per step':<28}{n_calls:>12}{n_tokens:>15,}{n_done!s:>11}")
    print(f"    {'one run_code program':<28}{c_calls:>12}{c_tokens:>15,}{c_done!s:>11}")
    print(f"    saving: {n_calls - c_calls} model calls ({1 - c_calls / n_calls:.0%}), "
          f"{n_tokens - c_tokens:,} prompt tokens ({1 - c_tokens / n_tokens:.0%})")
    return 0 if (n_done and c_done) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    return asyncio.run(main_async(parser.parse_args().repeat))


if __name__ == "__main__":
    sys.exit(main())
