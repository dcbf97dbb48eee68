"""``dsh doctor``'s sandbox line: the real probe ``bash`` would use, and what to install."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _landlock_exec
from .mechanisms import get_runner
from .policy import Settings

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.doctor import Finding

INSTALL_BWRAP = "apt-get install -y bubblewrap   (Debian/Ubuntu package: bubblewrap)"
METADATA_GAP = "not confined by Landlock: chmod/chown/touch of files outside the writable roots (contents are)"


class SandboxCheck:
    name = "sandbox"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def run(self) -> Finding:
        from dsh_core.doctor import Finding

        mode, mech = self.settings.mode, self.settings.mechanism
        result = await get_runner(mech)  # the same probe, run once per process, that bash uses
        tried = result.summary()
        bwrap_missing = result.attempts.get("bwrap", "").startswith("not installed")
        runner = result.runner
        if runner is None:
            if mech == "none":
                fix = "unset DSH_SANDBOX_MECHANISM / [config.sandbox-tools] mechanism"
            elif bwrap_missing or mech == "landlock":
                fix = INSTALL_BWRAP
            else:
                fix = "bubblewrap is installed but cannot start here (are user namespaces allowed?)"
            if mode == "danger-full-access":
                return Finding(self.name, "warn", f"none usable ({tried}); {mode} runs commands unconfined", fix)
            return Finding(self.name, "fail", f"none usable ({tried}); bash refuses every command in {mode} mode", fix)
        detail = f"{runner.detail} confines bash in {mode} mode ({tried})"
        if runner.partial:
            return Finding(self.name, "warn", f"{detail}; partial: {runner.detail} cannot confine truncation",
                           INSTALL_BWRAP)
        if runner.name == "landlock":
            # Landlock (ABI <= 7) has no right for file metadata: chmod, chown and utimes of a file outside
            # the roots are not confined; only bubblewrap's read-only root refuses them (README: Landlock gaps).
            detail += f"; {METADATA_GAP}"
            if bwrap_missing:
                return Finding(self.name, "ok", detail,
                               f"optional, to confine metadata too, for a read-only root and a pid namespace: {INSTALL_BWRAP}")
        return Finding(self.name, "ok", detail)


class IsolationCheck:
    """What confined code is kept from besides files: other processes (signals, ``/proc``)."""

    name = "sandbox-isolation"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def run(self) -> Finding:
        from dsh_core.doctor import Finding

        if self.settings.mode == "danger-full-access":
            return Finding(self.name, "warn", "danger-full-access: commands run unconfined, with dsh's own rights")
        runner = (await get_runner(self.settings.mechanism)).runner
        if runner is None:
            return Finding(self.name, "warn", "no sandbox: nothing to report (see the sandbox line)")
        abi = _landlock_exec.abi_version()
        given = ["capabilities dropped", "dsh's /proc files closed to confined code (non-dumpable)"]
        if runner.name == "bwrap":
            given.insert(0, "pid namespace (confined code sees and signals only its own processes)")
            return Finding(self.name, "ok", "; ".join(given))
        given.insert(0, f"Landlock ABI {abi}")
        if _landlock_exec.signal_scoped(abi):
            given.append("signal and abstract-socket scoping (cannot signal dsh or other processes)")
            return Finding(self.name, "ok", "; ".join(given) + "; missing: pid namespace (processes stay visible)",
                           f"optional: {INSTALL_BWRAP}")
        return Finding(
            self.name, "warn",
            "; ".join(given) + f"; missing: signal scoping (needs Landlock ABI {_landlock_exec.SCOPE_ABI}, Linux "
            "6.12+) and a pid namespace: confined code can signal (kill, stop) dsh and other processes of its user",
            f"{INSTALL_BWRAP}, or a Linux 6.12+ kernel",
        )
