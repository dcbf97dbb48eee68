"""The interception points of issue 15 with native plugins (typed returns, no bridge): session
start and prompt context, a prompt blocked, a tool denied / asked / allowed with the fold
deny > ask > allow, a Pending decision awaited inside the turn, a stop refused once, and a
blocked prompt that stays out of a resumed session's history."""

from __future__ import annotations

import pytest

from dsh_core import FunctionTool, hookimpl
from dsh_core.contracts import AgentSpec
from dsh_core.interception import BeforeStop, BeforeTool, PromptSubmit, SessionStart
from dsh_core.types import (
    AfterTool,
    AssistantMessage,
    Note,
    TextBlock,
    ToolResultEvent,
    ToolSpec,
    TurnEnd,
    UserMessage,
    UserMessageEvent,
)
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio

SCRIPT = {
    "rules": [
        {"when": "^touch", "steps": [{"tool": "touch", "args": {"name": "x"}}, {"text": "said: {tool_result}"}]},
        {"when": "^stop", "steps": [{"text": "ONE"}]},
        {"when": "^say TWO", "steps": [{"text": "TWO"}]},  # the model answers the stop hook's reason
        {"when": "^secret", "steps": [{"text": "leaked"}]},
    ],
    "default": [{"text": "echo: {prompt}"}],
}


class Touch:
    def __init__(self) -> None:
        self.ran = 0

    @hookimpl
    def dsh_register_tools(self, register):
        async def touch(args, ctx):
            self.ran += 1
            return "touched"

        register(FunctionTool("touch", "Touch.", {"type": "object"}, touch))


class Policy:
    def __init__(self, verdict=None, reason=None, pending=False):
        self.verdict, self.reason, self.pending = verdict, reason, pending
        self.calls = []

    @hookimpl
    def dsh_before_tool(self, session, name, args, call_id, turn, step):
        self.calls.append((name, args, turn, step))
        decision = BeforeTool(decision=self.verdict, reason=self.reason) if self.verdict else None
        if not self.pending:
            return decision

        class Later:
            async def decide(self_inner):
                import anyio

                await anyio.sleep(0.01)
                return decision

        return Later()


class Gate:
    @hookimpl
    def dsh_session_start(self, session, source, turn):
        return SessionStart(context=[f"started ({source})"])

    @hookimpl
    def dsh_prompt_submit(self, session, messages, turn):
        text = messages[0].content[0].text
        if text.startswith("secret"):
            return PromptSubmit(block="no secrets")
        return PromptSubmit(context=["remember: be brief"])


class StopOnce:
    def __init__(self):
        self.seen = []

    @hookimpl
    def dsh_before_stop(self, session, turn, step, continued):
        self.seen.append(continued)
        return BeforeStop(block="say TWO as well") if continued == 0 else None


async def _session(script, tmp_path, *plugins, prompts=("go",)):
    async with memory_host(script, *plugins) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        for text in prompts:
            agent.submit(UserMessage(id=f"u-{text}", content=[TextBlock(text=text)]))
            await agent.wait_idle()
        return agent, list(host.session_store.logs[agent.session_id].events)


def _results(events):
    return [e.result.content[0].text for e in events if isinstance(e, ToolResultEvent)]


@pytest.mark.parametrize("pending", [False, True])
async def test_deny_wins_over_ask_and_allow(scripted, tmp_path, pending):
    touch = Touch()
    plugins = (touch, Policy("allow"), Policy("ask", "check"), Policy("deny", "not here", pending=pending),
               Policy("deny", "nor there"))
    _, events = await _session(scripted(SCRIPT), tmp_path, *plugins, prompts=("touch it",))
    assert touch.ran == 0
    assert _results(events) == ["Error: nor there\n\nnot here"]  # pluggy's order: the last registered first
    assert [e.code for e in events if isinstance(e, ToolResultEvent)] == ["BLOCKED"]


async def test_ask_goes_to_the_approval_seam_and_fails_closed(scripted, tmp_path):
    touch = Touch()
    _, events = await _session(scripted(SCRIPT), tmp_path, touch, Policy("allow"), Policy("ask", "check"),
                              prompts=("touch it",))
    assert touch.ran == 0  # no answerer in a memory host: unavailable, so the call does not run
    assert _results(events) == ["Error: the user rejected tool 'touch' (check)"]
    assert [type(e).__name__ for e in events if "Approval" in type(e).__name__] == ["ApprovalAsked", "ApprovalDecided"]


async def test_allow_and_no_opinion_run_the_tool(scripted, tmp_path):
    touch, policy = Touch(), Policy("allow", pending=True)
    _, events = await _session(scripted(SCRIPT), tmp_path, touch, policy, Policy(None), prompts=("touch it",))
    assert touch.ran == 1 and _results(events) == ["touched"]
    assert policy.calls == [("touch", {"name": "x"}, 1, 1)]


async def test_session_start_and_prompt_context_are_appended(scripted, tmp_path):
    agent, events = await _session(scripted(SCRIPT), tmp_path, Gate(), prompts=("hello", "again"))
    hooked = [e.message for e in events if isinstance(e, UserMessageEvent) and e.message.source == "hook"]
    texts = [[b.text for b in m.content] for m in hooked]
    assert texts == [
        ["<system-reminder>\nstarted (startup)\n</system-reminder>",
         "<system-reminder>\nremember: be brief\n</system-reminder>"],
        ["<system-reminder>\nremember: be brief\n</system-reminder>"],  # session start: once
    ]
    history = list(agent.history)
    assert [m.source for m in history if isinstance(m, UserMessage)] == ["user", "hook", "user", "hook"]


async def test_blocked_prompt_never_reaches_the_model_nor_a_resumed_history(scripted, tmp_path):
    script = scripted(SCRIPT)
    agent, events = await _session(script, tmp_path, Gate(), prompts=("secret plans", "hello"))
    ends = [e for e in events if isinstance(e, TurnEnd)]
    assert [e.reason for e in ends] == ["blocked", "completed"]
    assert not any(isinstance(e, type(events[0])) and getattr(e, "message", None) and
                   isinstance(e.message, AssistantMessage) and "leaked" in str(e.message) for e in events)
    (note,) = [e for e in events if isinstance(e, Note)]
    assert note.kind == "prompt/blocked" and note.data["reason"] == "no secrets"
    live = [m.id for m in agent.history if isinstance(m, UserMessage)]
    assert "u-secret plans" not in live
    async with memory_host(script, Gate()) as host:  # the log rebuilds the same history
        fresh = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        fresh.restore(events)
        assert [m.id for m in fresh.history if isinstance(m, UserMessage)] == live


async def test_stop_refused_once_takes_another_step(scripted, tmp_path):
    stop = StopOnce()
    agent, _ = await _session(scripted(SCRIPT), tmp_path, stop, prompts=("stop soon",))
    said = [b.text for m in agent.history if isinstance(m, AssistantMessage) for b in m.content]
    assert said == ["ONE", "TWO"] and stop.seen == [0, 1]
    steer = [m for m in agent.history if isinstance(m, UserMessage) and m.source == "hook"]
    assert [b.text for b in steer[0].content] == ["say TWO as well"]


# ---------------------------------------------------------------------------- halt (continue: false)


class Halter:
    """Answers ``halt`` (with the reason for the user) at one point, and a verdict the halt must win over."""

    def __init__(self, point, reason="policy says stop"):
        self.point, self.reason = point, reason

    def _at(self, point, decision):
        return decision if point == self.point else None

    @hookimpl
    def dsh_prompt_submit(self, session, messages, turn):
        return self._at("prompt", PromptSubmit(context=["never seen"], halt=True, halt_reason=self.reason))

    @hookimpl
    def dsh_before_tool(self, session, name, args, call_id, turn, step):
        return self._at("before", BeforeTool(decision="allow", halt=True, halt_reason=self.reason))

    @hookimpl
    def dsh_after_tool(self, session, call, output):
        return self._at("after", AfterTool(context=["after the result"], halt=True, halt_reason=self.reason))

    @hookimpl
    def dsh_before_stop(self, session, turn, step, continued):
        return self._at("stop", BeforeStop(block="say TWO as well", halt=True, halt_reason=self.reason))


def _stopped(events):
    notes = [e.data for e in events if isinstance(e, Note) and e.kind == "turn/stopped"]
    return notes, [e.reason for e in events if isinstance(e, TurnEnd)]


async def test_halt_before_a_tool_wins_over_allow_and_ends_the_turn(scripted, tmp_path):
    touch = Touch()
    agent, events = await _session(scripted(SCRIPT), tmp_path, touch, Halter("before"), prompts=("touch it", "again"))
    assert touch.ran == 0  # the call did not run, although the same answer allowed it
    assert _results(events) == ["Error: not run: a hook stopped the turn"]
    assert [e.code for e in events if isinstance(e, ToolResultEvent)] == ["STOPPED"]
    notes, ends = _stopped(events)
    assert notes == [{"turn": 1, "point": "before_tool", "reason": "policy says stop"}]
    assert ends == ["stopped", "completed"]  # the next turn runs as usual
    said = [b.text for m in agent.history if isinstance(m, AssistantMessage) for b in m.content
            if isinstance(b, TextBlock)]
    assert said == ["echo: again"]  # no model call after the stop ("said: …" never came)


async def test_halt_after_a_tool_commits_the_result_then_ends_the_turn(scripted, tmp_path):
    touch = Touch()
    agent, events = await _session(scripted(SCRIPT), tmp_path, touch, Halter("after"), prompts=("touch it",))
    assert touch.ran == 1
    (result,) = [e.result for e in events if isinstance(e, ToolResultEvent)]
    assert [b.text for b in result.content] == ["touched", "<system-reminder>\nafter the result\n</system-reminder>"]
    notes, ends = _stopped(events)
    assert [n["point"] for n in notes] == ["after_tool"] and ends == ["stopped"]
    assert not [m for m in agent.history if isinstance(m, AssistantMessage) and "said" in str(m.content)]


async def test_halt_at_stop_wins_over_a_block(scripted, tmp_path):
    agent, events = await _session(scripted(SCRIPT), tmp_path, Halter("stop"), prompts=("stop soon",))
    said = [b.text for m in agent.history if isinstance(m, AssistantMessage) for b in m.content]
    assert said == ["ONE"]  # no second step
    assert not [m for m in agent.history if isinstance(m, UserMessage) and m.source == "hook"]
    notes, ends = _stopped(events)
    assert [n["point"] for n in notes] == ["before_stop"] and ends == ["stopped"]


async def test_halt_at_prompt_submit_keeps_the_prompt_out(scripted, tmp_path):
    script = scripted(SCRIPT)
    agent, events = await _session(script, tmp_path, Halter("prompt", reason=None), prompts=("secret plans",))
    notes, ends = _stopped(events)
    assert notes == [{"turn": 1, "point": "prompt_submit"}] and ends == ["blocked"]
    assert list(agent.history) == []  # neither the prompt nor the context: nothing reached the model
    async with memory_host(script) as host:
        fresh = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        fresh.restore(events)
        assert list(fresh.history) == []


async def test_an_ask_carries_the_kind_the_tool_declares(scripted, tmp_path):
    """A hook's ``ask`` reaches the approval seam with the tool's own ``ToolSpec.kind`` (the ACP
    door shows it as ``toolCall.kind``), not a name switch in the spine."""
    seen = []

    class Edit:
        spec = ToolSpec(name="touch", description="Touch.", parameters={"type": "object"}, kind="edit")

        async def run(self, args, ctx):
            raise AssertionError("must not run")

    class Tools:
        @hookimpl
        def dsh_register_tools(self, register):
            register(Edit())

    class Answer:
        @hookimpl
        def dsh_check_approval(self, request):
            seen.append((request.tool_name, request.kind))
            return "deny"

    _, events = await _session(scripted(SCRIPT), tmp_path, Tools(), Policy("ask", "check"), Answer(),
                               prompts=("touch it",))
    assert seen == [("touch", "edit")]
    assert _results(events) == ["Error: an approval policy refused tool 'touch' (check)"]  # nobody was asked
