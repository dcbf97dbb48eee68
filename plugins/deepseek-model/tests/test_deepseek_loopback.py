"""The provider against a real DeepSeek-compatible server on 127.0.0.1 (no MockTransport)."""

from __future__ import annotations

import json
import time

import anyio
import httpx
import pytest
from fake_deepseek import REASONING_400, Fault, Turn

from conftest import make_provider
from dsh_core import ModelError
from dsh_core.types import (
    Finish,
    ModelRequest,
    ReasoningDelta,
    TextBlock,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
    UserMessage,
)

pytestmark = pytest.mark.anyio

TOOLS = [ToolSpec(name="read", description="Read a file", parameters={"type": "object", "properties": {"path": {"type": "string"}}})]


def _req(provider, text="hi", model="deepseek-v4-flash"):
    return ModelRequest(route=provider.resolve(model), system="You are a test.",
                        messages=[UserMessage(id="u", content=[TextBlock(text=text)])], tools=TOOLS)


async def _collect(provider, request):
    try:
        return [d async for d in provider.stream(request)]
    finally:
        await provider.aclose()


async def _fails(provider, request) -> ModelError:
    with pytest.raises(ModelError) as info:
        await _collect(provider, request)
    return info.value


@pytest.mark.parametrize("crlf", [False, True])
@pytest.mark.parametrize("usage_mode", ["attached", "trailing", "both"])
async def test_text_turn_with_reasoning(env, crlf, usage_mode):
    env.crlf = crlf
    text, reasoning = "Héllo, 世界 🙂! " * 5, "Let me think… 🤔 " * 4
    env.push(Turn(content=text, reasoning=reasoning, usage_mode=usage_mode))
    p = make_provider()
    out = await _collect(p, _req(p))
    assert "".join(d.text for d in out if isinstance(d, ReasoningDelta)) == reasoning
    assert "".join(d.text for d in out if isinstance(d, TextDelta)) == text
    usage = [d.usage for d in out if isinstance(d, UsageDelta)]
    assert len(usage) == 1 and usage[0].input_tokens > 0 and usage[0].reasoning_tokens > 0
    assert usage[0].cache_hit_tokens + usage[0].cache_miss_tokens == usage[0].input_tokens
    assert out[-1] == Finish(reason="stop")
    sent = env.chat_requests[-1]
    assert sent.headers["Authorization"] == f"Bearer {env.api_key}" and sent.status == 200 and sent.finished


async def test_parallel_tool_calls_assembled_by_index(env):
    args0, args1 = json.dumps({"path": "a/b/c.txt", "n": [1, 2, 3]}), json.dumps({"path": "ü.md"})
    env.push(Turn(reasoning="two reads", tool_calls=[("read", args0), ("read", args1)], interleave=True))
    p = make_provider()
    out = await _collect(p, _req(p))
    calls: dict[int, dict] = {}
    for d in out:
        if isinstance(d, ToolCallDelta):
            slot = calls.setdefault(d.index, {"id": None, "name": None, "args": ""})
            slot["id"] = d.id or slot["id"]
            slot["name"] = d.name or slot["name"]
            slot["args"] += d.arguments
    assert [calls[i]["args"] for i in (0, 1)] == [args0, args1]
    assert all(c["id"].startswith(f"call_0{i}_") and c["name"] == "read" for i, c in calls.items())
    assert out[-1] == Finish(reason="tool-calls")


async def test_keepalives_before_first_event_are_tolerated(env):
    env.push(Turn(content="after the queue", queue_s=0.4))
    p = make_provider(**{"first-event-timeout": 2.0})
    out = await _collect(p, _req(p))
    assert "".join(d.text for d in out if isinstance(d, TextDelta)) == "after the queue"


async def test_keepalives_do_not_extend_the_first_event_timeout(env):
    env.push(Turn(content="too late", queue_s=5.0))
    p = make_provider(**{"first-event-timeout": 0.4})
    t0 = time.monotonic()
    err = await _fails(p, _req(p))
    assert err.code == "TIMEOUT" and err.retryable and "keep-alives do not count" in err.message
    assert time.monotonic() - t0 < 2.0


async def test_stalled_stream_hits_the_overall_deadline(env):
    """Valid output, then keep-alives forever: the overall deadline ends it."""
    env.push(Turn(content="partial answer", stall=True))
    p = make_provider(deadline=0.8, **{"idle-timeout": 30.0})
    t0 = time.monotonic()
    err = await _fails(p, _req(p))
    assert err.code == "TIMEOUT" and err.retryable and "overall deadline" in err.message
    assert 0.7 < time.monotonic() - t0 < 2.5
    assert env.wait_for(lambda: env.chat_requests[-1].cancelled, 3.0)


async def test_stalled_stream_hits_the_idle_timeout(env):
    env.push(Turn(content="partial answer", stall=True))
    p = make_provider(deadline=30.0, **{"idle-timeout": 0.4})
    err = await _fails(p, _req(p))
    assert err.code == "TIMEOUT" and "idle" in err.message


@pytest.mark.parametrize(
    "turn, code, retryable",
    [
        (Turn(content="cut short here", close_after=4, close_mode="clean"), "TRANSPORT", True),
        (Turn(content="cut short here", close_after=4, close_mode="reset"), "TRANSPORT", True),
        (Turn(content="cut short here", queue_s=0.2, close_after=0), "TRANSPORT", True),
        (Turn(content="garbled stream", malformed_after=2), "MALFORMED_RESPONSE", True),
        (Turn(content="", finish_reason="stop"), "EMPTY_RESPONSE", True),
        (Turn(content="half", finish_reason="insufficient_system_resource"), "SERVER", True),
        (Turn(content="nope", finish_reason="content_filter"), "CONTENT_FILTER", False),
        (Turn(content="?", finish_reason="mystery"), "MALFORMED_RESPONSE", False),
    ],
)
async def test_stream_faults_are_classified(env, turn, code, retryable):
    env.push(turn)
    p = make_provider()
    err = await _fails(p, _req(p))
    assert (err.code, err.retryable) == (code, retryable)
    assert env.api_key not in err.message


async def test_length_is_a_max_tokens_finish_not_an_error(env):
    env.push(Turn(content="truncated answ", finish_reason="length"))
    p = make_provider()
    out = await _collect(p, _req(p))
    assert out[-1] == Finish(reason="max-tokens")


@pytest.mark.parametrize("status", [400, 401, 402, 422, 429, 500, 503])
async def test_real_error_bodies(env, status):
    env.push(Fault(status, headers={"Retry-After": "2", "x-request-id": "rid-9"}))
    p = make_provider()
    err = await _fails(p, _req(p))
    assert err.status == status and f"HTTP {status}" in err.message and "rid-9" in err.message
    assert err.retryable == (status in (429, 500, 503))
    assert err.retry_after == (2.0 if err.retryable else None)


async def test_wrong_key_is_auth_and_model_not_exist_is_invalid(env, monkeypatch):
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-wrong-key-123456")
    p = make_provider()
    err = await _fails(p, _req(p))
    assert err.code == "AUTH" and "Authentication Fails" in err.message and "sk-wrong-key-123456" not in err.message
    monkeypatch.setenv("DEEPSEEK_API_KEY", env.api_key)
    p = make_provider()
    err = await _fails(p, _req(p, model="deepseek-v9-imaginary"))
    assert err.code == "INVALID_REQUEST" and "Model Not Exist" in err.message


async def test_concurrency_cap_gives_429(env):
    env.max_concurrency = 1
    env.push(Turn(content="slow " * 20, delay_per_event_s=0.05))  # a second of streaming
    p = make_provider()
    results: list = []
    streaming = anyio.Event()

    async def one() -> None:
        try:
            deltas = []
            async for d in p.stream(_req(p)):
                deltas.append(d)
                streaming.set()
            results.append(deltas)
        except ModelError as exc:
            results.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        with anyio.fail_after(10):
            await streaming.wait()  # the first request holds the server's one slot
        tg.start_soon(one)
    assert any(isinstance(r, ModelError) and r.code == "RATE_LIMIT" for r in results)
    assert any(isinstance(r, list) for r in results), results
    await p.aclose()


async def test_cancel_closes_the_stream_at_once(env):
    env.push(Turn(content="x" * 400, delay_per_event_s=0.03))
    p = make_provider()
    got: list = []
    with anyio.move_on_after(5):
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                async for d in p.stream(_req(p)):
                    got.append(d)

            tg.start_soon(consume)
            while sum(isinstance(d, TextDelta) for d in got) < 3:
                await anyio.sleep(0.01)
            t0 = time.monotonic()
            tg.cancel_scope.cancel()
    rec = env.chat_requests[-1]
    assert env.wait_for(lambda: rec.cancelled, 2.0), "the server never saw the disconnect"
    assert time.monotonic() - t0 < 1.0
    assert not rec.finished and rec.events_sent < 60
    await p.aclose()


async def test_fake_rejects_missing_reasoning_content(fake):
    """The fake enforces DeepSeek's thinking-mode rule (so the e2e tests prove the adapter obeys it)."""
    body = {
        "model": "deepseek-flash", "stream": False,
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "r"},
        ],
    }
    async with httpx.AsyncClient(base_url=fake.base_url, headers={"Authorization": f"Bearer {fake.api_key}"}) as c:
        r = await c.post("/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["message"] == REASONING_400
        body["messages"][1]["reasoning_content"] = ""
        r = await c.post("/chat/completions", json=body)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
        r = await c.get("/models")
        assert [m["id"] for m in r.json()["data"]][:2] == ["deepseek-flash", "deepseek-v4-pro"]
