"""The ``deepseek`` model provider: streaming ``POST /chat/completions`` over one pooled httpx client."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from dsh_core import ModelError, RouteError
from dsh_core.protocols import AuthMethod
from dsh_core.types import (
    Cost,
    Finish,
    ModelDelta,
    ModelInfo,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageDelta,
)

from . import _catalogue
from ._config import KEY_ENV, DeepSeekConfig, find_api_key, repo_root
from ._errors import http_error, redact, transport_error
from ._sse import KEEP_ALIVE, SSEParser
from ._wire import build_body, dumps

log = logging.getLogger("dsh.deepseek-model")

if TYPE_CHECKING:  # pragma: no cover
    import httpx

    from dsh_core.protocols import Host

PROVIDER = "deepseek"
USER_AGENT = "dsh-deepseek-model/0.1"
MAX_ERROR_BODY = 64 * 1024

_FINISH = {"stop": "stop", "tool_calls": "tool-calls", "length": "max-tokens"}


@dataclass
class _Call:
    """What one streamed answer has shown so far."""

    model: str
    text: bool = False
    reasoning: bool = False
    tools: set[int] = field(default_factory=set)
    finish: str | None = None
    usage: dict[str, Any] | None = None
    events: int = 0


_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")  # a bearer token: visible ASCII only


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def usage_from(raw: dict[str, Any]) -> Usage:
    prompt = _int(raw.get("prompt_tokens"))
    details = d if isinstance(d := raw.get("prompt_tokens_details"), dict) else {}
    hit = raw.get("prompt_cache_hit_tokens")
    hit = _int(hit) if hit is not None else _int(details.get("cached_tokens"))
    miss = raw.get("prompt_cache_miss_tokens")
    miss = _int(miss) if miss is not None else max(0, prompt - hit)
    completion = raw.get("completion_tokens_details")
    reasoning = _int(completion.get("reasoning_tokens")) if isinstance(completion, dict) else 0
    return Usage(
        input_tokens=prompt,
        output_tokens=_int(raw.get("completion_tokens")),
        cache_hit_tokens=hit,
        cache_miss_tokens=miss,
        reasoning_tokens=reasoning,
    )


def _chunk_deltas(chunk: Any, call: _Call) -> list[ModelDelta]:
    if not isinstance(chunk, dict):
        raise ModelError(f"deepseek: malformed stream event from model {call.model}: not a JSON object",
                         code="MALFORMED_RESPONSE", retryable=True)
    if chunk.get("error"):
        err = chunk["error"]
        text = err.get("message") if isinstance(err, dict) else str(err)
        raise ModelError(f"deepseek: error inside the stream from model {call.model}: {text}",
                         code="SERVER", retryable=True)
    out: list[ModelDelta] = []
    if isinstance(chunk.get("usage"), dict):
        call.usage = chunk["usage"]
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or {}
        if isinstance(delta, dict):
            reasoning = delta.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                call.reasoning = True
                out.append(ReasoningDelta(text=reasoning))
            content = delta.get("content")
            if isinstance(content, str) and content:
                call.text = True
                out.append(TextDelta(text=content))
            for tc in delta.get("tool_calls") or []:
                if not isinstance(tc, dict):
                    continue
                index = _int(tc.get("index"))
                fn = f if isinstance(f := tc.get("function"), dict) else {}
                call.tools.add(index)
                out.append(
                    ToolCallDelta(
                        index=index,
                        id=tc.get("id") or None,
                        name=fn.get("name") or None,
                        arguments=fn.get("arguments") or "",
                    )
                )
        if choice.get("finish_reason"):
            call.finish = choice["finish_reason"]
    return out


class DeepSeekProvider:
    """Provider ``deepseek``. ``resolve`` is a catalogue lookup; ``stream`` does the HTTP."""

    name = PROVIDER

    def __init__(
        self,
        settings: DeepSeekConfig | None = None,
        *,
        host: Host | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings or DeepSeekConfig()
        self.retry_policy = self.settings.retry_policy()
        self._overrides = self.settings.model_overrides()
        self._prices = self.settings.price_table()
        self._host = host
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._warned: set[str] = set()
        self._stored_key: str | None = None  # what `dsh auth login` stored ("": nothing), read on first need

    # ------------------------------------------------------------------ catalogue

    def resolve(self, model: str) -> ModelInfo:
        if not isinstance(model, str) or not model or model != model.strip() or any(c.isspace() for c in model):
            raise RouteError(f"deepseek: {model!r} is not a model id (known: {', '.join(_catalogue.CATALOGUE)})")
        if model in _catalogue.RETIRED:
            raise RouteError(f"deepseek: model {model!r} is refused: {_catalogue.RETIRED[model]}")
        overrides = self._overrides.get(model)
        card = _catalogue.CATALOGUE.get(model)
        known = card is not None or overrides is not None
        if card is None:
            card = _catalogue.unlisted(model)
            if overrides is None and model not in self._warned:
                self._warned.add(model)
                log.warning(
                    f"{model!r} is not in the catalogue "
                    f"({', '.join(_catalogue.CATALOGUE)}); passing it through as a text-only route"
                )
        if overrides:
            card = card.with_overrides(overrides)
        return ModelInfo(
            provider=PROVIDER,
            model=model,
            known=known,
            **card.declared(),
            efforts=_catalogue.EFFORTS if card.thinking else (),
            effort=self.settings.effort if card.thinking else None,
        )

    def models(self) -> list[ModelInfo]:
        """The routes a session may switch to: the catalogue's current ids, then the configured ones."""
        ids = list(_catalogue.OFFERED) + [m for m in self._overrides if m not in _catalogue.OFFERED]
        return [self.resolve(m) for m in ids]

    def cost(self, model: str, usage: Usage, at: float) -> Cost | None:
        """One call's price: cached input at the hit rate, the rest of the input at the miss rate,
        output (reasoning included) at the output rate; doubled in peak hours. None for a model
        without a price (``[config.deepseek-model] prices`` adds or overrides them)."""
        price = self._prices.get(model) or _catalogue.PRICES.get(model)
        if price is None:
            return None
        hit = min(usage.cache_hit_tokens, usage.input_tokens)
        amount = (hit * price.hit + (usage.input_tokens - hit) * price.miss + usage.output_tokens * price.output) / 1e6
        return Cost(amount=amount * (_catalogue.PEAK_FACTOR if _catalogue.peak(at) else 1.0), currency=price.currency)

    # ------------------------------------------------------------------ client

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            # httpx is imported on first use, not at start-up: where click, rich and pygments are
            # installed (uvicorn, which the mcp SDK needs, brings them), importing httpx also loads
            # its command line, 35-50 ms of an agent's start-up measured here (bench/startup_cpu.py)
            import httpx

            s = self.settings
            self._client = httpx.AsyncClient(
                transport=self._transport,
                timeout=httpx.Timeout(connect=s.connect_timeout, read=None, write=60.0, pool=s.connect_timeout),
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=16, keepalive_expiry=60.0),
                headers={"User-Agent": USER_AGENT},
                follow_redirects=False,
                trust_env=True,
            )
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with anyio.CancelScope(shield=True):
                await client.aclose()

    # ------------------------------------------------------------------ streaming

    def _stored(self) -> str | None:
        """The key ``dsh auth login`` stored, read once per process (a keyring call may cost
        milliseconds; requests are many); a 401 forgets it, so a new login is read again."""
        if self._stored_key is None:
            from ._login import stored_key

            self._stored_key = stored_key()[0] or ""
        return self._stored_key or None

    def credential_problem(self) -> str | None:
        """None when a key is at hand (environment, ``dsh auth login``, a ``.env``), else what to do."""
        self._stored_key = None  # asked before a session opens: read the store again
        if os.environ.get(KEY_ENV, "").strip() or self._stored() or find_api_key(dotenv=self.settings.dotenv):
            return None
        return (f"no DeepSeek API key: log in with `dsh auth login` in a terminal (the key goes to the OS keyring), "
                f"or set {KEY_ENV}")

    def auth_methods(self) -> list[AuthMethod]:
        return [AuthMethod(
            id="deepseek-api-key", name="DeepSeek API key",
            description="Paste your DeepSeek API key (from platform.deepseek.com) in a terminal: `dsh auth login`. "
                        "It is kept in the OS keyring, or else in a file only you can read.",
            args=("--login",))]

    def logout(self) -> list[str]:
        """Remove the stored key (``dsh auth logout``: the OS keyring and the key file); where it was."""
        from ._login import forget_key

        self._stored_key = None
        return forget_key()

    def login(self) -> int:
        """``dsh run --login``: the terminal login an editor runs (ACP terminal auth)."""
        from ._login import login

        self._stored_key = None
        return login(base_url=self.settings.base_url)

    def _missing_key(self) -> ModelError:
        if not self.settings.dotenv:  # .env files are not read: do not send the user to write one
            return ModelError(f"deepseek: no API key: set {KEY_ENV} in the environment "
                              "(.env files are off: [config.deepseek-model] dotenv = false)", code="MISSING_CREDENTIAL")
        where = [str(Path.cwd() / ".env")]
        root = repo_root() / ".env"
        if str(root) not in where:
            where.append(str(root))
        return ModelError(
            f"deepseek: no API key: set {KEY_ENV} in the environment or in a .env file ({' or '.join(where)})",
            code="MISSING_CREDENTIAL",
        )

    async def _read_image(self, block: Any) -> bytes:
        store = getattr(self._host, "attachment_store", None)
        if store is None:
            raise ModelError(
                "deepseek: the request holds an image but no attachment store is mounted to read it "
                "(mount a plugin that provides dsh_attachment_store)",
                code="INVALID_REQUEST",
            )
        return await store.read_image(block)

    def _api_key(self) -> str:
        key = os.environ.get(KEY_ENV, "").strip() or self._stored() or find_api_key(dotenv=self.settings.dotenv)
        if not key:
            raise self._missing_key()
        if not _HEADER_SAFE.fullmatch(key):  # httpx would fail it deep in the send, as a crash or a retried transport error
            raise ModelError(
                f"deepseek: the API key contains characters an HTTP header cannot carry (spaces, control or non-ASCII "
                f"characters); set {KEY_ENV} to the key alone",
                code="INVALID_CREDENTIAL",
            )
        return key

    async def _http_request(self, request: ModelRequest, key: str) -> httpx.Request:
        s = self.settings
        body = await build_body(request, effort=request.effort or s.effort, max_tokens=s.max_tokens, read_image=self._read_image)
        return self.client().build_request(
            "POST",
            s.endpoint() + "/chat/completions",
            content=dumps(body),
            headers={
                "Authorization": f"Bearer {key}",
                "Content-Type": "application/json",
                "Accept": "text/event-stream",
            },
        )

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelDelta, None]:
        s = self.settings
        model = request.route.model
        key = self._api_key()
        http_request = await self._http_request(request, key)
        client = self.client()
        call = _Call(model=model)
        clock = _Clock.starting(s, call)
        import httpx  # loaded by client() above

        response: httpx.Response | None = None
        try:
            try:
                with anyio.move_on_after(clock.limit() - clock.start) as scope:
                    response = await client.send(http_request, stream=True)
                if scope.cancelled_caught or response is None:
                    raise clock.timed_out(anyio.current_time())
                await _check_response(response, clock, key)
                parser = SSEParser()
                chunks = response.aiter_bytes().__aiter__()
                done = False
                while not done:
                    chunk = await clock.next_chunk(chunks)
                    items = parser.feed(chunk) if chunk is not None else parser.close()
                    for item in items:
                        if item is KEEP_ALIVE:
                            continue
                        data = item.data  # type: ignore[union-attr]
                        call.events += 1
                        clock.data = anyio.current_time() + s.idle_timeout
                        if data.strip() == "[DONE]":
                            done = True
                            break
                        for delta in _chunk_deltas(_parse_event(data, model, key), call):
                            yield delta
                    if chunk is None and not done:
                        raise ModelError(
                            f"deepseek: the stream from model {model} closed before [DONE] "
                            f"after {call.events} events (truncated)",
                            code="TRANSPORT",
                            retryable=True,
                        )
            except httpx.HTTPError as exc:
                during = "while connecting" if response is None else "while streaming"
                raise transport_error(exc, model=model, secret=key, during=during) from None
        finally:
            if response is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                    await response.aclose()
        # [DONE] seen: judge the answer as a whole.
        mapped = _judge(call)
        if call.usage is not None:
            yield UsageDelta(usage=usage_from(call.usage))
        yield Finish(reason=mapped)  # type: ignore[arg-type]


@dataclass
class _Clock:
    """The deadlines of one streamed call: overall, and the next data event's (the first within
    ``first-event-timeout``, each later one within ``idle-timeout``; keep-alives do not count)."""

    settings: DeepSeekConfig
    call: _Call
    start: float
    overall: float
    data: float  # the next data event is due by then

    @classmethod
    def starting(cls, settings: DeepSeekConfig, call: _Call) -> _Clock:
        start = anyio.current_time()
        return cls(settings, call, start, start + settings.deadline, start + settings.first_event_timeout)

    def limit(self) -> float:
        return min(self.overall, self.data)

    def timed_out(self, now: float) -> ModelError:
        s = self.settings
        if now >= self.overall:
            what = f"the overall deadline of {s.deadline:g}s passed"
        elif self.call.events == 0:
            what = f"no data within {s.first_event_timeout:g}s (keep-alives do not count)"
        else:
            what = f"the stream was idle for {s.idle_timeout:g}s (keep-alives do not count)"
        return ModelError(f"deepseek: timeout from model {self.call.model}: {what}", code="TIMEOUT", retryable=True)

    async def next_chunk(self, chunks: AsyncIterator[bytes]) -> bytes | None:
        """The next piece of the body, None at its end; a timeout error when it is due and absent."""
        now = anyio.current_time()
        limit = self.limit()
        if now >= limit:
            raise self.timed_out(now)
        chunk: bytes | None = None
        with anyio.move_on_after(limit - now) as scope:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                chunk = None
        if scope.cancelled_caught:
            raise self.timed_out(anyio.current_time())
        return chunk


async def _check_response(response: httpx.Response, clock: _Clock, key: str) -> None:
    """An error for anything but an HTTP 200 event stream (the error body read, bounded)."""
    model = clock.call.model
    if response.status_code != 200:
        raw = b""
        with anyio.move_on_after(max(0.0, min(clock.overall - anyio.current_time(), clock.settings.idle_timeout))):
            async for piece in response.aiter_bytes():
                raw += piece
                if len(raw) > MAX_ERROR_BODY:
                    break
        raise http_error(response.status_code, raw, response.headers, model=model, secret=key)
    ctype = response.headers.get("content-type", "")
    if "text/event-stream" not in ctype:
        raise ModelError(
            f"deepseek: HTTP 200 from model {model} with content-type {ctype!r}, not an event stream",
            code="MALFORMED_RESPONSE",
            retryable=True,
            status=200,
        )


def _parse_event(data: str, model: str, key: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise ModelError(
            f"deepseek: malformed stream event from model {model}: {redact(data[:200], key)!r}",
            code="MALFORMED_RESPONSE",
            retryable=True,
        ) from None


def _judge(call: _Call) -> str:
    """The answer as a whole, once [DONE] was seen: its finish reason in dsh's terms, or the error."""
    model, reason = call.model, call.finish
    if reason is None:
        raise ModelError(f"deepseek: the stream from model {model} ended without a finish_reason",
                         code="MALFORMED_RESPONSE", retryable=True)
    if reason == "insufficient_system_resource":
        raise ModelError(f"deepseek: model {model} stopped with insufficient_system_resource "
                         "(inference interrupted by lack of capacity)", code="SERVER", retryable=True)
    if reason == "content_filter":
        raise ModelError(f"deepseek: model {model} stopped the answer: content_filter", code="CONTENT_FILTER")
    mapped = _FINISH.get(reason)
    if mapped is None:
        raise ModelError(f"deepseek: model {model} returned an unknown finish_reason {reason!r}",
                         code="MALFORMED_RESPONSE")
    if mapped != "max-tokens" and not call.text and not call.tools:
        raise ModelError(f"deepseek: model {model} returned an empty answer (finish_reason {reason!r}, "
                         "no text and no tool calls)", code="EMPTY_RESPONSE", retryable=True)
    return mapped
