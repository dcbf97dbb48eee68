"""The otel plugin in real parts: a real dsh over real stdio (the official ACP SDK client), the
scripted model running a tool call, an in-process subagent, an ACP subagent (a second dsh process)
and a compaction, exporting over OTLP/HTTP to a real receiver this test serves on 127.0.0.1, which
decodes the protobuf requests with opentelemetry-proto."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from dsh_otel import CAPTURE, exporters
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from dsh_testing import REPO, spawn_acp

acp = pytest.importorskip("acp")
pytestmark = pytest.mark.anyio

PLUGINS = ["acp-transport", "jsonl-persistence", "attachment-store", "scripted-model", "todo", "subagents",
           "subagent-acp", "compaction", "otel"]
OTEL_ENV = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "OTEL_SERVICE_NAME"]


class Receiver:
    """An OTLP/HTTP receiver: every POST to /v1/traces and /v1/metrics, decoded."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self.metrics: list[Any] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.paths.append(self.path)
                assert self.headers.get("Content-Type") == "application/x-protobuf"
                if self.path == "/v1/traces":
                    req = ExportTraceServiceRequest.FromString(body)
                    for rs in req.resource_spans:
                        receiver.resources.append({a.key: a.value.string_value for a in rs.resource.attributes})
                        for ss in rs.scope_spans:
                            receiver.spans.extend(ss.spans)
                elif self.path == "/v1/metrics":
                    req = ExportMetricsServiceRequest.FromString(body)
                    for rm in req.resource_metrics:
                        for sm in rm.scope_metrics:
                            receiver.metrics.extend(sm.metrics)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Receiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        v = a.value
        kind = v.WhichOneof("value")
        out[a.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
    return out


def _example(tmp_path: Path) -> str:
    root = tmp_path / "examples" / "traced"
    root.mkdir(parents=True)
    inherit = ["DSH_HOME", "DSH_EXAMPLES_PATH", *OTEL_ENV]
    (root / "example.toml").write_text("\n".join([
        "[example]", 'description = "otel test composition"', 'front-door = "acp-stdio"',
        "plugins = " + json.dumps(PLUGINS),
        "[route]", 'provider = "scripted"', 'model = "set-by-test.json"',
        "[config.subagents]", "max-depth = 1",
        "[config.subagent-acp]", 'example = "traced"', "inherit-env = " + json.dumps(inherit),
        "eof-grace = 1.0", "term-grace = 1.0",
    ]) + "\n")
    return os.pathsep.join([str(root.parent), str(REPO / "tests" / "examples")])


SCRIPT = {
    "capabilities": {"context_window": 3000},
    "rules": [
        {"when": "^<transcript>", "steps": [{"text": "The user sent long notes; each was noted."}]},
        {"when": "^helper:", "steps": [{"text": "helper says hi", "usage": {"inputTokens": 50, "outputTokens": 4}}]},
        {"when": "^remote:", "steps": [{"text": "remote says hi", "usage": {"inputTokens": 60, "outputTokens": 5}}]},
        {"when": "^go\\b", "steps": [
            {"tool": "todo_write", "args": {"todos": [{"content": "delegate", "status": "in_progress"}]},
             "usage": {"inputTokens": 900, "outputTokens": 12, "cacheHitTokens": 800}},
            {"tool": "subagent", "args": {"description": "greet", "prompt": "helper: say hi",
                                          "run_in_background": False}},
            {"tool": "subagent_acp", "args": {"task": "remote: say hi"}},
            {"text": "all done: {tool_result}"},
        ]},
    ],
    "default": [{"text": "noted {prompt}"}],
}


async def _session(tmp_path: Path, receiver: Receiver, *, capture: bool, notes: int = 3) -> str:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    env = {"DSH_HOME": str(home), "DSH_EXAMPLES_PATH": _example(tmp_path),
           "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "dsh-under-test"}
    if capture:
        env[CAPTURE] = "true"
    async with spawn_acp(script, cwd=work, env=env, example="traced") as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid)[-1].startswith("all done:")
        for n in range(notes):
            resp = await run.conn.prompt(session_id=sid, prompt=[acp.text_block(f"note {n}: " + "z" * 2400)])
            assert resp.stop_reason == "end_turn"
        assert await run.close_stdin() == 0  # the lifespan flushed the batches before the exit
    return sid


async def test_a_session_arrives_as_a_conventional_span_tree(tmp_path: Path, receiver: Receiver):
    sid = await _session(tmp_path, receiver, capture=False)
    spans = receiver.spans
    by_id = {s.span_id: s for s in spans}
    names = [s.name for s in spans]
    assert {"/v1/traces", "/v1/metrics"} <= set(receiver.paths)
    assert {"service.name": "dsh-under-test"}.items() <= receiver.resources[0].items()

    # the parent's first turn: invoke_agent → 4 chats, 3 execute_tools
    turns = [s for s in spans if s.name == "invoke_agent dsh" and _attrs(s)["gen_ai.conversation.id"] == sid]
    assert len(turns) == 4  # "go" and three notes
    first = min(turns, key=lambda s: s.start_time_unix_nano)
    assert first.parent_span_id == b""  # a root: nobody handed this session a trace context
    a = _attrs(first)
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "dsh"
    assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "scripted"
    assert a["dsh.turn.end_reason"] == "completed"
    under = [s for s in spans if s.parent_span_id == first.span_id]
    assert sorted(s.name for s in under) == sorted(
        ["chat " + a["gen_ai.request.model"]] * 4 + ["execute_tool todo_write", "execute_tool subagent",
                                                     "execute_tool subagent_acp"])
    assert all(s.trace_id == first.trace_id for s in under)
    chats = sorted((s for s in under if s.name.startswith("chat ")), key=lambda s: s.start_time_unix_nano)
    c = _attrs(chats[0])
    assert c["gen_ai.operation.name"] == "chat" and c["gen_ai.response.model"] == a["gen_ai.request.model"]
    assert (c["gen_ai.usage.input_tokens"], c["gen_ai.usage.output_tokens"]) == (900, 12)
    assert c["gen_ai.usage.cache_read.input_tokens"] == 800
    assert c["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert _attrs(chats[-1])["gen_ai.response.finish_reasons"] == ["stop"]
    assert chats[0].kind == 3  # SPAN_KIND_CLIENT
    tools = {s.name: s for s in under if s.name.startswith("execute_tool ")}
    t = _attrs(tools["execute_tool todo_write"])
    assert t["gen_ai.tool.name"] == "todo_write" and t["gen_ai.tool.call.id"]
    assert t["gen_ai.operation.name"] == "execute_tool"
    # each model call ends before the tools it asked for start; the turn spans them all
    for s in under:
        assert first.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano <= first.end_time_unix_nano
    assert chats[0].end_time_unix_nano <= tools["execute_tool todo_write"].start_time_unix_nano

    # the in-process subagent's turn is a child of the parent's `subagent` call
    helper = [s for s in spans if s.name == "invoke_agent dsh" and s.parent_span_id == tools["execute_tool subagent"].span_id]
    assert len(helper) == 1 and _attrs(helper[0])["gen_ai.conversation.id"] != sid
    assert _attrs(helper[0])["dsh.delegation.depth"] == 1
    assert [s.name for s in spans if s.parent_span_id == helper[0].span_id] == ["chat " + a["gen_ai.request.model"]]

    # the ACP subagent (another process) continued the trace under the `subagent_acp` call
    remote = [s for s in spans if s.parent_span_id == tools["execute_tool subagent_acp"].span_id]
    assert [s.name for s in remote] == ["invoke_agent dsh"] and remote[0].trace_id == first.trace_id
    remote_chat = [s for s in spans if s.parent_span_id == remote[0].span_id]
    assert [_attrs(s)["gen_ai.usage.output_tokens"] for s in remote_chat] == [5]

    # the notes outgrew the window: a compaction span under its turn, with its summary call's usage
    compactions = [s for s in spans if s.name == "compaction"]
    assert compactions, names
    k = _attrs(compactions[0])
    assert k["dsh.compaction.reason"] == "pressure" and k["dsh.compaction.tokens_after"] < k["dsh.compaction.tokens_before"]
    assert by_id[compactions[0].parent_span_id].name == "invoke_agent dsh"

    # no content unless opted in
    for s in spans:
        assert not {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments",
                    "gen_ai.tool.call.result"} & _attrs(s).keys(), s.name
    assert all("zzzz" not in repr(_attrs(s)) for s in spans)

    # metrics: the conventional histograms
    metrics = {m.name: m for m in receiver.metrics}
    usage = metrics["gen_ai.client.token.usage"]
    assert usage.unit == "{token}"
    kinds = {dict((a.key, a.value.string_value) for a in p.attributes)["gen_ai.token.type"]
             for p in usage.histogram.data_points}
    assert kinds == {"input", "output"}
    duration = metrics["gen_ai.client.operation.duration"]
    assert duration.unit == "s"
    ops = {dict((a.key, a.value.string_value) for a in p.attributes)["gen_ai.operation.name"]
           for p in duration.histogram.data_points}
    assert ops == {"chat", "invoke_agent"}


async def test_content_is_recorded_when_the_convention_says_so(tmp_path: Path, receiver: Receiver):
    await _session(tmp_path, receiver, capture=True, notes=0)
    spans = receiver.spans
    tool = next(s for s in spans if s.name == "execute_tool todo_write")
    t = _attrs(tool)
    assert json.loads(t["gen_ai.tool.call.arguments"]) == {"todos": [{"content": "delegate", "status": "in_progress"}]}
    assert "gen_ai.tool.call.result" in t
    root = next(s for s in spans if s.name == "invoke_agent dsh" and s.parent_span_id == b"")
    r = _attrs(root)
    assert json.loads(r["gen_ai.input.messages"])[0]["parts"][0]["content"] == "go"
    assert json.loads(r["gen_ai.output.messages"])[0]["parts"][0]["content"].startswith("all done:")
    chat = next(s for s in spans if s.parent_span_id == root.span_id and s.name.startswith("chat "))
    out = json.loads(_attrs(chat)["gen_ai.output.messages"])[0]
    assert out["parts"][0]["type"] == "tool_call" and out["parts"][0]["name"] == "todo_write"


def test_the_environment_decides_what_exports():
    assert exporters({}) == (False, False)  # nothing configured: nothing built, nothing sent
    assert exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}) == (True, True)
    assert exporters({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"}) == (True, False)
    assert exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_METRICS_EXPORTER": "none"}) == (True, False)
    assert exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}) == (False, False)
    assert exporters({"OTEL_TRACES_EXPORTER": "console"}) == (False, False)  # stdout is the protocol's
    assert exporters({"OTEL_TRACES_EXPORTER": "otlp"}) == (True, False)


async def test_a_client_s_trace_context_in_session_new_meta_is_continued(tmp_path: Path, receiver: Receiver):
    """Any ACP client (here the SDK's, as an editor that traces itself) may hand the session a W3C
    trace context in ``_meta`` of session/new; a malformed one is ignored."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": [{"text": "hi"}]}))
    work = tmp_path / "work"
    work.mkdir()
    env = {"DSH_HOME": str(tmp_path / "home"), "DSH_EXAMPLES_PATH": _example(tmp_path),
           "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with spawn_acp(script, cwd=work, env=env, example="traced") as run:
        await run.conn.initialize(protocol_version=1)
        # the SDK sends new_session's keyword arguments as `_meta`
        traced = (await run.conn.new_session(cwd=str(work), mcp_servers=[], traceparent=f"00-{trace_id}-{span_id}-01",
                                             other={"x": 1})).session_id
        garbled = (await run.conn.new_session(cwd=str(work), mcp_servers=[], traceparent=42)).session_id
        for sid in (traced, garbled):
            assert (await run.conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    turns = {_attrs(s)["gen_ai.conversation.id"]: s for s in receiver.spans if s.name == "invoke_agent dsh"}
    assert turns[traced].trace_id.hex() == trace_id and turns[traced].parent_span_id.hex() == span_id
    assert turns[garbled].parent_span_id == b"" and turns[garbled].trace_id.hex() != trace_id


@pytest.mark.parametrize(("environ", "detail"), [
    ({}, "no exporter configured: nothing is traced or sent"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://pk:sk@cloud.example:4318/api/otel/", "OTEL_METRICS_EXPORTER": "none",
      "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Basic c2VjcmV0"},
     "traces → https://cloud.example:4318/api/otel/v1/traces, metrics: off (OTLP/HTTP, without message content)"),
    ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:4318/v1/metrics", CAPTURE: "true"},
     "traces: off, metrics → http://m:4318/v1/metrics (OTLP/HTTP, with message content)"),
])
async def test_doctor_says_where_telemetry_goes_and_never_a_secret(environ: dict[str, str], detail: str):
    from dsh_otel import ExportCheck

    finding = await ExportCheck(environ).run()
    assert (finding.subject, finding.status, finding.detail) == ("otel", "ok", detail)
    assert "pk:" not in finding.detail and "@" not in finding.detail and "c2VjcmV0" not in finding.detail


async def test_doctor_runs_the_check_in_a_composition_that_mounts_otel(tmp_path: Path):
    import subprocess
    import sys

    from dsh_testing import minimal_env

    proc = subprocess.run([sys.executable, "-m", "dsh_core.cli", "doctor", "--example", "acp-extended"],
                          capture_output=True, timeout=120, cwd=tmp_path,
                          env=minimal_env(DSH_HOME=str(tmp_path / "home"), OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318"))
    out = proc.stdout.decode() + proc.stderr.decode()
    assert "traces → http://c:4318/v1/traces, metrics → http://c:4318/v1/metrics" in out, out


async def test_retries_and_a_failed_model_call_show_as_errors(tmp_path: Path, receiver: Receiver):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [
        {"when": "^flaky", "steps": [{"error": "server"}, {"text": "recovered"}]},
        {"when": "^broken", "steps": [{"error": "auth"}]},
    ]}))
    work = tmp_path / "work"
    work.mkdir()
    env = {"DSH_HOME": str(tmp_path / "home"), "DSH_EXAMPLES_PATH": _example(tmp_path),
           "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
    async with spawn_acp(script, cwd=work, env=env, example="traced") as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[acp.text_block("flaky")])).stop_reason == "end_turn"
        with pytest.raises(acp.RequestError):  # a turn that fails is the prompt's JSON-RPC error (ACP-7)
            await run.conn.prompt(session_id=sid, prompt=[acp.text_block("broken")])
        assert await run.close_stdin() == 0
    turns = sorted((s for s in receiver.spans if s.name == "invoke_agent dsh"), key=lambda s: s.start_time_unix_nano)
    assert len(turns) == 2
    flaky = [s for s in receiver.spans if s.parent_span_id == turns[0].span_id]
    assert len(flaky) == 1 and _attrs(flaky[0])["dsh.retries"] == 1
    assert [e.name for e in flaky[0].events] == ["gen_ai.client.error"] and flaky[0].status.code != 2
    assert _attrs(turns[1])["dsh.turn.end_reason"] == "error" and turns[1].status.code == 2  # STATUS_CODE_ERROR
    broken = [s for s in receiver.spans if s.parent_span_id == turns[1].span_id]
    assert len(broken) == 1 and broken[0].name.startswith("chat ") and broken[0].status.code == 2
    assert _attrs(broken[0])["error.type"] and _attrs(turns[1])["error.type"]
