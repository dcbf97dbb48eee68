"""The scripted model's playback rules, through its provider object and a real host."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest
from dsh_scripted_model import ScriptedProvider

from dsh_core import ModelError, RouteError
from dsh_core.compose import Composition
from dsh_core.contracts import AgentSpec
from dsh_core.host import make_plugin_manager, open_host
from dsh_core.types import (
    AssistantMessage,
    Finish,
    ModelRequest,
    ReasoningDelta,
    TextBlock,
    TextDelta,
    ToolCallDelta,
    ToolResultMessage,
    UserMessage,
)

pytestmark = pytest.mark.anyio


def request(provider: ScriptedProvider, model: str, *messages, session="s1", cwd="/work") -> ModelRequest:
    return ModelRequest(route=provider.resolve(model), system="", messages=list(messages), tools=[],
                        session_id=session, cwd=cwd)


def user(text: str, mid: str | None = None) -> UserMessage:
    return UserMessage(id=mid or text, content=[TextBlock(text=text)])


async def deltas(provider, req) -> list:
    return [d async for d in provider.stream(req)]


async def test_first_matching_rule_then_default_then_echo(scripted):
    p = ScriptedProvider()
    both = str(scripted({"rules": [{"when": "^a", "steps": [{"text": "rule A"}]},
                                   {"when": "a", "steps": [{"text": "rule a"}]}],
                         "default": [{"text": "default {prompt}"}]}))
    assert await deltas(p, request(p, both, user("abc"))) == [TextDelta(text="rule A"), Finish(reason="stop")]
    assert (await deltas(p, request(p, both, user("zzz"))))[0] == TextDelta(text="default zzz")
    bare = str(scripted({}))
    assert (await deltas(p, request(p, bare, user("hi"))))[0] == TextDelta(text="echo: hi")


async def test_steps_are_consumed_per_call_with_substitution_and_run_out_empty(scripted):
    p = ScriptedProvider()
    model = str(scripted({"default": [
        {"tool": "read", "args": {"path": "{cwd}/x", "n": 1}, "reasoning": "think {prompt}"},
        {"text": "saw {tool_result} {unknown}"}]}))
    first = await deltas(p, request(p, model, user("go")))
    assert first[0] == ReasoningDelta(text="think go")
    assert first[1] == ToolCallDelta(index=0, id="call_1", name="read", arguments=json.dumps({"path": "/work/x", "n": 1}))
    assert first[-1] == Finish(reason="tool-calls")
    call = AssistantMessage(id="a1", content=[])
    result = ToolResultMessage(call_id="call_1", name="read", content=[TextBlock(text="DATA")])
    second = await deltas(p, request(p, model, user("go"), call, result))
    assert second == [TextDelta(text="saw DATA {unknown}"), Finish(reason="stop")]
    third = await deltas(p, request(p, model, user("go"), call, result, AssistantMessage(id="a2", content=[])))
    assert third == [Finish(reason="stop")]  # steps ran out: an empty answer ends the turn


async def test_the_prompt_is_found_however_many_messages_follow_it(scripted):
    """The latest prompt is looked for from the end in a window that grows: a prompt 70 tool steps
    back is still the prompt (its rule and its text), and the latest tool result is the one shown."""
    from dsh_core.types import HistoryView

    p = ScriptedProvider()
    model = str(scripted({"rules": [{"when": "^deep", "repeat": True, "steps": [{"text": "{prompt}: {tool_result}"}]}],
                          "default": [{"text": "other"}]}))
    older = [user("deep old", "u0"), AssistantMessage(id="a0", content=[TextBlock(text="x")])]
    for n in (0, 3, 7, 8, 70):
        steps = []
        for i in range(n):
            steps += [AssistantMessage(id=f"a{i}", content=[]),
                      ToolResultMessage(call_id=f"c{i}", name="read", content=[TextBlock(text=f"R{i}")])]
        history = [*older, user(f"deep {n}", f"u{n}"), *steps]
        req = ModelRequest(route=p.resolve(model), system="", messages=HistoryView(history), tools=[], session_id=f"s{n}")
        assert (await deltas(p, req))[0] == TextDelta(text=f"deep {n}: {f'R{n - 1}' if n else ''}")
    none = [AssistantMessage(id=f"a{i}", content=[]) for i in range(20)]
    assert await deltas(p, request(p, model, *none, session="none")) == [Finish(reason="stop")]  # no prompt at all


async def test_args_without_placeholders_are_sent_as_written_and_others_filled_in(scripted):
    p = ScriptedProvider()
    static = {"command": "true", "n": [1, {"x": "{nothing}"}], "{prompt}": "key, not value"}
    model = str(scripted({"default": [{"tools": [{"name": "a", "args": static},
                                                 {"name": "b", "args": {"path": "{cwd}/{prompt}"}}]}]}))
    for session in ("s1", "s2"):  # the second call of the same step: the same text
        calls = [d for d in await deltas(p, request(p, model, user("go"), session=session)) if isinstance(d, ToolCallDelta)]
        assert [json.loads(c.arguments) for c in calls] == [static, {"path": "/work/go"}]
        assert calls[0].arguments == json.dumps(static)


async def test_repeat_cycles_and_each_session_has_its_own_cursor(scripted):
    p = ScriptedProvider()
    model = str(scripted({"rules": [{"when": "", "repeat": True, "steps": [{"text": "one"}, {"text": "two"}]}]}))
    texts = [(await deltas(p, request(p, model, user("q"))))[0].text for _ in range(3)]
    assert texts == ["one", "two", "one"]
    assert (await deltas(p, request(p, model, user("q"), session="other")))[0].text == "one"


async def test_errors_and_length_finish(scripted):
    p = ScriptedProvider()
    model = str(scripted({"rules": [{"when": "rate", "steps": [{"error": "rate_limit"}]},
                                    {"when": "auth", "steps": [{"error": "auth"}]},
                                    {"when": "long", "steps": [{"finish": "length", "text": "cut"}]}]}))
    with pytest.raises(ModelError) as err:
        await deltas(p, request(p, model, user("rate")))
    assert err.value.retryable and err.value.status == 429
    with pytest.raises(ModelError) as err:
        await deltas(p, request(p, model, user("auth")))
    assert not err.value.retryable and "HTTP 401" in err.value.message
    assert (await deltas(p, request(p, model, user("long"))))[-1] == Finish(reason="max-tokens")


async def test_length_finish_cuts_the_last_tool_call_half_way(scripted):
    p = ScriptedProvider()
    model = str(scripted({"default": [{"finish": "length", "tools": [
        {"name": "read", "args": {"path": "a.txt"}}, {"name": "read", "args": {"path": "b.txt"}}]}]}))
    out = await deltas(p, request(p, model, user("go")))
    first, second = [d for d in out if isinstance(d, ToolCallDelta)]
    assert json.loads(first.arguments) == {"path": "a.txt"}  # streamed whole before the cut
    assert second.arguments == '{"path": "b.txt"}'[:8]  # the cut came while this one streamed
    assert out[-1] == Finish(reason="max-tokens")


@pytest.mark.parametrize("script, message", [
    ({"rules": [{"when": "(", "steps": []}]}, "bad regex"),
    ({"default": [{"txt": "typo"}]}, "invalid script"),
    ({"default": [{"error": "nope"}]}, "unknown error"),
])
def test_bad_scripts_are_refused_with_the_file_named(scripted, script, message):
    path = scripted(script)
    with pytest.raises(RouteError) as err:
        ScriptedProvider().resolve(str(path))
    assert message in str(err.value) and path.name in str(err.value)


def test_a_missing_script_names_the_way_out():
    with pytest.raises(RouteError) as err:
        ScriptedProvider().resolve("/nope.json")
    assert "examples/acp-agent/demo.json" in str(err.value)


def test_capabilities_are_declared_by_the_script(scripted):
    info = ScriptedProvider().resolve(str(scripted({"capabilities": {"image_input": True, "context_window": 999}})))
    assert info.image_input and info.context_window == 999 and info.provider == "scripted"


async def test_delay_is_cancellable_and_partial_comes_first(scripted):
    p = ScriptedProvider()
    model = str(scripted({"default": [{"partial": "part", "delay_ms": 60000, "text": "never"}]}))
    seen = []
    with anyio.move_on_after(0.1) as scope:
        async for d in p.stream(request(p, model, user("x"))):
            seen.append(d)
    assert scope.cancelled_caught and seen == [TextDelta(text="part")]


async def test_an_image_step_needs_a_store(scripted, tmp_path):
    from dsh_testing import make_png

    script = scripted({"default": [{"image": "pic.png"}]})
    (script.parent / "pic.png").write_bytes(make_png())
    comp = Composition(name="t", path=Path("t/example.toml"), plugins=("scripted-model",))
    async with open_host(comp, provider="scripted", model=str(script), pm=make_plugin_manager(trace=False)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(user("draw"))
        await agent.wait_idle()
        end = host.session_store.logs[agent.session_id].events[-1]
        assert end.reason == "error" and "needs an attachment store" in end.error


async def test_rules_match_the_users_prompt_not_a_hooks_added_context(tmp_path):
    """A UserPromptSubmit-style hook appends its context after the prompt as a message of its own
    (source "hook"); the script's `when` still matches what the user typed."""
    from dsh_core import hookimpl
    from dsh_core.interception import PromptSubmit
    from dsh_testing import memory_host

    class Context:
        @hookimpl
        def dsh_prompt_submit(self, session, messages, turn):
            return PromptSubmit(context=["the repository's rules: be brief"])

    script = tmp_path / "s.json"
    script.write_text(json.dumps({"rules": [{"when": "^ping$", "steps": [{"text": "PONG"}]}]}))
    async with memory_host(script, Context()) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="ping")]))
        await agent.wait_idle()
        texts = [e.message.content for e in host.session_store.logs[agent.session_id].events
                 if type(e).__name__ == "AssistantMessageEvent"]
    assert texts == [[TextBlock(text="PONG")]]


@pytest.mark.parametrize("mark", ["../escaped", "{cwd}/../escaped", "/tmp/dsh-mark-escaped", "link/escaped", "."])
async def test_a_mark_stays_inside_the_cwd(tmp_path, mark):
    """The scripted model runs unconfined in dsh and a script may come from a cloned repository:
    a mark that leaves the session's cwd (or passes a symlink) fails the call and creates nothing."""
    from dsh_testing import memory_host

    work = tmp_path / "work"
    work.mkdir()
    (work / "link").symlink_to(tmp_path)
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"default": [{"partial": "p", "mark": mark}]}))
    async with memory_host(script) as host:
        agent = host.create_agent(AgentSpec(cwd=str(work), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        end = host.session_store.logs[agent.session_id].events[-1]
    assert end.reason == "error"
    assert "is not a path inside the session's cwd" in end.error or "passes a symlink" in end.error
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "dsh-mark-escaped").exists()
    assert not os.path.exists("/tmp/dsh-mark-escaped")


async def test_a_mark_inside_the_cwd_is_created(tmp_path):
    from dsh_testing import memory_host

    (tmp_path / "sub").mkdir()
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"default": [{"partial": "p", "mark": "sub/started-{prompt}"}, {"text": "x"}]}))
    async with memory_host(script) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await agent.wait_idle()
    assert (tmp_path / "sub" / "started-go").is_file()
