"""dsh plugin ``code-mode``: the model answers with one program instead of many tool calls.

``run_code {code, description}`` runs ``code`` — the body of an async Python function — in a
fresh Python subprocess confined like ``bash``; inside it ``tools`` is the agent's own tool
set (``await tools.read(path="a.py")``), each call a real tool call through the host's tool
path (approvals included). Only the program's output returns to the model.

``[config.code-mode] mode``: ``code`` (only ``run_code`` is offered; the system prompt
carries the typed API) or ``both`` (the native tools and ``run_code``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from dsh_core import ConfigError, hookimpl

from .limits import Limits
from .runtime import PythonRuntime
from .stubs import callable_name, render
from .tool import NAME, RunCodeTool, outer_result

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import AgentSpec
    from dsh_core.protocols import Agent, Host

__all__ = ["Limits", "PythonRuntime", "RunCodeTool", "Settings", "outer_result", "render"]

PLUGIN = "code-mode"
MODES = ("code", "both")
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


@dataclass(frozen=True)
class Settings:
    mode: str = "code"
    max_parallel_sub_calls: int = 10
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_config(cls, table: Mapping[str, Any] | None) -> Settings:
        table = dict(table or {})
        known = {"mode", "max-parallel-sub-calls", *_LIMIT_KEYS}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ConfigError(f"[config.{PLUGIN}]: unknown key(s) {', '.join(unknown)}; known keys: "
                              f"{', '.join(sorted(known))}")
        mode = table.get("mode", "code")
        if mode not in MODES:
            raise ConfigError(f'[config.{PLUGIN}] mode must be "code" or "both", got {mode!r}')
        ints: dict[str, Any] = {}
        for key in ("max-parallel-sub-calls", *_LIMIT_KEYS):
            if key in table:
                v = table[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 or (
                        key != "wall-seconds" and not isinstance(v, int)):
                    raise ConfigError(f"[config.{PLUGIN}] {key} must be a positive integer, got {v!r}")
                ints[key] = v
        limits = replace(Limits(), **{_LIMIT_KEYS[k]: v for k, v in ints.items() if k in _LIMIT_KEYS})
        return cls(mode=mode, max_parallel_sub_calls=ints.get("max-parallel-sub-calls", 10), limits=limits)


assert {f.name for f in fields(Limits)} >= set(_LIMIT_KEYS.values())

@dataclass
class HostSettings:
    """This plugin's settings on one host (the host's state slot, set by ``dsh_configure``)."""

    settings: Settings = field(default_factory=Settings)


def settings_for(host: Host) -> Settings:
    return host.state(HostSettings).settings


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    host.state(HostSettings).settings = Settings.from_config(config.get(PLUGIN))


@hookimpl(trylast=True)  # after the native tools, so run_code comes last in the list the model sees
def dsh_register_tools(register: Callable[[Any], None], host: Host) -> None:
    register(RunCodeTool(settings_for(host)))


@hookimpl(wrapper=True)
def dsh_make_agent(spec: AgentSpec, host: Host) -> Generator[None, Agent | None, Agent | None]:
    agent = yield
    if agent is not None and settings_for(host).mode == "code" and hasattr(agent, "offer"):
        agent.offer([NAME], hint=UNKNOWN_HINT)
    return agent


@hookimpl(trylast=True)
def dsh_code_runtime(session: Agent, host: Host) -> PythonRuntime:
    return PythonRuntime(host, session.cwd, settings_for(host).limits)


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
def dsh_system_prompt(spec: AgentSpec, host: Host) -> str:
    return prompt_section(host)
