"""Unit tests: SSE parsing, config, catalogue, request building, error taxonomy (MockTransport)."""

from __future__ import annotations

import json
import random

import httpx
import pytest
from dsh_deepseek_model import DeepSeekProvider, parse_settings
from dsh_deepseek_model._config import find_api_key
from dsh_deepseek_model._errors import parse_retry_after
from dsh_deepseek_model._sse import KEEP_ALIVE, SSEEvent, SSEParser
from dsh_deepseek_model._wire import build_body, dumps

from conftest import FAST
from dsh_core import ConfigError, ModelError, RouteError
from dsh_core.types import (
    AssistantMessage,
    ImageBlock,
    ModelRequest,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)

# --------------------------------------------------------------------------- SSE


def _feed_all(data: bytes, sizes: list[int]) -> list:
    p = SSEParser()
    out, i = [], 0
    for n in sizes:
        out += p.feed(data[i : i + n])
        i += n
    out += p.feed(data[i:])
    return out + p.close()


def test_sse_split_anywhere_gives_the_same_events():
    text = "data: {\"a\":\"héllo 🙂 世界\"}\r\n\r\n: keep-alive\n\ndata: x\ndata: y\n\ndata: [DONE]\n\n"
    data = text.encode()
    want = [e for e in _feed_all(data, []) if e is not KEEP_ALIVE]
    assert want == [SSEEvent('{"a":"héllo 🙂 世界"}'), SSEEvent("x\ny"), SSEEvent("[DONE]")]
    rng = random.Random(1)
    for _ in range(200):
        sizes = [rng.randint(1, 7) for _ in range(len(data))]
        got = [e for e in _feed_all(data, sizes) if e is not KEEP_ALIVE]
        assert got == want


def test_sse_comments_and_blank_lines_are_keepalives():
    p = SSEParser()
    assert p.feed(b": keep-alive\n\n\n") == [KEEP_ALIVE, KEEP_ALIVE, KEEP_ALIVE]
    assert p.feed(b"data: 1") == []
    assert p.close() == []  # undispatched event at EOF is dropped


# --------------------------------------------------------------------------- config & catalogue


def test_config_defaults_and_overrides():
    s = parse_settings(None)
    assert s.reasoning_effort == "high" and s.max_tokens == 256_000
    assert s.retry.max_retries == 5
    s = parse_settings({"reasoning-effort": "off", "retry": {"max-retries": 1, "base-delay": 0.2}, "deadline": 5})
    assert s.reasoning_effort == "off" and s.retry.max_retries == 1 and s.retry.base_delay == 0.2
    assert s.retry.max_delay == 30.0 and s.deadline == 5.0
    assert DeepSeekProvider(s).retry_policy.max_retries == 1


@pytest.mark.parametrize(
    "table, needle",
    [
        ({"bogus": 1}, "bogus"),
        ({"reasoning-effort": "medium"}, "reasoning-effort"),
        ({"max-tokens": 0}, "max-tokens"),
        ({"deadline": "soon"}, "deadline"),
        ({"retry": {"tries": 3}}, "retry.tries"),
        ({"retry": {"jitter": 1.5}}, "retry.jitter"),
        ({"base-url": "ftp://x"}, "base-url"),
        ({"models": {"x": {"image-input": "yes"}}}, "models.x.image-input"),
    ],
)
def test_config_errors_name_the_key(table, needle):
    with pytest.raises(ConfigError, match="deepseek-model") as info:
        parse_settings(table)
    assert needle in str(info.value)


def test_catalogue_declares_capabilities_truthfully(capsys):
    p = DeepSeekProvider()
    flash, pro, legacy, vision = (p.resolve(m) for m in
                                  ("deepseek-flash", "deepseek-v4-pro", "deepseek-v4-flash", "deepseek-v4-flash-vision-exp"))
    assert flash.image_input and vision.image_input
    assert not pro.image_input and not legacy.image_input
    for info in (flash, pro, legacy, vision):
        assert info.provider == "deepseek" and info.known and info.tools and info.thinking
        assert info.context_window == 1_048_576 and info.max_output == 393_216
    assert capsys.readouterr().err == ""


def test_unknown_ids_pass_through_text_only_with_one_warning(capsys):
    p = DeepSeekProvider()
    info = p.resolve("deepseek-v5-preview")
    p.resolve("deepseek-v5-preview")
    assert not info.known and not info.image_input
    err = capsys.readouterr().err
    assert err.count("deepseek-v5-preview") == 1 and "text-only" in err


def test_retired_and_malformed_ids_are_refused():
    p = DeepSeekProvider()
    with pytest.raises(RouteError, match="retired"):
        p.resolve("deepseek-chat")
    with pytest.raises(RouteError):
        p.resolve("")
    with pytest.raises(RouteError):
        p.resolve("deepseek flash")


def test_config_models_table_declares_or_overrides(capsys):
    p = DeepSeekProvider(parse_settings({"models": {"my-proxy-model": {"image-input": True, "context-window": 131072},
                                                    "deepseek-v4-flash": {"image-input": True}}}))
    mine = p.resolve("my-proxy-model")
    assert mine.known and mine.image_input and mine.context_window == 131072
    assert p.resolve("deepseek-v4-flash").image_input
    assert capsys.readouterr().err == ""


def test_api_key_from_env_then_dotenv(isolated, monkeypatch):
    from dsh_deepseek_model import _config

    assert find_api_key() is None
    (_config.repo_root() / ".env").write_text("OTHER=1\nexport DEEPSEEK_API_KEY='sk-root'\n")
    assert find_api_key() == "sk-root"
    (isolated / ".env").write_text("# comment\nDEEPSEEK_API_KEY=sk-cwd # trailing\n")
    assert find_api_key() == "sk-cwd"
    assert find_api_key(dotenv=False) is None
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-env")
    assert find_api_key() == "sk-env"


# --------------------------------------------------------------------------- request building

TOOLS = [
    ToolSpec(name="read", description="Read a file", parameters={"type": "object", "properties": {"path": {"type": "string"}}}),
    ToolSpec(name="bash", description="Run", parameters={"type": "object", "properties": {"cmd": {"type": "string"}}}),
]


def _history():
    return [
        UserMessage(id="u1", content=[TextBlock(text="look at a.txt")]),
        AssistantMessage(id="a1", content=[ReasoningBlock(text="I should read it"),
                                           ToolCallBlock(id="call_1", name="read", arguments='{"path":"a.txt"}'),
                                           ToolCallBlock(id="call_2", name="bash", arguments="")]),
        ToolResultMessage(call_id="call_1", name="read", content=[TextBlock(text="hello")]),
        ToolResultMessage(call_id="call_2", name="bash", content=[]),
        AssistantMessage(id="a2", content=[TextBlock(text="It says hello.")]),
        UserMessage(id="u2", content=[TextBlock(text="thanks")]),
    ]


def _request(messages, model="deepseek-v4-flash", **kw):
    return ModelRequest(route=DeepSeekProvider().resolve(model), system="SYSTEM", messages=messages, tools=TOOLS, **kw)


@pytest.mark.anyio
async def test_body_shape_and_reasoning_replay(anyio_backend):
    body = await build_body(_request(_history()), effort="high", max_tokens=1000)
    assert list(body) == ["model", "messages", "tools", "thinking", "reasoning_effort", "stream", "stream_options", "max_tokens"]
    m = body["messages"]
    assert m[0] == {"role": "system", "content": "SYSTEM"}
    assert m[2] == {
        "role": "assistant", "content": "", "reasoning_content": "I should read it",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path":"a.txt"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "bash", "arguments": "{}"}},
        ],
    }
    assert m[4] == {"role": "tool", "tool_call_id": "call_2", "content": "(no output)"}
    assert m[5] == {"role": "assistant", "content": "It says hello.", "reasoning_content": ""}
    assert [t["function"]["name"] for t in body["tools"]] == ["read", "bash"]
    assert body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 1000


@pytest.mark.anyio
async def test_thinking_off_omits_reasoning(anyio_backend):
    body = await build_body(_request(_history()), effort="off", max_tokens=1000)
    assert body["thinking"] == {"type": "disabled"} and "reasoning_effort" not in body
    assert all("reasoning_content" not in m for m in body["messages"])


@pytest.mark.anyio
async def test_requests_are_append_only(anyio_backend):
    """Each call's serialized messages are a byte prefix of the next call's."""
    history = _history()
    previous = None
    for n in range(1, len(history) + 1):
        body = await build_body(_request(history[:n]), effort="high", max_tokens=1000)
        head = dumps({k: v for k, v in body.items() if k != "messages"})
        encoded = [dumps(m) for m in body["messages"]]
        if previous is not None:
            assert head == previous[0]
            assert encoded[: len(previous[1])] == previous[1]
        previous = (head, encoded)


@pytest.mark.anyio
async def test_images_become_data_urls_only_on_image_routes(anyio_backend):
    img = ImageBlock(digest="sha256:00", mime="image/png", size=4)

    async def read(block):
        assert block is img
        return b"\x89PNG"

    msgs = [UserMessage(id="u", content=[TextBlock(text="what is this"), img])]
    body = await build_body(_request(msgs, model="deepseek-flash"), effort="high", max_tokens=10, read_image=read)
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
    ]
    with pytest.raises(ModelError, match="does not accept image input"):
        await build_body(_request(msgs, model="deepseek-v4-pro"), effort="high", max_tokens=10, read_image=read)
    with pytest.raises(ModelError, match="no attachment store"):
        await build_body(_request(msgs, model="deepseek-flash"), effort="high", max_tokens=10, read_image=None)


@pytest.mark.anyio
async def test_tool_images_follow_in_a_user_message(anyio_backend):
    img = ImageBlock(digest="sha256:01", mime="image/jpeg", size=2)

    async def read(block):
        return b"\xff\xd8"

    msgs = [
        UserMessage(id="u", content=[TextBlock(text="screenshot")]),
        AssistantMessage(id="a", content=[ToolCallBlock(id="c1", name="read", arguments="{}")]),
        ToolResultMessage(call_id="c1", name="read", content=[TextBlock(text="shot:"), img]),
    ]
    body = await build_body(_request(msgs, model="deepseek-flash"), effort="high", max_tokens=10, read_image=read)
    tool, follow = body["messages"][3], body["messages"][4]
    assert tool["role"] == "tool" and isinstance(tool["content"], str) and "image 1" in tool["content"]
    assert follow["role"] == "user" and follow["content"][1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    text_only = await build_body(_request(msgs, model="deepseek-v4-pro"), effort="high", max_tokens=10, read_image=read)
    assert "image omitted" in text_only["messages"][3]["content"] and len(text_only["messages"]) == 4


# --------------------------------------------------------------------------- error taxonomy (MockTransport)

SECRET = "sk-unit-secret-0000"


def _provider(handler) -> DeepSeekProvider:
    return DeepSeekProvider(parse_settings({**FAST, "base-url": "http://deepseek.invalid"}),
                            transport=httpx.MockTransport(handler))


@pytest.mark.anyio
@pytest.mark.parametrize(
    "status, code, retryable, text",
    [
        (400, "INVALID_REQUEST", False, "Model Not Exist"),
        (400, "CONTEXT_WINDOW_EXCEEDED", False, "This model's maximum context length is 131072 tokens."),
        (401, "AUTH", False, "Authentication Fails (no such user)"),
        (402, "QUOTA", False, "Insufficient Balance"),
        (422, "INVALID_REQUEST", False, "Failed to deserialize the JSON body"),
        (429, "RATE_LIMIT", True, "Rate Limit Reached"),
        (500, "SERVER", True, "Server Error"),
        (502, "SERVER", True, "Bad Gateway"),
        (503, "SERVER", True, "Server Overloaded"),
        (418, "HTTP_418", False, "teapot"),
    ],
)
async def test_http_errors_are_classified(anyio_backend, monkeypatch, status, code, retryable, text):
    monkeypatch.setenv("DEEPSEEK_API_KEY", SECRET)
    monkeypatch.delenv("DEEPSEEK_BASE_URL", raising=False)

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == f"Bearer {SECRET}"
        body = {"error": {"message": f"{text} (key {SECRET})", "type": "x", "param": None, "code": "x"}}
        return httpx.Response(status, json=body, headers={"Retry-After": "3", "x-request-id": "req-1"})

    p = _provider(handler)
    with pytest.raises(ModelError) as info:
        async for _ in p.stream(_request([UserMessage(id="u", content=[TextBlock(text="hi")])])):
            pass
    await p.aclose()
    err = info.value
    assert (err.code, err.retryable, err.status) == (code, retryable, status)
    assert f"HTTP {status}" in err.message and text in err.message and "req-1" in err.message
    assert SECRET not in err.message and "[redacted]" in err.message
    assert err.retry_after == (3.0 if retryable else None)


@pytest.mark.anyio
async def test_transport_error_is_retryable_and_names_no_key(anyio_backend, monkeypatch):
    monkeypatch.setenv("DEEPSEEK_API_KEY", SECRET)
    monkeypatch.delenv("DEEPSEEK_BASE_URL", raising=False)

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    p = _provider(handler)
    with pytest.raises(ModelError) as info:
        async for _ in p.stream(_request([UserMessage(id="u", content=[TextBlock(text="hi")])])):
            pass
    assert info.value.code == "TRANSPORT" and info.value.retryable and SECRET not in info.value.message


def test_retry_after_parsing():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == pytest.approx(10.0)


@pytest.mark.anyio
@pytest.mark.parametrize("bad", ["sk-abc\ndef", "sk-abc def", "sk-\u00e9t\u00e9"], ids=["newline", "space", "non-ascii"])
async def test_a_key_no_header_can_carry_fails_as_invalid_credential(anyio_backend, env, monkeypatch, bad):
    monkeypatch.setenv("DEEPSEEK_API_KEY", bad)
    p = DeepSeekProvider(parse_settings(FAST))
    with pytest.raises(ModelError) as exc:
        async for _ in p.stream(ModelRequest(route=p.resolve("deepseek-flash"), system="", messages=[], tools=[])):
            pass
    assert exc.value.code == "INVALID_CREDENTIAL" and not exc.value.retryable
    assert "DEEPSEEK_API_KEY" in exc.value.message and bad not in exc.value.message
    assert env.chat_requests == []  # refused before anything was sent


@pytest.mark.anyio
async def test_missing_key_with_dotenv_off_does_not_point_at_env_files(anyio_backend, isolated):
    p = DeepSeekProvider(parse_settings({**FAST, "dotenv": False}))
    with pytest.raises(ModelError) as exc:
        async for _ in p.stream(ModelRequest(route=p.resolve("deepseek-flash"), system="", messages=[], tools=[])):
            pass
    assert exc.value.code == "MISSING_CREDENTIAL" and "DEEPSEEK_API_KEY" in exc.value.message
    assert "dotenv = false" in exc.value.message and "or in a .env" not in exc.value.message


@pytest.mark.anyio
async def test_missing_key_fails_the_request_not_startup(anyio_backend, isolated):
    p = DeepSeekProvider(parse_settings(FAST))
    info = p.resolve("deepseek-flash")  # resolving needs no key
    with pytest.raises(ModelError) as exc:
        async for _ in p.stream(ModelRequest(route=info, system="", messages=[], tools=[])):
            pass
    assert exc.value.code == "MISSING_CREDENTIAL" and not exc.value.retryable
    assert "DEEPSEEK_API_KEY" in exc.value.message and ".env" in exc.value.message
    json.dumps(exc.value.message)
