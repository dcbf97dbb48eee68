"""The goal tools and the round driver in one in-process host, the model played by the scripted
model: the rounds are real autonomous turns (``Agent.notify(wake=True)``), the goal's record is
the real session log (the memory store), a resume folds it back from that log."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from dsh_goals import domain
from dsh_goals.driver import round_prompt
from dsh_goals.guidance import GUIDANCE, guidance_text
from dsh_goals.tools import state

from dsh_core.contracts import AgentSpec
from dsh_core.types import Note, TextBlock, ToolResultEvent, TurnEnd, TurnStart, UserMessage, UserMessageEvent
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio

PLUGINS = ("scripted-model", "goals")


def _call(tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"tool": tool, "args": args or {}}


async def _open(host: Any, tmp_path: Any, script: Any) -> tuple[Any, list[Any]]:
    agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
    seen: list[Any] = []
    agent.subscribe(lambda a, e: seen.append(e))
    return agent, seen


def _prompt(agent: Any, text: str, n: int = 1) -> None:
    agent.submit(UserMessage(id=f"u{n}", content=[TextBlock(text=text)]))


async def _until(check: Any, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.01)


def _results(seen: list[Any]) -> list[str]:
    return [e.result.content[0].text for e in seen if isinstance(e, ToolResultEvent)]


def _value(text: str) -> dict[str, Any]:
    return json.loads(text)


ROUNDS = [
    {"when": "^make it", "steps": [_call("create_goal", {"objective": "  ship the thing  ", "max_goal_rounds": 5}),
                                   {"text": "goal set"}]},
    {"when": "Round: 1/5", "steps": [{"text": "round one: half done"}]},
    {"when": "Round: 2/5", "steps": [_call("get_goal"),
                                     _call("update_goal", {"goal_id": "goal-1", "revision": 1, "action": "complete"}),
                                     {"text": "all done: {tool_result}"}]},
]


async def test_a_goal_runs_in_autonomous_rounds_until_a_round_marks_it_complete(scripted, tmp_path):
    script = scripted({"rules": ROUNDS})
    async with memory_host(script, plugins=PLUGINS) as host:
        agent, seen = await _open(host, tmp_path, script)
        _prompt(agent, "make it so")
        await _until(lambda: state(agent).goal is not None and state(agent).goal["phase"] == "complete"
                     and not agent.busy)
        results = _results(seen)
        assert _value(results[0]) == {"goal": {"id": "goal-1", "revision": 1, "objective": "ship the thing",
                                               "phase": "active", "roundsStarted": 0, "maxGoalRounds": 5},
                                      "activation": "armed"}
        assert results[0] == ('{"goal":{"id":"goal-1","revision":1,"objective":"ship the thing","phase":"active",'
                              '"roundsStarted":0,"maxGoalRounds":5},"activation":"armed"}')
        assert _value(results[1])["goal"]["roundsStarted"] == 2
        assert _value(results[2]) == {"goal": {"id": "goal-1", "revision": 2, "objective": "ship the thing",
                                               "phase": "complete", "roundsStarted": 2, "maxGoalRounds": 5},
                                      "activation": "disarmed"}
        starts = [e for e in seen if isinstance(e, TurnStart)]
        assert [s.autonomous for s in starts] == [False, True, True]
        prompts = [e.message for e in seen if isinstance(e, UserMessageEvent) and e.message.source == "goal"]
        assert [p.content[0].text for p in prompts] == [round_prompt(state(agent).goal, 1),
                                                        round_prompt(state(agent).goal, 2)]
        # the wrap-up follows the completing call's result; the round's last answer is the closing message
        wrap = [m for m in agent.history if isinstance(m, UserMessage) and m.source == "tool"]
        assert len(wrap) == 1 and wrap[0].content[0].text.startswith('<goal_complete>\nObjective: "ship the thing"\n')
        notes = [(e.kind, e.data) for e in seen if isinstance(e, Note) and e.kind.startswith("goal/")]
        assert [k for k, _ in notes] == ["goal/change", "goal/round", "goal/round", "goal/change"]
        assert notes[1][1] == {"goalId": "goal-1", "revision": 1, "round": 1}
        await anyio.sleep(0.2)
        assert len([e for e in seen if isinstance(e, TurnStart)]) == 3  # nothing after completion


async def test_out_of_rounds_the_goal_is_blocked_without_another_turn(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^make it", "steps": [_call("create_goal", {"objective": "x", "max_goal_rounds": 2}), {"text": "ok"}]},
        {"when": "<goal_round>", "steps": [{"text": "still working"}]}]})
    async with memory_host(script, plugins=PLUGINS) as host:
        agent, seen = await _open(host, tmp_path, script)
        _prompt(agent, "make it so")
        await _until(lambda: state(agent).goal is not None and state(agent).goal["phase"] == "blocked")
        assert state(agent).view()["goal"]["blockedReason"] == {
            "code": "round-limit", "message": "Goal reached its configured limit of 2 rounds."}
        assert state(agent).rounds == 2 and len([e for e in seen if isinstance(e, TurnStart)]) == 3


async def _cancel_a_round(tmp_path, agent) -> None:
    """Prompt ``make it so``, wait for the goal's round to start (its mark), cancel it: the goal pauses."""
    _prompt(agent, "make it so")
    await _until(lambda: (tmp_path / "round-started").exists())
    agent.cancel()
    await _until(lambda: state(agent).goal["phase"] == "paused" and not agent.busy)


async def test_cancelling_a_round_pauses_the_goal(scripted, tmp_path):
    script = scripted({"rules": [
        {"when": "^make it", "steps": [_call("create_goal", {"objective": "x"}), {"text": "ok"}]},
        {"when": "<goal_round>", "steps": [{"partial": "working", "mark": "round-started", "delay_ms": 600000}]}]})
    async with memory_host(script, plugins=PLUGINS) as host:
        agent, seen = await _open(host, tmp_path, script)
        await _cancel_a_round(tmp_path, agent)
        ends = [e for e in seen if isinstance(e, TurnEnd)]
        assert [e.reason for e in ends] == ["completed", "aborted"]
        assert state(agent).view()["activation"] == "disarmed" and state(agent).rounds == 1
        await anyio.sleep(0.2)
        assert not agent.busy and len([e for e in seen if isinstance(e, TurnStart)]) == 2


async def test_a_resumed_session_gets_its_goal_back_disarmed_and_a_person_resumes_it(scripted, tmp_path, dsh_home):
    script = scripted({"rules": [
        {"when": "^make it", "steps": [_call("create_goal", {"objective": "x", "max_goal_rounds": 3}),
                                       {"text": "ok"}]},
        {"when": "<goal_round>", "steps": [{"partial": "working", "mark": "round-started", "delay_ms": 600000}]},
        {"when": "^what", "steps": [_call("get_goal"), {"text": "{tool_result}"}]},
        {"when": "^go on", "steps": [_call("update_goal", {"goal_id": "goal-1", "revision": 1, "action": "resume"}),
                                     _call("update_goal", {"goal_id": "goal-1", "revision": 2, "action": "resume"}),
                                     _call("update_goal", {"goal_id": "goal-1", "revision": 3, "action": "resume"}),
                                     {"text": "resumed"}]}]})
    plugins = (*PLUGINS, "jsonl-persistence")
    async with memory_host(script, plugins=plugins) as host:
        first, _ = await _open(host, tmp_path, script)
        await _cancel_a_round(tmp_path, first)
        (tmp_path / "round-started").unlink()
    async with memory_host(script, plugins=plugins) as host:  # another process, later
        _, events = await host.session_store.read(first.session_id)
        again = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script),
                                            session_id=first.session_id))
        seen: list[Any] = []
        again.subscribe(lambda a, e: seen.append(e))
        again.restore(events)
        _prompt(again, "what is the goal?", 2)
        await _until(lambda: not again.busy and _results(seen))
        assert _value(_results(seen)[0]) == {"goal": {"id": "goal-1", "revision": 2, "objective": "x",
                                                      "phase": "paused", "roundsStarted": 1, "maxGoalRounds": 3},
                                             "activation": "disarmed"}
        await anyio.sleep(0.2)  # no old wake is replayed: the goal waits for a person
        assert [e.autonomous for e in seen if isinstance(e, TurnStart)] == [False] and not again.busy
        _prompt(again, "go on", 3)
        await _until(lambda: (tmp_path / "round-started").exists())
        stale, resumed, armed_twice = _results(seen)[1:4]
        assert stale == 'Error: stale goal ref "goal-1" revision 1; current is "goal-1" revision 2'
        assert _value(resumed)["goal"]["phase"] == "active" and _value(resumed)["activation"] == "armed"
        assert armed_twice == 'Error: goal "goal-1" is already active and armed'
        assert state(again).rounds == 2  # the resumed goal's next round is its second
        again.cancel()
        await _until(lambda: not again.busy)


GUARDED = [
    ({"goal_id": "goal-1", "revision": 1, "action": "blocked", "blocked_reason": "no key"},
     "Error: blocked requires at least 3 consecutive goal rounds; current round is 1"),
    ({"goal_id": "goal-1", "revision": 1, "action": "pause"},
     "Error: this goal operation requires a direct human turn on a top-level agent"),
    ({"goal_id": "goal-1", "revision": 1, "action": "edit", "objective": "y"},
     "Error: this goal operation requires a direct human turn on a top-level agent"),
    ({"goal_id": "goal-1", "revision": 1, "action": "complete", "blocked_reason": "x"},
     "Error: blocked_reason is valid only with action blocked"),
    ({"goal_id": "goal-1", "revision": 1, "action": "blocked"}, "Error: blocked_reason is required with action blocked"),
    ({"goal_id": "goal-1", "revision": 1, "action": "complete", "objective": "y"},
     "Error: objective and max_goal_rounds are valid only with action edit"),
    ({"goal_id": "goal-1", "revision": 1.5, "action": "complete"},
     "Error: goal_id must be non-empty and revision must be a positive safe integer"),
]


@pytest.mark.parametrize(("args", "message"), GUARDED)
async def test_a_round_may_only_complete_or_block_its_goal_as_the_original_allows(scripted, tmp_path, args, message):
    script = scripted({"rules": [
        {"when": "^make it", "steps": [_call("create_goal", {"objective": "x", "max_goal_rounds": 1}),
                                       {"text": "ok"}]},
        {"when": "<goal_round>", "steps": [_call("update_goal", args), _call("create_goal", {"objective": "z"}),
                                           {"text": "done"}]}]})
    async with memory_host(script, plugins=PLUGINS) as host:
        agent, seen = await _open(host, tmp_path, script)
        _prompt(agent, "make it so")
        await _until(lambda: len(_results(seen)) == 3)
        assert _results(seen)[1] == message
        assert _results(seen)[2] == "Error: this goal operation requires a direct human turn on a top-level agent"


@pytest.mark.parametrize(("calls", "message"), [
    ([_call("create_goal", {"objective": "a"}), _call("create_goal", {"objective": "b"})],
     'Error: goal "goal-1" already exists with phase "active"'),
    ([_call("create_goal", {"objective": " "})], "Error: goal objective must be a non-empty string"),
    ([_call("create_goal", {"objective": "a", "max_goal_rounds": 0})],
     "Error: maxGoalRounds must be a positive safe integer"),
    ([_call("update_goal", {"goal_id": "goal-1", "revision": 1, "action": "pause"})], "Error: no current goal"),
    ([_call("create_goal", {"objective": "a"}),
      _call("update_goal", {"goal_id": "goal-1", "revision": 1, "action": "edit"})],
     "Error: goal edit requires objective and/or maxGoalRounds"),
    ([_call("create_goal", {"objective": "a"}),
      _call("update_goal", {"goal_id": "goal-1", "revision": 1, "action": "pause", "objective": "b"})],
     "Error: objective and max_goal_rounds are valid only with action edit; blocked_reason is valid only with "
     "action blocked"),
    ([_call("create_goal", {"objective": "a"}),
      _call("update_goal", {"goal_id": "goal-1", "revision": 1, "action": "complete"}),
      _call("update_goal", {"goal_id": "goal-1", "revision": 2, "action": "pause"})],
     'Error: cannot pause goal "goal-1" from phase "complete"; expected active'),
    ([_call("create_goal", {"objective": "a", "max_goal_rounds": 1}),
      _call("update_goal", {"goal_id": "goal-1", "revision": 1, "action": "pause"}),
      _call("update_goal", {"goal_id": "goal-1", "revision": 2, "action": "edit", "objective": "b"}),
      _call("update_goal", {"goal_id": "goal-1", "revision": 3, "action": "blocked", "blocked_reason": " needs a key "}),
      ], 'Error: cannot block goal "goal-1" from phase "paused"; expected active'),
])
async def test_a_person_s_turn_gets_the_original_s_errors(scripted, tmp_path, calls, message):
    script = scripted({"rules": [{"when": "^now", "steps": [*calls, {"text": "done"}]},
                                 {"when": "<goal_round>", "steps": [{"text": "a round"}]}]})
    async with memory_host(script, plugins=PLUGINS) as host:
        agent, seen = await _open(host, tmp_path, script)
        agent.cancel()  # (nothing runs yet)
        _prompt(agent, "now")
        await _until(lambda: len(_results(seen)) == len(calls))
        assert _results(seen)[-1] == message
        agent.cancel()
        await _until(lambda: not agent.busy)


async def test_a_completed_goal_is_replaced_by_the_next_one_with_the_next_id(scripted, tmp_path):
    script = scripted({"rules": [{"when": "^now", "steps": [
        _call("create_goal", {"objective": "a"}),
        _call("update_goal", {"goal_id": "goal-1", "revision": 1, "action": "complete"}),
        _call("create_goal", {"objective": "b", "max_goal_rounds": 7.0}),
        _call("update_goal", {"goal_id": "goal-2", "revision": 1, "action": "pause"}),
        _call("update_goal", {"goal_id": "goal-2", "revision": 2, "action": "edit", "max_goal_rounds": 9}),
        {"text": "done"}]}]})
    async with memory_host(script, plugins=PLUGINS) as host:
        agent, seen = await _open(host, tmp_path, script)
        _prompt(agent, "now")
        await _until(lambda: len(_results(seen)) == 5 and not agent.busy)
        last = _value(_results(seen)[-1])
        assert last == {"goal": {"id": "goal-2", "revision": 3, "objective": "b", "phase": "paused",
                                 "roundsStarted": 0, "maxGoalRounds": 9}, "activation": "disarmed"}
        # a human completes a goal outside any round: no wrap-up instruction
        assert not [m for m in agent.history if isinstance(m, UserMessage) and m.source == "tool"]


def test_the_fold_gives_back_the_goal_its_rounds_and_its_next_id():
    st = domain.GoalState()
    created = domain.create(st, "a", None, 256)
    notes = [created.note(), Note(kind=domain.ROUND, data={"goalId": "goal-1", "revision": 1, "round": 1}),
             Note(kind=domain.ROUND, data={"goalId": "goal-1", "revision": 1, "round": 2})]
    folded = domain.GoalState()
    folded.fold(notes)
    assert folded.view() == {"goal": {"id": "goal-1", "revision": 1, "objective": "a", "phase": "active",
                                      "roundsStarted": 2, "maxGoalRounds": 256}, "activation": "disarmed"}
    folded.goal["phase"] = "complete"
    assert domain.create(folded, "b", 3, 256).goal["id"] == "goal-2"


def test_the_guidance_names_the_tools_and_the_blocked_threshold():
    assert "get_goal before update_goal" in GUIDANCE and "at least 3 consecutive goal rounds" in GUIDANCE
    assert "at least 5 consecutive" in guidance_text(5)
