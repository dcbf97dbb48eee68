"""Open a file for writing only beneath a writable root, race-free.

The root is picked by canonicalising the path's existing parent, but the open itself is
``openat2(root_fd, relative, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)``: the kernel refuses
any resolution — ``..``, an absolute or relative symlink, ``/proc/<pid>/root`` — that leaves
the root, atomically, so there is no check-then-open window. Where openat2 is missing
(Linux < 5.6) every component is opened with ``O_NOFOLLOW`` and symlinks are refused.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
import struct

SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
RESOLVE_CACHED = 0x20


class PathDenied(Exception):
    """The path is not writable under the current tier; ``reason`` says why in plain words."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_have_openat2: bool | None = None


def _openat2(dirfd: int, path: str, flags: int, mode: int = 0,
             resolve: int = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) -> int:
    if "\0" in path:  # as os.open: a C string would end there and name another file
        raise ValueError("embedded null byte")
    if not flags & os.O_CREAT:
        mode = 0  # openat2 rejects a mode without O_CREAT
    how = _OpenHow(flags=flags | os.O_CLOEXEC, mode=mode, resolve=resolve)
    while True:
        fd = _libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dirfd), os.fsencode(path), ctypes.byref(how),
                           ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err == errno.EINTR or (err == errno.EAGAIN and not resolve & RESOLVE_CACHED):
            continue  # (EAGAIN: a rename raced a RESOLVE_BENEATH walk; try again)
        raise OSError(err, os.strerror(err), path)


# False on a system without these, or once the kernel said it has no RESOLVE_CACHED (before 5.12) or no openat2
_cached_opens = all(hasattr(os, name) for name in ("O_PATH", "RWF_NOWAIT", "preadv"))
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_STATX_DONT_SYNC = 0x4000  # what the kernel has cached: no network round trip, no FUSE request
STATX_TYPE = 0x1
_statx = getattr(_libc, "statx", None)  # glibc 2.28
# File systems whose open and cached read never wait on anything but the local kernel; a file
# anywhere else (NFS, SMB, FUSE, 9p, Ceph, ..., or a device this list does not know) is opened
# in a worker thread, where a dead server or daemon can hang nothing but that thread.
LOCAL_FILE_SYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "overlay", "zfs", "bcachefs"})
_local_devices: dict[int, bool] = {}  # st_dev -> on one of LOCAL_FILE_SYSTEMS (from /proc/self/mountinfo)


def mounted_devices() -> dict[int, bool]:
    """Each mounted device (``st_dev``) and whether its file system is a local one."""
    out: dict[int, bool] = {}
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()  # id parent major:minor root point options [optional...] - type source super
                major, _, minor = fields[2].partition(":")
                out[os.makedev(int(major), int(minor))] = fields[fields.index("-", 6) + 1] in LOCAL_FILE_SYSTEMS
    except (OSError, ValueError, IndexError):
        pass
    return out


def _local_device(fd: int) -> bool:
    """Whether ``fd`` (an ``O_PATH`` descriptor) is on a local file system, asked without syncing
    anything (``statx`` with ``AT_STATX_DONT_SYNC``: a network or FUSE file system answers from
    its cache). The mount table is read again only for a device not seen before."""
    if _statx is None:
        return False
    buf = ctypes.create_string_buffer(256)  # struct statx
    if _statx(fd, b"", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, buf) != 0:
        return False
    major, minor = struct.unpack_from("II", buf, 136)  # stx_dev_major, stx_dev_minor
    dev = os.makedev(major, minor)
    local = _local_devices.get(dev)
    if local is None:
        _local_devices.update(mounted_devices())
        local = _local_devices.setdefault(dev, False)  # not in the table (a btrfs subvolume): never asked again
    return local


def open_cached(path: str, flags: int) -> int | None:
    """``path`` opened (``flags``) only if that cannot wait: the path resolved from the kernel's
    caches alone (``openat2`` with ``RESOLVE_CACHED``, Linux 5.12, made for "a fast-path open that
    can be performed without resorting to thread offload"), on a local file system (the open of a
    file on NFS or FUSE asks its server or daemon), then opened through ``/proc/self/fd``. None
    when any of that would wait or cannot be told, and the caller opens it in a worker thread; a
    failed lookup raises as ``os.open``'s does (FileNotFoundError, ...)."""
    global _cached_opens
    if not _cached_opens:
        return None
    try:
        fd = _openat2(AT_FDCWD, path, os.O_PATH, resolve=RESOLVE_CACHED)  # O_PATH: no file system open yet
    except OSError as exc:
        if exc.errno == errno.EAGAIN:
            return None
        if exc.errno in (errno.ENOSYS, errno.EINVAL, errno.EPERM):  # no openat2, no RESOLVE_CACHED, a seccomp filter
            _cached_opens = False
            return None
        raise
    try:
        if not _local_device(fd):
            return None
        return os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC)
    except OSError:  # no /proc, or refused: the worker thread's open says why
        return None
    finally:
        os.close(fd)


def openat2_available() -> bool:
    global _have_openat2
    if _have_openat2 is None:
        try:
            os.close(_openat2(-100, ".", os.O_PATH))  # AT_FDCWD
            _have_openat2 = True
        except OSError as exc:
            _have_openat2 = exc.errno != errno.ENOSYS
    return _have_openat2


def absolute(path: str, cwd: str) -> str:
    """Absolute form of a tool path (relative paths are relative to the session cwd; ``~`` expands)."""
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(cwd, path)


def canonical_target(abspath: str) -> str:
    """The canonical path (symlinks, including the final one, and ``..`` resolved as far as they exist).

    Only used to pick the root; the open itself is re-checked by the kernel beneath that root.
    """
    return os.path.realpath(abspath)


def pick_root(target: str, roots: list[str]) -> str | None:
    best = None
    for r in roots:
        if (target == r or target.startswith(r.rstrip("/") + "/")) and (best is None or len(r) > len(best)):
            best = r
    return best


def _open_dir_beneath(rootfd: int, rel_parts: list[str], mkdirs: bool) -> int:
    """An O_PATH fd for root/rel_parts, created on demand, never leaving the root."""
    fd = os.dup(rootfd)
    try:
        for part in rel_parts:
            if part in ("", "."):
                continue
            try:
                nfd = _openat2(fd, part, os.O_PATH | os.O_DIRECTORY) if openat2_available() else \
                    os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not mkdirs:
                    raise
                os.mkdir(part, 0o777, dir_fd=fd)
                nfd = _openat2(fd, part, os.O_PATH | os.O_DIRECTORY) if openat2_available() else \
                    os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_for_write(abspath: str, roots: list[str] | None, *, create: bool, mkdirs: bool, mode_label: str) -> int:
    """A writable fd (not truncated) for a regular file. ``roots=None``: unconfined."""
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    if roots is None:
        if mkdirs:
            os.makedirs(os.path.dirname(abspath) or "/", exist_ok=True)
        fd = os.open(abspath, flags, 0o666)
        return _check_regular(fd, abspath, confined=False)
    target = canonical_target(abspath)
    root = pick_root(target, roots)
    if root is None:
        where = ", ".join(roots) if roots else "nothing (every write is denied)"
        raise PathDenied(abspath, f"resolves to {target}, outside the writable roots of {mode_label} mode ({where})")
    rel = os.path.relpath(target, root)
    parts = [] if rel == "." else rel.split("/")
    if not parts or parts[-1] in ("..", "."):
        raise PathDenied(abspath, "is a directory, not a file")
    if ".." in parts:
        raise PathDenied(abspath, f"leaves the writable root {root} through '..'")
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            dfd = _open_dir_beneath(rootfd, parts[:-1], mkdirs)
        except OSError as exc:
            raise _denial(abspath, exc, root) from exc
        try:
            if openat2_available():
                fd = _openat2(dfd, parts[-1], flags, 0o666)
            else:
                fd = os.open(parts[-1], flags | os.O_NOFOLLOW, 0o666, dir_fd=dfd)
        except OSError as exc:
            raise _denial(abspath, exc, root) from exc
        finally:
            os.close(dfd)
    finally:
        os.close(rootfd)
    return _check_regular(fd, abspath, confined=True)


def _denial(path: str, exc: OSError, root: str) -> Exception:
    if exc.errno == errno.EXDEV:
        return PathDenied(path, f"a symlink or '..' in it leads outside the writable root {root}")
    if exc.errno == errno.ELOOP:
        return PathDenied(path, "goes through a symlink that cannot be followed safely (magic link or symlink loop)")
    if exc.errno == errno.ENOTDIR:
        return PathDenied(path, "a component of it is not a directory (or is a symlink, refused here)")
    return exc


def _check_regular(fd: int, path: str, *, confined: bool) -> int:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise PathDenied(path, "is not a regular file")
    if confined and st.st_nlink > 1:
        os.close(fd)
        raise PathDenied(path, "is a hard link (it may alias a file outside the workspace); copy it instead")
    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~os.O_NONBLOCK)
    return fd
