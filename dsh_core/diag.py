"""Diagnostics on stderr, bounded.

ACP clients often pipe an agent's stderr and never read it (docs/acp-contract.md#client-facts, 4): past about
64 KiB the agent's next write blocks forever. So warnings share a 16 KiB budget per process,
after which one line says they are suppressed; ``DSH_DEBUG=1`` lifts the budget and also
prints ``debug`` lines (client-caused noise such as a cancel for an unknown session).
"""

from __future__ import annotations

import os
import sys

BUDGET = 16 * 1024
_spent = 0


def _verbose() -> bool:
    return os.environ.get("DSH_DEBUG") == "1"


def warn(message: str) -> None:
    """Print ``dsh: <message>`` to stderr unless the budget is spent."""
    global _spent
    line = f"dsh: {message}\n"
    if not _verbose():
        if _spent >= BUDGET:
            return
        _spent += len(line)
        if _spent >= BUDGET:
            line += "dsh: further diagnostics suppressed (set DSH_DEBUG=1 to see them all)\n"
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def debug(message: str) -> None:
    """Print only with ``DSH_DEBUG=1``."""
    if _verbose():
        warn(message)
