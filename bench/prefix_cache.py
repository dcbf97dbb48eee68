"""Prefix-cache benchmark: a 30-model-call, tool-heavy session through a real dsh host with
the deepseek-model plugin, against the loopback fake DeepSeek server (a real HTTP server on
127.0.0.1, plugins/deepseek-model/tests/fake_deepseek.py), whose cache model counts the
longest common token prefix with earlier prompts and outputs, in 64-token blocks.

Prints prompt tokens, cache-hit tokens and the hit ratio for dsh's requests (goal >= 95%,
over all 30 calls, the cold first call included), next to non-append-only peers in the
same run: the very same 30 request bodies dsh sent, replayed to a fresh fake server with
the history rewritten on every call:

- "volatile system header": a per-call line (a clock) at the head of the system prompt;
- "elide old tool output": tool results older than the last 4 replaced by a stub, the
  boundary moving forward each call (a common context-trimming scheme).

A second dsh run gives the route a context window small enough (7/8 of the first run's last
prompt) that the compaction plugin compacts once: its row shows the hit ratio before and
after the compaction (the first call after it is necessarily cold), and the prompt tokens
(and cache-miss tokens) it saved against the uncompacted run, the summary call included.

The tools are sandbox-tools' real ``read`` / ``grep`` / ``glob`` on a temporary workspace.
Exits 1 only when dsh rewrote history (any token of a previous prompt not re-sent
unchanged): that is the property dsh controls. The ratio itself also depends on the
session's shape (the cold first call, how much new tool output each step adds), so it is
reported against the goal, not gated.

    python bench/prefix_cache.py
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins" / "deepseek-model" / "tests"))

from dsh_compaction import SUMMARY_SYSTEM  # noqa: E402
from fake_deepseek import FakeDeepSeek, Turn, _lcp, render_prompt  # noqa: E402

from dsh_core.compose import load_composition  # noqa: E402
from dsh_core.contracts import AgentSpec, new_id  # noqa: E402
from dsh_core.host import open_host  # noqa: E402
from dsh_core.types import TextBlock, UserMessage  # noqa: E402

GOAL = 0.95
CALLS = 30
MODEL = "deepseek-flash"
CONFIG = {
    "deepseek-model": {
        "deadline": 20.0,
        "dotenv": False,
        "retry": {"max-retries": 0, "base-delay": 0.01, "max-delay": 0.1, "jitter": 0.0},
    },
    "sandbox-tools": {"permission-mode": "read-only"},
}


def make_workspace(root: Path) -> None:
    (root / "src").mkdir()
    (root / "tests").mkdir()
    for i in range(CALLS):
        body = "".join(f"def f{i}_{j}(x):\n    # TODO: check bounds\n    return x * {j}\n\n" for j in range(8))
        (root / "src" / f"m{i}.py").write_text(f'"""Module {i}."""\n\n' + body)
        (root / "tests" / f"test_m{i}.py").write_text(f"from src.m{i} import f{i}_0\n\n\ndef test_f():\n    assert f{i}_0(2) == 0\n")


def script() -> list[Turn]:
    """29 tool-call turns (one to three calls each), then the answer: 30 model calls."""
    turns = []
    for i in range(CALLS - 1):
        if i % 3 == 0:
            calls = [("read", json.dumps({"file_path": f"src/m{i}.py"}))]
        elif i % 3 == 1:
            calls = [("grep", json.dumps({"pattern": f"def f{i}_", "path": "src"})),
                     ("read", json.dumps({"file_path": f"tests/test_m{i}.py"}))]
        else:
            calls = [("glob", json.dumps({"pattern": f"**/*m{i}*.py"})),
                     ("read", json.dumps({"file_path": f"src/m{i}.py", "offset": 5, "limit": 10})),
                     ("grep", json.dumps({"pattern": "TODO", "path": f"src/m{i}.py"}))]
        turns.append(Turn(reasoning=f"Step {i}: look at module {i} and its test.", tool_calls=calls))
    turns.append(Turn(reasoning="All modules inspected.", content=f"Checked {CALLS - 1} modules; every TODO is a bounds check."))
    return turns


def totals(fake: FakeDeepSeek) -> tuple[int, int, int, int]:
    """Calls, prompt tokens, cache-hit tokens (as the server reported them), and rewritten
    tokens: those of each previous prompt not re-sent verbatim as the next one's prefix."""
    chats = fake.chat_requests
    bad = [r.status for r in chats if r.status != 200]
    if bad:
        raise SystemExit(f"the fake rejected requests: HTTP {bad}")
    prompts = [render_prompt(r.body) for r in chats]
    rewritten = sum(len(a) - _lcp(a, b) for a, b in pairwise(prompts))
    return len(chats), sum(r.prompt_tokens for r in chats), sum(r.cache_hit_tokens for r in chats), rewritten


class SummarisingFake(FakeDeepSeek):
    """The fake, answering compaction's summary call (recognised by its system prompt) out of band,
    so the session's own answers stay in the same order as in the uncompacted run."""

    def validate(self, body: Any) -> Any:
        first = (body.get("messages") or [{}])[0] if isinstance(body, dict) else {}
        self._summary_call = first.get("content") == SUMMARY_SYSTEM
        return super().validate(body)

    def next_item(self) -> Any:
        if getattr(self, "_summary_call", False):
            return Turn(content="Audited the first modules of src/ and their tests; every TODO so far is a bounds check.")
        return super().next_item()


def is_summary(body: dict[str, Any]) -> bool:
    return body["messages"][0].get("content") == SUMMARY_SYSTEM


async def run_dsh(workspace: Path, window: int | None = None) -> tuple[FakeDeepSeek, list[dict[str, Any]], int, float]:
    fake = (SummarisingFake if window else FakeDeepSeek)(keepalive_every_s=0.05).start()
    os.environ["DEEPSEEK_BASE_URL"] = fake.base_url
    os.environ["DEEPSEEK_API_KEY"] = fake.api_key  # a dummy: the fake's own key
    fake.push(*script())
    shipped = load_composition("acp-agent")  # the real example: its plugins, tools and system prompt
    overrides = dict(CONFIG)
    if window:
        overrides["deepseek-model"] = {**CONFIG["deepseek-model"],
                                       "models": {MODEL: {"context-window": window, "max-output": 1000}}}
    config = {**shipped.config, **{k: {**shipped.config.get(k, {}), **v} for k, v in overrides.items()}}
    composition = dataclasses.replace(shipped, config=config)
    t0 = time.perf_counter()
    async with open_host(composition, provider="deepseek", model=MODEL) as host:
        agent = host.create_agent(AgentSpec(cwd=str(workspace), provider="deepseek", model=MODEL))
        agent.submit(UserMessage(id=new_id("u_"), content=[TextBlock(text="Audit every module in src/ and its test.")]))
        await agent.wait_idle()
        session_id = agent.session_id
    elapsed = time.perf_counter() - t0
    fake.stop()
    # The session as jsonl-persistence wrote it under $DSH_HOME: what dsh recorded.
    log = Path(os.environ["DSH_HOME"]) / "sessions" / f"{session_id}.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    usage_hit = sum((e.get("usage") or {}).get("cacheHitTokens", 0) for e in events
                    if e["type"] in ("assistant/message", "compaction/summary"))
    _, _, server_hit, _ = totals(fake)
    if usage_hit != server_hit:
        raise SystemExit(f"dsh recorded {usage_hit} cache-hit tokens, the server reported {server_hit}")
    tool_results = sum(e["type"] == "tool/result" for e in events)
    return fake, [r.body for r in fake.chat_requests], tool_results, elapsed


# --------------------------------------------------------------------------- non-append-only peers


def volatile_header(i: int, body: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(body)
    system = body["messages"][0]
    assert system["role"] == "system"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1_760_000_000 + 7 * i))
    system["content"] = f"Current time: {stamp} (call {i + 1}).\n" + system["content"]
    return body


def elide_old_tool_output(i: int, body: dict[str, Any], keep: int = 4) -> dict[str, Any]:
    body = copy.deepcopy(body)
    tools = [m for m in body["messages"] if m["role"] == "tool"]
    for m in tools[: max(0, len(tools) - keep)]:
        m["content"] = "[older tool output elided]"
    return body


def replay(bodies: list[dict[str, Any]], rewrite: Callable[[int, dict[str, Any]], dict[str, Any]]) -> FakeDeepSeek:
    """The same conversation, rewritten per call, sent to a fresh fake (its own cache)."""
    fake = FakeDeepSeek(keepalive_every_s=0.05).start()
    fake.push(*script())  # the same answers, so the cache sees the same outputs
    try:
        with httpx.Client(base_url=fake.base_url, headers={"Authorization": f"Bearer {fake.api_key}"},
                          timeout=20.0) as client:
            for i, body in enumerate(bodies):
                resp = client.post("/chat/completions", json=rewrite(i, body))
                resp.read()
                if resp.status_code != 200:
                    raise SystemExit(f"baseline call {i + 1}: HTTP {resp.status_code} {resp.text[:300]}")
    finally:
        fake.stop()
    return fake


def row(name: str, calls: int, prompt: int, hit: int, rewritten: int) -> str:
    return f"{name:<38} {calls:>5} {prompt:>14,} {hit:>16,} {hit / prompt:>9.1%} {rewritten:>10,}"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dsh-bench-cache-") as tmp:
        workspace = Path(tmp) / "work"
        workspace.mkdir()
        os.environ["DSH_HOME"] = str(Path(tmp) / "home")
        make_workspace(workspace)
        fake, bodies, tool_results, elapsed = asyncio.run(run_dsh(workspace))
        window = round(fake.chat_requests[-1].prompt_tokens * 7 / 8)
        compacted, _, _, _ = asyncio.run(run_dsh(workspace, window))
    calls, prompt, hit, rewritten = totals(fake)
    if calls != CALLS:
        print(f"expected {CALLS} model calls, the fake saw {calls}", file=sys.stderr)
        return 1
    ratio = hit / prompt
    chats = fake.chat_requests
    cold = chats[0].prompt_tokens
    warm_ratio = sum(r.cache_hit_tokens for r in chats[1:]) / sum(r.prompt_tokens for r in chats[1:])

    print(f"prefix cache: {CALLS} model calls, {tool_results} tool results, examples/acp-agent on {MODEL}, "
          f"fake DeepSeek on {fake.base_url} (64-token cache blocks); dsh session took {elapsed:.2f}s")
    print(f"{'':<38} {'calls':>5} {'prompt tokens':>14} {'cache-hit tokens':>16} {'hit ratio':>9} {'rewritten':>10}")
    print(row("dsh (append-only)", calls, prompt, hit, rewritten))
    for name, rewrite in (("peer: volatile system header", volatile_header),
                          ("peer: elide old tool output (keep 4)", elide_old_tool_output)):
        print(row(name, *totals(replay(bodies, rewrite))))
    print(f"dsh misses {prompt - hit:,} tokens: {cold:,} cold first call, {prompt - hit - cold:,} new tool output "
          f"and 64-token block rounding, {rewritten:,} rewritten; excluding the cold call the ratio is {warm_ratio:.1%}")
    compaction_report(chats, compacted.chat_requests, window)
    verdict = "meets" if ratio >= GOAL else "MISSES"
    print(f"goal: hit ratio >= {GOAL:.0%} over all {CALLS} calls -> {verdict} ({ratio:.1%})")
    return 0 if rewritten == 0 else 1


def compaction_report(plain: list[Any], chats: list[Any], window: int) -> None:
    """The compacting run: hit ratio before and after its compaction, and what it saved."""
    if any(r.status != 200 for r in chats):
        raise SystemExit(f"the compacting run was rejected: HTTP {[r.status for r in chats]}")
    marks = [i for i, r in enumerate(chats) if is_summary(r.body)]
    if len(marks) != 1:
        print(f"compacting run: expected one compaction, saw {len(marks)}")
        return
    (s,) = marks
    before, summary, after = chats[:s], chats[s], chats[s + 1:]

    def ratio(rs: list[Any]) -> float:
        return sum(r.cache_hit_tokens for r in rs) / max(1, sum(r.prompt_tokens for r in rs))

    main = before + after
    spent = sum(r.prompt_tokens for r in chats)
    misses = spent - sum(r.cache_hit_tokens for r in chats)
    plain_prompt = sum(r.prompt_tokens for r in plain)
    plain_misses = plain_prompt - sum(r.cache_hit_tokens for r in plain)
    prompts = [render_prompt(r.body) for r in main]
    rewritten = sum(len(a) - _lcp(a, b) for a, b in pairwise(prompts))
    print(row(f"dsh, window {window:,} (compacts once)", len(main), sum(r.prompt_tokens for r in main),
              sum(r.cache_hit_tokens for r in main), rewritten))
    print(f"  compaction before call {len(before) + 1}: hit ratio {ratio(before):.1%} over the {len(before)} calls before, "
          f"{ratio(after):.1%} over the {len(after)} after ({ratio(after[1:]):.1%} after the first, cold one); "
          f"summary call {summary.prompt_tokens:,} prompt tokens ({summary.cache_hit_tokens:,} hit)")
    print(f"  saved against the uncompacted run, summary call included: {plain_prompt - spent:,} prompt tokens "
          f"({(plain_prompt - spent) / plain_prompt:.0%}), {plain_misses - misses:,} cache-miss tokens; "
          f"largest prompt {max(r.prompt_tokens for r in chats):,} vs {max(r.prompt_tokens for r in plain):,}")


if __name__ == "__main__":
    sys.exit(main())
