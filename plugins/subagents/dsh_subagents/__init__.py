"""subagents: in-process children for a dsh agent — the ``spawn`` and ``fork`` providers on the
spine's subagent seam (``dsh_register_subagent_providers``) and the delegation tools
``subagent``, ``subagent_fork``, ``send_message``, ``interrupt_agent``, ``list_agents`` and,
inside a continuable child, ``report``.

A child is an ``Agent`` of the same host with its own durable session linked to its parent
(parent session, call and depth in its log's header). It never gets more than its parent:
its cwd is the parent's or inside it, it takes the parent's permission mode, the same
host's sandbox, hooks and guards apply, and its permission requests go to the parent's
client, titled with its description. Background children outlive the turn that started
them but not their parent's session. See README.md."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from msgspec import Meta

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.protocols import Agent, AgentSpec, Host
from dsh_core.types import ApprovalOutcome, ApprovalRequest

from .providers import InProcessProvider
from .runs import Registry
from .tools import (
    INTERRUPT_AGENT,
    LIST_AGENTS,
    REPORT,
    SEND_MESSAGE,
    Delegate,
    delegations_of,
    fork_tool,
    recall,
    registry_of,
    subagent_tool,
)

log = logging.getLogger("dsh.subagents")

NAME = "subagents"
CONTINUABLE = "subagents.continuable"  # AgentSpec.extra key: this child takes follow-ups
DESCRIPTION = "subagents.description"  # AgentSpec.extra key: what the child was started for


class SubagentsConfig(PluginConfig):
    """[config.subagents]"""

    max_depth: Annotated[int, Meta(ge=0, description="deepest delegation (1: children, no grandchildren)")] = 1
    max_running: Annotated[int, Meta(ge=1, description="children with a turn under way at once in one session's "
                                                        "delegation tree (an idle child counts nothing)")] = 16
    provider: Annotated[str, Meta(min_length=1, description="the provider behind `subagent` (spawn, or acp)")] = (
        "spawn")
    background: Annotated[bool, Meta(description="`subagent` returns at once unless run_in_background is false")] = (
        True)


dsh_config_type = config_type_hook(NAME, SubagentsConfig)


@hookimpl
def dsh_register_tools(register: Any, host: Host) -> None:
    config = host.config_for(SubagentsConfig)
    caps = {"max_depth": config.max_depth, "max_running": config.max_running}
    register(subagent_tool(Delegate(provider=config.provider, continuable=True, background_default=config.background,
                                    allow_background=True, **caps)))
    register(fork_tool(Delegate(provider="fork", continuable=False, background_default=False,
                                allow_background=False, **caps)))
    register(SEND_MESSAGE)
    register(INTERRUPT_AGENT)
    register(LIST_AGENTS)


@hookimpl
def dsh_register_subagent_providers(register: Any, host: Host) -> None:
    registry = registry_of(host)
    register(InProcessProvider("spawn", host, registry, fork=False))
    register(InProcessProvider("fork", host, registry, fork=True))


class _ReportSource:
    """``report`` for a continuable child alone."""

    name = NAME

    async def serve(self, session: Agent, ready: Any) -> None:
        session.publish_tools(self.name, [REPORT])
        ready()


@hookimpl
def dsh_session_tools(session: Agent, host: Host) -> _ReportSource | None:
    return _ReportSource() if session.spec.extra.get(CONTINUABLE) else None


class _Recall:
    """A resumed session lists the children its log names before its first turn runs (the
    log is read once, before any tool call: siblings started in one message stay in order)."""

    def __init__(self, session: Agent) -> None:
        self.session = session

    async def decide(self) -> None:
        await recall(self.session)


@hookimpl
def dsh_session_start(session: Agent, source: str, turn: int) -> _Recall | None:
    if source == "resume":
        return _Recall(session)
    delegations_of(session).loaded = True  # a new session: its log names no children yet
    return None


class ChildApprovals:
    """A child's permission request goes up: asked again for its parent (whose front door asks
    its person, or whose own parent does), about the parent's delegating call, titled with the
    child's description. Nobody above answering means no (the seam fails closed). Any child the
    in-process providers started counts (a delegation's, a workflow member's): the spine knows
    its parent and call (``AgentSpec.parent``, ``parent_call``)."""

    name = "subagents"

    def __init__(self, host: Host) -> None:
        self.host = host

    async def answer(self, request: ApprovalRequest) -> ApprovalOutcome | None:
        child = request.agent
        spec: AgentSpec | None = getattr(child, "spec", None)
        parent = spec.parent if spec is not None else None
        if spec is None or parent is None or not str(spec.origin or "").startswith("subagent:"):
            return None  # not an in-process child: the next answerer decides
        description = str(spec.extra.get(DESCRIPTION) or "subagent")
        args = dict(request.args) if isinstance(request.args, dict) else None
        for key in ("file_path", "path"):  # the parent's client sees where, exactly (the file tools' file_path)
            if args is not None and isinstance(args.get(key), str):
                args[key] = os.path.normpath(os.path.join(child.cwd, os.path.expanduser(args[key])))
        upward = ApprovalRequest(
            agent=parent, tool_name=request.tool_name, call_id=spec.parent_call, reason=request.reason,
            kind=request.kind, subject=request.subject, args=args, tier=request.tier,
            justification=request.justification, choices=request.choices, change=request.change,
            delegate=description if request.delegate is None else f"{description} / {request.delegate}",
        )
        outcome: ApprovalOutcome = await self.host.approvals.request(upward)
        return outcome


@asynccontextmanager
async def _lifespan(host: Host) -> AsyncIterator[None]:
    remove = host.approvals.add_answerer(ChildApprovals(host))
    try:
        yield
    finally:
        remove()


@hookimpl
def dsh_lifespan(host: Host) -> Any:
    return _lifespan(host)


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    host.state(Registry)  # the host's slot: closed (every child disposed) when the host closes


@hookimpl
def dsh_register_guidance(register: Any, host: Host) -> None:
    from .guidance import REPORT_SECTION, subagent  # the texts live in their own module (guidance.py)

    register(subagent(background=host.config_for(SubagentsConfig).background))
    register(REPORT_SECTION)


@hookimpl
def dsh_session_tool_names(spec: AgentSpec, host: Host) -> list[str] | None:
    """``report``, for the child ``dsh_session_tools`` gives it to: its guidance reaches that child alone."""
    return [REPORT.spec.name] if spec.extra.get(CONTINUABLE) else None
