"""The spine's ``Confinement`` seam, provided by this plugin (``dsh_confinement``): other plugins
(hooks, code mode) run confined processes through ``host.confinement`` and never import this one.

- ``confine(argv, cwd=…)`` wraps an argv the way a ``bash`` call of that session is confined
  (the probed mechanism, bubblewrap else Landlock, the same writable roots) and returns it with
  the scrubbed environment, for a long-lived process its caller spawns and owns (code mode's
  Python runner). ``danger-full-access`` returns ``argv`` as is.
- ``write_file(path, data, session=…, cwd=…, create=…)`` writes a file exactly as ``write`` and
  ``edit`` do (``files.write_bytes``: the tier's writable roots, ``openat2`` beneath the root), for
  another plugin's editing tool (str-replace-editor); a refused path raises ``WriteDenied``.
- ``run(argv, session=…, …)`` runs one command to its end through the *session's* warm confined
  command server (a fork and an exec, no launcher: a hook costs what a ``bash`` call costs), with
  ``stdin`` fed and stdout/stderr captured apart.

With no usable mechanism a confined mode refuses (``ToolError`` ``SANDBOX_UNAVAILABLE``), never
runs unconfined.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from dsh_core import ToolError
from dsh_core.contracts import ConfinedCommand, ConfinedRun
from dsh_core.errors import WriteDenied

from .files import write_bytes
from .fspath import PathDenied
from .mechanisms import get_runner
from .policy import scrubbed_env, wider, writable_roots
from .sandbox import Sandbox, sandbox_for

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent

Confined = ConfinedCommand  # the name this module used before the seam moved into the spine


class SandboxConfinement:
    """``protocols.Confinement`` over one host's Sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    @property
    def default_mode(self) -> str:
        """The tier this deployment runs sessions in when they chose none."""
        return self.sandbox.settings.mode

    async def describe(self, session: Agent) -> str:
        """``workspace-write (landlock)``: the tier ``session``'s calls run in and the mechanism."""
        mode = self.sandbox.mode_for(session)
        if mode == "danger-full-access":
            return f"{mode} (unconfined)"
        probe = await get_runner(self.sandbox.settings.mechanism)
        return f"{mode} ({probe.runner.name if probe.runner is not None else 'no sandbox mechanism: commands refused'})"

    async def confine(self, argv: list[str], *, cwd: str, mode: str | None = None,
                      session: Agent | None = None) -> ConfinedCommand:
        settings = self.sandbox.settings
        if session is not None:  # the session's tier; an asked-for mode only narrows it
            tier = self.sandbox.mode_for(session)
            mode = mode if mode is not None and wider(tier, mode) else tier
        mode = mode or settings.mode
        real = os.path.realpath(cwd)
        env = scrubbed_env(mode=mode)
        if mode == "danger-full-access":
            return ConfinedCommand(argv=list(argv), env=env, mode=mode, mechanism=None)
        probe = await get_runner(settings.mechanism)
        runner = probe.runner
        if runner is None:
            raise ToolError(
                f'sandbox mode "{mode}" is requested but no sandbox backend is usable on this host; refusing to run '
                f"unconfined. Tried: {probe.summary()}. Fix: install bubblewrap (apt-get install bubblewrap) or use "
                "a kernel with Landlock.",
                code="SANDBOX_UNAVAILABLE",
            )
        roots = writable_roots(mode, real, self.sandbox.extra_roots(session), resolved=True)  # (real: resolved above)
        return ConfinedCommand(argv=runner.wrap(list(argv), roots, real), env=env, mode=mode,
                               mechanism=runner.name, denial=runner.denial)

    async def write_file(self, path: str, data: bytes, *, session: Agent, cwd: str, create: bool) -> int:
        mode = self.sandbox.mode_for(session)
        roots = self.sandbox.write_roots(mode, cwd, session)
        try:
            _, mtime = await anyio.to_thread.run_sync(
                lambda: write_bytes(path, data, roots, create=create, label=mode))
        except PathDenied as exc:
            raise WriteDenied(path, mode, exc.reason) from None
        return mtime

    async def run(
        self, argv: list[str], *, session: Agent, cwd: str, stdin: bytes = b"",
        env: Mapping[str, str] | None = None, timeout_s: float, output_limit: int,
    ) -> ConfinedRun:
        mode = self.sandbox.mode_for(session)
        real = os.path.realpath(cwd)
        spill = Path(os.devnull)  # never written: a captured call keeps each stream's head, with no spill file
        result, _ = await self.sandbox.run_argv(
            list(argv), mode=mode, cwd=real, spill=spill, owner=session, timeout_s=timeout_s, limit=output_limit,
            env={**scrubbed_env(mode=mode), **(env or {})}, stdin=stdin, capture=True,
        )
        return ConfinedRun(exit_code=result.exit_code, stdout=result.text, stderr=result.stderr or "",
                           timed_out=result.timed_out)


async def confine(argv: list[str], *, host: Any, cwd: str, mode: str | None = None,
                  session: Any = None) -> ConfinedCommand:
    """``host``'s confinement of ``argv`` (see ``SandboxConfinement.confine``)."""
    return await SandboxConfinement(sandbox_for(host)).confine(argv, cwd=cwd, mode=mode, session=session)
