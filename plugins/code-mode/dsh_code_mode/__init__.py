"""dsh plugin ``code-mode``: the model answers with one program instead of many tool calls.

``run_code {code, description}`` runs ``code`` — the body of an async Python function — in a
fresh fork of the session's warm Python process, confined like ``bash``; inside it ``tools`` is the agent's own tool
set (``await tools.read(file_path="a.py")``), each call a real tool call through the host's tool
path (approvals included). Only the program's output returns to the model.

``[config.code-mode] mode``: ``code`` (only ``run_code`` is offered; the system prompt
carries the typed API), ``both`` (the native tools and ``run_code``) or ``runtime`` (no
``run_code``: only the confined runtime, for plugins such as workflow).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio
from msgspec import Meta

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig, decode
from dsh_core.interception import PromptSubmit
from dsh_core.types import RequestHeader

from .limits import Limits
from .runtime import PythonRuntime
from .stubs import callable_name, render
from .tool import NAME, RunCodeTool, outer_result

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import AgentSpec
    from dsh_core.protocols import Agent, Host

__all__ = ["Limits", "PythonRuntime", "RunCodeTool", "Settings", "outer_result", "render"]

PLUGIN = "code-mode"
MODES = ("code", "both", "runtime")
START_TIMEOUT_S = 20.0  # a command server started ahead of the first bash call
START_DELAY_S = 0.02  # after the session is made, before its warm start begins
START_WAIT_S = 1.0  # at most this long for the first turn's first model request to go out
UNKNOWN_HINT = "Tools are called from programs in this session: call run_code and use `await tools.<name>(...)` inside it."

_LIMIT_KEYS = {
    "compute-seconds": "compute_seconds",
    "wall-seconds": "wall_seconds",
    "max-output-bytes": "max_output_bytes",
    "max-value-bytes": "max_value_bytes",
    "address-space-bytes": "address_space_bytes",
    "max-processes": "max_processes",
    "max-calls": "max_calls",
}


Positive = Annotated[int, Meta(gt=0)]


class CodeModeConfig(PluginConfig):
    """[config.code-mode]"""

    mode: Annotated[Literal["code", "both", "runtime"], Meta(
        description="code: run_code is the only tool the model sees; both: the native tools too; runtime: no "
                    "run_code, only the confined runtime other plugins use (workflow)")] = "code"
    max_parallel_sub_calls: Annotated[Positive, Meta(description="tool calls of one program running at once")] = 10
    compute_seconds: Annotated[Positive, Meta(description="CPU seconds of the program's process")] = (
        Limits.compute_seconds)
    wall_seconds: Annotated[float, Meta(gt=0, description="seconds from start to finish")] = Limits.wall_seconds
    max_output_bytes: Annotated[Positive, Meta(description="captured stdout+stderr")] = Limits.max_output_bytes
    max_value_bytes: Annotated[Positive, Meta(description="the return value, as JSON")] = Limits.max_value_bytes
    address_space_bytes: Annotated[Positive, Meta(description="RLIMIT_AS of the program's process")] = (
        Limits.address_space_bytes)
    max_processes: Annotated[Positive, Meta(description="processes and threads at once")] = Limits.max_processes
    max_calls: Annotated[Positive, Meta(description="tool calls per run")] = Limits.max_calls


dsh_config_type = config_type_hook(PLUGIN, CodeModeConfig)


@dataclass(frozen=True)
class Settings:
    mode: str = "code"
    max_parallel_sub_calls: int = 10
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_typed(cls, config: CodeModeConfig) -> Settings:
        limits = replace(Limits(), **{attr: getattr(config, attr) for attr in _LIMIT_KEYS.values()})
        return cls(mode=config.mode, max_parallel_sub_calls=config.max_parallel_sub_calls, limits=limits)

    @classmethod
    def from_config(cls, table: Mapping[str, Any] | None) -> Settings:
        """Settings from a raw ``[config.code-mode]`` table (ConfigError when it is bad)."""
        return cls.from_typed(decode(PLUGIN, CodeModeConfig, table, where="example"))


assert {f.name for f in fields(Limits)} >= set(_LIMIT_KEYS.values())

@dataclass
class HostSettings:
    """This plugin's settings on one host (the host's state slot, set by ``dsh_configure``)."""

    settings: Settings = field(default_factory=Settings)


def settings_for(host: Host) -> Settings:
    return host.state(HostSettings).settings


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    host.state(HostSettings).settings = Settings.from_typed(host.config_for(CodeModeConfig))


@hookimpl(trylast=True)  # after the native tools, so run_code comes last in the list the model sees
def dsh_register_tools(register: Callable[[Any], None], host: Host) -> None:
    if settings_for(host).mode != "runtime":
        register(RunCodeTool(settings_for(host)))


@hookimpl(wrapper=True)
def dsh_make_agent(spec: AgentSpec, host: Host) -> Generator[None, Agent | None, Agent | None]:
    agent = yield
    if agent is not None and settings_for(host).mode == "code" and hasattr(agent, "offer"):
        agent.offer([NAME], hint=UNKNOWN_HINT)
    return agent


@hookimpl(trylast=True)
def dsh_code_runtime(session: Agent, host: Host) -> PythonRuntime:
    return PythonRuntime(host, session.cwd, settings_for(host).limits, session=session)


class WarmStart:
    """A task of a session that has ``run_code`` (a ``ToolSource`` that offers no tools): it
    starts the session's warm runtime and makes its first run ready in the background as soon
    as the session exists, so the session's first program costs what a later one does. It says
    ready at once (the first turn never waits for it), runs inside the session's own task group
    (cancelled, and its processes closed, when the session is disposed), and leaves a failure
    to the first run, which tries again and reports it. It also starts the session's command
    server (its bash calls'), and, for the shipped runtime, makes the next run ready whenever a
    run takes the ready one (``PythonRuntime.keep_ready``). A runtime picked by another plugin is started only if it
    offers ``keep_ready()``."""

    name = "code-mode warm start"

    async def serve(self, session: Agent, ready: Callable[[], None]) -> None:
        ready()
        host = session.host
        if host.confinement is None:
            return
        await _after_first_request(session)
        runtime = host.pm.hook.dsh_code_runtime(session=session, host=host)
        keep_ready = getattr(runtime, "keep_ready", None)
        async with anyio.create_task_group() as tg:
            if keep_ready is not None:
                tg.start_soon(_quietly, keep_ready, "the warm runtime")
            if "bash" in session.tools:  # the program's first bash call would start the command server
                tg.start_soon(_quietly, partial(_start_command_server, session), "the command server")


async def _after_first_request(session: Agent) -> None:
    """Let what is already under way go first: session/new's answer (a short pause) and, when a
    turn has started meanwhile, its first model request (the model thinks while the processes
    start). Spawning a process holds the event loop for a few milliseconds."""
    asked = anyio.Event()

    def observe(agent: Any, event: Any) -> None:
        if isinstance(event, RequestHeader):
            asked.set()

    unsubscribe = session.subscribe(observe)
    try:
        await anyio.sleep(START_DELAY_S)
        if session.busy:
            with anyio.move_on_after(START_WAIT_S):
                await asked.wait()
    finally:
        unsubscribe()


async def _start_command_server(session: Agent) -> None:
    """Start the session's warm confined command server (sandbox-tools'), which its bash calls
    go through, by running ``true`` through the Confinement seam (one fork and exec more)."""
    confinement = session.host.confinement
    if confinement is not None:
        await confinement.run(["true"], session=session, cwd=session.cwd, timeout_s=START_TIMEOUT_S,
                              output_limit=1024)


async def _quietly(start: Callable[[], Awaitable[None]], what: str) -> None:
    try:
        await start()
    except Exception as exc:  # the first use meets it again and says why
        logging.getLogger("dsh.code-mode").debug("could not start %s ahead: %r", what, exc)


@hookimpl
def dsh_session_tools(session: Agent, host: Host) -> WarmStart | None:
    """``WarmStart`` for a session whose model has ``run_code`` (modes ``code`` and ``both``);
    none in mode ``runtime``, whose users (workflow) run in warm processes of their own."""
    if settings_for(host).mode == "runtime" or NAME not in session.tools:
        return None
    return WarmStart()


def prompt_section(host: Host) -> str:
    settings = settings_for(host)
    specs = [t.spec for name, t in host.tools.items() if name != NAME and callable_name(name)]
    lim = settings.limits
    if settings.mode == "code":
        lead = ("run_code is your only tool. Each call runs one Python program; inside it, `tools` calls the "
                "workspace tools below.")
    else:
        lead = ("Besides calling tools directly, you can call run_code: it runs one Python program, inside which "
                "`tools` calls the same tools, so loops, many reads or several steps take one call.")
    return (
        "# Code mode\n\n"
        f"{lead} `code` is the body of an async function: top-level `await` and `return` work. "
        '`description` says in one line what the program does. Example: `r = await tools.bash(command="ls")` '
        "then `print(r[\"output\"])`. `asyncio.gather(...)` runs calls concurrently: read, glob, grep and "
        "read_image overlap, bash, write and edit run one at a time, always in the order you started them. A "
        "failed call raises `ToolCallError` (bash does not raise for a non-zero exit: check `exit_code`). You "
        "get back only what the program prints and what it returns (a string as is, anything else as JSON); "
        "results you neither print nor return are not shown to you. The program runs in a fresh Python process "
        "(standard library only) confined like bash, with "
        f"{lim.compute_seconds} s of CPU time and {lim.wall_seconds:g} s in all.\n\n"
        "The API of `tools`:\n\n```python\n" + render(specs) + "```"
    )


@hookimpl
def dsh_system_prompt(spec: AgentSpec, host: Host) -> str | None:
    return None if settings_for(host).mode == "runtime" else prompt_section(host)


@dataclass
class SessionApi:
    """The API of the session's own tools (its MCP servers', ``dsh_session_tools``) as the model
    was last shown it (code-mode's session slot): the system prompt, fixed when the session
    began, holds only the host's tools."""

    shown: dict[str, Any] = field(default_factory=dict)  # tool name -> the spec shown


@hookimpl
def dsh_prompt_submit(session: Agent, messages: list[Any], turn: int) -> PromptSubmit | None:
    """At the start of a turn, the ``tools`` API of the session's own tools that the model has not
    seen yet (or that changed), and the names of those that went away: appended after the
    prompt, so the system prompt, and the provider's prefix cache, stay as they were."""
    if settings_for(session.host).mode == "runtime":
        return None
    own = {n: t.spec for n, t in session.tools.items() if n not in session.host.tools and callable_name(n)}
    api = session.state(SessionApi)
    added = [spec for n, spec in own.items() if api.shown.get(n) != spec]
    gone = [n for n in api.shown if n not in own]
    if not added and not gone:
        return None
    api.shown = own
    texts = []
    if added:
        texts.append("This session also has these tools (from its MCP servers); programs call them as `tools.<name>` "
                     "like the others:\n\n```python\n" + render(added) + "```")
    if gone:
        texts.append("No longer available in this session: " + ", ".join(f"tools.{n}" for n in gone) + ".")
    return PromptSubmit(context=["\n\n".join(texts)])
