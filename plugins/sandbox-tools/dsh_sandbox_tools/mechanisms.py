"""The kernel confinement runners (bubblewrap, then Landlock) and the one-time probe.

A runner turns ``(argv, writable roots)`` into a confined argv. The probe runs a real
confined command once per process and mechanism preference: it must be able to write in
a granted directory *and* be refused beside it. No working runner → ``None``, and the
confined tiers refuse to run commands ("sandbox unavailable"), never run unconfined.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from dsh_core.paths import credentials_home, find_program

from . import _landlock_exec

PARTIAL_NOTICE = _landlock_exec.PARTIAL_NOTICE
LAUNCHER = str(Path(_landlock_exec.__file__).resolve())


@dataclass(frozen=True)
class Runner:
    name: str  # "bwrap" | "landlock"
    detail: str = ""  # e.g. "Landlock ABI 7"
    partial: bool = False
    denial: str = ""  # how a denied write reads: EROFS for bwrap, EACCES for Landlock

    def wrap(self, argv: list[str], roots: list[str], cwd: str, *, probe: bool = False) -> list[str]:
        if self.name == "bwrap":
            return bwrap_argv(argv, roots, cwd, probe=probe)
        return landlock_argv(argv, roots)


def bwrap_argv(argv: list[str], roots: list[str], cwd: str, *, probe: bool = False) -> list[str]:
    """``probe``: the one-time probe (``dsh doctor`` too), which creates nothing."""
    bwrap = bwrap_path() or FALLBACK_BWRAP
    # --cap-drop ALL matters when the harness runs as root: bwrap otherwise keeps every capability
    # inside, and CAP_SYS_ADMIN can simply `mount -o remount,rw /`.
    out = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--proc", "/proc", "--die-with-parent",
           "--cap-drop", "ALL"]
    # Parents before children, so a nested root is bound on top of its parent's bind.
    for r in sorted(roots, key=lambda p: (p.count("/"), p)):
        out += ["--bind", r, r]
    secrets = str(credentials_home())
    if not probe and not os.path.isdir(secrets):
        # made now (empty, owner-only) so that a key `dsh auth login` stores while this sandbox runs
        # lands under the tmpfs too: / is bound live, and a directory made later would show through
        with contextlib.suppress(OSError):
            os.makedirs(secrets, mode=0o700, exist_ok=True)
    if os.path.isdir(secrets):  # a login's stored key: an empty directory in its place, over any bind
        out += ["--tmpfs", secrets]  # (Landlock grants reads beside it instead: landlock_rules)
    out += ["--chdir", cwd, "--", *argv]
    return out


FALLBACK_BWRAP = "/usr/bin/bwrap"  # named when PATH has none: absolute, so never looked up anywhere else


def bwrap_path() -> str | None:
    """bwrap as PATH finds it through its absolute directories only, or None
    (``dsh_core.paths.find_program``: a ``bwrap`` in the directory of the moment, which may be a
    repository someone else wrote, would run unconfined as the sandbox itself, and could pass the
    probe)."""
    return find_program("bwrap")


def landlock_rules(roots: list[str]) -> list[str]:
    """The Landlock launcher's (and the command server's) rule arguments: write beneath ``roots``
    and to /dev/null, and read everything but the stored-credentials directory (``--hide``: Landlock
    only grants, so the launcher grants reads beside it; see ``_landlock_exec.hide_rules``)."""
    out: list[str] = []
    for r in roots:
        out += ["--rw", r]
    return [*out, "--rw-file", "/dev/null", "--hide", str(credentials_home())]


def landlock_argv(argv: list[str], roots: list[str]) -> list[str]:
    return [sys.executable, "-I", "-S", LAUNCHER, *landlock_rules(roots), "--", *argv]


@dataclass
class ProbeResult:
    runner: Runner | None
    attempts: dict[str, str] = field(default_factory=dict)  # mechanism -> outcome

    def summary(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in self.attempts.items()) or "no mechanism tried"


def _probe_one(runner: Runner) -> str | None:
    """Run a real confined command; None when it confines correctly, else what went wrong."""
    with tempfile.TemporaryDirectory(prefix="dsh-sandbox-probe-") as d:
        inside, beside = os.path.join(d, "in"), os.path.join(d, "out")
        os.mkdir(inside)
        os.mkdir(beside)
        # The probe also tries to undo the confinement (remount / read-write) before writing beside.
        script = (
            'echo ok > "$1/probe"; mount -o remount,rw / >/dev/null 2>&1; mount -o remount,bind,rw / >/dev/null 2>&1; '
            'echo bad > "$2/probe" 2>/dev/null; exit 0'
        )
        argv = runner.wrap(["/bin/sh", "-c", script, "sh", inside, beside], [inside], inside, probe=True)
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=20, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"cannot start ({exc})"
        if not os.path.exists(os.path.join(inside, "probe")):
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            return f"cannot start (exit {proc.returncode}: {err[-1] if err else 'no output'})"
        if os.path.exists(os.path.join(beside, "probe")):
            return "started but did not confine writes"
    return None


def probe(preference: str = "auto") -> ProbeResult:
    """Pick the first mechanism that really confines. Blocking; call it from a worker thread."""
    result = ProbeResult(runner=None)
    if preference == "none":
        result.attempts["none"] = "sandbox disabled by configuration"
        return result
    if preference in ("auto", "bwrap"):
        if bwrap_path() is None:
            result.attempts["bwrap"] = "not installed (Debian package: bubblewrap)"
        else:
            r = Runner("bwrap", detail="bubblewrap", denial="Read-only file system")
            err = _probe_one(r)
            result.attempts["bwrap"] = err or "ok"
            if err is None:
                result.runner = r
                return result
    if preference in ("auto", "landlock"):
        abi = _landlock_exec.abi_version()
        if abi < 1:
            result.attempts["landlock"] = "not available in this kernel"
        else:
            r = Runner("landlock", detail=f"Landlock ABI {abi}", partial=abi < 3, denial="Permission denied")
            err = _probe_one(r)
            result.attempts["landlock"] = err or f"ok (ABI {abi})"
            if err is None:
                result.runner = r
    return result


_cache: dict[str, ProbeResult] = {}
_lock = threading.Lock()


def probe_cached(preference: str) -> ProbeResult:
    with _lock:
        if preference not in _cache:
            _cache[preference] = probe(preference)
        return _cache[preference]


async def get_runner(preference: str) -> ProbeResult:
    """The probe result for this preference, probed once per process (lazily, on first use)."""
    cached = _cache.get(preference)
    if cached is not None:
        return cached
    return await anyio.to_thread.run_sync(probe_cached, preference)
