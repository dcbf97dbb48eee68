"""``dsh_session_event`` reaches its implementations directly (no pluggy call per event), in
pluggy's own order, with the arguments each implementation names; a wrapper or tracing keeps
the hook call."""

from __future__ import annotations

from typing import Any

from dsh_core import hookimpl
from dsh_core.host import _direct_observers, _monitored, make_plugin_manager


def _plugins(calls: list[tuple[str, Any]]) -> list[object]:
    class Both:
        @hookimpl
        def dsh_session_event(self, session: Any, event: Any) -> None:
            calls.append(("both", (session, event)))

    class EventOnly:
        @hookimpl
        def dsh_session_event(self, event: Any) -> None:
            calls.append(("event-only", event))

    class Reversed:
        @hookimpl
        def dsh_session_event(self, event: Any, session: Any) -> None:
            calls.append(("reversed", (session, event)))

    class First:
        @hookimpl(tryfirst=True)
        def dsh_session_event(self, session: Any, event: Any) -> None:
            calls.append(("first", (session, event)))

    return [First(), Both(), EventOnly(), Reversed()]


def test_direct_observers_are_called_as_pluggy_calls_them():
    calls: list[tuple[str, Any]] = []
    pm = make_plugin_manager(trace=False)
    for i, plugin in enumerate(_plugins(calls)):
        pm.register(plugin, name=f"p{i}")
    pm.hook.dsh_session_event(session="S", event="E")
    through_pluggy = list(calls)
    calls.clear()
    observers = _direct_observers(pm.hook.dsh_session_event)
    assert len(observers) == 4
    for observer in observers:
        observer("S", "E")
    assert calls == through_pluggy
    assert [name for name, _ in calls] == ["first", "reversed", "event-only", "both"]
    assert dict(calls)["reversed"] == ("S", "E") and dict(calls)["event-only"] == "E"


def test_no_implementation_means_no_call_and_a_wrapper_or_tracing_keeps_the_hook():
    pm = make_plugin_manager(trace=False)
    assert _direct_observers(pm.hook.dsh_session_event) == ()

    seen: list[str] = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def dsh_session_event(self, session: Any, event: Any) -> Any:
            seen.append("before")
            result = yield
            seen.append("after")
            return result

    class Plain:
        @hookimpl
        def dsh_session_event(self, session: Any, event: Any) -> None:
            seen.append("plain")

    pm.register(Plain(), name="plain")
    assert len(_direct_observers(pm.hook.dsh_session_event)) == 1
    (traced,) = _direct_observers(pm.hook.dsh_session_event, traced=True)
    traced("S", "E")
    assert seen == ["plain"]
    pm.register(Wrapper(), name="wrapper")
    seen.clear()
    (wrapped,) = _direct_observers(pm.hook.dsh_session_event)
    wrapped("S", "E")
    assert seen == ["before", "plain", "after"]


def test_a_traced_manager_is_seen_as_monitored_and_a_plain_one_is_not():
    # The host resolves its direct event observers with this (DSH_TRACE_PLUGINS=1: pluggy calls them).
    assert _monitored(make_plugin_manager(trace=True))
    assert not _monitored(make_plugin_manager(trace=False))
    pm = make_plugin_manager(trace=False)
    pm.add_hookcall_monitoring(lambda *a: None, lambda *a: None)
    assert _monitored(pm)


def test_an_observer_that_declares_its_event_types_sees_only_those():
    from dsh_core.state import ByEventType, reads

    class Base:
        pass

    class Sub(Base):
        pass

    class Other:
        pass

    seen: list[tuple[str, str]] = []

    @reads(Base)
    def declared(agent: Any, event: Any) -> None:
        seen.append(("declared", type(event).__name__))

    def undeclared(agent: Any, event: Any) -> None:
        seen.append(("undeclared", type(event).__name__))

    by_type = ByEventType((declared,))
    remove = by_type.add(undeclared)
    for event in (Base(), Sub(), Other()):
        for observer in by_type[type(event)]:
            observer("S", event)
    assert seen == [("declared", "Base"), ("undeclared", "Base"), ("declared", "Sub"), ("undeclared", "Sub"),
                    ("undeclared", "Other")]
    remove()
    assert by_type[Other] == () and by_type[Sub] == (declared,)  # the lists follow the observers
    remove()  # harmless again


def test_a_declared_hook_implementation_keeps_its_event_types_whatever_arguments_it_names():
    from dsh_core.state import ByEventType, reads

    calls: list[Any] = []

    class Reads:
        @hookimpl
        @reads(int)
        def dsh_session_event(self, event: Any) -> None:  # event only: called through a wrapper
            calls.append(event)

    pm = make_plugin_manager(trace=False)
    pm.register(Reads(), name="reads")
    by_type = ByEventType(_direct_observers(pm.hook.dsh_session_event))
    for event in (1, "not an int", 2):
        for observer in by_type[type(event)]:
            observer("S", event)
    assert calls == [1, 2]


def test_by_type_takes_a_subclass_as_its_nearest_base_and_any_other_type_as_the_default():
    from dsh_core.state import ByType

    class Base:
        pass

    class Mid(Base):
        pass

    class Leaf(Mid):
        pass

    table = ByType({Base: "base", Mid: "mid"}, "default")
    assert [table[Base], table[Leaf], table[int]] == ["base", "mid", "default"]
    assert table[Leaf] == "mid" and Leaf in table  # found once, then kept
