"""Where dsh keeps its data, and how the dsh process opens a file inside a workspace."""

from __future__ import annotations

import errno
import functools
import os
import shutil
import stat
from pathlib import Path

import platformdirs


def data_home() -> Path:
    """``$DSH_HOME`` when set (tests, overrides), else platformdirs' per-user data dir.

    Works with the minimal environment ACP clients pass (HOME, LOGNAME, PATH, SHELL,
    TERM, USER). Session logs, attachments and spill files live below it.
    """
    env = os.environ.get("DSH_HOME")
    base = Path(env) if env else Path(platformdirs.user_data_dir("dsh"))
    return base.expanduser().absolute()


def config_home() -> Path:
    """``$DSH_CONFIG_HOME`` when set (tests, overrides), else platformdirs' per-user config dir."""
    env = os.environ
    override = env.get("DSH_CONFIG_HOME")
    if override and not os.path.isabs(os.path.expanduser(override)):  # relative: to the cwd of the moment
        return Path(override).expanduser().absolute()
    return _config_home(override, env.get("XDG_CONFIG_HOME"), env.get("HOME"))


@functools.lru_cache(maxsize=8)
def _config_home(override: str | None, xdg: str | None, home: str | None) -> Path:
    """``config_home`` for these values of the variables it depends on: every confined start asks
    for the credentials directory it hides, and platformdirs' answer took 9 us of it (a bash call's
    or a program's, cold: 20-30 us)."""
    base = Path(override) if override else Path(platformdirs.user_config_dir("dsh"))
    return base.expanduser().absolute()


def find_program(name: str) -> str | None:
    """``name`` as PATH finds it through its absolute directories only, or None. An empty or
    relative entry (``PATH=:/usr/bin``, ``.``) names the directory of the moment: the dsh
    process's may be a repository someone else wrote, and a ``bwrap`` there would run unconfined
    as the sandbox itself. Looked up once per PATH (a lookup stats each entry: most of a confined
    start's 90 us, bench/profile_code_reads.py)."""
    return _find_program(name, os.environ.get("PATH", os.defpath))


@functools.lru_cache(maxsize=16)
def _find_program(name: str, path: str) -> str | None:
    absolute = os.pathsep.join(d for d in path.split(os.pathsep) if os.path.isabs(d))
    return shutil.which(name, path=absolute) if absolute else None


def credentials_home() -> Path:
    """Where a provider's login keeps a credential when no OS keyring is available (files only
    the user can read). Sandboxed commands must not read it: sandbox-tools hides it (a tmpfs over
    it under bubblewrap, reads granted only beside it under Landlock)."""
    return config_home() / "credentials"


def open_inside(root: str | os.PathLike[str], path: str | os.PathLike[str], flags: int = os.O_RDONLY,
                mode: int = 0o600) -> int:
    """Open ``path`` (relative to ``root``, or absolute) as a regular file that lies inside
    ``root``, for plugins that touch a session's workspace from the dsh process itself, outside
    any sandbox (a workspace may be a repository someone else wrote).

    Symlinks are followed only while they stay inside ``root``: the path is resolved first,
    opened with ``O_NOFOLLOW`` (and non-blocking, so a FIFO does not hang the caller), and then
    the descriptor itself is checked — ``/proc/self/fd`` names what was really opened, so a link
    swapped in between the check and the open is caught. Returns the descriptor (``O_CLOEXEC``).
    Raises ``PermissionError`` when the path leads out of ``root``, ``OSError(EINVAL)`` when it
    is not a regular file, and whatever ``os.open`` raises (``FileNotFoundError``, …).
    """
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, path))

    def inside(p: str) -> bool:
        return os.path.commonpath([base, p]) == base and p != base

    if not inside(target):
        raise PermissionError(errno.EACCES, "leads outside the workspace", os.fspath(path))
    fd = os.open(target, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        if not inside(os.readlink(f"/proc/self/fd/{fd}")):
            raise PermissionError(errno.EACCES, "leads outside the workspace", os.fspath(path))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def dir_inside(requested: object, base: str) -> str:
    """A working directory for a child of a session at ``base``: ``base`` itself (as given) when
    ``requested`` is empty, else that directory resolved against ``base`` and lying inside it.
    ``ValueError`` says why not (not a string, outside, not a directory): a delegate never gets
    a workspace its parent does not have."""
    if requested is None or requested == "":
        return base
    if not isinstance(requested, str):
        raise ValueError("cwd must be a string")
    real = os.path.realpath(base)
    target = os.path.realpath(os.path.join(real, requested))
    if os.path.commonpath([real, target]) != real:
        raise ValueError(f"cwd {requested!r} is outside the working directory {real}")
    if not os.path.isdir(target):
        raise ValueError(f"cwd {requested!r} is not a directory")
    return target


def fd_name(fd: int) -> str | None:
    """The real name of what ``fd`` has open, as the kernel says (read back from
    ``/proc/self/fd``): one syscall, and the name of what was opened, not of what its path
    leads to a moment later (``os.path.realpath`` walks a path in Python, an lstat and ~10
    Python calls a component). None without ``/proc``, or for a file removed meanwhile."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return real if real.startswith("/") and not real.endswith(" (deleted)") else None


def real_dir(path: str) -> str | None:
    """``os.path.realpath(path)`` when that is a directory, else None: resolved now by the kernel
    (``fd_name`` of the directory opened with ``O_PATH``): a bash call's workspace is resolved on
    every call (a symlink in it may have been retargeted since the last), and realpath cost ~45
    Python calls a call (bench/profile_prompt.py --bash). Without ``/proc``, or for a directory
    removed meanwhile, it is realpath and a stat after all."""
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        real = fd_name(fd)
    finally:
        os.close(fd)
    if real is not None:
        return real
    real = os.path.realpath(path)
    return real if os.path.isdir(real) else None


def exists_inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file inside ``root`` (``open_inside``'s rules)."""
    try:
        os.close(open_inside(root, path))
    except OSError:
        return False
    return True


def read_small_text(path: str, max_bytes: int) -> tuple[bool, str | None]:
    """(known, text) of a file that is about to change, for showing the change: ``(True, None)``
    when it does not exist; ``(False, None)`` when its text cannot be shown (not a regular UTF-8
    file, larger than ``max_bytes``, unreadable). The open does not block: a FIFO hangs nobody."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return True, None
    except OSError:
        return False, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return False, None
        data = os.read(fd, max_bytes + 1)
    except OSError:
        return False, None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew since the fstat
        return False, None
    try:
        return True, data.decode("utf-8")
    except UnicodeDecodeError:
        return False, None
