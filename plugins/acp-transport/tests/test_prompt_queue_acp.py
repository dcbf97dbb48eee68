"""Issue 42's row "a prompt during a turn" over a real ``dsh run`` with the official SDK client:
in acp-editor (``prompt-queue = 8``) a ``session/prompt`` sent while a turn runs waits and runs as
its own turn after it; acp-agent still refuses it (ACP-5, tests/test_acp_stdio.py)."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import Any

import pytest
from acp import RequestError, text_block

from dsh_testing import SHIPPED_EXAMPLES, session_log, until

pytestmark = pytest.mark.anyio


WAITS = {"text": "FIRST ANSWER", "wait_for": "release"}  # the first turn answers once `release` is written
SLOW = {"partial": "working", "delay_ms": 60000}  # the first turn runs until it is cancelled


def _script(scripted: Any, first: dict[str, Any]) -> Any:
    return scripted({"rules": [
        {"when": "^first", "steps": [{"mark": "first-started", **first}]},
        {"when": "^second", "steps": [{"text": "SECOND ANSWER"}]},
        {"when": "^third", "steps": [{"text": "THIRD ANSWER"}]},
        {"when": "^hello", "steps": [{"text": "HI"}]},
    ]})


async def _start(run: Any) -> str:
    """A session whose first prompt has answered: its title call (acp-editor's, a model call on the
    first prompt) is not the slow first turn's."""
    sid: str = await run.start()
    assert (await run.conn.prompt(session_id=sid, prompt=[text_block("hello")])).stop_reason == "end_turn"
    return sid


def _turns(log: list[dict[str, Any]]) -> list[tuple[int, bool, str | None]]:
    ends = {e["turn"]: e["reason"] for e in log if e["type"] == "turn/end"}
    return [(e["turn"], bool(e.get("autonomous")), ends.get(e["turn"])) for e in log if e["type"] == "turn/start"]


def _prompts(log: list[dict[str, Any]]) -> list[str]:
    return [e["message"]["content"][0]["text"] for e in log
            if e["type"] == "user/message" and e["message"].get("source", "user") == "user"]


def _answers(frames: list[dict[str, Any]]) -> list[tuple[Any, str]]:
    """The prompt responses in the order they were written: (request id, stop reason)."""
    return [(f["id"], f["result"]["stopReason"]) for f in frames if "stopReason" in (f.get("result") or {})]


def _seen(run: Any) -> list[str]:
    """The prompts the workspace's UserPromptSubmit hook saw, in order."""
    lines = (run.cwd / "prompts-seen.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines if line]


def _next_id(run: Any) -> Any:
    """The id the SDK client gives its next request (to name it in ``$/cancel_request``)."""
    return run.conn._conn._next_request_id


async def _queue(run: Any, sid: str, text: str) -> tuple[Any, asyncio.Future[Any]]:
    rid = _next_id(run)
    task = asyncio.ensure_future(run.conn.prompt(session_id=sid, prompt=[text_block(text)]))
    await asyncio.sleep(0)  # the request is written (its id taken) before the next one
    return rid, task


async def _running(run: Any, sid: str) -> tuple[Any, asyncio.Future[Any]]:
    """The prompt "first" sent (its request id, its answer to come) and its turn started."""
    queued = await _queue(run, sid, "first")
    await until(lambda: (run.cwd / "first-started").exists())
    return queued


@asynccontextmanager
async def _first_running(acp_agent: Any, scripted: Any, first: dict[str, Any], *, greeted: bool = False) -> Any:
    """acp-editor with a session whose prompt "first" runs (its turn started; ``first``: its step):
    yields the run, the session id, the first prompt's request id and its answer to come.
    ``greeted``: the session's first prompt has answered before (see ``_start``)."""
    async with acp_agent(_script(scripted, first), example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        sid = await (_start(run) if greeted else run.start())
        yield (run, sid, *await _running(run, sid))


async def test_a_prompt_during_a_turn_waits_and_runs_as_its_own_turn(acp_agent, scripted):
    script = _script(scripted, WAITS)
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        (run.cwd / ".claude").mkdir()  # a UserPromptSubmit hook: it runs for the waiting prompt as for any
        hook = {"type": "command", "command": "cat >> prompts-seen.jsonl; echo >> prompts-seen.jsonl"}
        (run.cwd / ".claude" / "settings.json").write_text(json.dumps({"hooks": {"UserPromptSubmit": [{"hooks": [hook]}]}}))
        init = await run.conn.initialize(protocol_version=1)
        assert init.agent_capabilities.field_meta == {"dsh": {"promptQueueing": True, "promptQueueLimit": 8}}
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        first_id, first = await _running(run, sid)
        second_id, second = await _queue(run, sid, "second")
        await asyncio.sleep(0.3)
        assert not second.done()  # admitted, not refused: it waits
        assert _seen(run) == ["first"]
        log = session_log(acp_agent.home, sid)
        assert _prompts(log) == ["first"]  # its message enters the agent when its turn comes, not before
        (run.cwd / "release").write_text("1")
        assert (await asyncio.wait_for(first, 20)).stop_reason == "end_turn"
        assert (await asyncio.wait_for(second, 20)).stop_reason == "end_turn"
        assert "".join(run.client.text(sid)) == "FIRST ANSWERSECOND ANSWER"
        assert _seen(run) == ["first", "second"]
        assert await run.close_stdin() == 0
    assert _answers(run.frames) == [(first_id, "end_turn"), (second_id, "end_turn")]
    # each answer's text went out before its own response, the second's after the first's response
    frames = [f for f in run.frames if "stopReason" in (f.get("result") or {}) or f.get("method") == "session/update"]
    first_done = next(i for i, f in enumerate(frames) if f.get("id") == first_id)
    assert any("SECOND ANSWER" in str(f) for f in frames[first_done:])
    assert not any("SECOND ANSWER" in str(f) for f in frames[:first_done])
    log = session_log(acp_agent.home, sid)
    assert _turns(log) == [(1, False, "completed"), (2, False, "completed")]  # a prompt's turn each (hooks run)
    assert _prompts(log) == ["first", "second"]
    # the second prompt's message is recorded when its turn starts: after the first turn's end
    kinds = [(e["type"], e.get("turn")) for e in log]
    second_msg = next(i for i, e in enumerate(log) if e["type"] == "user/message" and _prompts([e]) == ["second"])
    assert kinds.index(("turn/end", 1)) < second_msg


async def test_session_cancel_cancels_the_turn_and_every_prompt_waiting(acp_agent, scripted):
    async with _first_running(acp_agent, scripted, SLOW, greeted=True) as (run, sid, _, first):
        _, second = await _queue(run, sid, "second")
        _, third = await _queue(run, sid, "third")
        await asyncio.sleep(0.3)  # both wait in line (a cancel read before their handlers ran would also do)
        assert not second.done() and not third.done()
        await run.conn.cancel(session_id=sid)
        answers = await asyncio.wait_for(asyncio.gather(first, second, third), 20)
        assert [a.stop_reason for a in answers] == ["cancelled"] * 3
        # the session goes on: the next prompt runs
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("third")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    log = session_log(acp_agent.home, sid)
    assert _turns(log) == [(1, False, "completed"), (2, False, "aborted"), (3, False, "completed")]
    assert _prompts(log) == ["hello", "first", "third"]  # the cancelled ones never reached the agent


async def test_cancel_request_for_a_waiting_prompt_removes_only_that_one(acp_agent, scripted):
    async with _first_running(acp_agent, scripted, WAITS) as (run, sid, first_id, first):
        second_id, second = await _queue(run, sid, "second")
        third_id, third = await _queue(run, sid, "third")
        await run.conn._conn.send_notification("$/cancel_request", {"requestId": second_id})
        assert (await asyncio.wait_for(second, 10)).stop_reason == "cancelled"  # at once, the turn still runs
        assert not first.done() and not third.done()
        (run.cwd / "release").write_text("1")
        assert (await asyncio.wait_for(first, 20)).stop_reason == "end_turn"
        assert (await asyncio.wait_for(third, 20)).stop_reason == "end_turn"
        assert "".join(run.client.text(sid)) == "FIRST ANSWERTHIRD ANSWER"
        assert await run.close_stdin() == 0
    assert _answers(run.frames) == [(second_id, "cancelled"), (first_id, "end_turn"), (third_id, "end_turn")]
    log = session_log(acp_agent.home, sid)
    assert _prompts(log) == ["first", "third"]
    assert _turns(log) == [(1, False, "completed"), (2, False, "completed")]


async def test_cancel_request_for_the_running_prompt_leaves_the_waiting_ones(acp_agent, scripted):
    async with _first_running(acp_agent, scripted, SLOW, greeted=True) as (run, sid, first_id, first):
        _, second = await _queue(run, sid, "second")
        await run.conn._conn.send_notification("$/cancel_request", {"requestId": first_id})
        assert (await asyncio.wait_for(first, 10)).stop_reason == "cancelled"
        assert (await asyncio.wait_for(second, 20)).stop_reason == "end_turn"  # a request-scoped cancel
        assert run.client.text(sid)[-1] == "SECOND ANSWER"
        assert await run.close_stdin() == 0
    assert _turns(session_log(acp_agent.home, sid)) == [(1, False, "completed"), (2, False, "aborted"),
                                                         (3, False, "completed")]


async def test_eof_answers_the_waiting_prompts_cancelled(acp_agent, scripted):
    async with _first_running(acp_agent, scripted, SLOW) as (run, sid, first_id, _):
        second_id, _ = await _queue(run, sid, "second")
        await asyncio.sleep(0.3)  # read by the agent before its stdin closes
        assert await run.close_stdin() == 0
    assert sorted(_answers(run.frames)) == [(first_id, "cancelled"), (second_id, "cancelled")]
    assert _prompts(session_log(acp_agent.home, sid)) == ["first"]


async def test_the_line_is_bounded_and_session_close_empties_it(acp_agent, scripted):
    async with _first_running(acp_agent, scripted, SLOW) as (run, sid, _, first):
        waiting = [(await _queue(run, sid, f"second {i}"))[1] for i in range(8)]
        with pytest.raises(RequestError) as refused:
            await run.conn.prompt(session_id=sid, prompt=[text_block("one too many")])
        assert refused.value.code == -32602
        assert "8 prompts already wait behind the one running in this session" in str(refused.value.data)
        assert not any(t.done() for t in waiting)  # the refusal took nothing from the line
        close_id = _next_id(run)
        await asyncio.wait_for(run.conn.close_session(session_id=sid), 10)
        answers = await asyncio.wait_for(asyncio.gather(first, *waiting), 10)
        assert [a.stop_reason for a in answers] == ["cancelled"] * 9
        assert await run.close_stdin() == 0
    assert _prompts(session_log(acp_agent.home, sid)) == ["first"]
    # every prompt, running or waiting, was answered before the close was
    ids = [f.get("id") for f in run.frames if "result" in f or "error" in f]
    answered = [f["id"] for f in run.frames if "stopReason" in (f.get("result") or {})]
    assert len(answered) == 9 and all(ids.index(a) < ids.index(close_id) for a in answered)


async def test_a_waiting_prompt_it_would_refuse_is_refused_at_once(acp_agent, scripted):
    async with _first_running(acp_agent, scripted, WAITS) as (run, sid, _, first):
        with pytest.raises(RequestError) as refused:  # an empty prompt: not after the turn, now
            await asyncio.wait_for(run.conn.prompt(session_id=sid, prompt=[text_block("  ")]), 5)
        assert refused.value.code == -32602 and "empty prompt" in str(refused.value.data)
        (run.cwd / "release").write_text("1")
        assert (await asyncio.wait_for(first, 20)).stop_reason == "end_turn"
        assert await run.close_stdin() == 0


async def test_a_waiting_prompt_whose_turn_comes_during_autonomous_work_waits_behind_it(acp_agent, scripted):
    """The first prompt's turn ends and autonomous work begins (a wake that came during its last
    model call): the first prompt answers then (ACP-5), and the waiting prompt enters the inbox
    behind the autonomous turn, as any prompt arriving during autonomous work does."""
    script = scripted({"rules": [
        {"when": "^go", "steps": [
            {"tool": "wake_later", "args": {"ms": 50, "text": "background job bash-1 finished"}},
            {"wait_for": "queued", "text": "started it"},  # the notice arrives during this call
            {"partial": "auto text", "mark": "auto-started", "wait_for": "auto-release", "text": " AUTO DONE"},
        ]},
        {"when": "^second", "steps": [{"text": "SECOND ANSWER"}]},
    ]})
    async with acp_agent(script, example="acp-wake-queue") as run:
        sid = await run.start()
        _, first = await _queue(run, sid, "go")
        await until(lambda: (run.cwd / "woke").exists())
        _, second = await _queue(run, sid, "second")
        await asyncio.sleep(0.3)
        (run.cwd / "queued").write_text("1")
        assert (await asyncio.wait_for(first, 20)).stop_reason == "end_turn"  # autonomous work began
        await until(lambda: (run.cwd / "auto-started").exists())
        await until(lambda: _prompts(session_log(acp_agent.home, sid)) == ["go", "second"])  # in the inbox now
        assert not second.done() and _turns(session_log(acp_agent.home, sid))[-1] == (2, True, None)
        (run.cwd / "auto-release").write_text("1")
        assert (await asyncio.wait_for(second, 20)).stop_reason == "end_turn"
        assert run.client.text(sid)[-1] == "SECOND ANSWER"
        assert await run.close_stdin() == 0
    assert _turns(session_log(acp_agent.home, sid)) == [(1, False, "completed"), (2, True, "completed"),
                                                         (3, False, "completed")]
