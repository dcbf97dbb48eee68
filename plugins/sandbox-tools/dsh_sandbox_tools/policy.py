"""Permission tiers, settings, writable roots and the scrubbed environment."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsh_core import ConfigError
from dsh_core.hardening import is_credential_name as _is_credential_name

PLUGIN = "sandbox-tools"
MODES = ("read-only", "workspace-write", "danger-full-access")
DEFAULT_MODE = "workspace-write"
MECHANISMS = ("auto", "bwrap", "landlock", "none")
_RANK = {m: i for i, m in enumerate(MODES)}


def wider(target: str, current: str) -> bool:
    """True when ``target`` grants strictly more than ``current``."""
    return _RANK[target] > _RANK[current]


@dataclass
class Settings:
    """One host's settings. Env (``DSH_PERMISSION_MODE``, ``DSH_SANDBOX_MECHANISM``) wins over config."""

    mode: str = DEFAULT_MODE
    mechanism: str = "auto"  # auto | bwrap | landlock | none (none: force "sandbox unavailable")
    max_output_bytes: int = 30_000
    default_timeout_ms: int = 120_000
    max_timeout_ms: int = 600_000
    spill_dir: Path | None = None  # default: $DSH_HOME/spill

    @classmethod
    def from_config(cls, table: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        table = dict(table or {})
        known = {"permission-mode", "mechanism", "max-output-bytes", "timeout-ms", "max-timeout-ms", "spill-dir"}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ConfigError(
                f"[config.{PLUGIN}]: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}"
            )
        mode = env.get("DSH_PERMISSION_MODE") or table.get("permission-mode") or DEFAULT_MODE
        if mode not in MODES:
            raise ConfigError(
                f"{PLUGIN}: permission mode {mode!r} (DSH_PERMISSION_MODE or [config.{PLUGIN}] permission-mode) "
                f"is not one of {', '.join(MODES)}"
            )
        mech = env.get("DSH_SANDBOX_MECHANISM") or table.get("mechanism") or "auto"
        if mech not in MECHANISMS:
            raise ConfigError(
                f"{PLUGIN}: sandbox mechanism {mech!r} (DSH_SANDBOX_MECHANISM or [config.{PLUGIN}] mechanism) "
                f"is not one of {', '.join(MECHANISMS)}"
            )
        s = cls(mode=mode, mechanism=mech)
        for key, attr in (("max-output-bytes", "max_output_bytes"), ("timeout-ms", "default_timeout_ms"),
                          ("max-timeout-ms", "max_timeout_ms")):
            if key in table:
                v = table[key]
                if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                    raise ConfigError(f"[config.{PLUGIN}] {key} must be a positive integer, got {v!r}")
                setattr(s, attr, v)
        if "spill-dir" in table:
            s.spill_dir = Path(str(table["spill-dir"]))
        return s

    def spill_root(self) -> Path:
        if self.spill_dir is not None:
            return self.spill_dir
        from dsh_core.spill import default_root

        return default_root()


def temp_roots() -> list[str]:
    """The platform temp areas that workspace-write also opens (canonical, existing, deduplicated)."""
    out: list[str] = []
    for p in ("/tmp", tempfile.gettempdir()):
        try:
            rp = os.path.realpath(p)
        except OSError:
            continue
        if os.path.isdir(rp) and rp not in out:
            out.append(rp)
    return out


def writable_roots(mode: str, root: str) -> list[str]:
    """Directories writable under ``mode`` for a session rooted at ``root`` (canonical paths)."""
    if mode == "read-only":
        return []
    roots = [os.path.realpath(root), *temp_roots()]
    out: list[str] = []
    for r in roots:
        if r not in out:
            out.append(r)
    return out


# Variables a command never needs and a leaked key must never reach: the spine's one pattern.
is_credential_name = _is_credential_name


def scrubbed_env(environ: Mapping[str, str] | None = None, *, mode: str = DEFAULT_MODE) -> dict[str, str]:
    """The environment a command sees: the harness's, minus credential-shaped variables."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if not is_credential_name(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["DSH_SANDBOX"] = mode
    env.setdefault("PAGER", "cat")
    env.setdefault("GIT_PAGER", "cat")
    return env
