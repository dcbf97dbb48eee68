"""otel: OpenTelemetry traces and metrics of every session, after the GenAI semantic conventions.

Configured only by the standard ``OTEL_*`` environment (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``…_HEADERS``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``…), exported over OTLP/HTTP.
With no exporter configured the plugin builds nothing: its observer returns at once.

Spans, built from the session's durable events (``dsh_session_event``; hooks decide, objects act:
the observer only records, the SDK's batch processor exports from its own thread):

- ``invoke_agent dsh`` per turn (``turn/start`` .. ``turn/end``);
- ``chat <model>`` per model call, from the end of what came before it in the turn (the turn's start,
  the step's tool results, a compaction) to its ``assistant/message``;
- ``execute_tool <tool>`` per tool call (``tool/call`` .. ``tool/result``), and per call a program
  makes (code mode), under the call that ran the program;
- ``compaction`` per history rewrite.

A subagent's turns are children of the parent's ``execute_tool`` span: in process through the
child's ``AgentSpec.parent``/``parent_call``; across processes through the W3C trace context this
plugin answers ``dsh_trace_context`` with, which subagent-acp sends in ``_meta`` of its
``session/new`` and the ACP door hands to the child's agent as ``AgentSpec.trace_context``.

Prompt, completion, tool arguments and results are recorded only when
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.doctor import Finding

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent, Host

    from .telemetry import Telemetry

log = logging.getLogger("dsh.otel")

NAME = "otel"
CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() == "true"


def exporters(environ: Mapping[str, str]) -> tuple[bool, bool]:
    """(export traces, export metrics) as the standard environment says: a signal exports when an
    OTLP endpoint is set for it (or for all signals) or its ``OTEL_<SIGNAL>_EXPORTER`` is ``otlp``;
    ``none`` there, or ``OTEL_SDK_DISABLED=true``, turns it off. Nothing set: nothing exports (the
    SDK's default of localhost:4318 would send every session to whatever listens there)."""
    if _flag(environ, "OTEL_SDK_DISABLED"):
        return False, False

    def wanted(signal: str) -> bool:
        chosen = environ.get(f"OTEL_{signal}_EXPORTER", "").strip().lower()
        if chosen == "none":
            return False
        if chosen and chosen != "otlp":  # console would write to stdout, which is the protocol's
            return False
        endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
        return bool(endpoint) or chosen == "otlp"

    return wanted("TRACES"), wanted("METRICS")


# --------------------------------------------------------------------------- per host


@dataclass(eq=False)
class Slot:
    """The host's telemetry (None: nothing exports, and nothing of OpenTelemetry is imported)."""

    telemetry: Telemetry | None = None


def build(environ: Mapping[str, str]) -> Telemetry | None:
    """The telemetry the environment asks for, or None when nothing exports."""
    traces, metrics = exporters(environ)
    if not (traces or metrics):
        return None
    for name in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"):
        protocol = environ.get(name, "").strip()
        if protocol and protocol != "http/protobuf":
            log.warning(f"{name}={protocol}: the otel plugin sends OTLP over HTTP (http/protobuf) only")
    from .telemetry import build as build_telemetry

    return build_telemetry(environ, traces, metrics)


def telemetry_of(session: Any) -> Telemetry | None:
    host = getattr(session, "host", None)
    return host.state(Slot).telemetry if host is not None else None


@asynccontextmanager
async def _lifespan(host: Host) -> AsyncIterator[None]:
    tel = host.state(Slot).telemetry = build(os.environ)
    try:
        yield
    finally:
        if tel is not None:
            # shutdown flushes what is batched: blocking HTTP, so off the event loop
            with anyio.CancelScope(shield=True):
                for provider in tel.providers:
                    await anyio.to_thread.run_sync(provider.shutdown)


def _where(url: str) -> str:
    """An endpoint as a report shows it: scheme, host, port and path, never a user or password."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{parts.path}" if parts.scheme else "(unparsable)"


@dataclass
class ExportCheck:
    """``dsh doctor``: where traces and metrics go, as the environment says (nothing is sent)."""

    environ: Mapping[str, str]
    name: str = NAME

    async def run(self) -> Finding:
        traces, metrics = exporters(self.environ)
        if not (traces or metrics):
            return Finding(self.name, "ok", "no exporter configured: nothing is traced or sent",
                           fix="set OTEL_EXPORTER_OTLP_ENDPOINT (see plugins/otel/README.md)")
        base = self.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").rstrip("/")

        def target(signal: str, on: bool) -> str:
            if not on:
                return f"{signal.lower()}: off"
            url = self.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT") or (
                f"{base or 'http://localhost:4318'}/v1/{signal.lower()}")
            return f"{signal.lower()} → {_where(url)}"

        capture = "with" if _flag(self.environ, CAPTURE) else "without"
        return Finding(self.name, "ok", f"{target('TRACES', traces)}, {target('METRICS', metrics)} "
                                        f"(OTLP/HTTP, {capture} message content)")


class OtelConfig(PluginConfig):
    """``[config.otel]``: no options (only the standard ``OTEL_*`` environment variables configure it)."""


dsh_config_type = config_type_hook(NAME, OtelConfig)


@hookimpl
def dsh_register_doctor_checks(register: Any, host: Host) -> None:
    register(ExportCheck(os.environ))


@hookimpl
def dsh_lifespan(host: Host) -> Any:
    return _lifespan(host)


@hookimpl
def dsh_session_event(session: Agent, event: Any) -> None:
    tel = telemetry_of(session)
    if tel is not None:
        from .telemetry import observe

        observe(tel, session, event)


@hookimpl
def dsh_trace_context(session: Agent, call_id: str | None) -> dict[str, str] | None:
    tel = telemetry_of(session)
    if tel is None:
        return None
    from .telemetry import trace_context

    return trace_context(tel, session, call_id)
