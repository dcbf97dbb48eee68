"""The subagent seam and the in-process providers, in one host (the scripted model plays the
parent and the children by rule; rules match the prompt, never the notices dsh adds)."""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio
import pytest
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism
from dsh_subagents.tools import registry_of

from dsh_core import hookimpl
from dsh_core.contracts import AgentSpec
from dsh_core.types import (
    HistoryForked,
    SubagentResult,
    SubagentSettled,
    SubagentStarted,
    TextBlock,
    ToolResultEvent,
    TurnEnd,
    UserMessage,
    UserMessageEvent,
)
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio

PLUGINS = ("scripted-model", "subagents")


def _events(agent):
    seen = []
    agent.subscribe(lambda a, e: seen.append(e))
    return seen


@asynccontextmanager
async def _parent(script, cwd, *extra_plugins, config=None):
    """A host with the subagents plugin (and ``extra_plugins``) and a parent agent on the scripted
    model ``script``: yields the host, the parent and the parent's events as they come."""
    async with memory_host(script, *extra_plugins, plugins=PLUGINS, config=config) as host:
        parent = host.create_agent(AgentSpec(cwd=str(cwd), provider="scripted", model=str(script)))
        yield host, parent, _events(parent)


async def _turn(agent, text, events):
    agent.submit(UserMessage(id=f"u{len(events)}", content=[TextBlock(text=text)]))
    with anyio.fail_after(10):
        await agent.wait_idle()
    return [e for e in events if isinstance(e, ToolResultEvent)]


async def test_a_foreground_spawn_answers_with_the_childs_final_text(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^delegate", "steps": [
            {"tool": "subagent", "args": {"description": "say ok", "prompt": "child: say CHILD_OK",
                                          "run_in_background": False}},
            {"text": "parent got: {tool_result}"}]},
        {"when": "^child:", "steps": [{"text": "CHILD_OK"}]},
    ]})
    async with _parent(script, tmp_path) as (host, parent, events):
        (result,) = await _turn(parent, "delegate", events)
        assert result.result.content[0].text == "CHILD_OK" and not result.result.is_error
        (started,) = [e for e in events if isinstance(e, SubagentStarted)]
        assert started.provider == "spawn" and not started.background and started.session
        assert [e.stop for e in events if isinstance(e, SubagentSettled)] == ["completed"]
        assert not parent.children and not registry_of(host).entries  # disposed once its answer is in
        header, _ = await host.session_store.read(started.session)  # its log stays, linked to its parent
        assert header.parent_session == parent.session_id and header.parent_call == "call_1"
        assert header.delegation_depth == 1 and started.id == started.session  # named by its session id


async def test_a_background_child_settles_as_one_notice_in_the_original_words(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^start", "steps": [
            {"tool": "subagent", "args": {"description": "bg", "prompt": "child: work"}},
            {"text": "started: {tool_result}"}]},
        {"when": "^child:", "steps": [{"text": "CHILD_DONE"}]},
        {"when": "^next", "steps": [{"text": "next turn"}]},
    ]})
    async with _parent(script, tmp_path) as (_, parent, events):
        (result,) = await _turn(parent, "start", events)
        (child,) = parent.children
        assert result.result.content[0].text == f"started subagent {child.session_id}"
        assert child.spec.extra["subagents.continuable"] and "report" in child.tools
        with anyio.fail_after(10):
            while not any(isinstance(e, SubagentSettled) for e in events):
                await anyio.sleep(0.01)
        await _turn(parent, "next", events)
        notices = [e.message for e in events if isinstance(e, UserMessageEvent) and e.message.source == "notice"]
        assert [n.content[0].text for n in notices] == [
            f"Background subagent {child.session_id} finished and will do no further work unless you send it "
            "more.\nIts closing message:\nCHILD_DONE"]
        assert parent.history[-1].content[0].text == "next turn"  # the rule matched the prompt, not the notice


async def test_a_fork_starts_from_the_parents_completed_history(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^remember", "steps": [{"text": "remembered"}]},
        {"when": "^fork", "steps": [
            {"tool": "subagent_fork", "args": {"description": "recall", "prompt": "what was the codeword?"}},
            {"text": "fork said: {tool_result}"}]},
        {"when": "codeword\\?$", "steps": [{"text": "history had {tool_result}"}]},
    ]})
    async with _parent(script, tmp_path) as (host, parent, events):
        await _turn(parent, "remember the codeword BLUE", events)
        seen: list = []
        host.models["scripted"].stream, original = None, host.models["scripted"].stream

        def spy(request):
            seen.append(request)
            return original(request)

        host.models["scripted"].stream = spy
        (result,) = await _turn(parent, "fork it", events)
        assert not result.result.is_error
        child_requests = [r for r in seen if r.session_id != parent.session_id]
        first = child_requests[0]
        texts = ["".join(getattr(b, "text", "") for b in m.content) for m in first.messages]
        assert texts[:2] == ["remember the codeword BLUE", "remembered"] and texts[2] == "what was the codeword?"
        assert first.system == parent.system and [t.name for t in first.tools] == [t.name for t in seen[0].tools]
        assert not parent.children  # one-shot: disposed with its answer
        header, logged = await host.session_store.read(first.session_id)
        assert header.parent_session == parent.session_id and header.delegation_depth == 1
        (forked,) = [e for e in logged if isinstance(e, HistoryForked)]
        assert [m.content[0].text for m in forked.history()[:2]] == ["remember the codeword BLUE", "remembered"]
        again = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        again.restore(logged)  # a resumed fork has the history it was born with, then its own turn
        assert [m.content[0].text for m in again.history][:3] == texts[:3]


async def test_depth_and_live_caps_refuse_before_anything_starts(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^nest", "steps": [
            {"tool": "subagent", "args": {"description": "d", "prompt": "nest deeper", "run_in_background": False}},
            {"text": "got: {tool_result}"}]},
    ]})
    async with _parent(script, tmp_path) as (host, parent, events):
        (result,) = await _turn(parent, "nest", events)
        # the child's own call was refused, in the original's words
        assert result.result.content[0].text == "got: Error: subagent depth 2 exceeds maxDepth 1"
        assert [e.id for e in events if isinstance(e, SubagentStarted)] and not registry_of(host).entries
    config = {"subagents": {"max-running": 1, "max-depth": 3}}
    async with _parent(script, tmp_path, config=config) as (host, parent, events):
        (result,) = await _turn(parent, "nest", events)
        assert ("got: Error: 1 subagents are running in this session (the cap is 1): wait for one to finish, or do "
                "the task yourself.") in result.result.content[0].text
        assert len([a for a in host.agents if a is not parent]) <= 1  # nothing started over the cap


class _Blocking:
    """A test tool that waits until cancelled (a child busy in a tool call)."""

    def __init__(self) -> None:
        from dsh_core.types import ToolSpec

        self.spec = ToolSpec(name="block", description="wait", parameters={"type": "object"})
        self.entered = anyio.Event()

    async def run(self, args, ctx):
        self.entered.set()
        await anyio.sleep_forever()


class _BlockingPlugin:
    def __init__(self) -> None:
        self.tool = _Blocking()

    @hookimpl
    def dsh_register_tools(self, register, host):
        register(self.tool)


async def test_the_running_cap_counts_one_sessions_tree_not_the_whole_process(scripted, tmp_path):
    # max-running 1: a child blocked in a tool call holds session A's one slot. Session B's
    # delegation still starts (its tree has none running); A's second one is refused.
    script = scripted({"rules": [
        {"when": "^delegate", "steps": [
            {"tool": "subagent", "args": {"description": "slow", "prompt": "child: block", "run_in_background": True}},
            {"text": "started: {tool_result}"}]},
        {"when": "^child:", "steps": [{"tool": "block", "args": {}}, {"text": "unreachable"}]},
    ]})
    plugin = _BlockingPlugin()
    config = {"subagents": {"max-running": 1}}
    async with memory_host(script, plugin, plugins=PLUGINS, config=config) as host:
        a = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        b = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        a_events, b_events = _events(a), _events(b)
        (first,) = await _turn(a, "delegate", a_events)
        with anyio.fail_after(10):
            await plugin.tool.entered.wait()
        (other,) = await _turn(b, "delegate", b_events)
        again = (await _turn(a, "delegate", a_events))[-1]
        texts = [r.result.content[0].text for r in (first, other, again)]
        assert texts[0].startswith("started subagent") and texts[1].startswith("started subagent"), texts
        assert again.result.is_error and again.code == "SUBAGENT_LIMIT", texts[2]
        assert "1 subagents are running in this session (the cap is 1)" in texts[2]


async def test_cancelling_the_parent_during_a_childs_tool_call_aborts_both_with_the_partial_text(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^delegate", "steps": [
            {"tool": "subagent", "args": {"description": "slow", "prompt": "child: block", "run_in_background": False}},
            {"text": "unreachable"}]},
        {"when": "^child:", "steps": [{"text": "WORKING", "tool": "block", "args": {}}, {"text": "unreachable"}]},
    ]})
    plugin = _BlockingPlugin()
    async with _parent(script, tmp_path, plugin) as (_, parent, events):
        parent.submit(UserMessage(id="u1", content=[TextBlock(text="delegate")]))
        with anyio.fail_after(10):
            await plugin.tool.entered.wait()
        (child,) = parent.children
        child_events = _events(child)
        parent.cancel()
        with anyio.fail_after(10):
            await parent.wait_idle()
        (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
        text = result.result.content[0].text
        assert result.result.is_error and result.code == "ABORTED"
        assert text.startswith("Error: subagent run was cancelled\nDiagnostic: ")
        assert text.endswith("\nPartial output before the run ended:\nWORKING")
        assert [e.reason for e in child_events if isinstance(e, TurnEnd)] == ["aborted"]
        assert [e.reason for e in events if isinstance(e, TurnEnd)] == ["aborted"]


async def test_cancelling_the_parent_while_a_child_starts_leaves_nothing_behind(scripted, tmp_path):
    gate = anyio.Event()
    started = anyio.Event()

    class SlowProvider:
        name = "slow"

        async def start(self, request):
            started.set()
            await gate.wait()  # never set: the parent is cancelled first
            raise AssertionError("unreachable")

    class Plugin:
        @hookimpl
        def dsh_register_subagent_providers(self, register, host):
            register(SlowProvider())

    script = scripted({"rules": [{"when": "^delegate", "steps": [
        {"tool": "subagent", "args": {"description": "d", "prompt": "p", "run_in_background": False}}]}]})
    async with _parent(script, tmp_path, Plugin(), config={"subagents": {"provider": "slow"}}) as (host, parent, events):
        parent.submit(UserMessage(id="u1", content=[TextBlock(text="delegate")]))
        with anyio.fail_after(10):
            await started.wait()
        parent.cancel()
        with anyio.fail_after(10):
            await parent.wait_idle()
        (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
        assert result.result.is_error
        registry = registry_of(host)
        assert registry.running(parent) == 0 and not registry.reserved and not registry.entries and not parent.children


async def test_a_fake_provider_on_the_seam_non_completed_is_an_error_and_background_settles_once(scripted, tmp_path):
    class FakeRun:
        def __init__(self, request, stop):
            self.id, self.description, self.session_id = f"fake-{id(self)}", request.description, None
            self.request, self.stop, self.disposed = request, stop, False
            self.done = anyio.Event()

        @property
        def status(self):
            return "ready" if self.done.is_set() else "running"

        def finish(self):
            self.result_ = SubagentResult(stop=self.stop, text="half an answer", diagnostic="cut at the limit")
            self.done.set()
            self.request.on_settled(self, self.result_)

        async def result(self):
            await self.done.wait()
            return self.result_

        def cancel(self):
            pass

        async def dispose(self):
            self.disposed = True

    runs = []

    class FakeProvider:
        name = "fake"

        async def start(self, request):
            run = FakeRun(request, "max-tokens")
            runs.append(run)
            host.task_group.start_soon(_later, run)
            return run

    async def _later(run):
        await anyio.sleep(0.01)
        run.finish()

    class Plugin:
        @hookimpl
        def dsh_register_subagent_providers(self, register, host):
            register(FakeProvider())

    script = scripted({"rules": [
        {"when": "^fg", "steps": [{"tool": "subagent", "args": {"description": "d", "prompt": "p",
                                                                "run_in_background": False}}, {"text": "ok"}]},
        {"when": "^bg", "steps": [{"tool": "subagent", "args": {"description": "d", "prompt": "p"}}, {"text": "ok"}]},
        {"when": "^then", "steps": [{"text": "then"}]},
    ]})
    async with _parent(script, tmp_path, Plugin(), config={"subagents": {"provider": "fake"}}) as (host, parent, events):
        (fg,) = await _turn(parent, "fg", events)
        assert fg.result.is_error and fg.code == "SUBAGENT_MAX_TOKENS"
        assert fg.result.content[0].text == ("Error: subagent run hit its token limit before finishing\n"
                                             "Diagnostic: cut at the limit\n"
                                             "Partial output before the run ended:\nhalf an answer")
        assert runs[0].disposed  # a foreground run is disposed once collected
        results = await _turn(parent, "bg", events)
        assert results[-1].result.content[0].text == f"started subagent {runs[1].id}"
        with anyio.fail_after(5):
            await runs[1].done.wait()
        await _turn(parent, "then", events)
        notices = [e.message.content[0].text for e in events
                   if isinstance(e, UserMessageEvent) and e.message.source == "notice"]
        assert notices == [f"Background subagent {runs[1].id} ran out of room before it finished.\n"
                           "Its closing message:\nhalf an answer"]
        await parent.dispose()
        assert runs[1].disposed  # the session's children go with it


async def test_only_an_ancestor_may_steer_a_child(scripted, tmp_path):
    """send_message reaches direct children only, interrupt_agent any descendant; both in the
    original's words, and interrupting an agent between turns is an accepted no-op."""
    script = scripted({"rules": [
        {"when": "^start", "steps": [{"tool": "subagent", "args": {"description": "bg", "prompt": "child: wait"}},
                                     {"text": "ok"}]},
        {"when": "^child:", "steps": [{"partial": "waiting", "delay_ms": 60000}]},
    ]})
    async with memory_host(script, plugins=PLUGINS) as host:
        owner = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        stranger = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        events = _events(owner)
        await _turn(owner, "start", events)
        rid = next(e.id for e in events if isinstance(e, SubagentStarted))
        for name, args in (("send_message", {"subagent_id": rid, "message": "hi"}), ("interrupt_agent", {"agent_id": rid})):
            out = await stranger.call_tool(name, args, call_id="x1", turn=1, step=1)
            assert out.is_error and out.content[0].text == f'Error: subagent "{rid}" is unavailable', name
        listing = await stranger.call_tool("list_agents", {}, call_id="x0", turn=1, step=1)
        assert listing.content[0].text == "(no subagents)"
        listing = await owner.call_tool("list_agents", {}, call_id="x2", turn=1, step=1)
        assert listing.content[0].text == f"{rid} [running] — bg"
        listing = await owner.call_tool("list_agents", {"scope": "descendants"}, call_id="x2", turn=1, step=1)
        assert listing.content[0].text == f"{rid} [running] parent={owner.session_id} depth=1 — bg"
        out = await owner.call_tool("interrupt_agent", {"agent_id": rid}, call_id="x3", turn=1, step=1)
        assert out.content[0].text == f"interrupt requested for agent {rid}"
        (child,) = owner.children
        with anyio.fail_after(5):
            await child.wait_idle()
        listing = await owner.call_tool("list_agents", {}, call_id="x4", turn=1, step=1)
        assert listing.content[0].text == f"{rid} [ready] — bg"
        out = await owner.call_tool("interrupt_agent", {"agent_id": rid}, call_id="x5", turn=1, step=1)
        assert out.content[0].text == f"interrupt requested for agent {rid}" and not out.is_error


async def test_disposing_the_parent_ends_its_background_children(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^start", "steps": [{"tools": [
            {"name": "subagent", "args": {"description": "a", "prompt": "child: wait"}},
            {"name": "subagent", "args": {"description": "b", "prompt": "child: wait"}}]}, {"text": "ok"}]},
        {"when": "^child:", "steps": [{"partial": "waiting", "delay_ms": 60000}]},
    ]})
    async with _parent(script, tmp_path) as (host, parent, events):
        await _turn(parent, "start", events)
        children = list(parent.children)
        assert len(children) == 2 and all(c.busy for c in children)
        with anyio.fail_after(10):
            await parent.dispose()
        assert all(c.disposed for c in children) and registry_of(host).running(parent) == 0
        assert not [a for a in host.agents if not a.disposed and a is not parent]


async def test_a_parent_cancelled_as_its_child_settles_keeps_the_answer_and_gets_no_notice(scripted, tmp_path):
    """The race at settlement: the child's turn has ended (its result is in) when the parent's turn
    is cancelled, before the waiting call returns. The call answers with the result; the turn ends
    aborted; the settlement is recorded once and never told again as a notice."""
    script = scripted({"rules": [
        {"when": "^delegate", "steps": [
            {"tool": "subagent", "args": {"description": "d", "prompt": "child: ok", "run_in_background": False}},
            {"text": "unreachable"}]},
        {"when": "^child:", "steps": [{"text": "CHILD_OK"}]},
        {"when": "^next", "steps": [{"text": "next"}]},
    ]})
    async with _parent(script, tmp_path) as (_, parent, events):

        def on_parent(agent, event):
            if isinstance(event, SubagentStarted):
                child = parent.children[-1]
                child.subscribe(lambda a, e: parent.cancel() if isinstance(e, TurnEnd) else None)

        parent.subscribe(on_parent)
        (result,) = await _turn(parent, "delegate", events)
        assert result.result.content[0].text == "CHILD_OK" and not result.result.is_error
        assert [e.reason for e in events if isinstance(e, TurnEnd)] == ["aborted"]
        assert [e.stop for e in events if isinstance(e, SubagentSettled)] == ["completed"]
        await _turn(parent, "next", events)
        assert not [e for e in events if isinstance(e, UserMessageEvent) and e.message.source == "notice"]


async def test_a_fork_cancelled_with_its_parent_is_disposed_and_frees_its_place(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^fork: hang", "steps": [{"partial": "HALF", "mark": "fork-started", "delay_ms": 600000}]},
        {"when": "^fork it", "steps": [{"tool": "subagent_fork", "args": {"description": "f", "prompt": "fork: hang"}},
                                       {"text": "unreachable"}]},
    ]})
    async with _parent(script, tmp_path) as (host, parent, events):
        parent.submit(UserMessage(id="u1", content=[TextBlock(text="fork it")]))
        with anyio.fail_after(10):
            while not (tmp_path / "fork-started").exists():
                await anyio.sleep(0.01)
        (child,) = parent.children
        parent.cancel()
        with anyio.fail_after(10):
            await parent.wait_idle()
        (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
        assert result.code == "ABORTED" and result.result.content[0].text.endswith("ended:\nHALF")
        assert child.disposed and not parent.children and registry_of(host).running(parent) == 0


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_child_never_gets_more_than_its_parents_mode(scripted, tmp_path, mechanism):
    """The parent's read-only (a person's choice) is the child's: recorded as a delegation, and a
    write by the child fails on this mechanism."""
    require_mechanism(mechanism)
    script = scripted({"rules": [
        {"when": "^delegate", "steps": [
            {"tool": "subagent", "args": {"description": "writer", "prompt": "child: write", "run_in_background": False}},
            {"text": "done"}]},
        {"when": "^child:", "steps": [{"tool": "bash", "args": {"description": "Run the command", "command": "echo x > by-child.txt"}},
                                      {"text": "bash said: {tool_result}"}]},
    ]})
    work = tmp_path / "work"
    work.mkdir()
    plugins = (*PLUGINS, "sandbox-tools")
    async with memory_host(script, plugins=plugins, config={"sandbox-tools": {"mechanism": mechanism}}) as host:
        parent = host.create_agent(AgentSpec(cwd=str(work), provider="scripted", model=str(script)))
        parent.configure(mode="read-only")
        events = _events(parent)
        (first,) = await _turn(parent, "delegate", events)
        assert not (work / "by-child.txt").exists()
        assert first.result.content[0].text.startswith("bash said:") and "by-child.txt" in first.result.content[0].text
        (started,) = [e for e in events if isinstance(e, SubagentStarted)]
        _, logged = await host.session_store.read(started.session)
        (changed,) = [e for e in logged if type(e).__name__ == "SettingsChanged"]
        assert changed.by == "delegation" and changed.settings.mode == "read-only"


async def test_code_mode_programs_delegate_too(scripted, tmp_path):
    program = ("answer = await tools.subagent(description='d', prompt='child: ok', run_in_background=False)\n"
               "return answer")
    script = scripted({"rules": [
        {"when": "^go", "steps": [{"tool": "run_code", "args": {"code": program, "description": "delegate"}},
                                  {"text": "{tool_result}"}]},
        {"when": "^child:", "steps": [{"text": "CHILD_OK"}]},
    ]})
    plugins = (*PLUGINS, "sandbox-tools", "code-mode")
    async with memory_host(script, plugins=plugins, config={"code-mode": {"mode": "both"}}) as host:
        parent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        events = _events(parent)
        (result,) = await _turn(parent, "go", events)
        assert result.result.content[0].text == "CHILD_OK", result.result.content
        assert [e.stop for e in events if isinstance(e, SubagentSettled)] == ["completed"]


async def test_interrupt_ends_the_current_turn_only_and_keeps_what_was_queued(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^start", "steps": [{"tool": "subagent", "args": {"description": "bg", "prompt": "child: long"}},
                                     {"text": "ok"}]},
        {"when": "^child: long", "steps": [{"partial": "working", "delay_ms": 60000}]},
        {"when": "^child: next", "steps": [{"text": "NEXT_DONE"}]},
    ]})
    async with memory_host(script, plugins=PLUGINS) as host:
        owner = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        events = _events(owner)
        await _turn(owner, "start", events)
        rid = next(e.id for e in events if isinstance(e, SubagentStarted))
        sent = await owner.call_tool("send_message", {"subagent_id": rid, "message": "child: next"}, call_id="x1",
                                     turn=1, step=1)
        assert sent.content[0].text == f"message queued as the next turn for subagent {rid}"
        out = await owner.call_tool("interrupt_agent", {"agent_id": rid}, call_id="x2", turn=1, step=1)
        assert out.content[0].text == f"interrupt requested for agent {rid}"
        with anyio.fail_after(10):
            while [e.stop for e in events if isinstance(e, SubagentSettled)] != ["aborted", "completed"]:
                await anyio.sleep(0.01)
        (settled,) = [e for e in events if isinstance(e, SubagentSettled) and e.stop == "completed"]
        assert settled.text == "NEXT_DONE"  # the queued message ran as the next turn


def _waking(agent) -> list[tuple[str, bool]]:
    """Record what each notice to ``agent`` asked: its text and whether it asked for a turn of its
    own (``wake``, the spine's autonomous turn); the notice is queued as the spine does."""
    asked: list[tuple[str, bool]] = []
    queue = agent.notify

    def notify(text, *, source="notice", unless=None, wake=False):
        asked.append((text, wake))
        queue(text, source=source, unless=unless)

    agent.notify = notify
    return asked


async def test_report_takes_output_and_wakes_the_parent_and_the_settlement_does_too(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^start", "steps": [{"tool": "subagent", "args": {"description": "find", "prompt": "child: find"}},
                                     {"text": "ok"}]},
        {"when": "^child:", "steps": [{"tool": "report", "args": {"output": "FOUND_IT"}}, {"text": "Reported."}]},
    ]})
    async with memory_host(script, plugins=PLUGINS) as host:
        parent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        asked = _waking(parent)
        events = _events(parent)
        await _turn(parent, "start", events)
        (child,) = parent.children
        child_events = _events(child)
        with anyio.fail_after(10):
            while not any(isinstance(e, SubagentSettled) for e in events):
                await anyio.sleep(0.01)
        (reported,) = [e for e in child_events if isinstance(e, ToolResultEvent)]
        assert reported.result.content[0].text.startswith("report accepted by the agent that started you as message ")
        sid = child.session_id
        assert asked == [(f"Background subagent {sid} reported:\nFOUND_IT", True),
                         (f"Background subagent {sid} finished and will do no further work unless you send it "
                          "more.\nIts closing message:\nReported.", True)]


async def test_a_fork_refuses_run_in_background(scripted, tmp_path):
    """The original's ACP fork has no run_in_background (its schema says so): the spine refuses the
    undeclared argument, naming it, before the fork starts."""
    script = scripted({"rules": [
        {"when": "^fork", "steps": [{"tool": "subagent_fork", "args": {"description": "f", "prompt": "p",
                                                                       "run_in_background": True}}, {"text": "ok"}]},
    ]})
    async with _parent(script, tmp_path) as (host, parent, events):
        (result,) = await _turn(parent, "fork", events)
        assert result.result.is_error and result.result.content[0].text == (
            "Error: subagent_fork: unknown argument 'run_in_background' (it takes: description, prompt). "
            "Call it again with arguments that match its schema.")
        assert not [e for e in events if isinstance(e, SubagentStarted)]
        assert "cwd" not in host.tools["subagent"].spec.parameters["properties"]  # the original's arguments only
