"""Landlock launcher: restrict writes to the given paths, then exec the command.

Run as a standalone script (stdlib + ctypes only), so it works without importing dsh:

    python3 -I _landlock_exec.py --rw PATH [--rw PATH …] --rw-file /dev/null [--hide PATH] -- argv…

Every write-ish access (write, truncate, create, remove, link/rename, mknod, symlink) is
denied outside the ``--rw`` directories and ``--rw-file`` files. Reads and execution are
left alone (the tiers describe file *effects*) except beneath each ``--hide`` path (the
stored-credentials directory): Landlock only grants, so reads are then handled too and
granted on everything *beside* the path to it — every entry of ``/`` and of each directory
on the way down, minus the next step and the hidden path itself (``hide_rules``). The
ancestors themselves get ``READ_DIR`` only (``ls ~`` works, names are visible); a file
created in one of them after the ruleset was built is not readable by the confined tree.
``no_new_privs`` is set first, so setuid binaries cannot regain anything. Failure to confine
is fatal: exit 125 with a ``landlock-run:`` line on stderr, never an unconfined exec.

Beyond files, because Landlock alone has no pid namespace:

- every capability is dropped (bounding, ambient, effective, permitted, inheritable), so
  code run as root cannot ``remount``, cannot read another process's ``/proc/<pid>/environ``
  (the kernel wants ``CAP_SYS_PTRACE`` for a process with more capabilities or a non-dumpable
  one), cannot override file permissions;
- on Landlock ABI >= 6 the domain is *scoped*: its processes can signal only processes of
  the same domain (``kill -9 <dsh pid>`` or ``SIGSTOP`` to an unrelated process fails with
  EPERM) and cannot connect to abstract unix sockets made outside it. ``signal_scoped()``
  says whether the running kernel gives that (``dsh doctor`` reports it).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Sequence

SYS_CREATE_RULESET = 444  # the same number on every architecture (unified syscall table)
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

# The filesystem access rights (linux/landlock.h), bits 1-14 in the kernel's order (bit 0,
# EXECUTE, is never handled here); REFER came with ABI 2, TRUNCATE with ABI 3.
(WRITE_FILE, READ_FILE, READ_DIR, REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK,
 MAKE_FIFO, MAKE_BLOCK, MAKE_SYM, REFER, TRUNCATE) = (1 << bit for bit in range(1, 15))
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6
SCOPE_ABI = 6

PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522

PARTIAL_NOTICE = "landlock-run: partial enforcement (older Landlock ABI)"
EXIT_RUNNER_FAILED = 125
MAX_ABI_ENV = "DSH_LANDLOCK_MAX_ABI"


class _RulesetAttr(ctypes.Structure):
    # struct landlock_ruleset_attr: handled_access_fs (ABI 1), handled_access_net (ABI 4), scoped (ABI 6)
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def abi_version() -> int:
    """The kernel's Landlock ABI (0 when Landlock is missing or disabled), capped by
    ``DSH_LANDLOCK_MAX_ABI`` if set: the launcher then behaves as on an older kernel (fewer
    rights handled, the partial notice), which is how tests pin that path on a new one."""
    r = _libc.syscall(ctypes.c_long(SYS_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    abi = int(r) if r > 0 else 0
    cap = os.environ.get(MAX_ABI_ENV, "")
    return min(abi, int(cap)) if cap.isdigit() else abi


def write_rights(abi: int) -> tuple[int, int]:
    """(rights for directories, rights for single files) handled at this ABI."""
    d = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM
    f = WRITE_FILE
    if abi >= 2:
        d |= REFER
    if abi >= 3:
        d |= TRUNCATE
        f |= TRUNCATE
    return d, f


def signal_scoped(abi: int | None = None) -> bool:
    """Whether a Landlock domain here keeps its processes from signalling processes outside it."""
    return (abi_version() if abi is None else abi) >= SCOPE_ABI


def _cap_last() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def drop_capabilities(fail: Callable[[str], None]) -> None:
    """Drop every capability this process has or could regain through exec (bounding set,
    ambient set, then effective/permitted/inheritable). Only a process that holds capabilities
    has anything to drop; one that cannot drop what it holds fails (never runs with them)."""
    if _effective_caps() == 0:
        return  # an ordinary user: nothing held; no_new_privs keeps setuid/file caps from adding any
    for cap in range(_cap_last() + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            fail(f"cannot drop capability {cap} from the bounding set: {os.strerror(ctypes.get_errno())}")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL on kernels without ambient caps
    header = _CapHeader(version=_CAP_VERSION_3, pid=0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        fail(f"capset failed: {os.strerror(ctypes.get_errno())}")
    if _effective_caps() != 0:
        fail("capabilities are still held after dropping them")


def _fail(msg: str) -> None:
    sys.stderr.write(f"landlock-run: {msg}\n")
    sys.stderr.flush()
    os._exit(EXIT_RUNNER_FAILED)


def _raise(msg: str) -> None:
    raise OSError(f"landlock-run: {msg}")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _under(base: str, rel: str) -> str:
    """``base``/``rel`` normalised (never the ``//`` that ``normpath`` keeps when ``base`` is ``/``)."""
    return "/" + os.path.normpath(os.path.join(base, rel)).lstrip("/")


def _unescape(field: str) -> str:
    """A /proc/self/mountinfo path field (space, tab, newline and backslash are octal escapes)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_aliases(path: str, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Other places ``path`` is visible through a bind mount of one of its ancestors (or of
    itself) made elsewhere: the same filesystem mounted at M with a root that covers it.
    Landlock checks the path a file was reached by, so each such place is hidden as well."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            mounts = [(p[2], _unescape(p[3]), _unescape(p[4])) for p in (line.split() for line in f) if len(p) > 4]
    except OSError:
        return []
    best = None  # the mount ``path`` lies in: the longest mount point above it (the last one stacked there)
    for m in mounts:
        if _inside(path, m[2]) and (best is None or len(m[2]) >= len(best[2])):
            best = m
    if best is None:
        return []
    dev, root, point = best
    in_fs = _under(root, os.path.relpath(path, point))
    out = []
    for m in mounts:
        if m is best or m[0] != dev or not _inside(in_fs, m[1]):
            continue
        alias = _under(m[2], os.path.relpath(in_fs, m[1]))
        if alias != path and alias not in out:
            out.append(alias)
    return out


def hide_rules(hidden: list[str]) -> list[tuple[str, int]]:
    """The read grants that leave every ``hidden`` path unreadable and everything else readable:
    ``(path, rights)`` for each entry beside the way down to a hidden path (symlinks skipped: what
    they point to is reached by its own path) and ``READ_DIR`` on each directory on that way."""
    hidden = [os.path.realpath(h) for h in hidden]
    hidden += [a for h in list(hidden) for a in mount_aliases(h)]
    ancestors: set[str] = set()
    for h in hidden:
        a = os.path.dirname(h)
        while True:
            ancestors.add(a)
            if a == "/":
                break
            a = os.path.dirname(a)
    rules: list[tuple[str, int]] = []
    for a in sorted(ancestors):
        try:
            entries = list(os.scandir(a))
        except OSError:
            continue  # not there (yet) or not listable: nothing beneath it is granted
        rules.append((a, READ_DIR))
        for e in entries:
            if e.path in ancestors or e.path in hidden:
                continue
            try:
                if e.is_symlink():
                    continue
                rules.append((e.path, READ_FILE | READ_DIR if e.is_dir(follow_symlinks=False) else READ_FILE))
            except OSError:
                continue
    return rules


def hidden_in_force(hidden: list[str], rw_dirs: list[str]) -> list[str]:
    """The ``--hide`` paths worth a read ruleset: each one that exists, and each missing one that
    no writable root contains (a key stored there later is hidden too). A missing one inside a
    writable root holds nothing yet, and hiding it would make files created directly in that root's
    directories on the way to it unreadable: it is left alone."""
    roots = [os.path.realpath(r) for r in rw_dirs]
    out = []
    for h in hidden:
        real = os.path.realpath(h)
        if os.path.lexists(real) or not any(_inside(real, r) for r in roots):
            out.append(real)
    return out


def build_ruleset(rw_dirs: list[str], rw_files: list[str], hidden: Sequence[str] = (),
                  fail: Callable[[str], None] = _raise) -> tuple[int, int]:
    """(the ruleset's descriptor, the ABI): writes beneath ``rw_dirs`` and to ``rw_files``, reads
    everywhere but the ``hidden`` paths. Built, not applied (``restrict`` applies it)."""
    abi = abi_version()
    if abi < 1:
        fail("Landlock is not available in this kernel")
    dir_rights, file_rights = write_rights(abi)
    reads = hide_rules(hidden_in_force(list(hidden), rw_dirs)) if hidden else []
    handled = dir_rights | (READ_FILE | READ_DIR if reads else 0)
    scoped = SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if signal_scoped(abi) else 0
    ruleset_attr = _RulesetAttr(handled_access_fs=handled, handled_access_net=0, scoped=scoped)
    size = ctypes.sizeof(_RulesetAttr) if scoped else 8  # older kernels refuse a larger struct with E2BIG
    ruleset = _libc.syscall(ctypes.c_long(SYS_CREATE_RULESET), ctypes.byref(ruleset_attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        fail(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    grants = [(p, dir_rights, os.O_DIRECTORY) for p in rw_dirs] + [(p, file_rights, 0) for p in rw_files]
    grants += [(p, rights, os.O_NOFOLLOW) for p, rights in reads]  # never a symlink's target
    for path, rights, flags in grants:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC | flags)
        except OSError:
            continue  # a missing optional root grants nothing; an entry gone since it was listed neither
        attr = _PathBeneath(allowed_access=rights, parent_fd=fd)
        r = _libc.syscall(ctypes.c_long(SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), ctypes.byref(attr), ctypes.c_uint32(0))
        err = ctypes.get_errno()
        os.close(fd)
        if r < 0 and not (flags == os.O_NOFOLLOW and err == 22):  # EINVAL: it became a file or a symlink since
            fail(f"landlock_add_rule({path}) failed: {os.strerror(err)}")
    return ruleset, abi


def restrict(rw_dirs: list[str], rw_files: list[str], *, fatal: bool = True, hidden: Sequence[str] = ()) -> int:
    """Confine this process (and everything it execs) to writing only the given paths, and to
    reading everything but the ``hidden`` paths.

    A failure exits (125) when ``fatal``, else raises ``OSError`` (the command server reports it)."""
    fail = _fail if fatal else _raise
    ruleset, abi = build_ruleset(rw_dirs, rw_files, hidden, fail)
    drop_capabilities(fail)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
    if _libc.syscall(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        fail(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    os.close(ruleset)
    return abi


def main(argv: list[str]) -> None:
    rw_dirs: list[str] = []
    rw_files: list[str] = []
    hidden: list[str] = []
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] in ("--rw", "--rw-file", "--hide") and i + 1 < len(argv):
            {"--rw": rw_dirs, "--rw-file": rw_files, "--hide": hidden}[argv[i]].append(argv[i + 1])
            i += 2
        else:
            _fail(f"bad argument {argv[i]!r}")
    cmd = argv[i + 1 :]
    if not cmd:
        _fail("no command given")
    abi = restrict(rw_dirs, rw_files, hidden=hidden)
    if abi < 3:
        sys.stderr.write(PARTIAL_NOTICE + "\n")
        sys.stderr.flush()
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        _fail(f"cannot exec {cmd[0]!r}: {exc.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
