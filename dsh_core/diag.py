"""Diagnostics on stderr, bounded, through the standard library's ``logging``.

Plugins log as every Python library does: ``log = logging.getLogger("dsh.<plugin>")``, then
``log.warning(...)`` / ``log.debug(...)``. Everything under the ``dsh`` logger reaches stderr
through one ``BudgetHandler`` as ``dsh: <plugin>: <message>``.

ACP clients often pipe an agent's stderr and never read it (docs/acp-contract.md#client-facts, 4):
past about 64 KiB the agent's next write blocks forever. So warnings share a 16 KiB budget per
process, after which one line says they are suppressed; ``DSH_DEBUG=1`` lifts the budget and
also prints debug records (client-caused noise such as a cancel for an unknown session).
stdout is never written: it is the protocol.

``warn(message)`` and ``debug(message)`` remain for the spine's own messages (logger ``dsh``).
"""

from __future__ import annotations

import logging
import os
import sys

BUDGET = 16 * 1024
ROOT = "dsh"
SUPPRESSED = "dsh: further diagnostics suppressed (set DSH_DEBUG=1 to see them all)\n"


def _verbose() -> bool:
    return os.environ.get("DSH_DEBUG") == "1"


class BudgetHandler(logging.Handler):
    """``dsh: [<plugin>: ]<message>`` on the *current* ``sys.stderr`` (looked up per record, so a
    redirected or captured stderr gets it), within a byte budget unless ``DSH_DEBUG=1``.

    ``logging.StreamHandler`` binds one stream at construction and has no budget; the budget is
    the point (a client that never reads stderr must not block the agent), hence this handler.
    """

    def __init__(self, budget: int = BUDGET) -> None:
        super().__init__(logging.DEBUG)
        self.budget = budget
        self.spent = 0

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            message += f": {record.exc_info[1]!r}"
        name = record.name
        suffix = name[len(ROOT) + 1:] if name.startswith(ROOT + ".") else ""
        return f"dsh: {suffix}: {message}" if suffix else f"dsh: {message}"

    def emit(self, record: logging.LogRecord) -> None:
        verbose = _verbose()
        if record.levelno < logging.WARNING and not verbose:
            return
        line = self.format(record) + "\n"
        if not verbose:
            if self.spent >= self.budget:
                return
            self.spent += len(line)
            if self.spent >= self.budget:
                line += SUPPRESSED
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def _install() -> BudgetHandler:
    """The one handler on the ``dsh`` logger (installed once per process, on first import)."""
    logger = logging.getLogger(ROOT)
    for h in logger.handlers:
        if isinstance(h, BudgetHandler):
            return h
    handler = BudgetHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)  # the handler decides what is shown (DSH_DEBUG is read per record)
    logger.propagate = False  # an embedding application's root handlers do not print it twice
    return handler


handler = _install()
_log = logging.getLogger(ROOT)


def warn(message: str) -> None:
    """``dsh: <message>`` on stderr unless the budget is spent (the spine's own warnings)."""
    _log.warning(message)


def debug(message: str) -> None:
    """Shown only with ``DSH_DEBUG=1``."""
    _log.debug(message)
