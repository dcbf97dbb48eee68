"""dsh plugin ``sandbox-tools``: bash and file tools confined by the kernel.

Tiers come from ``DSH_PERMISSION_MODE`` (or ``[config.sandbox-tools] permission-mode``):
``read-only`` | ``workspace-write`` (default) | ``danger-full-access``. ``bash`` runs under
bubblewrap, or Landlock where bubblewrap cannot start, probed once with a real confined
command; with neither, the confined tiers refuse to run commands. File tools enforce the
same roots in-process with ``openat2(RESOLVE_BENEATH)``. A wider tier is one approval
away, for one call; nothing is remembered.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dsh_core import config_type_hook, hookimpl

from .confine import Confined, SandboxConfinement, confine
from .mechanisms import get_runner
from .policy import PLUGIN, SandboxConfig, Settings, temp_roots
from .run import spill_path_for
from .sandbox import HostSandbox, Sandbox, sandbox_for
from .tools import make_tools

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import AgentSpec
    from dsh_core.protocols import Host
    from dsh_core.types import ApprovalRequest

__all__ = ["Confined", "Sandbox", "SandboxConfinement", "Settings", "confine", "sandbox_for"]

log = logging.getLogger(f"dsh.{PLUGIN}")


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    # The host's Sandbox is the host's state slot (sandbox.HostSandbox); the hooks below find it
    # from the host they are given.
    host.state(HostSandbox).sandbox = Sandbox(Settings.from_typed(host.config_for(SandboxConfig)))


dsh_config_type = config_type_hook(PLUGIN, SandboxConfig)


@hookimpl
def dsh_confinement(host: Host) -> SandboxConfinement:
    """The spine's Confinement seam over this host's Sandbox (hooks and code mode use it)."""
    return SandboxConfinement(sandbox_for(host))


@hookimpl
def dsh_check_approval(request: ApprovalRequest) -> Literal["deny"] | None:
    """In danger-full-access mode nobody is asked (as in the original, whose approval policy is
    ``never`` there): nothing of this plugin escalates in that mode, and a request from elsewhere
    (a PreToolUse hook answering ``ask``) is rejected by policy, not put to the client."""
    host = getattr(request.agent, "host", None)
    if host is not None and sandbox_for(host).mode_for(request.agent) == "danger-full-access":
        return "deny"
    return None


@hookimpl
def dsh_register_tools(register: Callable[[Any], None], host: Host) -> None:
    for tool in make_tools(sandbox_for(host), getattr(host, "jobs", None)):
        register(tool)


@asynccontextmanager
async def _probe_at_start(sb: Sandbox) -> AsyncIterator[None]:
    # Probe once (cached per process) with a real confined command, so the first bash call does not
    # pay for it and a host without a usable sandbox says so on stderr at start-up.
    if sb.settings.mode != "danger-full-access":
        result = await get_runner(sb.settings.mechanism)
        if result.runner is None:
            log.warning(
                f"no sandbox mechanism is usable ({result.summary()}); bash will refuse to run "
                f'commands in "{sb.settings.mode}" mode (sandbox unavailable)'
            )
    try:
        yield
    finally:
        await sb.aclose()  # the per-session command servers (agents are disposed before lifespans end)


@hookimpl
def dsh_session_artifacts(session_id: str, host: Host) -> list[Path]:
    """A deleted session's spill files: ``<spill root>/<session id>/`` (see ``run.spill_path_for``)."""
    return [spill_path_for(sandbox_for(host).settings.spill_root(), session_id, "x").parent]


@hookimpl
def dsh_lifespan(host: Host) -> Any:
    return _probe_at_start(sandbox_for(host))


@hookimpl
def dsh_system_prompt(spec: AgentSpec, host: Host) -> str:
    sb = sandbox_for(host)
    mode = sb.settings.mode
    root = spec.cwd
    if mode == "danger-full-access":
        return (
            "Current DSH file policy: danger-full-access. Commands and file tools run without confinement; "
            "be careful with writes outside the workspace. Do not set sandbox_permissions."
        )
    if mode == "read-only":
        return (
            "Current DSH file policy: read-only. bash commands and file tools may read anywhere but write nowhere "
            "(except /dev/null). If one call really must write, call it again with "
            'sandbox_permissions="workspace-write" (inside the workspace) or "danger-full-access" and a '
            "justification; a person approves or rejects that single call, and nothing is remembered."
        )
    temps = ", ".join(f'"{t}"' for t in temp_roots())
    return (
        f'Current DSH file policy: workspace-write. bash commands and the write/edit tools may write only under '
        f'the session workspace: "{root}" (including its .git), and the temporary directory ({temps}). '
        "Everything else is read-only; reads are allowed everywhere. If one call really must write outside, "
        'call it again with sandbox_permissions="danger-full-access" and a justification; a person approves or '
        "rejects that single call, and nothing is remembered."
    )


@hookimpl
def dsh_register_doctor_checks(register: Callable[[Any], None], host: Host) -> None:
    from ._doctor import IsolationCheck, SandboxCheck

    settings = sandbox_for(host).settings
    register(SandboxCheck(settings))
    register(IsolationCheck(settings))


@hookimpl
def dsh_register_guidance(register: Callable[[Any], None], host: Host) -> None:
    from .guidance import SECTIONS  # the texts live in their own module (guidance.py)

    for section in SECTIONS:
        register(section)
