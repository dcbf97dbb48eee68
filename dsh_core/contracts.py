"""Contracts a front door, a tool or a policy may hold: what an agent is pinned to
(``AgentSpec``), what a tool executor may use (``ToolContext``), what a history policy sees
(``HistoryContext``), and id minting.

Nothing here is the agent loop: these name the agent by its ``protocols.Agent`` surface, so a
plugin that imports this module depends on the contract, never on ``dsh_core.agent``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .types import (
    ApprovalOutcome,
    ApprovalRequest,
    ContentBlock,
    Event,
    HistoryView,
    ModelInfo,
)

if TYPE_CHECKING:  # pragma: no cover
    from .host import Host
    from .protocols import Agent


def new_id(prefix: str = "") -> str:
    """An unguessable id (128 bits from the OS CSPRNG)."""
    return prefix + secrets.token_hex(16)


@dataclass(kw_only=True)
class AgentSpec:
    """What a new agent is pinned to."""

    cwd: str
    provider: str
    model: str
    session_id: str = field(default_factory=new_id)
    parent: "Agent | None" = None
    origin: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        return 0 if self.parent is None else self.parent.spec.depth + 1


@dataclass(kw_only=True)
class ToolContext:
    """What a tool executor may use. ``agent`` is the exact calling agent."""

    agent: "Agent"
    call_id: str
    tool_name: str
    turn: int
    step: int

    @property
    def cwd(self) -> str:
        return self.agent.cwd

    @property
    def session_id(self) -> str:
        return self.agent.session_id

    @property
    def host(self) -> "Host":
        return self.agent.host

    @property
    def route(self) -> ModelInfo:
        return self.agent.route

    def emit(self, event: Event) -> None:
        self.agent.emit(event)

    async def approve(
        self,
        reason: str,
        *,
        kind: str | None = None,
        subject: str | None = None,
        args: dict[str, Any] | None = None,
        tier: str | None = None,
        justification: str | None = None,
    ) -> ApprovalOutcome:
        """Ask the approval seam (one-shot). Returns the outcome; nothing is remembered.

        The keywords describe the call to whoever answers (see ``ApprovalRequest``)."""
        req = ApprovalRequest(
            agent=self.agent, tool_name=self.tool_name, call_id=self.call_id, reason=reason,
            kind=kind, subject=subject, args=args, tier=tier, justification=justification,
        )
        return await self.host.approvals.request(req)

    def splice(self, content: list[ContentBlock]) -> None:
        """Show the model ``content`` (e.g. an image a nested call produced) as a user message
        (source ``tool``) spliced in after this step's tool results, before the next model call."""
        self.agent.splice(content)


@dataclass(kw_only=True)
class HistoryContext:
    """What a ``HistoryPolicy`` sees before a model call (see ``protocols.HistoryPolicy``).

    ``metered_tokens`` is the prompt-token count the provider reported for the previous call of
    this history (None when none was reported, or the history was rewritten since) and
    ``metered_messages`` how many of ``history``'s messages that call carried; what follows them
    was appended since and is not yet counted by the provider."""

    agent: "Agent"
    turn: int
    step: int
    route: ModelInfo
    system: str
    tools: list[Any]
    history: HistoryView
    metered_tokens: int | None = None
    metered_messages: int = 0
