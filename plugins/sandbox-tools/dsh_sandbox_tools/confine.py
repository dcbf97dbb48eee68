"""Confine any argv the way ``bash`` is confined, for other plugins (code mode's Python runner).

``await confine(argv, host=…, cwd=…)`` applies the host's permission mode: the probed
mechanism (bubblewrap, else Landlock) wraps ``argv`` with the same writable roots as a
``bash`` call of that session, and the environment is the same scrubbed one. With no usable
mechanism a confined mode refuses (``ToolError`` ``SANDBOX_UNAVAILABLE``), never runs
unconfined; ``danger-full-access`` returns ``argv`` as is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from dsh_core import ToolError

from .mechanisms import get_runner
from .policy import scrubbed_env, writable_roots
from .sandbox import sandbox_for


@dataclass(frozen=True)
class Confined:
    argv: list[str]
    env: dict[str, str]
    mode: str
    mechanism: str | None  # "bwrap" | "landlock"; None when unconfined (danger-full-access)
    denial: str = ""  # how a denied write reads under this mechanism


async def confine(argv: list[str], *, host: Any, cwd: str, mode: str | None = None) -> Confined:
    settings = sandbox_for(host).settings
    mode = mode or settings.mode
    real = os.path.realpath(cwd)
    env = scrubbed_env(mode=mode)
    if mode == "danger-full-access":
        return Confined(argv=list(argv), env=env, mode=mode, mechanism=None)
    probe = await get_runner(settings.mechanism)
    runner = probe.runner
    if runner is None:
        raise ToolError(
            f'sandbox mode "{mode}" is requested but no sandbox backend is usable on this host; refusing to run '
            f"unconfined. Tried: {probe.summary()}. Fix: install bubblewrap (apt-get install bubblewrap) or use a "
            "kernel with Landlock.",
            code="SANDBOX_UNAVAILABLE",
        )
    return Confined(argv=runner.wrap(list(argv), writable_roots(mode, real), real), env=env, mode=mode,
                    mechanism=runner.name, denial=runner.denial)
