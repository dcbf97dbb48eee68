"""dsh plugin ``terminal``: persistent terminals (a real PTY and a real screen) a session owns.

``terminal_open``, ``terminal_send``, ``terminal_read``, ``terminal_list``, ``terminal_signal``
and ``terminal_close``, with the original's names, arguments and result texts; or, as a
composition choice, the persistent ``bash`` (one ``command``; cwd and environment persist). A
terminal's shell runs under the same confinement as the session's ``bash`` calls (the spine's
Confinement seam), behind a keeper that ends its whole process tree with the terminal, with the
session, and when dsh dies, even by SIGKILL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from msgspec import Meta

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.errors import CompositionError

from .persistent import BashSettings, PersistentShell, make_bash
from .screen import TermScreen
from .sessions import Limits, TerminalSet
from .terminal import Terminal, Timing
from .tools import ToolSettings, make_tools

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Host

__all__ = ["PersistentShell", "TermScreen", "Terminal", "TerminalConfig", "TerminalSet"]

PLUGIN = "terminal"
Positive = Annotated[int, Meta(ge=1)]


class TerminalConfig(PluginConfig):
    """[config.terminal]"""

    tools: Annotated[Literal["terminals", "persistent-bash", "both"], Meta(description=(
        "terminals: the six terminal_* tools; persistent-bash: a `bash` whose shell persists between calls "
        "(then sandbox-tools must not register its own: [config.sandbox-tools] bash = false); both"))] = "terminals"
    rows: Annotated[int, Meta(ge=2, le=500, description="terminal rows")] = 40
    cols: Annotated[int, Meta(ge=20, le=2000, description="terminal columns")] = 160
    scrollback_lines: Annotated[Positive, Meta(description="lines kept per terminal beyond the screen")] = 10_000
    scrollback_max_bytes: Annotated[Positive, Meta(description="bytes kept per terminal beyond the screen")] = 4 << 20
    session_max_bytes: Annotated[Positive, Meta(description=(
        "bytes kept across all of a session's terminals; past it the largest gives up its oldest lines"))] = 16 << 20
    max_terminals: Annotated[Positive, Meta(description="terminals open at once per session")] = 8
    max_read_bytes: Annotated[Positive, Meta(description="bytes of one read page or one send's output")] = 256 << 10
    max_result_bytes: Annotated[int, Meta(ge=64, description="bytes of one whole tool result")] = 256 << 10
    poll_interval_ms: Annotated[Positive, Meta(description="how often a send checks for readiness")] = 50
    idle_silence_ms: Annotated[Positive, Meta(description="output silence that ends a send (inferred_idle)")] = 3_000
    timeout_ms: Annotated[Positive, Meta(description="the longest one send waits (timeout)")] = 30_000
    run_in_background: Annotated[bool, Meta(description=(
        "offer terminal_send's run_in_background (needs the jobs plugin)"))] = True
    bash_timeout_ms: Annotated[Positive, Meta(description="persistent bash: one command's deadline")] = 300_000
    bash_max_output_chars: Annotated[Positive, Meta(description="persistent bash: characters of output shown")] = 16_000


def _limits(c: TerminalConfig, *, cols: int | None = None) -> Limits:
    return Limits(
        rows=c.rows, cols=cols or c.cols, scrollback_lines=c.scrollback_lines,
        scrollback_max_bytes=c.scrollback_max_bytes, session_max_bytes=c.session_max_bytes,
        max_terminals=c.max_terminals, max_read_bytes=c.max_read_bytes,
        timing=Timing(poll_s=c.poll_interval_ms / 1000, idle_silence_s=c.idle_silence_ms / 1000,
                      timeout_s=c.timeout_ms / 1000),
    )


dsh_config_type = config_type_hook(PLUGIN, TerminalConfig)


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    c = host.config_for(TerminalConfig)
    if c.tools != "terminals" and host.pm.get_plugin("sandbox-tools") is not None and \
            config.get("sandbox-tools", {}).get("bash", True):
        raise CompositionError(
            f'[config.terminal] tools = "{c.tools}" registers the persistent `bash`, and sandbox-tools registers its '
            "one-shot `bash` under the same name: set [config.sandbox-tools] bash = false (its confinement and file "
            'tools stay), or tools = "terminals"')


@hookimpl
def dsh_register_tools(register: Callable[[Any], None], host: Host) -> None:
    c = host.config_for(TerminalConfig)
    if c.tools in ("terminals", "both"):
        settings = ToolSettings(limits=_limits(c), max_result_bytes=c.max_result_bytes,
                                run_in_background=c.run_in_background)
        for tool in make_tools(settings, getattr(host, "jobs", None)):
            register(tool)
    if c.tools in ("persistent-bash", "both"):
        # A wide screen: a command's long output lines are not folded at 160 columns.
        register(make_bash(BashSettings(limits=_limits(c, cols=max(c.cols, 1000)), timeout_s=c.bash_timeout_ms / 1000,
                                        max_output_chars=c.bash_max_output_chars)))


@hookimpl
def dsh_register_guidance(register: Callable[[Any], None], host: Host) -> None:
    from .guidance import SECTIONS  # the text lives in its own module (guidance.py)

    for section in SECTIONS:  # about the six terminal tools only: an agent without them gets no section
        register(section)
