"""The telemetry itself: the OpenTelemetry providers the environment asks for, and the spans and
metrics of a session's events. Imported only when something exports (see ``dsh_otel.build``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dsh_core.types import (
    AssistantMessageEvent,
    CodeDispatch,
    CodeDispatchStart,
    CompactionFailed,
    CompactionStart,
    CompactionSummary,
    ModelCallFailed,
    TextBlock,
    ToolCallBlock,
    ToolCallEvent,
    ToolResultEvent,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessageEvent,
)

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


def build(environ: Mapping[str, str], traces: bool, metrics: bool) -> Telemetry:
    """The providers for the signals that export (the SDK reads the rest of OTEL_* itself)."""
    from opentelemetry.sdk.resources import Resource

    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if named else {"service.name": AGENT_NAME})  # the SDK reads both variables
    tel = Telemetry(capture=environ.get(CAPTURE, "").strip().lower() == "true")
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
    handler = _HANDLERS.get(type(event))
    if handler is not None:
        handler(tel, session, _trace_of(session), event)


def _turn_start(tel: Telemetry, session: Any, st: SessionTrace, event: TurnStart) -> None:
    st.turn_started = st.mark = event.time
    st.failures.clear()
    st.last_text = ""
    st.turn_input, st.pending_input = (st.pending_input, []) if tel.capture else ([], [])
    if tel.tracer is not None:
        attrs = {**_common(session), "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": AGENT_NAME,
                 "gen_ai.agent.id": session.session_id, "dsh.turn": event.turn, "dsh.turn.autonomous": event.autonomous,
                 "dsh.delegation.depth": session.spec.depth}
        st.turn = tel.tracer.start_span(f"invoke_agent {AGENT_NAME}", context=_parent_context(session),
                                        kind=SpanKind.INTERNAL, attributes=attrs, start_time=_ns(event.time))
        st.turn_ctx = trace.set_span_in_context(st.turn)


def _user_message(tel: Telemetry, session: Any, st: SessionTrace, event: UserMessageEvent) -> None:
    if tel.capture:
        st.pending_input.append({"role": "user", "parts": [{"type": "text", "content": _text(event.message.content)}]})
    if st.turn is not None and not st.tools:
        st.mark = event.time


def _tool_start(tel: Telemetry, session: Any, st: SessionTrace, event: ToolCallEvent | CodeDispatchStart) -> None:
    if tel.tracer is None:
        return
    parent = st.turn_ctx
    if isinstance(event, CodeDispatchStart) and event.parent_call_id in st.tools:
        parent = trace.set_span_in_context(st.tools[event.parent_call_id])  # a program's call, under the program
    attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.name,
             "gen_ai.tool.call.id": event.call_id, "gen_ai.tool.type": "function",
             "gen_ai.conversation.id": session.session_id}
    if tel.capture:
        attrs["gen_ai.tool.call.arguments"] = event.arguments
    span = st.tools[event.call_id] = tel.tracer.start_span(f"execute_tool {event.name}", context=parent,
                                                           attributes=attrs, start_time=_ns(event.time))
    st.calls[event.call_id] = span.get_span_context()
    if len(st.calls) > CALLS_KEPT:
        del st.calls[next(iter(st.calls))]


def _tool_end(tel: Telemetry, session: Any, st: SessionTrace, event: ToolResultEvent | CodeDispatch) -> None:
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


def _model_failed(tel: Telemetry, session: Any, st: SessionTrace, event: ModelCallFailed) -> None:
    st.failures.append(event)


def _compaction_start(tel: Telemetry, session: Any, st: SessionTrace, event: CompactionStart) -> None:
    if tel.tracer is not None:
        st.compaction = tel.tracer.start_span("compaction", context=st.turn_ctx, start_time=_ns(event.time), attributes={
            "dsh.compaction.reason": event.reason, "dsh.compaction.estimated_tokens": event.estimated_tokens,
            "dsh.compaction.context_window": event.context_window, "dsh.compaction.messages": event.messages,
            "gen_ai.conversation.id": session.session_id})


def _compaction_end(tel: Telemetry, session: Any, st: SessionTrace, event: CompactionSummary | CompactionFailed) -> None:
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
                      for b in message.content if isinstance(b, ToolCallBlock)]
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


def trace_context(tel: Telemetry, session: Any, call_id: str | None) -> dict[str, str] | None:
    """The W3C trace context of ``call_id``'s execute_tool span (else the running turn's)."""
    if tel.tracer is None:
        return None
    ctx = _call_context(_trace_of(session), call_id)
    if ctx is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier or None


_HANDLERS: dict[type, Callable[[Telemetry, Any, SessionTrace, Any], None]] = {
    TurnStart: _turn_start,
    UserMessageEvent: _user_message,
    AssistantMessageEvent: _chat,
    ToolCallEvent: _tool_start,
    CodeDispatchStart: _tool_start,
    ToolResultEvent: _tool_end,
    CodeDispatch: _tool_end,
    ModelCallFailed: _model_failed,
    CompactionStart: _compaction_start,
    CompactionSummary: _compaction_end,
    CompactionFailed: _compaction_end,
    TurnEnd: _turn_end,
}
