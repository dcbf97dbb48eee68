"""One host's sandbox: its settings, the one-shot escalation through the approval seam, and
running a command confined (through the session's command server, or a fresh confined process)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from dsh_core import ToolError
from dsh_core.contracts import ReadRecords  # the spine's slot: other editing tools share it

from .mechanisms import Runner, get_runner
from .policy import MODES, SESSION_TIERS, Settings, scrubbed_env, wider, writable_roots
from .run import CommandResult, run_command
from .server import CommandServer, ServerError, ServerPool, server_argv

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import Host
    from dsh_core.types import FileChange

@dataclass
class HostSandbox:
    """The host's Sandbox (its state slot), set by ``dsh_configure``: two hosts in one process
    never see each other's, and this plugin keeps no module state."""

    sandbox: Sandbox | None = None


class Sandbox:
    """One host's sandbox state: settings, and per-agent read records (for ``edit``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.servers = ServerPool()

    def mode_for(self, agent: Any) -> str:
        """The tier ``agent``'s calls run in: the session's own mode when it chose one
        (``Agent.configure``: ``plan`` runs read-only, ``full-access`` unconfined), else this
        deployment's."""
        chosen = getattr(getattr(agent, "settings", None), "mode", None)
        return SESSION_TIERS.get(chosen, self.settings.mode) if chosen else self.settings.mode

    @staticmethod
    def extra_roots(agent: Any) -> tuple[str, ...]:
        """``agent``'s additional directories (``AgentSpec.additional_directories``: an editor's
        ``additionalDirectories``): roots beside its workspace, in the same tier."""
        return tuple(getattr(getattr(agent, "spec", None), "additional_directories", ()) or ())

    def reads(self, agent: Any) -> dict[str, int]:
        records: ReadRecords = agent.state(ReadRecords)
        return records

    def escalation_targets(self, mode: str | None = None) -> list[str]:
        """The tiers wider than ``mode`` (the session's current one), else than this deployment's."""
        return [m for m in MODES if wider(m, mode or self.settings.mode)]

    # -------------------------------------------------------------- escalation

    def escalation_params(self) -> dict[str, Any]:
        targets = self.escalation_targets()
        if not targets:
            return {}
        return {
            "sandbox_permissions": {
                "type": "string",
                "enum": targets,
                "description": "Only when this one call needs a wider sandbox tier than the current "
                f'"{self.settings.mode}"; a person approves or rejects it once. Requires justification.',
            },
            "justification": {
                "type": "string",
                "description": "Why this call needs the wider tier (shown to the approver). Required with sandbox_permissions.",
            },
        }

    async def effective_mode(self, args: dict[str, Any], ctx: ToolContext, what: str,
                             change: FileChange | None = None) -> str:
        """The tier this call runs with; asks the approval seam (one-shot) for a wider one
        (showing ``change``, a file tool's change, when it gives one)."""
        target = args.get("sandbox_permissions")
        justification = args.get("justification")
        mode = self.mode_for(ctx.agent)
        if target is None and justification is None:
            return mode
        if getattr(getattr(ctx.agent, "settings", None), "mode", None) == "plan":
            raise ToolError("the session is in plan mode: only reads run until the plan is approved "
                            "(exit_plan_mode); call again without sandbox_permissions", code="PLAN_MODE")
        if target is None or not isinstance(justification, str) or not justification.strip():
            raise ToolError(
                "sandbox_permissions and justification go together: give both (justification must not be blank), "
                "or neither to run in the current tier",
                code="INVALID_ARGUMENTS",
            )
        if target not in MODES:
            raise ToolError(f"sandbox_permissions must be one of {', '.join(MODES)}", code="INVALID_ARGUMENTS")
        if not wider(target, mode):
            if mode == "danger-full-access":
                raise ToolError(
                    "this deployment already runs without confinement (danger-full-access); "
                    "call again without sandbox_permissions",
                    code="INVALID_ARGUMENTS",
                )
            raise ToolError(
                f'sandbox_permissions "{target}" is not wider than the current mode "{mode}"; '
                "call again without it",
                code="INVALID_ARGUMENTS",
            )
        call = {k: v for k, v in args.items() if k not in ("sandbox_permissions", "justification")}
        outcome = await ctx.approve(
            f"escalate sandbox to {target}: {justification.strip()}",
            kind="execute" if what == "command" else "edit",  # bash runs; write/edit modify files
            subject=args.get("command") if what == "command" else args.get("file_path"),
            args=call,
            tier=target,
            justification=justification.strip(),
            change=change,
        )
        if outcome == "allowed-once":
            return target
        if outcome == "rejected":
            who = "an approval policy refused" if ctx.decided_by == "policy" else "the user rejected"
            raise ToolError(
                f'{who} escalating this {what} to "{target}"; nothing was run. '
                f'Work within "{mode}" mode or ask the user how to proceed.',
                code="ESCALATION_REJECTED",
            )
        if outcome == "cancelled":
            raise ToolError(f'approval for escalating to "{target}" was cancelled; nothing was run.',
                            code="ESCALATION_CANCELLED")
        raise ToolError(
            f'escalating this {what} to "{target}" requires approval, but no approval channel is available; '
            f'nothing was run. Work within "{mode}" mode.',
            code="APPROVAL_UNAVAILABLE",
        )

    def hint(self, mode: str) -> str:
        """The escalation note appended to a denied write (empty when escalation is not offered)."""
        nxt = self.escalation_targets(mode)
        if not nxt:
            return ""
        opts = " or ".join(f'"{m}"' for m in nxt)
        return (
            f"[sandbox: escalation available — retry this exact call once with sandbox_permissions={opts} "
            "(danger-full-access for paths outside the workspace) and a justification, only if the write is "
            "really needed]"
        )

    def write_roots(self, mode: str, cwd: str, agent: Any = None) -> list[str] | None:
        """Where a file tool may write (None: anywhere, danger-full-access): ``cwd``, the temp
        areas and ``agent``'s additional directories, unless the tier is read-only."""
        return None if mode == "danger-full-access" else writable_roots(mode, cwd, self.extra_roots(agent))

    # -------------------------------------------------------------- running commands

    async def runner_for(self, mode: str) -> Runner | None:
        """The confinement for ``mode`` (None: danger-full-access); refuses when none works."""
        if mode == "danger-full-access":
            return None
        probe = await get_runner(self.settings.mechanism)
        if probe.runner is None:
            raise ToolError(
                f'sandbox mode "{mode}" is requested but no sandbox backend is usable on this host; '
                f"refusing to run the command unconfined. Tried: {probe.summary()}. "
                "Fix: install bubblewrap (apt-get install bubblewrap) or use a kernel with Landlock; "
                "only on a disposable machine set DSH_PERMISSION_MODE=danger-full-access.",
                code="SANDBOX_UNAVAILABLE",
            )
        return probe.runner

    async def run_argv(
        self,
        argv: list[str],
        *,
        mode: str,
        cwd: str,
        spill: Path | str,
        owner: Any = None,
        timeout_s: float | None = None,
        limit: int | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        capture: bool = False,
        sink: Any = None,
        stop: anyio.Event | None = None,
        lifeline: bool = False,
        workspace: str | None = None,
        split: bool = False,
        tap: Callable[[bytes], None] | None = None,
        resolved: bool = False,
    ) -> tuple[CommandResult, Runner | None]:
        """Run any ``argv`` in ``cwd`` confined by ``mode``; returns the result and the runner used.

        Calls in the configured mode of a session (``owner``: its agent) go through that
        session's command server (a fork per call; unconfined in danger-full-access, where the
        server is there for its reaper); escalated one-shot calls, and calls without an owner,
        start a fresh (confined) process (``Runner.wrap``). Either way, when this returns (or is
        cancelled) no process of the call is alive.

        ``lifeline`` (a background job): always through a command server, so that the call's
        reaper kills everything it started even if this process is killed outright — the
        session's (an unconfined one in danger-full-access), or one of its own for an escalated
        call, ended with it. ``sink`` takes the output instead of the bounded spill sink;
        ``stop`` ends the command early (SIGTERM, then SIGKILL). ``workspace``: the session's
        directory, whose writable roots confine the call when ``cwd`` is another directory inside
        it (the bash tool's ``workdir``); ``split``: stdout and stderr apart (``CommandResult.stderr``);
        ``tap``: also sees every chunk of output as it arrives (the bash tool's live view);
        ``resolved``: ``workspace`` is canonical, resolved by the caller in this call (not again).
        """
        s = self.settings
        runner = await self.runner_for(mode)
        env = scrubbed_env(mode=mode) if env is None else env
        timeout_s = s.default_timeout_ms / 1000 if timeout_s is None else timeout_s
        limit = s.max_output_bytes if limit is None else limit
        io: dict[str, Any] = {"stdin": stdin, "capture": capture, "split": split, "tap": tap}
        workspace = cwd if workspace is None else workspace
        roots = writable_roots(mode, workspace, self.extra_roots(owner), resolved=resolved) if runner is not None else []
        one_shot = owner is None or mode != self.mode_for(owner)
        if one_shot and not lifeline:  # a fresh (confined) process
            if runner is not None:
                argv = runner.wrap(argv, roots, cwd)
            return await run_command(argv, cwd=cwd, env=env, timeout_s=timeout_s, limit=limit, spill=spill,
                                     **io), runner
        # Through a command server: the session's (confined, or in danger-full-access an unconfined
        # one, whose reaper still ends the call's whole tree when this process dies, even by SIGKILL),
        # or, for a background job in a one-shot tier, one of its own that ends with it.
        io.update(sink=sink, stop=stop)
        label = (runner.detail or runner.name) if runner is not None else "unconfined"

        def make() -> CommandServer:
            return CommandServer(lambda fd: server_argv(runner, roots, workspace, fd), env=scrubbed_env(mode=mode),
                                 cwd=workspace)

        def unavailable(exc: ServerError) -> ToolError:
            return ToolError(f'sandbox mode "{mode}" could not be applied ({label} command server: {exc}); '
                             "refusing to run the command unconfined.", code="SANDBOX_UNAVAILABLE")

        def failed(exc: ServerError) -> ToolError:
            return ToolError(f"the sandbox command server failed: {exc}", code="SANDBOX_FAILED")

        if one_shot:
            own = make()
            try:
                await own.start()
            except ServerError as exc:
                raise unavailable(exc) from None
            try:
                return await own.run(argv, cwd=cwd, env=env, timeout_s=timeout_s, limit=limit, spill=spill,
                                     **io), runner
            except ServerError as exc:
                raise failed(exc) from None
            finally:
                await own.aclose()
        key = (getattr(owner, "session_id", id(owner)), runner.name if runner is not None else "none", tuple(roots))
        for attempt in (1, 2):
            try:
                server = await self.servers.get(key, owner, make)
            except ServerError as exc:
                raise unavailable(exc) from None
            try:
                return await server.run(argv, cwd=cwd, env=env, timeout_s=timeout_s, limit=limit, spill=spill,
                                        **io), runner
            except ServerError as exc:
                await self.servers.discard(key)
                if attempt == 2 or not exc.before_start:  # lost mid-call: never run the command twice
                    raise failed(exc) from None
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self.servers.aclose()


def sandbox_for(host: Host | None) -> Sandbox:
    """``host``'s Sandbox, as ``dsh_configure`` set it up; for a host that does not mount this
    plugin (or none), a fresh one with the default settings (``DSH_PERMISSION_MODE`` and co.)."""
    sb = host.state(HostSandbox).sandbox if host is not None else None
    return sb if sb is not None else Sandbox(Settings.from_config(None))
