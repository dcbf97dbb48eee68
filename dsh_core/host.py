"""The host: one PluginManager for one composition, its registries, lifespan and task group.

It knows the agent loop only through the ``dsh_make_agent`` hook (whose default, in
``builtin.defaults``, builds ``dsh_core.agent.Agent``) and holds agents as ``protocols.Agent``.
``hookimpl`` is re-exported from ``dsh_core.hookspecs``, where it is defined.
"""

from __future__ import annotations

import inspect
import operator
import os
import shlex
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import pluggy

from . import hookspecs
from .builtin import defaults as builtin_defaults
from .compose import Composition
from .config import PluginConfig
from .config import decode as decode_config
from .diag import warn
from .errors import CompositionError, ConfigError, DshError, RouteError

# re-exported: `from dsh_core.host import hookimpl` keeps working
from .hookspecs import PROJECT as PROJECT
from .hookspecs import hookimpl as hookimpl
from .protocols import (
    Agent,
    AgentSpec,
    Answerer,
    AttachmentStore,
    Confinement,
    FrontDoor,
    Jobs,
    ModelProvider,
    SearchProvider,
    SessionStore,
    SubagentProvider,
    Tool,
    new_id,
)
from .spill import SpillConfig
from .spill import default_root as default_spill_root
from .state import ByEventType, StateOwner, StateSlots, registered
from .types import (
    ApprovalAsked,
    ApprovalDecided,
    ApprovalOutcome,
    ApprovalRequest,
    DurableEvent,
    Guidance,
)

ENTRY_POINT_GROUP = "dsh"
PROMPTS_KEPT = 64  # distinct system prompt texts a host keeps one copy of (Host.system_prompt)
C = TypeVar("C", bound=PluginConfig)


# The spine's own tables the host declares itself ([config.agent] is declared by the builtin defaults).
SPINE_CONFIGS: dict[str, type[PluginConfig]] = {"spill": SpillConfig}


def decode_plugin_configs(pm: pluggy.PluginManager, composition: Composition) -> dict[str, PluginConfig]:
    """Every mounted plugin's declared config (``dsh_config_type``) and the spine's own tables,
    decoded from the example: ``{plugin: config}``; one ``ConfigError`` naming file, plugin and key
    on the first bad table, or on a table nobody declared (see ``undeclared``)."""
    where = str(composition.path)
    declared: dict[str, type[PluginConfig]] = dict(SPINE_CONFIGS)
    for entry in pm.hook.dsh_config_type():
        if entry is None:
            continue
        name, cls = entry
        if declared.get(name, cls) is not cls:
            raise CompositionError(f"two declarations of [config.{name}]: {declared[name].__name__} and {cls.__name__}")
        declared[name] = cls
    for name, table in composition.config.items():
        refused = None if name in declared else undeclared(pm, composition, name, table)
        if refused:
            raise ConfigError(f"{where}: {refused}")
    return {name: decode_config(name, cls, composition.config.get(name), where=where)
            for name, cls in declared.items()}


def undeclared(pm: pluggy.PluginManager, composition: Composition, name: str, table: Any) -> str | None:
    """Why ``[config.<name>]`` is refused when no mounted plugin declares it (None: it is not; an
    empty table holds nothing that could go unread, so it is let be): a mounted plugin that
    declares no config takes no options (its first key is named); a plugin that is installed or
    shipped but not mounted by this example would never read the table (the example loads exactly
    the plugins it lists, as ``load_plugins`` does); any other name is no plugin at all."""
    keys = list(table) if isinstance(table, dict) else []
    if not keys:
        return None
    if name in composition.plugins or pm.get_plugin(name) is not None:
        return (f"[config.{name}] unknown key {keys[0]!r}: plugin {name!r} declares no config (dsh_config_type), "
                "so it takes no options")
    mounted = ", ".join(composition.plugins) or "none"
    if name in SHIPPED_PLUGINS or name in installed_plugins():
        return (f"[config.{name}]: plugin {name!r} is not mounted by example {composition.name!r}, so nothing "
                f"reads this table; add {name!r} to [example] plugins or remove the table (mounted: {mounted})")
    return f"[config.{name}]: there is no plugin {name!r} (mounted: {mounted}; `dsh plugins` lists the installed ones)"


def installed_plugins() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


# The plugins this project ships, each its own distribution ``dsh-<name>`` (tests/test_dependencies.py
# checks this against plugins/*/pyproject.toml).
SHIPPED_PLUGINS = frozenset({
    "acp-presentation", "acp-transport", "agent-instructions", "attachment-store", "batch", "code-mode", "compaction",
    "deepseek-model", "goals", "guards", "hooks-claude-code", "hooks-codex", "jobs", "jsonl-persistence", "lsp", "mcp-client",
    "otel", "replay-model", "sandbox-tools", "schedule", "scripted-model", "session-controls", "session-query", "skills",
    "str-replace-editor", "subagent-acp", "subagents", "terminal", "todo", "web", "workflow",
})  # fmt: skip


def install_hint(name: str) -> str:
    """How to install plugin ``name`` into the interpreter running dsh.

    ``sys.executable -m pip`` names the venv dsh lives in, so the command works where the
    system interpreter refuses ``pip install`` (PEP 668). From a source checkout it installs
    the plugin's directory; a plugin this project ships is the ``dsh-<name>`` distribution;
    any other name is a third party's, which only its author can name.
    """
    pip = f"{shlex.quote(sys.executable)} -m pip install"
    source = Path(__file__).resolve().parent.parent / "plugins" / name
    if (source / "pyproject.toml").is_file():
        return f"{pip} -e {shlex.quote(str(source))}"
    if name in SHIPPED_PLUGINS:
        return f"{pip} dsh-{name}"
    return (f"{pip} <the distribution that provides it> (a plugin is any installed distribution with an "
            f"entry point named {name!r} in group {ENTRY_POINT_GROUP!r}; `dsh plugins` lists the installed ones)")


def install_fix(missing: list[str]) -> str:
    """One command that installs every plugin in ``missing``: from a source checkout whose
    ``plugins/`` has them all, its ``requirements.txt`` (everything dsh ships, one short line);
    otherwise each plugin's ``install_hint``."""
    repo = Path(__file__).resolve().parent.parent
    if (repo / "requirements.txt").is_file() and all((repo / "plugins" / m / "pyproject.toml").is_file() for m in missing):
        return f"cd {shlex.quote(str(repo))} && {shlex.quote(sys.executable)} -m pip install -r requirements.txt"
    return " && ".join(install_hint(m) for m in missing)


def register_plugin(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    """Register with the house checks: no ``async def`` hookimpl (hooks decide, objects act)."""
    for attr in dir(plugin):
        if attr.startswith("dsh_"):
            fn = getattr(plugin, attr)
            if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
                raise CompositionError(
                    f"plugin {name!r}: hook {attr} is `async def`; hooks must be synchronous and return an "
                    "object whose async methods do the I/O (see dsh_core/hookspecs.py: hooks decide, objects act)"
                )
    pm.register(plugin, name=name)


def make_plugin_manager(*, trace: bool | None = None) -> pluggy.PluginManager:
    """A fresh manager holding the spec and the spine's runtime defaults (``dsh-defaults``).

    The CLI adds its builtin subcommands (``dsh-commands``) itself: see
    ``dsh_core.builtin.commands.plugin_manager``."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    register_plugin(pm, builtin_defaults, "dsh-defaults")
    if trace if trace is not None else os.environ.get("DSH_TRACE_PLUGINS") == "1":
        pm.trace.root.setwriter(lambda s: sys.stderr.write(s))
        pm.enable_tracing()
    return pm


def load_plugins(pm: pluggy.PluginManager, composition: Composition) -> dict[str, EntryPoint]:
    """Load exactly the plugins the example lists, then ``check_pending``. Returns name → entry point."""
    available = installed_plugins()
    loaded: dict[str, EntryPoint] = {}
    for name in composition.plugins:
        if pm.get_plugin(name) is not None:
            continue  # already registered by the caller (tests inject throwaway plugins by name)
        ep = available.get(name)
        if ep is None:
            raise CompositionError(
                f"example {composition.name!r} needs plugin {name!r}, which is not installed; "
                f"install it with: {install_hint(name)}"
            )
        try:
            module = ep.load()
        except Exception as exc:
            raise CompositionError(f"example {composition.name!r}: plugin {name!r} failed to import: {exc!r}") from exc
        register_plugin(pm, module, name)
        loaded[name] = ep
    pm.hook.dsh_addhooks.call_historic(kwargs={"pluginmanager": pm})
    pm.check_pending()
    return loaded


class ApprovalService:
    """The approval seam: policy verdict first, then answerers newest-first; one-shot."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm
        self._answerers: list[Answerer] = []

    def add_answerer(self, answerer: Answerer) -> Callable[[], None]:
        return registered(self._answerers, answerer)

    async def request(self, req: ApprovalRequest) -> ApprovalOutcome:
        agent: Agent = req.agent
        req.id = req.id or new_id("appr_")
        agent.emit(ApprovalAsked(id=req.id, tool_name=req.tool_name, call_id=req.call_id, reason=req.reason))
        outcome: ApprovalOutcome = "unavailable"
        answered_by: str | None = None
        try:
            verdict = self._pm.hook.dsh_check_approval(request=req)
            if verdict == "allow":
                outcome, answered_by = "allowed-once", "policy"
            elif verdict == "deny":
                outcome, answered_by = "rejected", "policy"
            else:
                for answerer in reversed(list(self._answerers)):
                    answer = await answerer.answer(req)
                    if answer is not None:
                        outcome, answered_by = answer, getattr(answerer, "name", type(answerer).__name__)
                        break
        except anyio.get_cancelled_exc_class():
            agent.emit(ApprovalDecided(id=req.id, outcome="cancelled", answered_by=answered_by))
            raise
        except Exception as exc:  # an answerer that fails closes the gate
            warn(f"approval answerer failed: {exc!r}")
            outcome = "unavailable"
        req.decided_by = answered_by
        agent.emit(ApprovalDecided(id=req.id, outcome=outcome, answered_by=answered_by))
        return outcome


class Host(StateOwner):
    """Everything one composition provides, plus the task group that owns every task."""

    def __init__(
        self,
        pm: pluggy.PluginManager,
        composition: Composition,
        *,
        provider: str | None = None,
        model: str | None = None,
    ) -> None:
        self.pm = pm
        self.composition = composition
        self.default_provider = provider or os.environ.get("DSH_PROVIDER") or composition.provider
        self.default_model = model or os.environ.get("DSH_MODEL") or composition.model
        self.config: dict[str, dict[str, Any]] = {k: dict(v) for k, v in composition.config.items()}
        self.models: dict[str, ModelProvider] = {}
        self.tools: dict[str, Tool] = {}
        self.front_doors: dict[str, FrontDoor] = {}
        self.subagent_providers: dict[str, SubagentProvider] = {}
        self.search_providers: dict[str, SearchProvider] = {}
        self.guidance: list[Guidance] = []  # every section, in prompt order (dsh_register_guidance)
        self.approvals = ApprovalService(pm)
        self.agents: set[Agent] = set()
        self._prompts: dict[str, str] = {}  # system prompts seen: one copy of each text (system_prompt)
        self._task_group: anyio.abc.TaskGroup | None = None
        self._state = StateSlots()  # plugin state of this host (dsh_core.state)
        # Each plugin's declared config Struct, decoded once (dsh_core.config); then dsh_configure.
        self._configs = {type(c): c for c in decode_plugin_configs(pm, composition).values()}
        # The spine's spill of every tool result (dsh_core.spill): `[config.spill]` max-bytes / dir.
        spill = self.config_for(SpillConfig)
        self.spill_limit: int = spill.max_bytes
        self.spill_root: Path = Path(spill.dir) if spill.dir is not None else default_spill_root()
        pm.hook.dsh_configure.call_historic(kwargs={"config": self.config, "host": self})
        self.jobs: Jobs | None = pm.hook.dsh_jobs(host=self)  # before the tools: bash asks it
        pm.hook.dsh_register_search_providers(register=self._add_search_provider, host=self)  # before the tools too
        pm.hook.dsh_register_models(register=self._add_model, host=self)
        pm.hook.dsh_register_tools(register=self._add_tool, host=self)
        pm.hook.dsh_register_guidance(register=self._add_guidance, host=self)
        self.guidance.sort(key=lambda g: (g.order, g.name))  # fixed: the cached prefix is stable
        pm.hook.dsh_register_subagent_providers(register=self._add_subagent_provider, host=self)
        pm.hook.dsh_register_front_doors(register=self._add_door, host=self)
        self.session_store: SessionStore = pm.hook.dsh_session_store(host=self)
        # Resolved once: each event goes straight to the dsh_session_event implementations
        # (none: nothing at all), not through pluggy's call machinery (bench/profile_prompt.py),
        # and only to those that read the event's type (``state.reads``).
        self._event_observers = ByEventType(_direct_observers(pm.hook.dsh_session_event, traced=_monitored(pm)))
        self.direct = DirectHooks(pm)  # the turn loop's per-prompt hooks, past pluggy's machinery
        self.attachment_store: AttachmentStore | None = pm.hook.dsh_attachment_store(host=self)
        self.confinement: Confinement | None = pm.hook.dsh_confinement(host=self)

    # ------------------------------------------------------------------ registries

    def _add_model(self, provider: ModelProvider) -> None:
        if provider.name in self.models:
            raise CompositionError(f"two plugins register the model provider {provider.name!r}")
        self.models[provider.name] = provider

    def _add_tool(self, tool: Tool) -> None:
        if tool.spec.name in self.tools:
            raise CompositionError(f"two plugins register the tool {tool.spec.name!r}")
        self.tools[tool.spec.name] = tool

    def _add_guidance(self, section: Guidance) -> None:
        if not isinstance(section, Guidance):
            raise CompositionError(f"dsh_register_guidance takes dsh_core.types.Guidance, not {type(section).__name__}")
        if not section.tools:
            raise CompositionError(f"the guidance section {section.name!r} names no tool (it would never be shown)")
        if any(g.name == section.name for g in self.guidance):
            raise CompositionError(f"two plugins register the guidance section {section.name!r}")
        self.guidance.append(section)

    def _add_search_provider(self, provider: SearchProvider) -> None:
        if provider.name in self.search_providers:
            raise CompositionError(f"two plugins register the search provider {provider.name!r}")
        self.search_providers[provider.name] = provider

    def _add_subagent_provider(self, provider: SubagentProvider) -> None:
        if provider.name in self.subagent_providers:
            raise CompositionError(f"two plugins register the subagent provider {provider.name!r}")
        self.subagent_providers[provider.name] = provider

    def _add_door(self, door: FrontDoor) -> None:
        self.front_doors[door.name] = door

    def provider(self, name: str) -> ModelProvider:
        try:
            return self.models[name]
        except KeyError:
            known = ", ".join(self.models) or "none"
            raise RouteError(
                f"no model provider {name!r} in example {self.composition.name!r} (providers: {known}). "
                "Pass --provider/--model (or DSH_PROVIDER/DSH_MODEL); keyless demo: "
                "--provider scripted --model examples/acp-agent/demo.json"
            ) from None

    def check_route(self, provider: str | None = None, model: str | None = None) -> tuple[str, str]:
        """The exact default route, resolved now so start-up fails early with the way out."""
        provider = provider or self.default_provider
        model = model or self.default_model
        if not provider or not model:
            raise RouteError(
                "no model route: pass --provider and --model (or DSH_PROVIDER/DSH_MODEL); keyless demo: "
                "--provider scripted --model examples/acp-agent/demo.json"
            )
        self.provider(provider).resolve(model)
        return provider, model

    def system_prompt(self, spec: AgentSpec) -> str:
        # pluggy calls trylast builtins last; reverse so the spine's base section leads.
        sections = [s for s in reversed(self.pm.hook.dsh_system_prompt(spec=spec, host=self)) if s]
        sections += [g.text for g in self.guidance_for(spec) if g.text]
        text = "\n\n".join(sections)
        # Sessions of one workspace mostly share one prompt (several KiB): they hold one copy of it.
        # A bounded table: prompts that differ per session (a date, a path) only fill it once.
        kept = self._prompts.get(text)
        if kept is not None:
            return kept
        if len(self._prompts) < PROMPTS_KEPT:
            self._prompts[text] = text
        return text

    def guidance_for(self, spec: AgentSpec) -> list[Guidance]:
        """The guidance sections of the tools an agent built from ``spec`` has — the host's and the
        session tools declared for it (``dsh_session_tool_names``) — in prompt order."""
        if not self.guidance:
            return []
        has = set(self.tools)
        for names in self.pm.hook.dsh_session_tool_names(spec=spec, host=self):
            has.update(names or ())
        return [g for g in self.guidance if has.intersection(g.tools)]

    def observe(self, agent: Agent, event: DurableEvent) -> None:
        for observer in self._event_observers[type(event)]:
            try:
                observer(agent, event)
            except Exception as exc:  # one observer's bug costs neither the turn nor the other observers
                warn(f"dsh_session_event observer failed: {exc!r}")

    @property
    def task_group(self) -> anyio.abc.TaskGroup:
        if self._task_group is None:
            raise DshError("the host is not running (use `async with open_host(...)`)")
        return self._task_group

    # ------------------------------------------------------------------ agents

    def create_agent(self, spec: AgentSpec) -> Agent:
        agent: Agent = self.pm.hook.dsh_make_agent(spec=spec, host=self)  # firstresult: one Agent
        self.agents.add(agent)
        return agent

    def config_for(self, cls: type[C]) -> C:
        """The plugin config of type ``cls`` decoded from the example (its defaults when the
        example has no table for it)."""
        found = self._configs.get(cls)
        return found if isinstance(found, cls) else cls()

    def forget(self, agent: Agent) -> None:
        self.agents.discard(agent)

    async def dispose_agents(self) -> None:
        errors: list[Exception] = []

        async def one(agent: Agent) -> None:
            try:
                await agent.dispose()
            except Exception as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for agent in [a for a in self.agents if a.spec.parent is None]:
                tg.start_soon(one, agent)
        self.agents.clear()
        if errors:
            raise ExceptionGroup("disposing agents failed", errors)


def _direct_observers(hook: Any, *, traced: bool = False) -> tuple[Callable[[Agent, DurableEvent], None], ...]:
    """``dsh_session_event``'s implementations as plain ``(session, event)`` callables, in pluggy's
    call order (plugins are registered before the host is made); with a wrapper among them, or
    hook calls traced (``DSH_TRACE_PLUGINS``), the hook itself, so pluggy's semantics hold."""
    impls = hook.get_hookimpls()
    if impls and (traced or any(i.hookwrapper or i.wrapper for i in impls)):
        return (lambda agent, event: hook(session=agent, event=event),)
    out: list[Callable[[Agent, DurableEvent], None]] = []
    for impl in reversed(impls):  # pluggy calls the last registered (and tryfirst) first
        fn, names = impl.function, tuple(impl.argnames)
        out.append(fn if names == ("session", "event") else _by_name(fn, names))
    return tuple(out)


_PLAIN_HOOKEXEC = pluggy.PluginManager("dsh-probe")._inner_hookexec  # pluggy's own call loop: not traced


def _monitored(pm: pluggy.PluginManager) -> bool:
    """Whether ``pm``'s hook calls are traced or monitored (``DSH_TRACE_PLUGINS``): then only
    pluggy itself calls them, so the trace sees every call."""
    return pm._inner_hookexec is not _PLAIN_HOOKEXEC


class DirectHook:
    """One hook called straight to its implementations, with pluggy's call semantics: the
    implementations in pluggy's order (the last registered and ``tryfirst`` first), each given
    the arguments it names, None answers dropped, ``firstresult`` stopping at the first answer;
    no implementation: no call at all. The implementations are resolved again whenever the
    hook's set changes (a plugin registered later); with a hook wrapper among them, defaults in
    the spec, or hook calls traced or monitored (``DSH_TRACE_PLUGINS``), pluggy itself calls it.
    The turn loop's interception points go through these (a pluggy call is ~8 Python calls of
    machinery per hook; bench/profile_prompt.py)."""

    __slots__ = ("_caller", "_calls", "_first", "_pm", "_seen")

    def __init__(self, pm: pluggy.PluginManager, name: str) -> None:
        self._caller = getattr(pm.hook, name)
        self._pm = pm
        self._seen: list[Any] | None = None
        self._calls: tuple[tuple[Callable[..., Any], Any, int], ...] | None = None
        spec = self._caller.spec
        self._first = bool(spec is not None and spec.opts.get("firstresult", False))

    def _resolve(self, impls: list[Any]) -> None:
        self._seen = list(impls)
        spec = self._caller.spec
        if (spec is None or spec.kwargdefaults or self._caller.is_historic()
                or any(i.hookwrapper or i.wrapper for i in impls)):
            self._calls = None
            return
        calls = []
        for impl in reversed(impls):
            names = tuple(impl.argnames)
            calls.append((impl.function, operator.itemgetter(*names) if names else None, len(names)))
        self._calls = tuple(calls)

    def __call__(self, **kwargs: Any) -> Any:
        caller = self._caller
        if caller._hookimpls != self._seen:
            self._resolve(caller._hookimpls)
        calls = self._calls
        if calls is None or self._pm._inner_hookexec is not _PLAIN_HOOKEXEC:  # _monitored, without its call (6 a tool turn)
            return caller(**kwargs)
        results = []
        for fn, pick, n in calls:
            if n == 1:
                res = fn(pick(kwargs))
            elif n:
                res = fn(*pick(kwargs))
            else:
                res = fn()
            if res is not None:
                if self._first:
                    return res
                results.append(res)
        return None if self._first else results


class DirectHooks:
    """``host.direct.<hook>``: a ``DirectHook`` per hook name, made on first use."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm

    def __getattr__(self, name: str) -> DirectHook:
        if not name.startswith("dsh_"):
            raise AttributeError(name)
        hook = DirectHook(self._pm, name)
        setattr(self, name, hook)
        return hook


def _by_name(fn: Callable[..., Any], names: tuple[str, ...]) -> Callable[[Agent, DurableEvent], None]:
    """``fn`` taking the arguments it names (a subset of ``session``, ``event``, in its order)."""

    def call(agent: Agent, event: DurableEvent) -> None:
        fn(*[agent if n == "session" else event for n in names])

    if hasattr(fn, "events"):  # the event types it reads (state.reads) hold for the wrapper too
        call.events = fn.events  # type: ignore[attr-defined]
    return call


@asynccontextmanager
async def open_host(
    composition: Composition,
    *,
    provider: str | None = None,
    model: str | None = None,
    pm: pluggy.PluginManager | None = None,
) -> AsyncIterator[Host]:
    """Compose, configure and run a host; on exit dispose every agent, then the lifespans."""
    pm = pm or make_plugin_manager()
    load_plugins(pm, composition)
    host = Host(pm, composition, provider=provider, model=model)
    async with anyio.create_task_group() as tg:
        host._task_group = tg
        async with AsyncExitStack() as stack:
            for cm in pm.hook.dsh_lifespan(host=host):
                if cm is not None:
                    await stack.enter_async_context(cm)
            try:
                yield host
            finally:
                with anyio.CancelScope(shield=True):
                    try:
                        await host.dispose_agents()
                    finally:
                        await host._state.aclose()
        tg.cancel_scope.cancel()


if TYPE_CHECKING:  # pragma: no cover - mypy checks the concrete host against the contract plugins program to
    from .protocols import Host as HostProtocol

    def _satisfies_the_contract(host: Host) -> HostProtocol:
        return host
