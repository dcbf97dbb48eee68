"""``host.direct.<hook>`` (dsh_core.host.DirectHook) calls a hook's implementations without
pluggy's call machinery and answers exactly as pluggy does: order (tryfirst/trylast, last
registered first), the arguments each implementation names, None dropped, ``firstresult``;
a plugin registered later is seen; a wrapper or tracing hands the call back to pluggy."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_core import hookimpl
from dsh_core.host import DirectHooks, make_plugin_manager


def _plugins(calls: list[str]) -> list[object]:
    class Full:
        @hookimpl
        def dsh_check_step(self, session: Any, turn: int, step: int) -> Any:
            calls.append(f"full {session} {turn} {step}")
            return None

        @hookimpl
        def dsh_before_stop(self, session: Any, turn: int, step: int, continued: int) -> Any:
            calls.append(f"full {session} {turn} {step} {continued}")
            return "full"

    class Some:
        @hookimpl(trylast=True)
        def dsh_check_step(self, step: int) -> Any:
            calls.append(f"some {step}")
            return "stop"

        @hookimpl
        def dsh_before_stop(self, continued: int, session: Any) -> Any:
            calls.append(f"some {continued} {session}")
            return None

    class Nothing:
        @hookimpl(tryfirst=True)
        def dsh_check_step(self) -> Any:
            calls.append("nothing")
            return None

        @hookimpl(tryfirst=True)
        def dsh_before_stop(self) -> Any:
            calls.append("nothing")
            return "nothing"

    class Late:
        @hookimpl
        def dsh_check_step(self, turn: int) -> Any:
            calls.append(f"late {turn}")
            return "late"

    return [Full(), Some(), Nothing(), Late()]


@pytest.mark.parametrize("hook", ["dsh_check_step", "dsh_before_stop"])
def test_answers_and_call_order_are_pluggys(hook: str):
    calls: list[str] = []
    full, some, nothing, late = _plugins(calls)
    pm = make_plugin_manager(trace=False)
    direct = DirectHooks(pm)
    kwargs: dict[str, Any] = {"session": "S", "turn": 3, "step": 2}
    if hook == "dsh_before_stop":
        kwargs["continued"] = 1
    assert getattr(direct, hook)(**kwargs) == getattr(pm.hook, hook)(**kwargs)  # no implementation
    assert calls == []
    for i, plugin in enumerate([full, some, nothing]):
        pm.register(plugin, name=f"p{i}")
    for late_too in (False, True):
        if late_too:
            pm.register(late, name="late")  # registered after the first direct call: seen
        expected = getattr(pm.hook, hook)(**kwargs)
        through_pluggy = list(calls)
        calls.clear()
        assert getattr(direct, hook)(**kwargs) == expected
        assert calls == through_pluggy and calls
        calls.clear()
    pm.unregister(name="p0")
    expected = getattr(pm.hook, hook)(**kwargs)
    through_pluggy, calls[:] = list(calls), []
    assert getattr(direct, hook)(**kwargs) == expected and calls == through_pluggy


def test_first_result_stops_and_list_hooks_keep_every_answer():
    calls: list[str] = []
    pm = make_plugin_manager(trace=False)
    for i, plugin in enumerate(_plugins(calls)):
        pm.register(plugin, name=f"p{i}")
    direct = DirectHooks(pm)
    assert direct.dsh_check_step(session="S", turn=1, step=1) == "late"  # firstresult: the first answer
    assert calls == ["nothing", "late 1"]  # and nothing after it runs
    calls.clear()
    assert direct.dsh_before_stop(session="S", turn=1, step=1, continued=0) == ["nothing", "full"]


def test_a_wrapper_or_tracing_hands_the_call_to_pluggy():
    seen: list[str] = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def dsh_check_step(self, step: int) -> Any:
            seen.append("before")
            result = yield
            seen.append("after")
            return "wrapped" if result is None else result

    class Plain:
        @hookimpl
        def dsh_check_step(self, step: int) -> Any:
            seen.append("plain")
            return None

    pm = make_plugin_manager(trace=False)
    pm.register(Plain(), name="plain")
    direct = DirectHooks(pm)
    assert direct.dsh_check_step(session="S", turn=1, step=1) is None
    pm.register(Wrapper(), name="wrapper")
    seen.clear()
    assert direct.dsh_check_step(session="S", turn=1, step=1) == "wrapped"
    assert seen == ["before", "plain", "after"]

    traced: list[str] = []
    pm2 = make_plugin_manager(trace=False)
    pm2.register(Plain(), name="plain")
    direct2 = DirectHooks(pm2)
    direct2.dsh_check_step(session="S", turn=1, step=1)
    pm2.add_hookcall_monitoring(lambda name, impls, kwargs: traced.append(name), lambda *a: None)
    direct2.dsh_check_step(session="S", turn=1, step=1)
    assert traced == ["dsh_check_step"]


def test_an_implementations_error_propagates():
    class Broken:
        @hookimpl
        def dsh_check_step(self) -> Any:
            raise RuntimeError("boom")

    pm = make_plugin_manager(trace=False)
    pm.register(Broken(), name="broken")
    with pytest.raises(RuntimeError, match="boom"):
        DirectHooks(pm).dsh_check_step(session="S", turn=1, step=1)
