"""Permission tiers, settings, writable roots and the scrubbed environment."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from msgspec import Meta

from dsh_core import ConfigError
from dsh_core.config import PluginConfig, decode
from dsh_core.hardening import is_credential_name as _is_credential_name

PLUGIN = "sandbox-tools"
MODES = ("read-only", "workspace-write", "danger-full-access")
# A session's own mode (``Agent.settings.mode``, as an editor picks it) -> the tier it runs in
SESSION_TIERS = {"read-only": "read-only", "plan": "read-only", "workspace-write": "workspace-write",
                 "full-access": "danger-full-access"}
DEFAULT_MODE: Literal["workspace-write"] = "workspace-write"
MECHANISMS = ("auto", "bwrap", "landlock", "none")
_RANK = {m: i for i, m in enumerate(MODES)}


def wider(target: str, current: str) -> bool:
    """True when ``target`` grants strictly more than ``current``."""
    return _RANK[target] > _RANK[current]


Positive = Annotated[int, Meta(gt=0)]


class SandboxConfig(PluginConfig):
    """[config.sandbox-tools] (DSH_PERMISSION_MODE and DSH_SANDBOX_MECHANISM win over the first two keys)"""

    permission_mode: Annotated[Literal["read-only", "workspace-write", "danger-full-access"], Meta(
        description="the tier commands and file tools run in")] = DEFAULT_MODE
    mechanism: Annotated[Literal["auto", "bwrap", "landlock", "none"], Meta(
        description="auto: bubblewrap, else Landlock; none: the confined tiers refuse to run commands")] = "auto"
    max_output_bytes: Annotated[Positive, Meta(description="bytes of a command's output the model sees")] = 30_000
    timeout_ms: Annotated[Positive, Meta(description="a command's default timeout")] = 120_000
    max_timeout_ms: Annotated[Positive, Meta(description="the longest timeout a call may ask for")] = 600_000
    spill_dir: Annotated[str | None, Meta(description="where full outputs go (default $DSH_HOME/spill)")] = None
    bash: Annotated[bool, Meta(description=(
        "offer the one-shot `bash` tool; false when another plugin offers a `bash` (the terminal plugin's "
        "persistent one): the confinement and the file tools stay"))] = True


@dataclass
class Settings:
    """One host's settings. Env (``DSH_PERMISSION_MODE``, ``DSH_SANDBOX_MECHANISM``) wins over config."""

    mode: str = DEFAULT_MODE
    mechanism: str = "auto"  # auto | bwrap | landlock | none (none: force "sandbox unavailable")
    max_output_bytes: int = 30_000
    default_timeout_ms: int = 120_000
    max_timeout_ms: int = 600_000
    spill_dir: Path | None = None  # default: $DSH_HOME/spill
    bash: bool = True  # offer the one-shot ``bash`` tool

    @classmethod
    def from_typed(cls, config: SandboxConfig, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        mode = env.get("DSH_PERMISSION_MODE") or config.permission_mode
        if mode not in MODES:
            raise ConfigError(f"{PLUGIN}: permission mode {mode!r} (DSH_PERMISSION_MODE) is not one of {', '.join(MODES)}")
        mech = env.get("DSH_SANDBOX_MECHANISM") or config.mechanism
        if mech not in MECHANISMS:
            raise ConfigError(
                f"{PLUGIN}: sandbox mechanism {mech!r} (DSH_SANDBOX_MECHANISM) is not one of {', '.join(MECHANISMS)}")
        return cls(mode=mode, mechanism=mech, max_output_bytes=config.max_output_bytes,
                   default_timeout_ms=config.timeout_ms, max_timeout_ms=config.max_timeout_ms,
                   spill_dir=Path(config.spill_dir) if config.spill_dir is not None else None, bash=config.bash)

    @classmethod
    def from_config(cls, table: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from a raw table and the environment (ConfigError naming the key when bad)."""
        return cls.from_typed(decode(PLUGIN, SandboxConfig, table, where="example"), environ)

    def spill_root(self) -> Path:
        if self.spill_dir is not None:
            return self.spill_dir
        raw = environ_data()
        if raw is not None:  # on every bash call: three C lookups, where os.environ.get was ~15 Python calls
            key: tuple[Any, ...] = (raw.get(b"DSH_HOME"), raw.get(b"XDG_DATA_HOME"), raw.get(b"HOME"))
        else:
            key = (os.environ.get("DSH_HOME"), os.environ.get("XDG_DATA_HOME"), os.environ.get("HOME"))
        root = _SPILL_ROOTS.get(key)
        if root is None:
            from dsh_core.spill import default_root

            root = default_root()
            if not key[0] or os.path.isabs(os.path.expanduser(key[0])):  # else it depends on the cwd
                _SPILL_ROOTS[key] = root
        return root


# The default spill root by the environment it is made from (DSH_HOME, XDG_DATA_HOME, HOME): made
# again only when one of them changed (platformdirs and Path.absolute cost ~20 µs a call, per call).
_SPILL_ROOTS: dict[tuple[Any, ...], Path] = {}


def environ_data() -> dict[bytes, bytes] | None:
    """The process environment as ``os.environ`` keeps it (bytes names and values on POSIX), to
    read a few variables on a hot path with C lookups (``os.environ.get`` is ~5 Python calls: a
    mapping method, an encode of the name and a decode of the value); None where it is not that."""
    raw = getattr(os.environ, "_data", None)
    return raw if isinstance(raw, dict) else None


def temp_roots() -> list[str]:
    """The platform temp areas that workspace-write also opens (canonical, existing, deduplicated).

    Each is resolved once per process (by the temp dir's name): a symlinked ``TMPDIR`` that a
    command retargets later does not move what later calls open. Whether it exists is checked
    on every call."""
    tmp = tempfile.gettempdir()
    real = _TEMP_REAL.get(tmp)
    if real is None:
        real = []
        for p in ("/tmp", tmp):
            try:
                real.append(os.path.realpath(p))
            except OSError:
                continue
        _TEMP_REAL[tmp] = real
    out: list[str] = []
    for rp in real:
        if rp not in out and os.path.isdir(rp):
            out.append(rp)
    return out


_TEMP_REAL: dict[str, list[str]] = {}  # the temp dir's name -> "/tmp" and it, resolved (see temp_roots)


def writable_roots(mode: str, root: str, extra: Sequence[str] = (), *, resolved: bool = False) -> list[str]:
    """Directories writable under ``mode`` for a session rooted at ``root`` (canonical paths);
    ``extra``: the session's additional directories, roots beside ``root`` in the same tier;
    ``resolved``: ``root`` is canonical already, the caller resolved it in this very call (the
    bash tool: a second realpath of it was ~20 Python calls a command, bench/profile_prompt.py --bash)."""
    if mode == "read-only":
        return []
    roots = [root if resolved else os.path.realpath(root), *(os.path.realpath(r) for r in extra), *temp_roots()]
    out: list[str] = []
    for r in roots:
        if r not in out:
            out.append(r)
    return out


# Variables a command never needs and a leaked key must never reach: the spine's one pattern.
is_credential_name = _is_credential_name


_SCRUBBED: dict[str, tuple[Any, dict[str, str]]] = {}  # mode -> (the environment it was made from, the result)


def scrubbed_env(environ: Mapping[str, str] | None = None, *, mode: str = DEFAULT_MODE) -> dict[str, str]:
    """The environment a command sees: the harness's, minus credential-shaped variables (for the
    harness's own environment, made again only when that changed: it is on every call's path)."""
    if environ is None:
        raw = environ_data()
        now = tuple(raw.items()) if raw is not None else None
        known = _SCRUBBED.get(mode)
        if now is not None and known is not None and known[0] == now:
            return dict(known[1])
        env = _scrub(os.environ, mode)
        if now is not None:
            _SCRUBBED[mode] = (now, env)
        return dict(env)
    return _scrub(environ, mode)


def _scrub(environ: Mapping[str, str], mode: str) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if not is_credential_name(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["DSH_SANDBOX"] = mode
    env.setdefault("PAGER", "cat")
    env.setdefault("GIT_PAGER", "cat")
    return env
