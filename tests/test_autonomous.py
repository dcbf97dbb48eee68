"""Autonomous turns (issue 41; docs/acp-contract.md ACP-7, ACP-8): an idle agent that a plugin's notice wakes
(``Agent.notify(..., wake=True)``: a background job or subagent settled, a child reported, a goal
round) starts a turn on its own, as the original's ``followup`` does.

In-process tests pin the spine's rules; the real-stdio tests drive ``dsh run`` with the official
ACP SDK client through ``testkit-wake`` (a tool that wakes its session later): the autonomous
turn's committed text outside any prompt, ``session/cancel`` with no prompt in flight, a prompt
that arrives during autonomous work, EOF during a wake, and the ``[config.agent] wake = false``
opt-out."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from acp import text_block

from dsh_core import FunctionTool, hookimpl
from dsh_core.contracts import AgentSpec
from dsh_core.types import TextBlock, TurnEnd, TurnStart, UserMessage, UserMessageEvent
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio


def _agent(host: Any, script: Path, tmp_path: Path) -> Any:
    return host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))


def _events(host: Any, agent: Any) -> list[Any]:
    return list(host.session_store.logs[agent.session_id].events)


def _starts(host: Any, agent: Any) -> list[tuple[int, bool]]:
    return [(e.turn, e.autonomous) for e in _events(host, agent) if isinstance(e, TurnStart)]


# --------------------------------------------------------------------------- the spine


async def test_a_waking_notice_starts_an_autonomous_turn_on_an_idle_agent(scripted, tmp_path):
    script = scripted({"default": [{"text": "ok"}], "repeat_default": True})
    async with memory_host(script) as host:
        agent = _agent(host, script, tmp_path)
        agent.notify("background job bash-1 finished", wake=True)
        assert agent.busy  # at once: a wake is not deferred to a later tick
        with anyio.fail_after(10):
            await agent.wait_idle()
        assert _starts(host, agent) == [(1, True)]
        (notice,) = [e.message for e in _events(host, agent) if isinstance(e, UserMessageEvent)]
        assert notice.source == "notice" and notice.content[0].text == "background job bash-1 finished"
        assert [e.reason for e in _events(host, agent) if isinstance(e, TurnEnd)] == ["completed"]


async def test_a_notice_without_wake_waits_for_the_next_prompt(scripted, tmp_path):
    script = scripted({"default": [{"text": "ok"}], "repeat_default": True})
    async with memory_host(script) as host:
        agent = _agent(host, script, tmp_path)
        agent.notify("a quiet notice")
        assert not agent.busy
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(10):
            await agent.wait_idle()
        assert _starts(host, agent) == [(1, False)]
        assert [m.content[0].text for m in agent.history if getattr(m, "source", "") == "notice"] == ["a quiet notice"]


async def test_the_composition_turns_wakes_off(scripted, tmp_path):
    script = scripted({"default": [{"text": "ok"}], "repeat_default": True})
    async with memory_host(script, config={"agent": {"wake": False}}) as host:
        agent = _agent(host, script, tmp_path)
        agent.notify("job done", wake=True)
        assert not agent.busy  # no turn: the notice waits for the next prompt
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(10):
            await agent.wait_idle()
        assert _starts(host, agent) == [(1, False)]
        assert [m.content[0].text for m in agent.history if getattr(m, "source", "") == "notice"] == ["job done"]


def _notifying_tool(text: str) -> object:
    class Plugin:
        @hookimpl
        def dsh_register_tools(self, register: Any) -> None:
            async def fn(args: dict[str, Any], ctx: Any) -> str:
                ctx.agent.notify(text, wake=True)
                return "started"

            register(FunctionTool("start_work", "start", {"type": "object", "properties": {}}, fn))

    return Plugin()


async def test_a_wake_during_a_turn_is_read_by_its_next_request_and_starts_no_turn(scripted, tmp_path):
    script = scripted({"default": [{"tool": "start_work", "args": {}}, {"text": "done"}]})
    async with memory_host(script, _notifying_tool("it settled")) as host:
        agent = _agent(host, script, tmp_path)
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(10):
            await agent.wait_idle()
        assert _starts(host, agent) == [(1, False)]  # the notice went into turn 1's second request
        assert [m.content[0].text for m in agent.history if getattr(m, "source", "") == "notice"] == ["it settled"]


async def test_a_wake_after_the_last_request_of_a_turn_starts_the_next_turn(scripted, tmp_path):
    script = scripted({"default": [{"text": "first"}, {"text": "second"}]})
    async with memory_host(script) as host:
        agent = _agent(host, script, tmp_path)

        def observe(a: Any, event: Any) -> None:
            if isinstance(event, TurnEnd) and event.turn == 1:  # still busy: the wake is latched
                a.notify("late news", wake=True)

        agent.subscribe(observe)
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(10):
            await agent.wait_idle()  # quiescence includes the autonomous turn
        assert _starts(host, agent) == [(1, False), (2, True)]
        texts = [b.text for m in agent.history if getattr(m, "source", "") == "notice" or getattr(m, "provider", "")
                 for b in m.content if isinstance(b, TextBlock)]
        assert texts == ["first", "late news", "second"]


async def test_cancel_drops_a_due_wake_but_keeps_its_notice(scripted, tmp_path):
    script = scripted({"default": [{"text": "ok"}], "repeat_default": True})
    async with memory_host(script) as host:
        agent = _agent(host, script, tmp_path)

        def observe(a: Any, event: Any) -> None:
            if isinstance(event, TurnEnd) and event.turn == 1:
                a.notify("late news", wake=True)
                a.cancel()  # nothing runs, but the wake it asked for must not start a turn

        unsubscribe = agent.subscribe(observe)
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(10):
            await agent.wait_idle()
        unsubscribe()
        assert _starts(host, agent) == [(1, False)]
        agent.submit(UserMessage(id="u2", content=[TextBlock(text="again")]))
        with anyio.fail_after(10):
            await agent.wait_idle()
        assert _starts(host, agent) == [(1, False), (2, False)]
        assert [m.content[0].text for m in agent.history if getattr(m, "source", "") == "notice"] == ["late news"]


async def test_nothing_wakes_an_agent_whose_teardown_began(scripted, tmp_path):
    script = scripted({"default": [{"text": "ok"}], "repeat_default": True})
    async with memory_host(script) as host:
        agent = _agent(host, script, tmp_path)
        agent.cancel("disposed")
        agent.notify("settled during teardown", wake=True)
        assert not agent.busy
        await agent.dispose()
        assert _starts(host, agent) == []


async def test_prompt_interception_does_not_run_for_an_autonomous_turn(scripted, tmp_path):
    seen: list[list[str]] = []

    class Hooks:
        @hookimpl
        def dsh_prompt_submit(self, session: Any, messages: list[Any], turn: int) -> None:
            seen.append([m.content[0].text for m in messages])

    script = scripted({"default": [{"text": "ok"}], "repeat_default": True})
    async with memory_host(script, Hooks()) as host:
        agent = _agent(host, script, tmp_path)
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(10):
            await agent.wait_idle()
        agent.notify("job done", wake=True)
        with anyio.fail_after(10):
            await agent.wait_idle()
        assert _starts(host, agent) == [(1, False), (2, True)]
        assert seen == [["go"]]  # a user's UserPromptSubmit hook never sees a notice as a prompt


# --------------------------------------------------------------------------- over real stdio (the SDK client)


def _log(home: Path, session_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (home / "sessions" / f"{session_id}.jsonl").read_text().splitlines()]


async def _until(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


def _turns(home: Path, sid: str) -> list[tuple[int, bool, str | None]]:
    events = _log(home, sid)
    ends = {e["turn"]: e["reason"] for e in events if e["type"] == "turn/end"}
    return [(e["turn"], bool(e.get("autonomous")), ends.get(e["turn"])) for e in events if e["type"] == "turn/start"]


def _wake_script(scripted: Any, autonomous_step: dict[str, Any], **more: Any) -> Path:
    return scripted({"rules": [
        {"when": "^go", "steps": [
            {"tool": "wake_later", "args": {"ms": 50, "text": "background job bash-1 finished"}},
            {"text": "started it"},
            autonomous_step,  # the autonomous turn's model call takes the next step of the prompt's rule
        ]},
        *more.get("rules", []),
    ]})


async def test_an_autonomous_turn_is_sent_after_end_turn_outside_any_prompt(acp_agent, scripted):
    script = _wake_script(scripted, {"text": "NOTICED"})
    async with acp_agent(script, example="acp-wake") as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("go")])
        assert resp.stop_reason == "end_turn"
        await _until(lambda: "NOTICED" in run.client.text(sid))
        assert run.client.text(sid) == ["started it", "NOTICED"]
        await _until(lambda: _turns(acp_agent.home, sid)[-1][2] is not None)
        assert await run.close_stdin() == 0
    assert _turns(acp_agent.home, sid) == [(1, False, "completed"), (2, True, "completed")]
    # the chunk came as a session/update after the prompt's response, with no request open
    methods = [f.get("method") or ("result" if "result" in f else "error") for f in run.frames]
    last_result = max(i for i, m in enumerate(methods) if m == "result")
    assert any(f.get("method") == "session/update" and "NOTICED" in json.dumps(f) for f in run.frames[last_result:])


async def test_session_cancel_with_no_prompt_in_flight_cancels_autonomous_work(acp_agent, scripted):
    script = _wake_script(scripted, {"partial": "working on it", "mark": "auto-started", "delay_ms": 60000},
                          rules=[{"when": "^after", "steps": [{"text": "AFTER"}]}])
    async with acp_agent(script, example="acp-wake") as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("go")])).stop_reason == "end_turn"
        await _until(lambda: (run.cwd / "auto-started").exists())
        await run.conn.cancel(session_id=sid)
        await _until(lambda: _turns(acp_agent.home, sid)[-1][2] is not None)
        assert _turns(acp_agent.home, sid) == [(1, False, "completed"), (2, True, "aborted")]
        # the interrupted text was committed and sent (the log tells the turn's end before the
        # client has read the chunk: wait for it); the session takes the next prompt as usual
        await _until(lambda: "working on it" in run.client.text(sid))
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("after")])
        assert resp.stop_reason == "end_turn" and run.client.text(sid)[-1] == "AFTER"
        assert await run.close_stdin() == 0


@pytest.mark.parametrize("autonomous", ["answers", "fails"])
async def test_a_prompt_during_autonomous_work_waits_behind_it_and_settles_on_its_own(acp_agent, scripted, autonomous):
    step: dict[str, Any] = {"partial": "auto text", "mark": "auto-started", "wait_for": "prompt-sent"}
    step |= {"text": "AUTO DONE"} if autonomous == "answers" else {"error": "auth"}
    script = _wake_script(scripted, step, rules=[{"when": "^second", "steps": [{"text": "SECOND"}]}])
    async with acp_agent(script, example="acp-wake") as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("go")])).stop_reason == "end_turn"
        await _until(lambda: (run.cwd / "auto-started").exists())
        second = asyncio.ensure_future(run.conn.prompt(session_id=sid, prompt=[text_block("second")]))
        # admitted (not "a prompt is already in flight"): its message waits in the inbox behind the turn
        await _until(lambda: sum(e["type"] == "user/message" for e in _log(acp_agent.home, sid)) == 3)
        assert not second.done()
        (run.cwd / "prompt-sent").write_text("1")
        resp = await asyncio.wait_for(second, 20)
        # a failure of the autonomous turn is not the prompt's (ACP-7): it settles on its own turn
        assert resp.stop_reason == "end_turn"
        assert run.client.text(sid)[-1] == "SECOND"
        assert await run.close_stdin() == 0
    ends = "completed" if autonomous == "answers" else "error"
    assert _turns(acp_agent.home, sid) == [(1, False, "completed"), (2, True, ends), (3, False, "completed")]


async def test_eof_during_an_autonomous_turn_ends_it_and_the_process(acp_agent, scripted):
    script = _wake_script(scripted, {"partial": "long", "mark": "auto-started", "delay_ms": 60000})
    async with acp_agent(script, example="acp-wake") as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("go")])).stop_reason == "end_turn"
        await _until(lambda: (run.cwd / "auto-started").exists())
        started = time.monotonic()
        assert await run.close_stdin() == 0
        assert time.monotonic() - started < 5  # not the step's minute
    (first, second) = _turns(acp_agent.home, sid)
    assert first == (1, False, "completed") and second[:2] == (2, True) and second[2] in ("aborted", "disposed")


async def test_wakes_off_a_notice_waits_for_the_next_prompt_over_stdio(acp_agent, scripted):
    script = scripted({"rules": [
        {"when": "^go", "steps": [
            {"tool": "wake_later", "args": {"ms": 0, "text": "background job bash-1 finished"}},
            {"text": "started it"},
        ]},
        {"when": "^next", "steps": [{"text": "NEXT"}]},
    ]})
    async with acp_agent(script, example="acp-wake-off") as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("go")])).stop_reason == "end_turn"
        await _until(lambda: (run.cwd / "woke").exists())  # notify() returned before this file was written
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("next")])).stop_reason == "end_turn"
        assert run.client.text(sid) == ["started it", "NEXT"]  # one answer per prompt
        assert await run.close_stdin() == 0
    assert _turns(acp_agent.home, sid) == [(1, False, "completed"), (2, False, "completed")]
    events = _log(acp_agent.home, sid)
    notices = [e["message"] for e in events if e["type"] == "user/message" and e["message"].get("source") == "notice"]
    assert [n["content"][0]["text"] for n in notices] == ["background job bash-1 finished"]


async def test_a_prompt_settles_when_its_turn_ended_and_autonomous_work_began(acp_agent, scripted):
    """A wake that arrived during the prompt's last model call starts a turn right after the
    prompt's turn: the prompt answers then (that work is the agent's own, and may be long: a goal's
    rounds), not when the agent is next quiescent."""
    script = scripted({"rules": [{"when": "^go", "steps": [
        {"tool": "wake_later", "args": {"ms": 100, "text": "background job bash-1 finished"}},
        {"wait_for": "woke", "text": "started it"},  # its request was built before the notice came
        {"partial": "on my own", "mark": "auto-started", "delay_ms": 60000},
    ]}]})
    async with acp_agent(script, example="acp-wake") as run:
        sid = await run.start()
        resp = await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block("go")]), 20)
        assert resp.stop_reason == "end_turn"
        await _until(lambda: (run.cwd / "auto-started").exists())
        assert _turns(acp_agent.home, sid) == [(1, False, "completed"), (2, True, None)]  # still running
        await run.conn.cancel(session_id=sid)
        await _until(lambda: _turns(acp_agent.home, sid)[-1][2] is not None)
        assert await run.close_stdin() == 0
    assert _turns(acp_agent.home, sid) == [(1, False, "completed"), (2, True, "aborted")]


async def test_a_background_job_that_ends_wakes_the_idle_session_over_stdio(acp_agent, scripted):
    """The real thing in acp-agent: bash with run_in_background, the prompt answered, then the job's
    end starts a turn on its own whose text arrives after end_turn; its notice is the original's."""
    script = scripted({"rules": [{"when": "^go", "steps": [
        {"tool": "bash", "args": {"command": "while [ ! -e release ]; do sleep 0.02; done; echo JOB-OUT",
                                  "description": "Wait for the release file", "run_in_background": True}},
        {"text": "started it", "mark": "prompt-answered"},
        {"text": "JOB NOTED"},  # the autonomous turn's call takes the rule's next step
    ]}]})
    async with acp_agent(script) as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("go")])).stop_reason == "end_turn"
        (run.cwd / "release").write_text("1")  # the job ends only now: the session is idle
        await _until(lambda: "JOB NOTED" in run.client.text(sid))
        await _until(lambda: _turns(acp_agent.home, sid)[-1][2] is not None)
        assert await run.close_stdin() == 0
    assert _turns(acp_agent.home, sid) == [(1, False, "completed"), (2, True, "completed")]
    events = _log(acp_agent.home, sid)
    notices = [e["message"]["content"][0]["text"] for e in events
               if e["type"] == "user/message" and e["message"].get("source") == "notice"]
    assert notices == ["background job bash-1 (bash: while [ ! -e release ]; do sleep 0.02; done; echo JOB-OUT) "
                       "finished [status: completed, exit code: 0]. Read its output with job_output."]
