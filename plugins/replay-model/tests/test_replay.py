"""replay-model through the real agent loop: a session recorded with the scripted model replays to
the same durable events (real tools running again), and every way a replay can go wrong fails
loudly with the call number — more calls than recorded, tool results that diverge, a different
prompt — while overrides add what a recording cannot hold (an injected error, a hang, a patch)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import msgspec
import pytest

from dsh_core import FunctionTool, ToolError, hookimpl
from dsh_core.contracts import AgentSpec
from dsh_core.types import (
    AgentError,
    AssistantMessageEvent,
    ModelCallFailed,
    RetryEvent,
    TextBlock,
    TurnEnd,
    UserMessage,
    log_encoder,
)
from dsh_testing import memory_host, streaming

pytestmark = pytest.mark.anyio


class Echo:
    """A tool whose result the test controls: ``fail`` makes it fail (a diverging run)."""

    fail = False

    @hookimpl
    def dsh_register_tools(self, register):
        async def echo(args, ctx):
            if Echo.fail:
                raise ToolError("echo is broken today")
            return f"echo {args.get('x')} in {ctx.cwd}"

        register(FunctionTool("echo", "Echo.", {"type": "object"}, echo, parallel_safe=True))


@pytest.fixture(autouse=True)
def _reset_echo():
    Echo.fail = False
    yield
    Echo.fail = False


async def _run(model, provider, plugins, cwd, prompts, *, cancel_at=None):
    """Run ``prompts`` through one agent; write its log as JSONL; return (path, events).
    ``cancel_at``: cancel each prompt once its model call has yielded a delta ("delta") or has
    started ("call")."""
    async with memory_host(model, Echo(), plugins=plugins, provider=provider) as host:
        agent = host.create_agent(AgentSpec(cwd=str(cwd), provider=provider, model=str(model)))
        for p in prompts:
            reached = streaming(host, provider, delta=cancel_at == "delta") if cancel_at else None
            agent.submit(UserMessage(id=f"u-{p}", content=[TextBlock(text=p)]))
            if reached is not None:
                with anyio.fail_after(10):
                    await reached.wait()
                await anyio.wait_all_tasks_blocked()  # the call is now in its wait
                agent.cancel()
            await agent.wait_idle()
        log = host.session_store.logs[agent.session_id]
        header, events = log.header, list(log.events)
    return header, events


def _write(path: Path, header, events) -> Path:
    path.write_bytes(b"".join(log_encoder.encode(x) + b"\n" for x in [header, *events]))
    return path


def _shape(events):
    """The events as data, minus what differs between any two runs (ids, times, the route's spelling)."""
    out = []
    for e in events:
        d = msgspec.to_builtins(e)
        d.pop("time", None)
        if "message" in d and isinstance(d["message"], dict):
            d["message"].pop("id", None)
        d.pop("messageIds", None)
        d.pop("delayMs", None)
        out.append(d)
    return out


SCRIPT = {
    "capabilities": {"image_input": True, "context_window": 50_000},
    "rules": [
        {"when": "^tools", "steps": [
            {"reasoning": "two echoes", "tools": [{"name": "echo", "args": {"x": 1}}, {"name": "echo", "args": {"x": 2}}],
             "usage": {"inputTokens": 30, "outputTokens": 5}},
            {"text": "got: {tool_result}"}]},
        {"when": "^flaky", "steps": [{"error": "rate_limit"}, {"text": "after a retry"}]},
        {"when": "^fail", "steps": [{"error": "auth"}]},
        {"when": "^long", "steps": [{"finish": "length", "text": "Once upon a"}]},
    ],
    "default": [{"text": "echo: {prompt}"}],
}
PROMPTS = ["tools please", "flaky one", "fail now", "long story", "plain"]


async def _record(scripted, tmp_path, prompts=PROMPTS, script=SCRIPT):
    cwd = tmp_path / "work"
    cwd.mkdir(exist_ok=True)
    header, events = await _run(scripted(script), "scripted", ("scripted-model",), cwd, prompts)
    return cwd, _write(tmp_path / "session.jsonl", header, events), events


async def test_a_recorded_session_replays_to_the_same_events(scripted, tmp_path):
    cwd, path, recorded = await _record(scripted, tmp_path)
    kinds = [type(e).__name__ for e in recorded]
    assert "ModelCallFailed" in kinds and "RetryEvent" in kinds  # the failures are in the log
    (auth,) = [e for e in recorded if isinstance(e, ModelCallFailed) and e.code == "AUTH"]
    assert auth.status == 401 and not auth.retryable
    _, replayed = await _run(path, "replay", ("replay-model",), cwd, PROMPTS)
    assert _shape(replayed) == _shape(recorded)
    ends = [e.reason for e in replayed if isinstance(e, TurnEnd)]
    assert ends == ["completed", "completed", "error", "max-tokens", "completed"]
    # the route the recording declared is the route replay serves (image input, window)
    async with memory_host(path, plugins=("replay-model",), provider="replay") as host:
        route = host.provider("replay").resolve(str(path))
    assert (route.provider, route.image_input, route.context_window) == ("scripted", True, 50_000)
    assert host.provider("replay").resolve(route.model) is route  # the recorded id resolves (ACP checks it)


async def test_more_calls_than_recorded_fail_with_the_call_number(scripted, tmp_path):
    cwd, path, _ = await _record(scripted, tmp_path, prompts=["plain"])
    _, events = await _run(path, "replay", ("replay-model",), cwd, ["plain", "again"])
    (err,) = [e for e in events if isinstance(e, AgentError)]
    assert err.code == "REPLAY_EXHAUSTED"
    assert "session.jsonl call 2" in err.message and "than the 1 recorded" in err.message


async def test_diverging_tool_results_name_the_call_and_the_tools(scripted, tmp_path):
    cwd, path, _ = await _record(scripted, tmp_path, prompts=["tools please"])
    Echo.fail = True
    _, events = await _run(path, "replay", ("replay-model",), cwd, ["tools please"])
    (err,) = [e for e in events if isinstance(e, AgentError)]
    assert err.code == "REPLAY_DIVERGED"
    assert "call 2 (turn 1 step 2) diverged" in err.message
    assert "echo[call_1], echo[call_2], the live one carries echo[call_1] error" in err.message


async def test_a_different_prompt_diverges(scripted, tmp_path):
    cwd, path, _ = await _record(scripted, tmp_path, prompts=["plain", "tools please"])
    _, events = await _run(path, "replay", ("replay-model",), cwd, ["plain", "something else"])
    (err,) = [e for e in events if isinstance(e, AgentError)]
    assert err.code == "REPLAY_DIVERGED" and "call 2 (turn 2 step 1)" in err.message
    assert "'tools please'" in err.message and "'something else'" in err.message


async def test_overrides_inject_an_error_patch_a_call_and_hang(scripted, tmp_path):
    cwd, path, _ = await _record(scripted, tmp_path, prompts=["plain", "tools please"])
    (tmp_path / "replay.override.json").write_text(json.dumps({"patches": [
        {"call": 1, "insert": {"error": {"message": "overloaded", "code": "SERVER", "retryable": True, "status": 503}}},
        {"call": 1, "replace": {"text": "patched answer", "usage": {"inputTokens": 7}}},
        {"call": 3, "replace": {"text": "half an ans", "hang": True}},
    ]}))
    _, events = await _run(path, "replay", ("replay-model",), cwd, ["plain"])
    failed = [e for e in events if isinstance(e, ModelCallFailed)]
    assert [(f.code, f.status, f.attempt) for f in failed] == [("SERVER", 503, 0)]
    assert any(isinstance(e, RetryEvent) for e in events)
    (msg,) = [e for e in events if isinstance(e, AssistantMessageEvent)]
    assert msg.message.content == [TextBlock(text="patched answer")] and msg.usage.input_tokens == 7

    # call 3 (the tools turn's second call) now hangs until cancelled
    async with memory_host(path, Echo(), plugins=("replay-model",), provider="replay") as host:
        agent = host.create_agent(AgentSpec(cwd=str(cwd), provider="replay", model=str(path)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="plain")]))
        await agent.wait_idle()
        third = streaming(host, "replay", calls=2)  # this turn's calls 2 (the tool call) and 3 (the hang)
        agent.submit(UserMessage(id="u2", content=[TextBlock(text="tools please")]))
        with anyio.fail_after(10):
            await third.wait()
            await anyio.wait_all_tasks_blocked()
            agent.cancel()
            await agent.wait_idle()
        events = list(host.session_store.logs[agent.session_id].events)
    last = [e for e in events if isinstance(e, AssistantMessageEvent)][-1]
    assert last.interrupted and last.message.content == [TextBlock(text="half an ans")]
    assert events[-1].reason == "aborted"


async def test_a_cancelled_call_replays_as_a_hang(scripted, tmp_path):
    script = {"default": [{"partial": "partial", "delay_ms": 60_000}]}
    cwd = tmp_path / "work"
    cwd.mkdir()
    header, recorded = await _run(scripted(script), "scripted", ("scripted-model",), cwd, ["hang"], cancel_at="delta")
    path = _write(tmp_path / "session.jsonl", header, recorded)
    assert recorded[-1].reason == "aborted"
    _, replayed = await _run(path, "replay", ("replay-model",), cwd, ["hang"], cancel_at="delta")
    assert _shape(replayed) == _shape(recorded)


async def test_a_call_cancelled_before_any_output_replays_as_a_hang(scripted, tmp_path):
    """Nothing was committed for it (the log has no assistant/message), yet the turn ended aborted
    with a call in flight: replay hangs there too instead of running out of calls."""
    script = {"rules": [{"when": "^slow", "steps": [{"delay_ms": 60_000, "text": "too late"}]}],
              "default": [{"text": "fine"}]}
    cwd = tmp_path / "work"
    cwd.mkdir()
    header, recorded = await _run(scripted(script), "scripted", ("scripted-model",), cwd, ["slow"], cancel_at="call")
    assert not any(isinstance(e, AssistantMessageEvent) for e in recorded) and recorded[-1].reason == "aborted"
    path = _write(tmp_path / "session.jsonl", header, recorded)
    _, replayed = await _run(path, "replay", ("replay-model",), cwd, ["slow"], cancel_at="call")
    assert _shape(replayed) == _shape(recorded)


async def test_two_sessions_bind_by_their_first_prompt(scripted, tmp_path):
    cwd = tmp_path / "work"
    cwd.mkdir()
    script = scripted(SCRIPT)
    h0, e0 = await _run(script, "scripted", ("scripted-model",), cwd, ["first one"])
    h1, e1 = await _run(script, "scripted", ("scripted-model",), cwd, ["second one"])
    _write(tmp_path / "session.jsonl", h0, e0)
    path1 = _write(tmp_path / "session.1.jsonl", h1, e1)
    path = tmp_path / "session.jsonl"
    async with memory_host(path, plugins=("replay-model",), provider="replay") as host:
        a = host.create_agent(AgentSpec(cwd=str(cwd), provider="replay", model=str(path)))
        b = host.create_agent(AgentSpec(cwd=str(cwd), provider="replay", model=str(path)))
        b.submit(UserMessage(id="u", content=[TextBlock(text="second one")]))  # b asks first
        await b.wait_idle()
        a.submit(UserMessage(id="u", content=[TextBlock(text="first one")]))
        await a.wait_idle()
        texts = {s: [x.text for e in host.session_store.logs[s.session_id].events
                     if isinstance(e, AssistantMessageEvent) for x in e.message.content]
                 for s in (a, b)}
    assert texts[a] == ["echo: first one"] and texts[b] == ["echo: second one"]
    assert path1.exists()


async def test_a_missing_or_foreign_file_is_a_route_error(tmp_path):
    from dsh_replay_model import ReplayProvider

    from dsh_core.errors import RouteError

    (tmp_path / "x.jsonl").write_text('{"not": "a log"}\n')
    provider = ReplayProvider()
    with pytest.raises(RouteError, match="no recorded session log"):
        provider.resolve(str(tmp_path / "missing.jsonl"))
    with pytest.raises(RouteError, match="not a dsh session log"):
        provider.resolve(str(tmp_path / "x.jsonl"))


async def test_a_committed_fixture_with_its_header_pinned_elsewhere_replays_as_it_is(scripted, tmp_path):
    """Scenario fixtures say "system": "{{system}}", "tools": "{{tools}}" (the class pin holds them);
    `dsh run --provider replay --model snapshots/…/session.jsonl` needs only the header's route."""
    cwd, path, recorded = await _record(scripted, tmp_path, prompts=["tools please"])
    lines = path.read_text().splitlines()
    pinned = []
    for line in lines:
        rec = json.loads(line)
        if rec.get("type") == "request/header":
            rec["system"], rec["tools"] = "{{system}}", "{{tools}}"
        pinned.append(json.dumps(rec, sort_keys=True))
    path.write_text("\n".join(pinned) + "\n")
    _, replayed = await _run(path, "replay", ("replay-model",), cwd, ["tools please"])
    assert [e.reason for e in replayed if isinstance(e, TurnEnd)] == ["completed"]
    assert _shape([e for e in replayed if isinstance(e, AssistantMessageEvent)]) == _shape(
        [e for e in recorded if isinstance(e, AssistantMessageEvent)])


class Minted:
    """``mint`` answers an id made anew every run (as a child's session id is); ``use`` accepts only
    an id this run minted."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    @hookimpl
    def dsh_register_tools(self, register):
        import secrets

        async def mint(args, ctx):
            self.ids.append(secrets.token_hex(16))
            return f"started subagent {self.ids[-1]}"

        async def use(args, ctx):
            if args.get("id") not in self.ids:
                raise ToolError(f"subagent {args.get('id')!r} is unavailable")
            return f"used {args['id']}"

        register(FunctionTool("mint", "Mint.", {"type": "object"}, mint))
        register(FunctionTool("use", "Use.", {"type": "object"}, use))


async def test_a_committed_recordings_numbered_ids_become_the_runs_own(scripted, tmp_path):
    """A committed recording says ``{{session1}}`` (or ``{{id:3}}``) where its run had a fresh id;
    replayed, a later call's argument gets the id this run's tool result put in its place."""
    script = scripted({"rules": [{"when": "^go", "steps": [
        {"tool": "mint", "args": {}}, {"tool": "use", "args": {"id": "{started_id}"}}, {"text": "done"}]}]})
    cwd = tmp_path / "work"
    cwd.mkdir()

    async def run(model, provider):
        minted = Minted()
        async with memory_host(model, minted, plugins=("scripted-model", "replay-model"), provider=provider) as host:
            agent = host.create_agent(AgentSpec(cwd=str(cwd), provider=provider, model=str(model)))
            agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
            await agent.wait_idle()
            log = host.session_store.logs[agent.session_id]
            return minted.ids, log.header, list(log.events)

    (recorded_id,), header, events = await run(script, "scripted")
    text = b"".join(log_encoder.encode(x) + b"\n" for x in [header, *events]).decode()
    assert text.count(recorded_id) >= 3  # its result, the next call's argument, that call's result
    for placeholder in ("{{session1}}", "{{id:3}}"):
        path = tmp_path / f"{placeholder.strip('{}').replace(':', '')}.jsonl"
        path.write_text(text.replace(recorded_id, placeholder))
        (live_id,), _, replayed = await run(path, "replay")
        results = [e.result for e in replayed if type(e).__name__ == "ToolResultEvent"]
        assert live_id != recorded_id
        assert [r.content[0].text for r in results] == [f"started subagent {live_id}", f"used {live_id}"]
        assert not [e for e in replayed if isinstance(e, AgentError)]


@pytest.mark.parametrize("mounted", [("replay-model", "compaction"), ("replay-model",)], ids=["compaction", "alone"])
async def test_a_compaction_summary_is_told_from_its_framing_by_the_mounted_compactor(mounted):
    """The summary call answered only what follows the compactor's framing; replay asks the
    mounted compactor through the declared ``dsh_compaction_summary`` hook (no import of
    dsh_compaction). Without a compactor nothing answers and the committed text is the call's."""
    from dsh_testing import REPO

    recording = str(REPO / "snapshots" / "acp-agent" / "compaction-pressure" / "session.jsonl")
    async with memory_host(recording, plugins=mounted, provider="replay") as host:
        provider = host.models["replay"]
        provider.resolve(recording)
        summaries = [c.blocks[0].text for c in provider._recordings(recording)[0].summaries]
    answer = "SUMMARY: the user asked for output bursts; they came."
    framed = "[Earlier conversation, compacted. Summary of what happened before the messages that follow:]\n\n" + answer
    assert summaries == [answer if "compaction" in mounted else framed]
