"""The spine: the hook contract, exact composition, and the agent loop."""

from __future__ import annotations

import asyncio
import inspect
import json
from importlib.metadata import entry_points
from itertools import pairwise
from pathlib import Path

import anyio
import pytest

from dsh_core import CompositionError, FunctionTool, hookimpl, hookspecs
from dsh_core.compose import Composition, load_composition
from dsh_core.contracts import AgentSpec
from dsh_core.host import make_plugin_manager
from dsh_core.types import (
    AssistantMessageEvent,
    TextBlock,
    ToolResultEvent,
    TurnEnd,
    UserMessage,
)
from dsh_testing import memory_host, streaming

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- the contract


def test_every_hookspec_is_documented():
    specs = [(n, f) for n, f in vars(hookspecs).items() if n.startswith("dsh_") and callable(f)]
    assert len(specs) >= 12
    for name, fn in specs:
        doc = inspect.getdoc(fn) or ""
        assert "Called" in doc, f"{name} does not say who calls it and when"
        assert len(doc) > 80, f"{name} is not documented"


def test_every_hook_the_manager_knows_is_declared_in_the_contract_module():
    pm = make_plugin_manager(trace=False)
    declared = {n for n in vars(hookspecs) if n.startswith("dsh_")}
    assert {name for name in vars(pm.hook) if name.startswith("dsh_")} <= declared


def test_async_hookimpls_are_rejected():
    class Bad:
        @hookimpl
        async def dsh_register_tools(self, register):  # pragma: no cover - never called
            pass

    from dsh_core.host import register_plugin

    pm = make_plugin_manager(trace=False)
    with pytest.raises(CompositionError, match="async def"):
        register_plugin(pm, Bad(), "bad")
    assert pm.get_plugin("bad") is None


def test_no_shipped_plugin_has_an_async_hookimpl():
    for ep in entry_points(group="dsh"):
        module = ep.load()
        for name in dir(module):
            if name.startswith("dsh_"):
                assert not inspect.iscoroutinefunction(getattr(module, name)), f"{ep.name}.{name} is async"


def test_entry_point_names_are_unique():
    names = [ep.name for ep in entry_points(group="dsh")]
    assert len(names) == len(set(names)), names
    assert {"acp-transport", "scripted-model", "jsonl-persistence"} <= set(names)


def test_composition_is_exact_an_installed_but_unlisted_plugin_is_not_loaded():
    from dsh_core.host import load_plugins

    installed = {ep.name for ep in entry_points(group="dsh")}
    assert "testkit-print" in installed  # installed in the test environment …
    pm = make_plugin_manager(trace=False)
    load_plugins(pm, load_composition("acp-agent"))
    names = {name for name, _ in pm.list_name_plugin()}
    assert "testkit-print" not in names  # … yet not loaded by an example that does not list it
    assert {"acp-transport", "jsonl-persistence", "scripted-model"} <= names


def test_a_missing_plugin_names_the_example_the_plugin_and_the_install_command():
    from dsh_core.host import load_plugins

    comp = Composition(name="demo", path=Path("demo/example.toml"), plugins=("no-such-plugin",))
    with pytest.raises(CompositionError) as err:
        load_plugins(make_plugin_manager(trace=False), comp)
    text = str(err.value)
    assert "'demo'" in text and "'no-such-plugin'" in text and "pip install" in text


def test_trace_plugins_prints_hook_calls_to_stderr(capfd):
    pm = make_plugin_manager(trace=True)
    pm.hook.dsh_session_store(host=None)
    out, err = capfd.readouterr()
    assert out == ""
    assert "dsh_session_store" in err


# --------------------------------------------------------------------------- the agent loop


class Tools:
    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.sleeping = anyio.Event()  # set once the "sleepy" tool runs

    @hookimpl
    def dsh_register_tools(self, register):
        async def echo(args, ctx):
            self.calls.append(args)
            return f"ECHO {args['x']}"

        async def sleepy(args, ctx):
            self.sleeping.set()
            await anyio.sleep(60)
            return "never"

        async def note(args, ctx):  # exclusive: records when it starts and ends
            self.calls.append(("start", args["x"]))
            await anyio.sleep(0.01)
            self.calls.append(("end", args["x"]))
            return "ok"

        register(FunctionTool("echo", "Echo x.", {"type": "object"}, echo, parallel_safe=True))
        register(FunctionTool("sleepy", "Sleep.", {"type": "object"}, sleepy, parallel_safe=True))
        register(FunctionTool("note", "Note x.", {"type": "object"}, note))


async def _host(script: Path, tools: Tools | None = None):
    return memory_host(script, tools or Tools())


def _events(host, agent):
    return host.session_store.logs[agent.session_id].events


async def test_tool_dispatch_and_quiescence(scripted, tmp_path):
    script = scripted(
        {"default": [{"tools": [{"name": "echo", "args": {"x": "a"}}, {"name": "echo", "args": {"x": "b"}}]},
                     {"text": "saw {tool_result}"}]}
    )
    tools = Tools()
    async with await _host(script, tools) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        assert agent.busy
        await agent.wait_idle()
        assert not agent.busy
        events = _events(host, agent)
        results = [e for e in events if isinstance(e, ToolResultEvent)]
        assert [r.result.content[0].text for r in results] == ["ECHO a", "ECHO b"]  # call order kept
        final = [e for e in events if isinstance(e, AssistantMessageEvent)][-1]
        assert final.message.content == [TextBlock(text="saw ECHO b")]
        assert isinstance(events[-1], TurnEnd) and events[-1].reason == "completed"
        assert [e.seq for e in events] == list(range(1, len(events) + 1))


async def test_unknown_tool_and_bad_arguments_become_error_results(scripted, tmp_path):
    script = scripted({"default": [{"tool": "nope", "args": {}}, {"text": "{tool_result}"}]})
    async with await _host(script) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        (result,) = [e for e in _events(host, agent) if isinstance(e, ToolResultEvent)]
        assert result.code == "UNKNOWN_TOOL" and result.result.is_error


def _recording(name: str, schema: dict, ran: list[dict]):
    """A plugin with one tool ``name`` (``schema``) that keeps the arguments it runs with in ``ran``."""

    class Recording:
        @hookimpl
        def dsh_register_tools(self, register):
            async def run(a, ctx):
                ran.append(a)
                return "ran"

            register(FunctionTool(name, "A tool.", schema, run))

    return Recording()


async def _one_call(scripted, tmp_path, name: str, schema: dict, args: dict) -> tuple[list[dict], ToolResultEvent]:
    """The model calls tool ``name`` (``schema``) once with ``args``: what reached the tool, and the call's result."""
    ran: list[dict] = []
    script = scripted({"default": [{"tool": name, "args": args}, {"text": "{tool_result}"}]})
    async with memory_host(script, _recording(name, schema, ran)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        (result,) = [e for e in _events(host, agent) if isinstance(e, ToolResultEvent)]
    return ran, result


@pytest.mark.parametrize(("args", "problem"), [
    ({}, "missing required argument 'x'"),
    ({"x": 3}, "argument 'x' must be string, not int"),
    ({"x": "a", "n": True}, "argument 'n' must be integer, not bool"),
    ({"x": "a", "path": "f"}, "unknown argument 'path' (it takes: x, n)"),
    ({"x": "a", "glob": "*", "timeout_ms": 5}, "unknown arguments 'glob', 'timeout_ms' (it takes: x, n)"),
])
async def test_arguments_that_break_the_schema_never_reach_the_tool(scripted, tmp_path, args, problem):
    schema = {"type": "object", "properties": {"x": {"type": "string"}, "n": {"type": "integer"}}, "required": ["x"]}
    ran, result = await _one_call(scripted, tmp_path, "strict", schema, args)
    assert ran == []
    assert result.code == "INVALID_ARGUMENTS" and result.result.is_error
    assert result.result.content[0].text == (f"Error: strict: {problem}. "
                                             "Call it again with arguments that match its schema.")


async def test_a_calls_arguments_are_read_as_the_stdlib_reads_json(scripted, tmp_path):
    """Arguments decode as ``json.loads`` decodes them (NaN, 1e400 and a lone surrogate included,
    which msgspec's faster decoder refuses), and what is not a JSON object is refused with the
    stdlib's reason."""
    ran: list[dict] = []
    script = scripted({"default": [{"text": "hi"}]})
    async with memory_host(script, _recording("any", {"type": "object", "additionalProperties": True}, ran)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        for i, raw in enumerate(['{"a": [1, 2.5, "x"], "b": {"c": null}}', '  ', '{"a": NaN}', '{"a": 1e400}',
                                 '{"a": "\\ud800"}', '{"a": 1, "a": 2}', '[1]', '{"a": ', 'nope']):
            out = await agent.call_tool("any", raw, call_id=f"c{i}", turn=1, step=1)
            try:
                expected = json.loads(raw) if raw.strip() else {}
                reason = None if isinstance(expected, dict) else "arguments must be a JSON object"
            except ValueError as exc:
                expected, reason = None, str(exc)
            if reason is None:
                assert not out.is_error and repr(ran.pop()) == repr(expected), raw
            else:
                assert out.code == "INVALID_ARGUMENTS" and out.content[0].text == (
                    f"Error: the arguments of any are not a JSON object ({reason}). Call it again with valid JSON."), raw
        assert ran == []


@pytest.mark.parametrize(("extra", "runs"), [(True, True), ({"type": "string"}, True), (False, False)])
async def test_undeclared_arguments_pass_only_when_the_schema_opens_itself(scripted, tmp_path, extra, runs):
    schema = {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": extra}
    ran, result = await _one_call(scripted, tmp_path, "open", schema, {"x": "a", "y": "b"})
    assert ran == ([{"x": "a", "y": "b"}] if runs else [])
    assert result.result.is_error is not runs


async def test_cancel_mid_delay_commits_partial_and_aborts(scripted, tmp_path):
    script = scripted({"default": [{"partial": "partial", "delay_ms": 60000}]})
    async with await _host(script) as host:
        streamed = streaming(host)
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(5):
            await streamed.wait()  # the partial is out; the model now waits 60 s
            agent.cancel()
            await agent.wait_idle()
        events = _events(host, agent)
        msg = [e for e in events if isinstance(e, AssistantMessageEvent)][-1]
        assert msg.interrupted and msg.message.content == [TextBlock(text="partial")]
        assert events[-1].reason == "aborted" and events[-1].abort_kind == "user"


async def _in_sleepy(host, tools, tmp_path, script):
    """A new agent whose turn (prompt ``go``) is inside the ``sleepy`` tool."""
    agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
    agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
    with anyio.fail_after(5):
        await tools.sleeping.wait()
    return agent


async def test_cancel_during_a_tool_gives_every_call_a_result(scripted, tmp_path):
    script = scripted({"default": [{"tools": [{"name": "sleepy", "args": {}}, {"name": "echo", "args": {"x": "q"}}]}]})
    tools = Tools()
    async with await _host(script, tools) as host:
        agent = await _in_sleepy(host, tools, tmp_path, script)
        agent.cancel()
        await agent.wait_idle()
        results = [e for e in _events(host, agent) if isinstance(e, ToolResultEvent)]
        assert [(r.result.name, r.code) for r in results] == [("sleepy", "ABORTED"), ("echo", None)]


async def test_exclusive_calls_of_one_message_run_alone_in_order(scripted, tmp_path):
    # Two writes of one assistant message used to run concurrently; exclusive tools now run
    # one after the other, in the model's order, and a parallel-safe call waits its turn too.
    script = scripted({"default": [{"tools": [{"name": "note", "args": {"x": "1"}}, {"name": "echo", "args": {"x": "e"}},
                                              {"name": "note", "args": {"x": "2"}}]}, {"text": "done"}]})
    tools = Tools()
    async with await _host(script, tools) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
    assert tools.calls == [("start", "1"), ("end", "1"), {"x": "e"}, ("start", "2"), ("end", "2")]


async def test_an_exclusive_call_waits_for_the_parallel_safe_calls_before_it(scripted, tmp_path):
    script = scripted({"default": [{"tools": [{"name": "sleepy", "args": {}}, {"name": "note", "args": {"x": "1"}}]}]})
    tools = Tools()
    async with await _host(script, tools) as host:
        agent = await _in_sleepy(host, tools, tmp_path, script)
        await anyio.wait_all_tasks_blocked()  # every task that could run now has run
        assert tools.calls == []  # note has not started while sleepy runs
        agent.cancel()
        await agent.wait_idle()
        results = [e for e in _events(host, agent) if isinstance(e, ToolResultEvent)]
        assert [(r.result.name, r.code) for r in results] == [("sleepy", "ABORTED"), ("note", "ABORTED")]


async def test_retryable_errors_are_retried_and_recorded(scripted, tmp_path):
    script = scripted({"default": [{"error": "rate_limit"}, {"error": "server"}, {"text": "Recovered."}]})
    async with await _host(script) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        types = [e.__class__.__name__ for e in _events(host, agent)]
        assert types.count("RetryEvent") == 2
        assert _events(host, agent)[-1].reason == "completed"


async def test_non_retryable_error_fails_the_turn(scripted, tmp_path):
    script = scripted({"default": [{"error": "auth"}]})
    async with await _host(script) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        end = _events(host, agent)[-1]
        assert end.reason == "error" and "HTTP 401" in end.error
        assert not [e for e in _events(host, agent) if isinstance(e, AssistantMessageEvent)]


async def test_length_finish_ends_the_turn_as_max_tokens(scripted, tmp_path):
    script = scripted({"default": [{"finish": "length", "text": "cut"}]})
    async with await _host(script) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        assert _events(host, agent)[-1].reason == "max-tokens"


async def test_dispose_cancels_running_work_and_refuses_more(scripted, tmp_path):
    from dsh_core import AgentDisposed

    script = scripted({"default": [{"partial": "p", "delay_ms": 60000}]})
    async with await _host(script) as host:
        streamed = streaming(host)
        parent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        child = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script), parent=parent))
        parent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        child.submit(UserMessage(id="u2", content=[TextBlock(text="go")]))
        with anyio.fail_after(5):
            await streamed.wait()
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(2):
            await parent.dispose()
        assert parent.disposed and child.disposed and not child.busy
        assert _events(host, child)[-1].abort_kind == "disposed"
        with pytest.raises(AgentDisposed):
            parent.submit(UserMessage(id="u3", content=[TextBlock(text="again")]))


async def test_history_sent_to_the_model_is_append_only(scripted, tmp_path):
    seen: list[list] = []
    script = scripted({"default": [{"tool": "echo", "args": {"x": "1"}}, {"text": "done"}]})
    async with await _host(script) as host:
        provider = host.models["scripted"]
        original = provider.stream

        def spy(request):
            seen.append(list(request.messages))
            return original(request)

        provider.stream = spy
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        for text in ("one", "two"):
            agent.submit(UserMessage(id=text, content=[TextBlock(text=text)]))
            await agent.wait_idle()
        for before, after in pairwise(seen):
            assert after[: len(before)] == before


async def test_a_crashing_provider_fails_the_turn_not_the_host(scripted, tmp_path):
    script = scripted({"default": [{"text": "fine"}]})
    async with await _host(script) as host:
        provider = host.models["scripted"]
        original = provider.stream
        calls = []

        def broken(request):
            calls.append(request)
            if len(calls) == 1:
                raise RuntimeError("adapter bug")
            return original(request)

        provider.stream = broken
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        end = _events(host, agent)[-1]
        assert end.reason == "error" and "RuntimeError: adapter bug" in end.error and end.code == "INTERNAL"
        agent.submit(UserMessage(id="u2", content=[TextBlock(text="again")]))  # the agent (and host) live on
        await agent.wait_idle()
        assert _events(host, agent)[-1].reason == "completed"


@pytest.mark.parametrize("fail_after", [0, 2, 4])  # the user message, TurnStart, the model's answer
async def test_a_failing_session_log_fails_that_prompt_and_the_host_keeps_serving(scripted, tmp_path, capfd,
                                                                                   fail_after):
    # Changed with issue 12: a failing log used to be reported once while the session carried on
    # unrecorded. Now no work happens without a record: the turn fails (LOG_FAILED), later prompts
    # are refused, and the log stops at the failure. Other sessions of the host are untouched.
    from dsh_core import SessionLogFailed
    from dsh_core.types import AssistantMessageEvent, TurnEnd

    class Log:
        def __init__(self, fail_after):
            self.fail_after = fail_after
            self.events = []

        def append(self, event):
            if self.fail_after is not None and len(self.events) >= self.fail_after:
                raise OSError(28, "No space left on device")
            self.events.append(event)

        async def close(self):
            pass

    logs = []

    class Store:
        def open(self, header):
            logs.append(Log(fail_after if not logs else None))  # only the first session's disk is full
            return logs[-1]

        async def list_sessions(self):
            return []

        async def read(self, session_id):
            raise KeyError(session_id)

    class StorePlugin:
        @hookimpl
        def dsh_session_store(self, host):
            return Store()

    script = scripted({"default": [{"text": "fine"}]})
    seen: list = []
    async with memory_host(script, StorePlugin()) as host:
        broken = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        healthy = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        broken.subscribe(lambda a, e: seen.append(e))
        if fail_after == 0:
            with pytest.raises(SessionLogFailed, match="session log cannot be written"):
                broken.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        else:
            broken.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
            await broken.wait_idle()
            end = seen[-1]
            assert isinstance(end, TurnEnd) and end.reason == "error" and end.code == "LOG_FAILED"
            assert "No space left on device" in end.error and "start a new session" in end.error
            assert len(logs[0].events) == fail_after  # the log stops at the failure: no gaps
        with pytest.raises(SessionLogFailed):  # and the session takes no more prompts
            broken.submit(UserMessage(id="u2", content=[TextBlock(text="again")]))
        healthy.submit(UserMessage(id="h1", content=[TextBlock(text="go")]))
        await healthy.wait_idle()
        assert logs[1].events[-1].reason == "completed"
    assert isinstance(broken.log_error, OSError)
    if fail_after < 4:  # failed before the model call: no work was done without a record
        assert not any(isinstance(e, AssistantMessageEvent) for e in seen)
    assert capfd.readouterr().err.count("No space left on device") == 1  # said once, not per event


async def test_a_notice_goes_in_the_next_request_unless_it_was_told_another_way_by_then(scripted, tmp_path):
    script = scripted({"default": [{"text": "ok"}], "repeat_default": True})
    async with memory_host(script) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        told = {"b": False}
        agent.notify("A happened")
        agent.notify("B happened", unless=lambda: told["b"])  # checked when the request is built
        told["b"] = True
        agent.notify("C happened", unless=lambda: False)
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(10):
            await agent.wait_idle()
        notices = [m.content[0].text for m in agent.history if getattr(m, "source", None) == "notice"]
        assert notices == ["A happened", "C happened"]


# --------------------------------------------------------------------------- what an idle session holds


async def test_idle_drivers_past_the_bound_end_and_their_sessions_still_answer(scripted, tmp_path, monkeypatch):
    from dsh_core import turn

    monkeypatch.setattr(turn, "PARKED_DRIVERS", 2)
    script = scripted({"default": [{"text": "said {prompt}"}], "repeat_default": True})
    async with await _host(script) as host:
        parked = host.state(turn.ParkedDrivers)
        agents = [host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
                  for _ in range(4)]
        for i, agent in enumerate(agents):
            agent.submit(UserMessage(id=f"u{i}", content=[TextBlock(text=f"p{i}")]))
            with anyio.fail_after(5):
                await agent.wait_idle()
        await anyio.wait_all_tasks_blocked()
        # the two most recently idle keep a driver waiting; the older two ended theirs
        assert list(parked.idle) == agents[2:]
        assert [a._wake is None for a in agents] == [True, True, False, False]
        tasks = [t.get_name() for t in asyncio.all_tasks()]
        assert sum(name.startswith("agent ") for name in tasks) == 2
        # a session whose driver ended answers its next prompt (a new driver), which parks again
        agents[0].submit(UserMessage(id="again", content=[TextBlock(text="again")]))
        with anyio.fail_after(5):
            await agents[0].wait_idle()
        await anyio.wait_all_tasks_blocked()
        final = [e for e in _events(host, agents[0]) if isinstance(e, AssistantMessageEvent)][-1]
        assert final.message.content == [TextBlock(text="said again")]
        assert list(parked.idle) == [agents[3], agents[0]]
        # a parked driver and an ended one both let dispose finish
        with anyio.fail_after(5):
            for agent in agents:
                await agent.dispose()
        await anyio.wait_all_tasks_blocked()
        assert parked.idle == {}


async def test_a_prompt_that_comes_while_the_retired_driver_wakes_is_run_by_it(scripted, tmp_path, monkeypatch):
    from dsh_core import turn

    monkeypatch.setattr(turn, "PARKED_DRIVERS", 1)
    script = scripted({"default": [{"text": "said {prompt}"}], "repeat_default": True})
    async with await _host(script) as host:
        a, b = (host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
                for _ in range(2))
        a.submit(UserMessage(id="a1", content=[TextBlock(text="one")]))
        with anyio.fail_after(5):
            await a.wait_idle()
        await anyio.wait_all_tasks_blocked()
        b.submit(UserMessage(id="b1", content=[TextBlock(text="one")]))
        with anyio.fail_after(5):
            await b.wait_idle()  # b parks: a's driver is told to end, and is woken
        a.submit(UserMessage(id="a2", content=[TextBlock(text="two")]))  # before it runs
        with anyio.fail_after(5):
            await a.wait_idle()
        final = [e for e in _events(host, a) if isinstance(e, AssistantMessageEvent)][-1]
        assert final.message.content == [TextBlock(text="said two")]


async def test_the_flag_is_an_event_that_makes_its_event_only_for_a_waiter():
    from dsh_core.state import Flag

    flag = Flag()
    assert not flag.is_set() and flag._waiters is None
    woke: list[str] = []

    async def waiter(name: str) -> None:
        await flag.wait()
        woke.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "a")
        tg.start_soon(waiter, "b")
        await anyio.wait_all_tasks_blocked()
        assert woke == [] and flag._waiters is not None
        flag.set()
    assert sorted(woke) == ["a", "b"] and flag.is_set() and flag._waiters is None
    flag = Flag()  # a cancelled waiter leaves; the one left is still woken by set
    gone = anyio.CancelScope()

    async def cancelled() -> None:
        with gone:
            await flag.wait()
            woke.append("never")

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, "c")
        tg.start_soon(cancelled)
        await anyio.wait_all_tasks_blocked()
        assert len(flag._waiters) == 2  # type: ignore[arg-type]
        gone.cancel()
        await anyio.wait_all_tasks_blocked()
        assert len(flag._waiters) == 1  # type: ignore[arg-type]
        flag.set()
    assert "c" in woke and "never" not in woke and flag._waiters is None
    with anyio.CancelScope() as scope:  # waiting on a set flag is a checkpoint, as on a set event
        scope.cancel()
        await Flag(True).wait()
    assert scope.cancelled_caught


async def test_sessions_share_the_host_catalog_and_prompt_until_a_source_publishes(scripted, tmp_path):
    script = scripted({"default": [{"text": "ok"}]})
    async with await _host(script, Tools()) as host:
        a, b = (host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
                for _ in range(2))
        assert a.tools is host.tools and b.tools is host.tools
        assert a.system is b.system  # one copy of the text
        assert vars(a) == {}  # the state is in slots (the __dict__ is made only for extras)
        assert a.publish_tools("mine", []) == [] and a.tools is host.tools  # nothing published: nothing copied

        async def run(args, ctx):
            return "x"

        assert a.publish_tools("mine", [FunctionTool("extra", "Extra.", {"type": "object"}, run)]) == ["extra"]
        assert "extra" in a.tools and "echo" in a.tools
        assert "extra" not in host.tools and b.tools is host.tools
        assert a.publish_tools("mine", []) == [] and "extra" not in a.tools and "extra" not in host.tools


def test_a_history_view_slices_as_a_list_of_its_first_n_messages():
    from dsh_core.types import HistoryView

    items = list(range(10))
    view = HistoryView(items, 6)
    items.append(10)  # the history grows past the view: the view does not
    expected = items[:6]
    for s in (slice(None), slice(2, None), slice(-3, None), slice(1, 100), slice(None, -2), slice(4, 2),
              slice(None, None, 2), slice(None, None, -1), slice(5, 0, -2)):
        assert view[s] == expected[s], s
    assert view[-1] == 5 and len(view) == 6
