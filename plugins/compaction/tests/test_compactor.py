"""The compactor inside a real agent loop (in process, scripted model): the history is replaced
whole (views handed out earlier stay what they were), and a cancelled summary call leaves the
history untouched."""

from __future__ import annotations

import json

import anyio
import pytest

from dsh_core import AgentSpec
from dsh_core.types import CompactionFailed, CompactionStart, CompactionSummary, TextBlock, TurnEnd, UserMessage
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio
PLUGINS = ("scripted-model", "compaction")


def _script(tmp_path, summary_step: dict) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({
        "capabilities": {"context_window": 2000},
        "rules": [{"when": "^<transcript>", "steps": [summary_step]},
                  {"when": "^overflow", "steps": [{"text": "a" * 400}, {"text": "b" * 400}]}],
        "default": [{"text": "ok"}],
    }))
    return str(path)


def events_prompt(events) -> UserMessage:
    """The first prompt of a log: a user message that is no compaction summary."""
    return next(e.message for e in events if isinstance(getattr(e, "message", None), UserMessage)
                and e.message.source != "compaction")


def _say(agent, text: str) -> None:
    agent.submit(UserMessage(id=f"m{len(text)}{text[:3]}", content=[TextBlock(text=text)]))


async def test_compaction_replaces_the_history_whole_and_old_views_stay_valid(tmp_path):
    script = _script(tmp_path, {"text": "short summary"})
    async with memory_host(script, plugins=PLUGINS, config={"compaction": {"retain-ratio": 0.3}}) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=script))
        seen: dict = {}

        def observe(_agent, event):
            if isinstance(event, CompactionStart):
                seen["view"], seen["items"] = agent.history, list(agent.history)

        agent.subscribe(observe)
        for text in ("first " + "x" * 3000, "second " + "y" * 2600, "third " + "z" * 1000):
            _say(agent, text)
            await agent.wait_idle()
        events = host.session_store.logs[agent.session_id].events
        (summary,) = [e for e in events if isinstance(e, CompactionSummary)]
        assert seen["view"] == seen["items"]  # the view handed out before the rewrite did not change
        assert summary.step == 1 and summary.retained == 2  # before the third prompt's call: "ok", the prompt
        assert agent.history[0] == summary.message and len(agent.history) == 1 + summary.retained + 1  # + answer
        # the log alone rebuilds the compacted history
        rebuilt = [summary.message, *seen["items"][summary.covered_to:]]
        assert list(agent.history)[: len(rebuilt)] == rebuilt
        # the declared seam a reader of the log asks (replay-model): the summary call's own answer
        assert host.pm.hook.dsh_compaction_summary(message=summary.message) == "short summary"
        assert host.pm.hook.dsh_compaction_summary(message=events_prompt(events)) is None


async def test_a_cancelled_summary_call_leaves_the_history_untouched(tmp_path):
    script = _script(tmp_path, {"partial": "half a summ", "delay_ms": 60_000})
    async with memory_host(script, plugins=PLUGINS) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=script))
        started = anyio.Event()
        before: dict = {}

        def observe(_agent, event):
            if isinstance(event, CompactionStart):
                before["items"] = list(agent.history)
                started.set()

        agent.subscribe(observe)
        _say(agent, "first " + "x" * 3400)
        await agent.wait_idle()
        _say(agent, "second " + "y" * 3400)
        with anyio.fail_after(10):
            await started.wait()
        agent.cancel()
        await agent.wait_idle()
        events = host.session_store.logs[agent.session_id].events
        assert not any(isinstance(e, CompactionSummary) for e in events)
        (failed,) = [e for e in events if isinstance(e, CompactionFailed)]
        assert failed.code == "ABORTED"
        assert isinstance(events[-1], TurnEnd) and events[-1].reason == "aborted"
        assert list(agent.history) == before["items"]


async def test_auto_compact_off_leaves_pressure_and_overflow_alone_but_a_request_still_compacts(tmp_path):
    """``SessionSettings.auto_compact`` False: ``prepare`` past the threshold and ``recover`` after
    a context-length error compact nothing; ``compact`` (a person asked) still does; on again,
    ``prepare`` compacts."""
    from dsh_compaction import Compactor, Settings

    from dsh_core import ModelError
    from dsh_core.protocols import HistoryContext

    script = _script(tmp_path, {"text": "short summary"})
    async with memory_host(script, plugins=PLUGINS, config={"compaction": {"retain-ratio": 0.3}}) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=script))
        agent.configure(auto_compact=False)
        for text in ("first " + "x" * 3000, "second " + "y" * 2600, "third " + "z" * 1000):  # compacted when on
            _say(agent, text)
            await agent.wait_idle()
        assert not any(isinstance(e, CompactionStart) for e in host.session_store.logs[agent.session_id].events)

        def ctx():
            return HistoryContext(agent=agent, turn=9, step=1, route=agent.route, system="", tools=[],
                                  history=agent.history)

        policy = Compactor(Settings(retain_ratio=0.3))
        assert await policy.prepare(ctx()) is None
        assert await policy.recover(ctx(), ModelError("too long", code="CONTEXT_WINDOW_EXCEEDED")) is None
        assert await policy.compact(ctx()) is not None  # asked for: compacted
        agent.configure(auto_compact=True)
        assert await policy.prepare(ctx()) is not None  # on again: past the threshold, compacted
        await agent.dispose()
