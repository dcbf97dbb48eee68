"""``dsh doctor``: can this machine serve an example (by default ``acp-agent``)?

The spine checks what it owns — the example's plugins (installed or not, with the pip
command), its default route, the data dir and its free space — and every plugin the
example mounts may add checks of its own through ``dsh_register_doctor_checks`` (the
sandbox-tools plugin runs its real sandbox probe there; deepseek-model says whether an
API key is present). The spine never imports a plugin. A ``fail`` finding means the
example cannot serve here: exit 1. ``warn`` is worth reading but does not stop it.
Nothing here writes to disk or prints a secret.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .errors import DshError

# Finding is what a DoctorCheck returns, so it is defined beside that seam; re-exported here.
from .protocols import Finding as Finding
from .protocols import Status as Status

if TYPE_CHECKING:  # pragma: no cover
    from .protocols import DoctorCheck

LOW_SPACE = 100 * 1024 * 1024  # below this free in the data dir's file system: warn


@dataclass(frozen=True)
class ExampleStatus:
    name: str
    plugins: list[str]
    missing: list[str]
    install: list[str]  # one pip command per missing plugin


@dataclass
class Report:
    example: str
    findings: list[Finding] = field(default_factory=list)
    examples: list[ExampleStatus] = field(default_factory=list)

    @property
    def can_serve(self) -> bool:
        return not any(f.status == "fail" for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "example": self.example,
            "can_serve": self.can_serve,
            "checks": [asdict(f) for f in self.findings],
            "examples": [asdict(e) for e in self.examples],
        }

    def render(self) -> str:
        width = max([len(f.subject) for f in self.findings] + [8])
        lines = [f"dsh doctor: can this machine serve the example {self.example!r}?", ""]
        for f in self.findings:
            lines.append(f"  {f.status:<4}  {f.subject:<{width}}  {f.detail}")
            if f.fix:
                lines.append(f"        {'':<{width}}  fix: {f.fix}")
        lines += ["", "examples (plugins each one mounts; * = not installed):"]
        name_width = max([len(e.name) for e in self.examples] + [8])
        for e in self.examples:
            plugins = ", ".join(p + ("*" if p in e.missing else "") for p in e.plugins)
            lines.append(f"  {'ready' if not e.missing else 'needs':<5}  {e.name:<{name_width}}  {plugins}")
            lines += [f"         {'':<{name_width}}  {cmd}" for cmd in e.install]
        verdict = "can serve" if self.can_serve else "cannot serve"
        lines += ["", f"{self.example}: {verdict} on this machine (exit {0 if self.can_serve else 1})"]
        return "\n".join(lines)


def _data_dir_finding() -> Finding:
    from .paths import data_home

    home = data_home()
    where = "DSH_HOME" if os.environ.get("DSH_HOME") else "default"
    existing = home
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK) or not existing.is_dir():
        return Finding(
            "data dir", "fail", f"{home} ({where}) is not writable here (nearest existing: {existing})",
            "set DSH_HOME to a writable directory",
        )
    free = shutil.disk_usage(existing).free
    state = "exists" if existing == home else "created on first use"
    detail = f"{home} ({where}; {state}), {_size(free)} free"
    if free < LOW_SPACE:
        return Finding("data dir", "warn", detail, "free some space or set DSH_HOME elsewhere")
    return Finding("data dir", "ok", detail)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _examples(installed: set[str]) -> list[ExampleStatus]:
    from .compose import available_examples, load_composition
    from .host import install_fix

    out = []
    for name, path in available_examples().items():
        try:
            comp = load_composition(str(path))
        except DshError:
            continue  # a broken manifest shows up when that example is doctored or run
        missing = [p for p in comp.plugins if p not in installed]
        out.append(ExampleStatus(name, list(comp.plugins), missing, [install_fix(missing)] if missing else []))
    return out


async def examine(example: str) -> Report:
    """Build (but do not start) a host for ``example`` from its installed plugins and run every check."""
    from . import __version__
    from .compose import load_composition
    from .host import Host, install_fix, installed_plugins, load_plugins, make_plugin_manager

    comp = load_composition(example)
    report = Report(comp.name)
    add = report.findings.append
    add(Finding("dsh", "ok", f"{__version__} on Python {sys.version.split()[0]} ({sys.executable})"))

    installed = set(installed_plugins())
    missing = [p for p in comp.plugins if p not in installed]
    if missing:
        add(Finding(
            "plugins", "fail", f"not installed: {', '.join(missing)} (mounts {len(comp.plugins)})",
            install_fix(missing),
        ))
    else:
        add(Finding("plugins", "ok", f"all {len(comp.plugins)} installed: {', '.join(comp.plugins)}"))

    host: Host | None = None
    pm = make_plugin_manager()
    present = replace(comp, plugins=tuple(p for p in comp.plugins if p in installed))
    try:
        load_plugins(pm, present)
        host = Host(pm, present)
    except DshError as exc:
        add(Finding("plugins", "fail", str(exc)))

    if host is not None:
        try:
            provider, model = host.check_route()
            add(Finding("route", "ok", f"{provider} / {model} (the example's default route)"))
        except DshError as exc:
            add(Finding("route", "fail", str(exc)))
        checks: list[DoctorCheck] = []
        pm.hook.dsh_register_doctor_checks(register=checks.append, host=host)
        for check in checks:
            try:
                add(await check.run())
            except Exception as exc:  # a check that crashes is a finding, not a crash of the doctor
                add(Finding(getattr(check, "name", type(check).__name__), "fail", f"the check failed: {exc!r}"))

    add(_data_dir_finding())
    report.examples = _examples(installed)
    if not any(e.name == comp.name for e in report.examples):  # doctoring a manifest outside the search path
        report.examples.insert(0, ExampleStatus(comp.name, list(comp.plugins), missing,
                                                [install_fix(missing)] if missing else []))
    return report
