"""End to end: a real dsh host with the deepseek-model plugin, talking to the loopback fake."""

from __future__ import annotations

import json
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from fake_deepseek import Fault, Turn

from conftest import FAST
from dsh_core import FunctionTool, hookimpl
from dsh_core.compose import Composition
from dsh_core.contracts import AgentSpec, new_id
from dsh_core.host import make_plugin_manager, open_host, register_plugin
from dsh_core.types import (
    AgentError,
    AssistantMessageEvent,
    ImageBlock,
    RetryEvent,
    TextBlock,
    ToolResultEvent,
    TurnEnd,
    UserMessage,
)

pytestmark = pytest.mark.anyio

BIG_SYSTEM_EXTRA = "Follow the house rules. " * 300  # a realistic, stable system-prompt size


async def _read(args: dict[str, Any], ctx: Any) -> str:
    return f"contents of {args.get('path')}: " + "lorem ipsum " * 10


async def _grep(args: dict[str, Any], ctx: Any) -> str:
    return f"3 matches for {args.get('pattern')!r}"


TOOLS = [
    FunctionTool("read", "Read a file from the workspace", {"type": "object", "properties": {"path": {"type": "string"}},
                                                            "required": ["path"]}, _read),
    FunctionTool("grep", "Search the workspace", {"type": "object", "properties": {"pattern": {"type": "string"}},
                                                  "required": ["pattern"]}, _grep),
]


class _TestPlugin:
    def __init__(self, store: Any = None) -> None:
        self.store = store

    @hookimpl
    def dsh_register_tools(self, register: Any) -> None:
        for tool in TOOLS:
            register(tool)

    @hookimpl
    def dsh_system_prompt(self, spec: Any, host: Any) -> str:
        return BIG_SYSTEM_EXTRA

    @hookimpl
    def dsh_attachment_store(self, host: Any) -> Any:
        return self.store


class _MemoryImages:
    mime_types = ("image/png",)

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    async def save_images(self, batch: Any) -> list[ImageBlock]:
        out = []
        for mime, data in batch:
            import hashlib

            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            self.blobs[digest] = data
            out.append(ImageBlock(digest=digest, mime=mime, size=len(data)))
        return out

    async def read_image(self, ref: ImageBlock) -> bytes:
        return self.blobs[ref.digest]


async def run_session(
    tmp_path: Path,
    prompts: list[list[Any]],
    *,
    model: str = "deepseek-v4-flash",
    config: dict[str, Any] | None = None,
    store: Any = None,
    during: Any = None,
) -> list[Any]:
    pm = make_plugin_manager()
    register_plugin(pm, _TestPlugin(store), "t-tools")
    composition = Composition(
        name="t", path=Path("t/example.toml"), plugins=("deepseek-model", "t-tools"),
        config={"deepseek-model": {**FAST, **(config or {})}},
    )
    async with open_host(composition, provider="deepseek", model=model, pm=pm) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="deepseek", model=model))
        for blocks in prompts:
            agent.submit(UserMessage(id=new_id("u_"), content=blocks))
            if during is not None:
                await during(agent)
            await agent.wait_idle()
        return list(host.session_store.logs[agent.session_id].events)


def _text(s: str) -> list[Any]:
    return [TextBlock(text=s)]


def _answers(events: list[Any]) -> list[str]:
    return ["".join(b.text for b in e.message.content if isinstance(b, TextBlock))
            for e in events if isinstance(e, AssistantMessageEvent)]


async def test_text_turn(env, tmp_path):
    env.push(Turn(content="Hello from DeepSeek.", reasoning="The user greets me."))
    events = await run_session(tmp_path, [_text("hi")])
    assert _answers(events) == ["Hello from DeepSeek."]
    msg = next(e for e in events if isinstance(e, AssistantMessageEvent))
    assert msg.message.provider == "deepseek" and msg.finish == "stop"
    assert msg.usage is not None and msg.usage.input_tokens > 0
    assert msg.usage.cache_hit_tokens + msg.usage.cache_miss_tokens == msg.usage.input_tokens
    assert [e.reason for e in events if isinstance(e, TurnEnd)] == ["completed"]


async def test_multi_tool_turn_with_thinking_replays_reasoning(env, tmp_path):
    env.strict_span = True  # the strictest reading of the V4 rule
    env.push(
        Turn(reasoning="I need two files.", tool_calls=[("read", '{"path": "a.py"}'), ("grep", '{"pattern": "TODO"}')],
             interleave=True),
        Turn(reasoning="Now one more.", tool_calls=[("read", '{"path": "b.py"}')]),
        Turn(reasoning="Enough.", content="Both files are fine."),
        Turn(reasoning="Short.", content="You're welcome."),
    )
    events = await run_session(tmp_path, [_text("check a.py and b.py"), _text("thanks")])
    assert _answers(events)[-2:] == ["Both files are fine.", "You're welcome."]
    chats = env.chat_requests
    assert [r.status for r in chats] == [200] * 4, "the fake rejected a request (reasoning_content not replayed?)"
    assert sum(isinstance(e, ToolResultEvent) for e in events) == 3
    # Every request is a pure append of the previous one: same head, same earlier messages.
    for prev, cur in pairwise(chats):
        assert {k: v for k, v in prev.body.items() if k != "messages"} == {k: v for k, v in cur.body.items() if k != "messages"}
        assert cur.body["messages"][: len(prev.body["messages"])] == prev.body["messages"]
    last = chats[-1].body["messages"]
    assert last[0]["role"] == "system"
    assert [m.get("reasoning_content") for m in last if m["role"] == "assistant"] == [
        "I need two files.", "Now one more.", "Enough."]
    assert all(r.cache_hit_tokens > 0 for r in chats[1:])


async def test_429_then_success_honours_retry_after(env, tmp_path):
    env.push(Fault(429, headers={"Retry-After": "1"}), Turn(content="made it"))
    t0 = time.monotonic()
    events = await run_session(tmp_path, [_text("hi")])
    elapsed = time.monotonic() - t0
    retries = [e for e in events if isinstance(e, RetryEvent)]
    assert len(retries) == 1 and retries[0].delay_ms == 1000 and retries[0].code == "RATE_LIMIT"
    assert "HTTP 429" in retries[0].failure and retries[0].provider == "deepseek"
    assert _answers(events) == ["made it"] and elapsed >= 1.0
    assert len(env.chat_requests) == 2


async def test_500_every_time_fails_clearly_after_bounded_retries(env, tmp_path):
    env.push(*[Fault(500, message="Server Error: upstream exploded")] * 4)
    events = await run_session(tmp_path, [_text("hi")])
    retries = [e for e in events if isinstance(e, RetryEvent)]
    assert [r.retry for r in retries] == [1, 2, 3] and all(r.max_retries == 3 for r in retries)
    err = next(e for e in events if isinstance(e, AgentError))
    assert "HTTP 500" in err.message and "upstream exploded" in err.message and err.code == "SERVER"
    assert [e.reason for e in events if isinstance(e, TurnEnd)] == ["error"]
    assert len(env.chat_requests) == 4 and not any(isinstance(e, AssistantMessageEvent) for e in events)


async def test_401_is_not_retried(env, tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-not-the-right-one-42")
    events = await run_session(tmp_path, [_text("hi")])
    assert not any(isinstance(e, RetryEvent) for e in events)
    err = next(e for e in events if isinstance(e, AgentError))
    assert err.code == "AUTH" and "HTTP 401" in err.message and "Authentication Fails" in err.message
    assert len(env.chat_requests) == 1


async def test_stream_faults_retry_then_succeed(env, tmp_path):
    env.push(
        Turn(content="partial", close_after=3, close_mode="reset"),
        Turn(content="", finish_reason="stop"),
        Turn(content="ok at last", usage_mode="trailing"),
    )
    events = await run_session(tmp_path, [_text("hi")])
    assert [e.code for e in events if isinstance(e, RetryEvent)] == ["TRANSPORT", "EMPTY_RESPONSE"]
    assert _answers(events) == ["ok at last"]  # failed attempts left no assistant message


async def test_cancel_mid_stream_closes_the_http_stream(env, tmp_path):
    env.push(Turn(content="word " * 400, delay_per_event_s=0.03))

    async def cancel_when_streaming(agent: Any) -> None:
        with anyio.fail_after(5):
            while not env.chat_requests or env.chat_requests[-1].events_sent < 5:
                await anyio.sleep(0.01)
        agent.cancel()

    t0 = time.monotonic()
    events = await run_session(tmp_path, [_text("talk a lot")], during=cancel_when_streaming)
    rec = env.chat_requests[-1]
    assert env.wait_for(lambda: rec.cancelled, 2.0), "server never saw the disconnect"
    assert time.monotonic() - t0 < 3.0 and not rec.finished
    ends = [e for e in events if isinstance(e, TurnEnd)]
    assert ends[-1].reason == "aborted"


async def test_image_input_on_the_flash_route(env, tmp_path):
    store = _MemoryImages()
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
    [block] = await store.save_images([("image/png", png)])
    env.push(Turn(content="A tiny PNG."))
    events = await run_session(tmp_path, [[TextBlock(text="what is this?"), block]], model="deepseek-flash", store=store)
    assert _answers(events) == ["A tiny PNG."]
    content = env.chat_requests[-1].body["messages"][-1]["content"]
    assert content[1]["type"] == "image_url" and content[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")


async def test_image_without_store_fails_clearly(env, tmp_path):
    block = ImageBlock(digest="sha256:" + "0" * 64, mime="image/png", size=10)
    events = await run_session(tmp_path, [[TextBlock(text="see"), block]], model="deepseek-flash")
    err = next(e for e in events if isinstance(e, AgentError))
    assert "attachment store" in err.message and not env.chat_requests


async def test_api_key_never_leaks(env, tmp_path, capsys):
    env.push(
        Fault(500, message=f"echoing your key {env.api_key}"),
        Turn(content="fine", reasoning="r"),
        Fault(401),
    )
    events = await run_session(tmp_path, [_text("one"), _text("two")])
    encoded = b"\n".join(msgspec.json.encode(e) for e in events).decode()
    captured = capsys.readouterr()
    for where in (encoded, captured.out, captured.err):
        assert env.api_key not in where
    assert "[redacted]" in encoded  # the echoed key was scrubbed from the retry record


async def test_missing_key_fails_the_turn_not_startup(fake, isolated, tmp_path):
    events = await run_session(tmp_path, [_text("hi")])
    err = next(e for e in events if isinstance(e, AgentError))
    assert err.code == "MISSING_CREDENTIAL" and "DEEPSEEK_API_KEY" in err.message


async def test_prefix_cache_hit_ratio_over_a_tool_heavy_session(env, tmp_path):
    """30 model calls, mostly tool calls: append-only requests keep the prefix cache hitting."""
    turns = []
    for i in range(29):
        turns.append(Turn(reasoning=f"step {i}: look at file {i}",
                          tool_calls=[("read", json.dumps({"path": f"src/m{i}.py"}))] if i % 2 == 0 else
                          [("grep", json.dumps({"pattern": f"def f{i}"})), ("read", json.dumps({"path": f"t{i}.py"}))]))
    turns.append(Turn(reasoning="done", content="All 29 steps checked."))
    env.push(*turns)
    events = await run_session(tmp_path, [_text("audit the repo")])
    chats = env.chat_requests
    assert len(chats) == 30 and all(r.status == 200 for r in chats)
    prompt = sum(r.prompt_tokens for r in chats)
    hit = sum(r.cache_hit_tokens for r in chats)
    usage = [e.usage for e in events if isinstance(e, AssistantMessageEvent)]
    assert sum(u.cache_hit_tokens for u in usage) == hit  # the adapter recorded what the server reported
    ratio = hit / prompt
    print(f"\nprefix cache: {len(chats)} calls, prompt tokens {prompt}, cache-hit tokens {hit}, ratio {ratio:.1%}",
          file=sys.__stderr__)
    assert ratio >= 0.94
