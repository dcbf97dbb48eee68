"""Failure classification: every way a call can fail becomes one precise ``ModelError``.

Retryable (the spine's agent loop retries with the provider's RetryPolicy): 408, 429, 5xx,
transport errors, timeouts, truncated streams, empty answers and
``insufficient_system_resource``. Not retryable: 400/401/402/403/413/422, content filter.
Messages name the HTTP status and DeepSeek's own error text, never the API key.
"""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any

from dsh_core import ModelError

_STATUS = {
    400: ("INVALID_REQUEST", False, "invalid request"),
    401: ("AUTH", False, "authentication failed; check DEEPSEEK_API_KEY"),
    402: ("QUOTA", False, "insufficient balance; top up the DeepSeek account"),
    403: ("AUTH", False, "forbidden; check DEEPSEEK_API_KEY"),
    408: ("TIMEOUT", True, "request timeout"),
    413: ("INVALID_REQUEST", False, "request too large"),
    422: ("INVALID_REQUEST", False, "invalid parameters"),
    429: ("RATE_LIMIT", True, "rate limit reached"),
    500: ("SERVER", True, "server error"),
    502: ("SERVER", True, "bad gateway"),
    503: ("SERVER", True, "server overloaded"),
    504: ("SERVER", True, "gateway timeout"),
}


def redact(text: str, secret: str | None) -> str:
    if secret and len(secret) >= 4 and secret in text:
        text = text.replace(secret, "[redacted]")
    return text


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Delta-seconds (fractions tolerated) or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (now if now is not None else time.time())
    if seconds != seconds or seconds < 0:  # NaN or in the past
        return 0.0 if seconds == seconds else None
    return seconds


def error_text(body: bytes) -> str:
    """DeepSeek's ``error.message`` (or the raw body, trimmed)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data: Any = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
        if isinstance(data.get("message"), str):
            return data["message"]
    return text[:500]


def http_error(
    status: int,
    body: bytes,
    headers: Any,
    *,
    model: str,
    secret: str | None,
) -> ModelError:
    text = redact(error_text(body), secret) or "(empty body)"
    code, retryable, meaning = _STATUS.get(status, (None, status >= 500, "HTTP error"))
    if code is None:
        code = "SERVER" if status >= 500 else f"HTTP_{status}"
    if status == 400 and "maximum context length" in text:
        code, meaning = "CONTEXT_WINDOW_EXCEEDED", "context window exceeded"
    request_id = headers.get("x-request-id") if headers is not None else None
    rid = f" [x-request-id {redact(request_id, secret)}]" if request_id else ""
    message = f"deepseek: HTTP {status} ({meaning}) from model {model}: {text}{rid}"
    return ModelError(
        message,
        code=code,
        retryable=retryable,
        retry_after=parse_retry_after(headers.get("retry-after")) if retryable and headers is not None else None,
        status=status,
    )


def transport_error(exc: BaseException, *, model: str, secret: str | None, during: str) -> ModelError:
    import httpx

    kind = type(exc).__name__
    detail = redact(str(exc), secret) or kind
    code = "TIMEOUT" if isinstance(exc, httpx.TimeoutException) else "TRANSPORT"
    return ModelError(f"deepseek: {kind} {during} (model {model}): {detail}", code=code, retryable=True)
