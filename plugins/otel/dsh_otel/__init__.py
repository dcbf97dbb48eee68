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

import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dsh_core import hookimpl
from dsh_core.types import (
    AssistantMessageEvent,
    CodeDispatch,
    CodeDispatchStart,
    CompactionFailed,
    CompactionStart,
    CompactionSummary,
    ModelCallFailed,
    TextBlock,
    ToolCallEvent,
    ToolResultEvent,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessageEvent,
)

if TYPE_CHECKING:  # pragma: no cover
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    from dsh_core.protocols import Agent, Host

NAME = "otel"
AGENT_NAME = "dsh"
CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SCOPE = "dsh"
# the conventional histogram buckets (GenAI semantic conventions, "advice")
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
# the agent's finish → the convention's finish reason
FINISH = {"stop": "stop", "tool-calls": "tool_calls", "max-tokens": "length", "aborted": "aborted"}
_PROPAGATOR = TraceContextTextMapPropagator()
CALLS_KEPT = 256


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
class Telemetry:
    """The host's tracer and instruments (None: that signal does not export); ``capture``: content
    is recorded."""

    tracer: trace.Tracer | None = None
    token_usage: Any = None
    duration: Any = None
    capture: bool = False
    providers: list[Any] = field(default_factory=list)

    @property
    def on(self) -> bool:
        return self.tracer is not None or self.token_usage is not None


_OFF = Telemetry()


def build(environ: Mapping[str, str]) -> Telemetry:
    """The providers the environment asks for (the SDK reads the rest of OTEL_* itself)."""
    traces, metrics = exporters(environ)
    if not (traces or metrics):
        return _OFF
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME") or AGENT_NAME})
    tel = Telemetry(capture=_flag(environ, CAPTURE))
    if traces:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider: TracerProvider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        tel.tracer = tracer_provider.get_tracer(SCOPE)
        tel.providers.append(tracer_provider)
    if metrics:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

        views = [
            View(instrument_name="gen_ai.client.token.usage",
                 aggregation=ExplicitBucketHistogramAggregation(TOKEN_BUCKETS)),
            View(instrument_name="gen_ai.client.operation.duration",
                 aggregation=ExplicitBucketHistogramAggregation(DURATION_BUCKETS)),
        ]
        meter_provider: MeterProvider = MeterProvider(
            resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())], views=views)
        meter = meter_provider.get_meter(SCOPE)
        tel.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Number of input and output tokens used")
        tel.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration")
        tel.providers.append(meter_provider)
    return tel


def telemetry_of(host: Any) -> Telemetry:
    return host.state(Telemetry, lambda: _OFF) if host is not None else _OFF


@asynccontextmanager
async def _lifespan(host: Host) -> AsyncIterator[None]:
    tel = build(os.environ)
    host.state(Telemetry, lambda: tel)
    try:
        yield
    finally:
        if tel.providers:
            # shutdown flushes what is batched: blocking HTTP, so off the event loop
            with anyio.CancelScope(shield=True):
                for provider in tel.providers:
                    await anyio.to_thread.run_sync(provider.shutdown)


# --------------------------------------------------------------------------- per session


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _text(content: list[Any]) -> str:
    return "".join(b.text for b in content if isinstance(b, TextBlock))


def _messages(role: str, parts: list[dict[str, Any]], **extra: Any) -> str:
    return json.dumps([{"role": role, "parts": parts, **extra}], ensure_ascii=False)


@dataclass(eq=False)
class SessionTrace:
    """One session's open spans. Filled and emptied by ``observe`` only."""

    turn: Any = None  # the open invoke_agent span
    turn_ctx: Context | None = None
    turn_started: float = 0.0
    mark: float = 0.0  # where the next model call began: the end of what came before it
    tools: dict[str, Any] = field(default_factory=dict)  # call id -> open execute_tool span
    # call id -> its execute_tool span's context, kept after the span ends (a background child's
    # turns start later), the latest CALLS_KEPT
    calls: dict[str, Any] = field(default_factory=dict)
    compaction: Any = None
    failures: list[ModelCallFailed] = field(default_factory=list)  # the step's failed attempts
    pending_input: list[dict[str, Any]] = field(default_factory=list)  # captured: what the next call adds
    turn_input: list[dict[str, Any]] = field(default_factory=list)
    last_text: str = ""


def _trace_of(session: Any) -> SessionTrace:
    state: SessionTrace = session.state(SessionTrace)
    return state


def _common(session: Any) -> dict[str, Any]:
    provider = session.spec.provider
    return {
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,
        "gen_ai.request.model": session.spec.model,
        "gen_ai.conversation.id": session.session_id,
    }


def _parent_context(session: Any) -> Context | None:
    """The context a turn of ``session`` continues: the parent's tool span (an in-process child),
    the trace context the front door received (a child in another process), else a new trace."""
    spec = session.spec
    parent = spec.parent
    if parent is not None:
        return _call_context(_trace_of(parent), spec.parent_call)
    carrier = getattr(spec, "trace_context", None)
    if carrier and carrier.get("traceparent"):
        return _PROPAGATOR.extract(carrier=dict(carrier))
    return None


def _call_context(st: SessionTrace, call_id: str | None) -> Context | None:
    """The context of tool call ``call_id``'s span (open or ended), else of the running turn."""
    span_context = st.calls.get(call_id or "")
    if span_context is not None:
        return trace.set_span_in_context(trace.NonRecordingSpan(span_context))
    return st.turn_ctx


def _usage_attributes(usage: Usage | None) -> dict[str, int]:
    if usage is None:
        return {}
    return {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_hit_tokens,
        "gen_ai.usage.reasoning.output_tokens": usage.reasoning_tokens,
    }


def observe(tel: Telemetry, session: Any, event: Any) -> None:
    """Record one durable event of ``session`` (called in event order)."""
    st = _trace_of(session)
    tracer = tel.tracer
    if isinstance(event, TurnStart):
        attrs = {**_common(session), "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": AGENT_NAME,
                 "gen_ai.agent.id": session.session_id, "dsh.turn": event.turn, "dsh.turn.autonomous": event.autonomous,
                 "dsh.delegation.depth": session.spec.depth}
        st.turn_started = st.mark = event.time
        st.failures.clear()
        st.last_text = ""
        st.turn_input, st.pending_input = (st.pending_input, []) if tel.capture else ([], [])
        if tracer is not None:
            st.turn = tracer.start_span(f"invoke_agent {AGENT_NAME}", context=_parent_context(session),
                                        kind=SpanKind.INTERNAL, attributes=attrs, start_time=_ns(event.time))
            st.turn_ctx = trace.set_span_in_context(st.turn)
        return
    if isinstance(event, UserMessageEvent):
        if tel.capture:
            st.pending_input.append({"role": "user", "parts": [{"type": "text", "content": _text(event.message.content)}]})
        if st.turn is not None and not st.tools:
            st.mark = event.time
        return
    if isinstance(event, AssistantMessageEvent):
        _chat(tel, session, st, event)
        return
    if isinstance(event, ToolCallEvent | CodeDispatchStart):
        if tracer is None:
            return
        parent = st.turn_ctx
        if isinstance(event, CodeDispatchStart) and event.parent_call_id in st.tools:
            parent = trace.set_span_in_context(st.tools[event.parent_call_id])
        attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.name,
                 "gen_ai.tool.call.id": event.call_id, "gen_ai.tool.type": "function",
                 "gen_ai.conversation.id": session.session_id}
        if tel.capture:
            attrs["gen_ai.tool.call.arguments"] = event.arguments
        span = st.tools[event.call_id] = tracer.start_span(f"execute_tool {event.name}", context=parent,
                                                           attributes=attrs, start_time=_ns(event.time))
        st.calls[event.call_id] = span.get_span_context()
        if len(st.calls) > CALLS_KEPT:
            del st.calls[next(iter(st.calls))]
        return
    if isinstance(event, ToolResultEvent | CodeDispatch):
        if isinstance(event, ToolResultEvent):
            st.mark = event.time
            call_id, is_error, content = event.result.call_id, event.result.is_error, event.result.content
            if tel.capture:
                st.pending_input.append({"role": "tool", "parts": [
                    {"type": "tool_call_response", "id": call_id, "response": _text(content)}]})
        else:
            call_id, is_error, content = event.call_id, event.is_error, event.result
        span = st.tools.pop(call_id, None)
        if span is None:
            return
        if tel.capture:
            span.set_attribute("gen_ai.tool.call.result", _text(content))
        if is_error:
            span.set_attribute("error.type", event.code or "tool_error")
            span.set_status(Status(StatusCode.ERROR, event.code or None))
        span.end(end_time=_ns(event.time))
        return
    if isinstance(event, ModelCallFailed):
        st.failures.append(event)
        return
    if isinstance(event, CompactionStart):
        if tracer is not None:
            st.compaction = tracer.start_span("compaction", context=st.turn_ctx, start_time=_ns(event.time), attributes={
                "dsh.compaction.reason": event.reason, "dsh.compaction.estimated_tokens": event.estimated_tokens,
                "dsh.compaction.context_window": event.context_window, "dsh.compaction.messages": event.messages,
                "gen_ai.conversation.id": session.session_id})
        return
    if isinstance(event, CompactionSummary | CompactionFailed):
        st.mark = event.time
        span, st.compaction = st.compaction, None
        if span is None:
            return
        if isinstance(event, CompactionSummary):
            span.set_attributes({"dsh.compaction.tokens_before": event.tokens_before,
                                 "dsh.compaction.tokens_after": event.tokens_after,
                                 "dsh.compaction.covered": event.covered_to - event.covered_from,
                                 "dsh.compaction.retained": event.retained, **_usage_attributes(event.usage)})
        else:
            span.set_attribute("error.type", event.code or "compaction_failed")
            span.set_status(Status(StatusCode.ERROR, event.error))
        span.end(end_time=_ns(event.time))
        return
    if isinstance(event, TurnEnd):
        _turn_end(tel, session, st, event)


def _chat(tel: Telemetry, session: Any, st: SessionTrace, event: AssistantMessageEvent) -> None:
    message = event.message
    model = message.model or session.spec.model
    common = _common(session)
    finish = FINISH.get(event.finish, event.finish)
    duration = max(0.0, event.time - st.mark)
    metric_attrs = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": common["gen_ai.provider.name"],
                    "gen_ai.request.model": common["gen_ai.request.model"], "gen_ai.response.model": model}
    if tel.duration is not None:
        tel.duration.record(duration, metric_attrs)
        if event.usage is not None:
            tel.token_usage.record(event.usage.input_tokens, {**metric_attrs, "gen_ai.token.type": "input"})
            tel.token_usage.record(event.usage.output_tokens, {**metric_attrs, "gen_ai.token.type": "output"})
    text = _text(message.content)
    if text:
        st.last_text = text
    if tel.tracer is not None:
        attrs = {**common, "gen_ai.operation.name": "chat", "gen_ai.response.model": model,
                 "gen_ai.response.id": message.id, "gen_ai.response.finish_reasons": [finish],
                 "dsh.turn": event.turn, "dsh.step": event.step, **_usage_attributes(event.usage)}
        if st.failures:
            attrs["dsh.retries"] = len(st.failures)
        if tel.capture:
            attrs["gen_ai.input.messages"] = json.dumps(st.pending_input, ensure_ascii=False)
            parts: list[dict[str, Any]] = [{"type": "text", "content": text}] if text else []
            parts += [{"type": "tool_call", "id": b.id, "name": b.name, "arguments": b.arguments}
                      for b in message.content if getattr(b, "arguments", None) is not None]
            attrs["gen_ai.output.messages"] = _messages("assistant", parts, finish_reason=finish)
        span = tel.tracer.start_span(f"chat {model}", context=st.turn_ctx, kind=SpanKind.CLIENT,
                                     attributes=attrs, start_time=_ns(st.mark))
        for failure in st.failures:
            span.add_event("gen_ai.client.error", {"error.type": failure.code, "dsh.attempt": failure.attempt,
                                                   "message": failure.message}, timestamp=_ns(failure.time))
        if event.interrupted:
            span.set_status(Status(StatusCode.ERROR, "interrupted"))
        span.end(end_time=_ns(event.time))
    st.failures.clear()
    st.pending_input = []
    st.mark = event.time


def _turn_end(tel: Telemetry, session: Any, st: SessionTrace, event: TurnEnd) -> None:
    if tel.duration is not None:
        tel.duration.record(max(0.0, event.time - st.turn_started), {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": session.spec.provider,
            "gen_ai.request.model": session.spec.model, **({"error.type": event.code or event.reason}
                                                           if event.reason == "error" else {})})
    span, st.turn, st.turn_ctx = st.turn, None, None
    if span is None:
        return
    if st.failures and tel.tracer is not None:  # the model call that failed for good
        last = st.failures[-1]
        chat = tel.tracer.start_span(f"chat {session.spec.model}", context=trace.set_span_in_context(span),
                                     kind=SpanKind.CLIENT, start_time=_ns(st.mark), attributes={
                                         **_common(session), "gen_ai.operation.name": "chat", "error.type": last.code})
        chat.set_status(Status(StatusCode.ERROR, last.message))
        chat.end(end_time=_ns(last.time))
        st.failures.clear()
    for call_id, tool in list(st.tools.items()):  # never left open (a turn that died mid-call)
        tool.set_status(Status(StatusCode.ERROR, event.reason))
        tool.end(end_time=_ns(event.time))
        del st.tools[call_id]
    span.set_attribute("dsh.turn.end_reason", event.reason)
    if tel.capture:
        span.set_attribute("gen_ai.input.messages", json.dumps(st.turn_input, ensure_ascii=False))
        span.set_attribute("gen_ai.output.messages", _messages(
            "assistant", [{"type": "text", "content": st.last_text}] if st.last_text else []))
    if event.reason == "error":
        span.set_attribute("error.type", event.code or "error")
        span.set_status(Status(StatusCode.ERROR, event.error))
    span.end(end_time=_ns(event.time))


# --------------------------------------------------------------------------- hooks


@hookimpl
def dsh_lifespan(host: Host) -> Any:
    return _lifespan(host)


@hookimpl
def dsh_session_event(session: Agent, event: Any) -> None:
    tel = telemetry_of(getattr(session, "host", None))
    if tel.on:
        observe(tel, session, event)


@hookimpl
def dsh_trace_context(session: Agent, call_id: str | None) -> dict[str, str] | None:
    """The W3C trace context of ``call_id``'s execute_tool span (else the running turn's)."""
    tel = telemetry_of(getattr(session, "host", None))
    if tel.tracer is None:
        return None
    ctx = _call_context(_trace_of(session), call_id)
    if ctx is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier or None
