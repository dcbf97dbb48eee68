"""The in-process subagent providers: ``spawn`` (a fresh child agent of this host) and
``fork`` (a child that starts from the parent's completed history, system prompt and tools,
so its first request is the parent's cached prefix plus the fork prompt)."""

from __future__ import annotations

from typing import Any

from dsh_core.protocols import AgentSpec, SubagentRequest

from .runs import InProcessRun, Registry


class InProcessProvider:
    """``spawn`` or ``fork``: the child is an ``Agent`` of this host, linked to its parent (the
    parent session and call in its log's header), with the parent's permission mode and effort
    (never more than the parent has: the same host's sandbox, hooks and guards)."""

    def __init__(self, name: str, host: Any, registry: Registry, *, fork: bool) -> None:
        self.name = name
        self.host = host
        self.registry = registry
        self.fork = fork

    async def start(self, request: SubagentRequest) -> InProcessRun:
        parent = request.parent
        # The parent's route as its session names it (a provider may serve a route under another
        # name, as the replay provider serves a recording's), with the model it switched to, if any.
        own = (parent.provider.name, parent.settings.model or parent.spec.model)
        provider, model = request.route if request.route and not self.fork else own
        spec = AgentSpec(
            cwd=parent.cwd if self.fork else request.cwd,
            provider=provider,
            model=model,
            parent=parent,
            parent_call=request.call_id,
            origin=f"subagent:{self.name}",
            persona=None if self.fork else request.persona,
            fork=self.fork,
            buffers=parent.spec.buffers,  # the editor's open files are the parent's too
            extra={"subagents.continuable": request.continuable, "subagents.description": request.description},
        )
        agent = self.host.create_agent(spec)
        try:
            if not self.fork:  # a fork took the parent's settings whole
                inherited = parent.settings
                same_route = (provider, model) == own
                agent.configure(mode=inherited.mode, effort=inherited.effort if same_route else None,
                                by="delegation")
                if request.tools is not None:
                    agent.offer([n for n in request.tools if n in agent.tools])
            run = InProcessRun(agent.session_id, self.name, request, agent)
            run.begin(request.prompt)
        except BaseException:
            await agent.dispose()
            self.host.forget(agent)
            raise
        return run

    async def revive(self, request: SubagentRequest, rid: str, session_id: str, events: list[Any]) -> InProcessRun:
        """A recorded child back under its id: its log reopened and its history restored (idle)."""
        parent = request.parent
        spec = AgentSpec(cwd=request.cwd, provider=parent.provider.name, model=parent.settings.model or parent.spec.model,
                         session_id=session_id, parent=parent, parent_call=request.call_id,
                         origin=f"subagent:{self.name}", buffers=parent.spec.buffers,
                         extra={"subagents.continuable": True, "subagents.description": request.description})
        agent = self.host.create_agent(spec)
        try:
            agent.restore(events)
            if parent.settings.mode is not None:  # never more than the parent has now
                agent.configure(mode=parent.settings.mode, by="delegation")
        except BaseException:
            await agent.dispose()
            self.host.forget(agent)
            raise
        return InProcessRun(rid, self.name, request, agent)
