"""Contracts a front door, a tool or a policy may hold: what an agent is pinned to
(``AgentSpec``), what a tool executor may use (``ToolContext``), what a history policy sees
(``HistoryContext``), id minting (``new_id``), and what confined processes are
(``ConfinedCommand``, ``ConfinedRun``; the ``Confinement`` seam is ``host.confinement``) and
what a session's file tools have read (``ReadRecords``).

Nothing here is the agent loop: these name the agent by its ``protocols.Agent`` surface, so a
plugin that imports this module depends on the contract, never on ``dsh_core.agent``. They are
defined in ``dsh_core.protocols`` beside the seams they refer to (a spec names its parent agent,
an agent has a spec, a tool's context holds its agent), so that the contract has no import
circle; this module is the name doors and tools import them by.
"""

from __future__ import annotations

from .protocols import AgentSpec, ConfinedCommand, ConfinedRun, HistoryContext, ReadRecords, ToolContext, new_id

__all__ = ["AgentSpec", "ConfinedCommand", "ConfinedRun", "HistoryContext", "ReadRecords", "ToolContext", "new_id"]
