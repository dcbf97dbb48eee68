"""``testkit-broken-presenter``: a ``dsh_present_event`` that always raises (a presentation plugin's
bug must cost its updates, never the door's answer)."""

from __future__ import annotations

from typing import Any

from dsh_core import hookimpl


@hookimpl
def dsh_present_event(session: Any, event: Any) -> list[Any] | None:
    raise RuntimeError("a presentation bug")
