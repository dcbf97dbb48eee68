"""pytest support for tests that drive ACP agents with the client (opt-in, like ``dsh_testing``).

``peer_agent.py`` (in ``plugins/acp/tests``) is a third-party ACP agent written with the official
SDK's agent side; its modes (``echo``, ``crash``, ``permission``, …) are listed in the script.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from dsh_testing import REPO

from .proctree import _stat

PEER_AGENT = REPO / "plugins" / "acp" / "tests" / "peer_agent.py"


def peer_argv(mode: str) -> list[str]:
    """The peer agent's command line in ``mode``."""
    return [sys.executable, str(PEER_AGENT), mode]


def peer_command(mode: str) -> str:
    return f"{sys.executable} {PEER_AGENT} {mode}"


def live(pids: Iterable[int]) -> list[int]:
    """The pids that still exist as non-zombie processes."""
    out = []
    for pid in pids:
        s = _stat(pid)
        if s is not None and s[0] != "Z":
            out.append(pid)
    return out
