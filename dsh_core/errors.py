"""Errors of the spine. Messages name the plugin, hook, file and the fix."""

from __future__ import annotations

SHOWN_MAX = 80  # characters of a user- or client-chosen value that an error message repeats


def shown(value: object, limit: int = SHOWN_MAX) -> str:
    """``repr(value)`` as an error message may repeat it: whole when short, else its head and its
    length, so a 100 KB id or a huge config value is never echoed back in full."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


class DshError(Exception):
    """Base of every error dsh raises on purpose."""


class CompositionError(DshError):
    """An example cannot be assembled (missing example, missing plugin, bad manifest)."""


class ConfigError(DshError):
    """A plugin rejected its configuration table."""


class RouteError(DshError):
    """No provider serves the requested (provider, model) route."""


class AgentDisposed(DshError):
    """The agent was disposed; it accepts no more work."""


class SessionLogFailed(DshError):
    """The session's durable log cannot be written: the session takes no more prompts."""


class ModelError(DshError):
    """A model call failed the way a real provider's would.

    ``code`` is one of AUTH, QUOTA, RATE_LIMIT, CONTEXT_WINDOW_EXCEEDED, INVALID_REQUEST,
    SERVER, TIMEOUT, TRANSPORT, EMPTY_RESPONSE, MALFORMED_RESPONSE, MISSING_CREDENTIAL,
    or HTTP_<status>. ``retryable`` errors are retried by the agent loop with the provider's
    RetryPolicy; ``retry_after`` (seconds) replaces the local backoff when it is not too long.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "ERROR",
        retryable: bool = False,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status


class ToolError(DshError):
    """Raised by a tool executor to return an error result with a code the model can act on."""

    def __init__(self, message: str, *, code: str = "TOOL_ERROR") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class WriteDenied(DshError):
    """A confined file write the session's tier refuses (``Confinement.write_file``): the tier
    (``mode``) and why, in plain words (``reason``: "resolves to /etc/x, outside the writable roots …")."""

    def __init__(self, path: str, mode: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.mode = mode
        self.reason = reason


class AttachmentError(DshError):
    """An image was refused by policy (the caller can fix it)."""


class AttachmentCorrupt(DshError):
    """A stored object is missing or does not hash to its digest."""


class CodeCallError(DshError):
    """Raised by ``CodeBindings.call`` when a program's tool call fails; the runtime turns it into
    the program's ``ToolCallError`` (``tool_name``, the message, the tool's error ``code``)."""

    def __init__(self, tool_name: str, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.tool_name = tool_name
        self.message = message
        self.code = code
