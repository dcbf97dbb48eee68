"""The original's selectors, checks and fold, and the per-session bound through a real host."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import anyio
import pytest
from dsh_schedule import ScheduleConfig, domain

from dsh_core import ConfigError
from dsh_core.config import decode
from dsh_core.contracts import AgentSpec
from dsh_testing import memory_host

NOW = int(datetime(2026, 3, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)


def _rec(args, now=NOW, min_every=300):
    return domain.create_record("schedule-1", args.get("prompt", "p"), args, now, min_every)


@pytest.mark.parametrize(("at", "want"), [
    ("2026-03-01T13:00:00Z", "2026-03-01T13:00:00.000Z"),
    ("2026-03-01T14:30:00.5+02:00", "2026-03-01T12:30:00.500Z"),
    ({"date": "2026-03-30", "time": "09:00:00", "time_zone": "Europe/Paris"}, "2026-03-30T07:00:00.000Z"),
    # the autumn overlap (02:30 happens twice in Paris): the earlier instant
    ({"date": "2026-10-25", "time": "02:30:00", "time_zone": "Europe/Paris"}, "2026-10-25T00:30:00.000Z"),
    ({"date": "2026-03-01", "time": "13:00:00.25", "time_zone": "UTC"}, "2026-03-01T13:00:00.250Z"),
])
def test_at_is_an_explicit_instant(at, want):
    assert _rec({"at": at}) == {"id": "schedule-1", "kind": "at", "prompt": "p", "scheduledAt": want}


@pytest.mark.parametrize(("args", "code"), [
    ({"at": "2026-03-01T13:00:00"}, "invalid_rule"),  # no offset
    ({"at": "2026-02-30T13:00:00Z"}, "invalid_rule"),  # no such day
    ({"at": "2026-03-01T11:00:00Z"}, "not_future"),
    ({"at": {"date": "2026-03-29", "time": "02:30:00", "time_zone": "Europe/Paris"}}, "invalid_rule"),  # DST gap
    ({"at": {"date": "2026-04-01", "time": "09:00:00", "time_zone": "Mars/Olympus"}}, "invalid_time_zone"),
    ({"at": {"date": "2026-04-01", "time": "09:00:00"}}, "invalid_rule"),
    ({"after_seconds": 0}, "invalid_rule"),
    ({"after_seconds": 1.5}, "invalid_rule"),
    ({"every_seconds": 299}, "frequency_too_high"),
    ({"prompt": "   ", "after_seconds": 5}, "invalid_prompt"),
])
def test_bad_selectors_answer_the_originals_codes(args, code):
    with pytest.raises(domain.ScheduleInputError) as err:
        _rec(args)
    assert err.value.code == code


def test_exactly_one_selector_and_a_prompt():
    assert domain.selector_problem({"prompt": "p"})[0] == "invalid_selector"
    assert domain.selector_problem({"prompt": "p", "after_seconds": 1, "every_seconds": 300})[0] == "invalid_selector"
    assert domain.selector_problem({"prompt": "p", "after_seconds": 1, "extra": 1})[0] == "invalid_selector"
    assert domain.selector_problem({"prompt": " ", "after_seconds": 1})[0] == "invalid_prompt"
    assert domain.selector_problem({"prompt": "p", "at": "x"}) is None


def test_fixed_rate_stays_creation_aligned_and_skips_missed_occurrences():
    rec = _rec({"every_seconds": 600})
    assert rec["scheduledAt"] == domain.utc(NOW + 600_000)
    late = NOW + 600_000 * 4 + 1000  # three occurrences missed
    assert domain.next_every(rec, late) == (NOW + 600_000 * 4, NOW + 600_000 * 5)
    s = domain.Schedules()
    s.apply({"version": 1, "operation": "create", "schedule": rec})
    assert s.due(late) == [rec]
    text = domain.framing(s.due(late), late)
    assert text.startswith("[SCHEDULE REMINDER BATCH]\n")
    assert json.loads(text.split("reminders_json: ", 1)[1]) == [
        {"schedule_id": "schedule-1", "occurrence_at": domain.utc(NOW + 600_000 * 4), "reminder_prompt": "p"}]
    s.apply({"version": 1, "operation": "dispatch", "id": "schedule-1", "acceptedAt": domain.utc(late)})
    assert domain.parse_utc(s.active["schedule-1"]["scheduledAt"]) == NOW + 600_000 * 5


def test_the_fold_refuses_what_cannot_have_happened():
    s = domain.Schedules()
    s.apply({"version": 1, "operation": "create", "schedule": _rec({"after_seconds": 5})})
    assert s.allocate() == "schedule-2"
    for bad in ({"version": 2, "operation": "create"}, {"version": 1, "operation": "delete", "id": "nope"},
                {"version": 1, "operation": "create", "schedule": _rec({"after_seconds": 5})}):  # a reused id
        with pytest.raises(domain.ScheduleLogError):
            s.apply(bad)
    s.apply({"version": 1, "operation": "dispatch", "id": "schedule-1"})
    assert not s.active and s.allocate() == "schedule-2"  # ids are never reused


@pytest.mark.anyio
async def test_a_session_holds_at_most_max_active_and_a_subagent_gets_no_tools(scripted, tmp_path):
    script = scripted({"default": [{"text": "ok"}]})
    async with memory_host(script, plugins=("scripted-model", "schedule"), config={"schedule": {"max-active": 1}}) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        await agent.wait_idle()
        for _ in range(50):  # the session's tool source publishes its tools as a task of the session
            if "schedule_create" in agent.tools:
                break
            await anyio.sleep(0.01)
        args = {"prompt": "p", "after_seconds": 600}
        first = await agent.call_tool("schedule_create", args, call_id="c1", turn=1, step=1)
        second = await agent.call_tool("schedule_create", args, call_id="c2", turn=1, step=1)
        assert not first.is_error and json.loads(first.content[0].text)["id"] == "schedule-1"
        assert second.is_error and second.code == "TOO_MANY_SCHEDULES"
        assert json.loads(second.content[0].text)["code"] == "too_many_schedules"
        child = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script), parent=agent))
        assert "schedule_create" not in child.tools
        await child.dispose()


def test_config_is_checked():
    with pytest.raises(ConfigError, match=r"max-active"):
        decode("schedule", ScheduleConfig, {"max-active": 0}, where="example.toml")


@pytest.mark.anyio
async def test_a_fixed_rate_reminder_fires_again_and_again_as_a_batch(scripted, tmp_path):
    from dsh_core.types import Note, UserMessageEvent

    script = scripted({"default": [{"text": "ok"}], "repeat_default": True})
    config = {"schedule": {"min-every-seconds": 1}}
    async with memory_host(script, plugins=("scripted-model", "schedule"), config=config) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        with anyio.fail_after(10):
            while "schedule_create" not in agent.tools:
                await anyio.sleep(0.01)
        out = await agent.call_tool("schedule_create", {"prompt": "tick", "every_seconds": 1}, call_id="c1",
                                    turn=1, step=1)
        assert not out.is_error, out.content
        events = host.session_store.logs[agent.session_id].events

        def told() -> list[str]:
            return [e.message.content[0].text for e in events
                    if isinstance(e, UserMessageEvent) and e.message.source == "schedule"]

        with anyio.fail_after(15):
            while len(told()) < 2:
                await anyio.sleep(0.05)
        await agent.dispose()
    first, second = told()[:2]
    assert first.startswith("[SCHEDULE REMINDER BATCH]\n") and '"reminder_prompt":"tick"' in first
    occurrences = [json.loads(t.split("reminders_json: ", 1)[1])[0]["occurrence_at"] for t in (first, second)]
    assert domain.parse_utc(occurrences[1]) - domain.parse_utc(occurrences[0]) >= 1000  # creation-aligned, one interval on
    dispatches = [e.data for e in events if isinstance(e, Note) and e.data.get("operation") == "dispatch"]
    assert len(dispatches) >= 2 and all("acceptedAt" in d for d in dispatches)
