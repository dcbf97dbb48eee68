"""The JSONL session store: ``$DSH_HOME/sessions/<id>.jsonl``, one append-only file per session.

Line 0 is the ``SessionHeader``; every further line is one durable event, in the order it
was appended, encoded with ``dsh_core.types.log_encoder``. Each line reaches the kernel in
one ``write`` on an ``O_APPEND`` descriptor, so a crash leaves at most a torn last line,
which the reader tolerates and reports.

``open`` creates the file and writes the header at once (``session/new``): a session that
got no prompt yet can still be listed, resumed or deleted, by this process or another.

A session is *open* while an agent holds its log, in whichever dsh process: ``open`` takes
the session's lock (``SessionLocks``) and ``close`` gives it back, so a second process can
neither resume it (two writers on one file) nor delete it under its writer. A holder that
died (``kill -9``) holds nothing: the lock is a POSIX byte lock the kernel drops with the process.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
import struct
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import anyio
import msgspec

from dsh_core.errors import DshError, shown
from dsh_core.paths import data_home
from dsh_core.types import DurableEvent, SessionHeader, log_decoder, log_encoder

log = logging.getLogger("dsh.jsonl-persistence")

SUFFIX = ".jsonl"
# Session ids become file names: keep them to a conservative, traversal-free alphabet.
_SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")




def sessions_dir() -> Path:
    return data_home() / "sessions"


def check_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not _SAFE_ID.fullmatch(session_id):
        raise DshError(
            f"jsonl-persistence: session id {shown(session_id)} is not usable as a file name "
            "(allowed: letters, digits, '.', '_', '-'; at most 200 characters; no leading '.' or '-')"
        )
    return session_id


def encode_line(record: SessionHeader | DurableEvent) -> bytes:
    return log_encoder.encode(record) + b"\n"


class TornTail(msgspec.Struct, frozen=True):
    """The undecodable last line of a log (a crash mid-write): where and what it was."""

    line: int  # 0-based line number
    offset: int  # byte offset of the line in the file
    data: bytes


@dataclass
class SessionContents:
    """A decoded log. ``torn`` is set when the last line was incomplete (and was skipped)."""

    path: Path
    header: SessionHeader
    events: list[DurableEvent]
    torn: TornTail | None = None
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line, reason): unknown event types

    @property
    def intact(self) -> bool:
        return self.torn is None and not self.skipped


class SessionRead(tuple):
    """What ``JsonlStore.read`` returns: a ``(header, events)`` pair that also carries
    ``torn`` (a ``TornTail`` or None) and ``contents`` (the full ``SessionContents``)."""

    torn: TornTail | None
    contents: SessionContents

    def __new__(cls, contents: SessionContents) -> SessionRead:
        self = super().__new__(cls, (contents.header, contents.events))
        self.torn = contents.torn
        self.contents = contents
        return self


def _warn(message: str) -> None:
    log.warning(f"{message}")


def _write_all(fd: int, data: bytes) -> None:
    # A regular-file write is whole unless the disk fills up or a signal lands; loop on a
    # short write anyway, so the worst case stays "a torn last line".
    n = os.write(fd, data)
    if n == len(data):  # the usual case: one whole write
        return
    view = memoryview(data)[n:]
    while view:
        n = os.write(fd, view)
        view = view[n:]


def parse_log(path: Path, raw: bytes) -> SessionContents:
    """Decode a whole log. The last line may be torn; any other bad line is an error."""
    lines = raw.split(b"\n")
    # `raw` ends with b"\n" when intact, which leaves an empty final element.
    tail = lines.pop()
    offsets: list[int] = []
    pos = 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    torn: TornTail | None = None
    if tail:
        torn = TornTail(line=len(lines), offset=pos, data=tail)
    if not lines:
        raise DshError(f"{path}: no complete header line (the file is empty or was torn while being created)")
    header: SessionHeader | None = None
    events: list[DurableEvent] = []
    skipped: list[tuple[int, str]] = []
    last = len(lines) - 1
    for i, line in enumerate(lines):
        try:
            record = log_decoder.decode(line)
        except RecursionError:
            raise DshError(f"{path}:{i + 1}: a record nested too deeply to read (not written by dsh)") from None
        except msgspec.DecodeError as exc:
            if i == last and torn is None and not _is_json(line):
                # Terminated but undecodable last line: a write the kernel never finished
                # (e.g. a zero-filled tail after power loss). Same treatment as a torn line.
                torn = TornTail(line=i, offset=offsets[i], data=line)
                continue
            if i > 0 and _is_json(line):
                # A complete record of a type this version does not know (evolution by addition).
                skipped.append((i, str(exc)))
                continue
            raise DshError(f"{path}:{i + 1}: corrupt record in the middle of the log: {exc}") from exc
        if i == 0:
            if not isinstance(record, SessionHeader):
                raise DshError(f"{path}:1: line 0 is not a session header (type {type(record).__name__})")
            header = record
        elif isinstance(record, SessionHeader):
            raise DshError(f"{path}:{i + 1}: a second session header in the middle of the log")
        else:
            events.append(record)
    if header is None:  # only possible when line 0 itself was torn
        raise DshError(f"{path}: the header line is torn; the log holds no readable session")
    return SessionContents(path=path, header=header, events=events, torn=torn, skipped=skipped)


def _is_json(line: bytes) -> bool:
    try:
        msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


class SessionLocks:
    """Which dsh process has which session open, across processes, at one syscall per open.

    One lock file per store, ``<root>/.session-locks``, held open by each process that opens
    sessions (one descriptor per process, not per session: 10,000 open sessions must not cost
    10,000 descriptors). A session is open while its process holds a POSIX write lock on one
    byte of that file, at an offset derived from the session id (56 bits of its SHA-256, so two
    ids meet on one byte with negligible odds). The kernel drops a process's locks when it dies
    (``kill -9``), and ``F_GETLK`` names the holder's pid. POSIX locks do not conflict within one
    process: a second open in the same process is the caller's to refuse (the ACP door does).
    Replaces a lock file per session under a mutex, which cost ~0.5 ms per session open.
    """

    # Taking and giving back a lock is fcntl.lockf; only naming the holder (F_GETLK, which the
    # standard library does not wrap) packs a struct flock by hand, on the refusal path.
    _FLOCK = "@hhqqi"
    _SIZE = 32  # sizeof(struct flock) on Linux x86_64 and aarch64 (the packed fields plus padding)

    def __init__(self, root: Path) -> None:
        self.path = root / ".session-locks"
        self._fd: int | None = None

    def _file(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    @staticmethod
    def _offset(session_id: str) -> int:
        return int.from_bytes(hashlib.sha256(session_id.encode()).digest()[:7], "big")

    def _holder(self, session_id: str) -> int | None:
        """The pid of another process holding the session, or None."""
        arg = struct.pack(self._FLOCK, fcntl.F_WRLCK, os.SEEK_SET, self._offset(session_id), 1, 0)
        raw = fcntl.fcntl(self._file(), fcntl.F_GETLK, arg.ljust(self._SIZE, b"\0"))
        kind, _, _, _, pid = struct.unpack(self._FLOCK, raw[: struct.calcsize(self._FLOCK)])
        return None if kind == fcntl.F_UNLCK else pid

    def _take(self, session_id: str, doing: str) -> None:
        try:
            fcntl.lockf(self._file(), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self._offset(session_id), os.SEEK_SET)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise DshError(f"jsonl-persistence: cannot lock session {session_id}: {exc}") from exc
            pid = self._holder(session_id)
            where = f"another dsh process (pid {pid})" if pid else "another dsh process"
            raise DshError(f"session {session_id} is open in {where}; close it there before {doing}") from None

    def acquire(self, session_id: str) -> None:
        """Mark the session open by this process; DshError when a live process has it open."""
        self._take(session_id, "opening it again")

    def release(self, session_id: str) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, self._offset(session_id), os.SEEK_SET)

    @contextlib.contextmanager
    def closed(self, session_id: str, doing: str) -> Iterator[None]:
        """Hold the session's lock for the ``with`` body (nobody else can open it meanwhile);
        DshError when another live process has it open."""
        self._take(session_id, doing)
        try:
            yield
        finally:
            self.release(session_id)


class JsonlLog:
    """One session's log file. ``append`` is synchronous: one ``write`` per record.

    The descriptor is borrowed from the store's bounded set of open logs: a session that
    has been quiet while others wrote gets its descriptor closed, and reopens on its next
    record, so the number of sessions never costs descriptors (nor durability).
    """

    def __init__(self, store: JsonlStore, header: SessionHeader) -> None:
        self.store = store
        self.header = header
        self.path = store.path_for(header.id)
        self._fd: int | None = None
        self._unsynced = False
        self.closed = False
        store.locks.acquire(header.id)  # DshError when another live process has it open
        try:
            self._start()
        except BaseException:
            store.locks.release(header.id)
            raise

    def _start(self) -> None:
        """Create the file with its header now (or reopen an existing log), so the session exists
        on disk from ``session/new`` on."""
        try:
            self.store._make_room()
            self._fd, prefix = self._open()
            if prefix:
                _write_all(self._fd, prefix)
            self.store._touch(self)
        except OSError as exc:
            raise DshError(f"jsonl-persistence: cannot create {self.path}: {exc}") from exc

    def _open(self) -> tuple[int, bytes]:
        """Open (creating if need be) and return the fd and the prefix the next write carries."""
        self.store.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return fd, encode_line(self.header)
            # Re-opening an existing log (same id): the old header stays line 0. If the last
            # writer died mid-line, cut the torn fragment so the next record starts a line.
            with open(self.path, "rb") as f:
                f.seek(max(0, size - 1))
                if f.read(1) != b"\n":
                    f.seek(0)
                    data = f.read()
                    keep = data.rfind(b"\n") + 1
                    _warn(f"{self.path}: dropping a torn last line ({size - keep} bytes) before appending")
                    os.ftruncate(fd, keep)
                    if keep == 0:
                        return fd, encode_line(self.header)
            return fd, b""
        except BaseException:
            os.close(fd)
            raise

    def append(self, event: DurableEvent) -> None:
        # Every event of every session comes through here: the helpers are inlined (encode_line,
        # the store's _touch, _write_all's whole first write), bench/profile_prompt.py.
        line = log_encoder.encode(event) + b"\n"
        try:
            if self._fd is None:
                self.store._make_room()
                self._fd, prefix = self._open()
                self.closed = False
                line = prefix + line
            open_logs = self.store._open_logs
            if self in open_logs:
                open_logs.move_to_end(self)
            else:
                open_logs[self] = None
            n = os.write(self._fd, line)
            if n != len(line):  # a short write (disk full, a signal): finish it or fail
                _write_all(self._fd, line[n:])
        except OSError as exc:
            raise DshError(f"jsonl-persistence: cannot append to {self.path}: {exc}") from exc

    def _evict(self) -> None:
        """Give the descriptor back (the store's bound); the next append reopens the file."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
            self._unsynced = True  # close() still flushes it to disk

    async def close(self) -> None:
        """Close the log. Its data is flushed to disk by the store's ``flush`` (once for all
        logs, at host exit), not here: 10,000 sessions closing must not cost 10,000 fsyncs."""
        if self.closed:
            return
        fd, self._fd = self._fd, None
        self.closed = True
        self.store._open_logs.pop(self, None)
        if fd is not None:
            os.close(fd)
            self._unsynced = True
        if self._unsynced:
            self._unsynced = False
            self.store._dirty = True
        self.store.locks.release(self.header.id)  # one fcntl: no thread hop needed


def _syncfs(fd: int) -> int:
    """syncfs(2) through libc; -1 when unavailable."""
    try:
        import ctypes

        return int(ctypes.CDLL(None, use_errno=True).syncfs(fd))
    except (OSError, AttributeError):
        return -1


def default_max_open() -> int:
    """How many logs keep a descriptor open: 256, or a quarter of the soft fd limit if that is less."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 64
    if soft == resource.RLIM_INFINITY:
        return 256
    return max(4, min(256, soft // 4))


TITLE_MAX = 100  # characters of the first prompt's first line kept as a session's title


class SessionSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded session as ``session/list`` shows it."""

    id: str
    cwd: str
    title: str | None
    updated_ns: int  # the log's mtime
    created_at: float
    parent: str | None = None  # a subagent's parent session


TITLED = b'"type":"session/titled"'
TITLED_WITHIN = 1 << 20  # bytes of a log searched for a written title, from the first prompt on


def _title_of(f: BinaryIO) -> str | None:
    """The session's title: the last ``session/titled`` written within ``TITLED_WITHIN`` bytes
    after the first prompt (a titler writes it at the end of the first turn), else the first
    prompt's first line (bounded). Searching a bounded window keeps ``session/list`` at ~0.1 ms
    a log however long its sessions grew (bytes.find over 1 MiB, measured on the 2-core box)."""
    first = _first_prompt_line(f)
    window = f.read(TITLED_WITHIN)
    at = window.rfind(TITLED)
    if at < 0:
        return first
    start = window.rfind(b"\n", 0, at) + 1
    end = window.find(b"\n", at)
    if end < 0:
        return first
    try:
        record = log_decoder.decode(window[start:end + 1])
    except (msgspec.DecodeError, RecursionError):
        return first
    title = getattr(record, "title", None)
    return title if isinstance(title, str) and title.strip() else first


def _first_prompt_line(f: BinaryIO) -> str | None:
    """The first user prompt's first line (bounded), read line by line from an open log."""
    for line in f:
        if b'"user/message"' not in line or not line.endswith(b"\n"):
            continue
        try:
            record = log_decoder.decode(line)
        except (msgspec.DecodeError, RecursionError):
            return None
        message = getattr(record, "message", None)
        if message is None or getattr(message, "source", "user") != "user":
            continue
        for block in message.content:
            text = getattr(block, "text", None)
            if isinstance(text, str) and text.strip():
                first = text.strip().splitlines()[0].strip()
                return first if len(first) <= TITLE_MAX else first[: TITLE_MAX - 1] + "…"
        return None
    return None


class JsonlStore:
    """``SessionStore`` over ``<root>/<id>.jsonl``.

    At most ``max_open`` logs hold a descriptor at a time (least recently written closed
    first): one open file per *active* session, not per session. Measured on a 2-core box,
    a record on an open descriptor costs ~6 µs, an open-append-close ~20 µs; a prompt writes
    about five records, so keeping the busy logs open saves ~70 µs per prompt.
    """

    durable = True  # logs outlive the process: front doors may offer list / resume / delete

    def __init__(self, root: Path | None = None, *, max_open: int | None = None) -> None:
        self.root = Path(root) if root is not None else sessions_dir()
        self.max_open = max_open or default_max_open()
        self._open_logs: OrderedDict[JsonlLog, None] = OrderedDict()
        self._dirty = False
        self.locks = SessionLocks(self.root)

    async def flush(self) -> None:
        """Make every log written through this store durable (one ``syncfs``, or an fsync per
        file where that is unavailable). Called at host exit by the plugin's lifespan."""
        if not self._dirty and not self._open_logs:
            return
        self._dirty = False
        for log in list(self._open_logs):
            log._evict()
        self._open_logs.clear()
        root = self.root

        def sync() -> None:
            try:
                fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                return
            try:
                if _syncfs(fd) == 0:
                    return
                for p in root.iterdir():
                    if p.name.endswith(SUFFIX):
                        try:
                            f = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
                        except OSError:
                            continue
                        try:
                            os.fsync(f)
                        finally:
                            os.close(f)
            finally:
                os.close(fd)

        await anyio.to_thread.run_sync(sync)

    def _touch(self, log: JsonlLog) -> None:
        if log in self._open_logs:
            self._open_logs.move_to_end(log)
        else:
            self._open_logs[log] = None

    def _make_room(self) -> None:
        while len(self._open_logs) >= self.max_open:
            log, _ = self._open_logs.popitem(last=False)
            log._evict()

    def path_for(self, session_id: str) -> Path:
        return self.root / (check_id(session_id) + SUFFIX)

    # ------------------------------------------------------------------ SessionStore

    def open(self, header: SessionHeader) -> JsonlLog:
        return JsonlLog(self, header)

    async def list_sessions(self) -> list[SessionHeader]:
        return await anyio.to_thread.run_sync(self.list_sessions_sync)

    async def read(self, session_id: str) -> SessionRead:
        contents = await anyio.to_thread.run_sync(self.read_contents, session_id)
        return SessionRead(contents)

    def delete_sync(self, session_id: str, artifacts: list[Path]) -> None:
        """Remove a session's log and the given files of it, unless a live process has it open
        (DshError); nobody can open it while this runs."""
        path = self.path_for(session_id)
        with self.locks.closed(session_id, "deleting it"):
            path.unlink(missing_ok=True)
        for a in artifacts:
            if a.is_dir() and not a.is_symlink():
                shutil.rmtree(a, ignore_errors=True)
            else:
                a.unlink(missing_ok=True)

    async def delete(self, session_id: str, artifacts: list[Path]) -> None:
        await anyio.to_thread.run_sync(self.delete_sync, session_id, artifacts)

    # ------------------------------------------------------------------ sync helpers (CLI)

    def list_sessions_sync(self) -> list[SessionHeader]:
        headers: list[SessionHeader] = []
        for path in self._files():
            header = self.read_header(path)
            if header is not None:
                headers.append(header)
        headers.sort(key=lambda h: (h.created_at, h.id))
        return headers

    def summaries_sync(self, *, cwd: str | None = None, children: bool = False) -> list[SessionSummary]:
        """Top-level recorded sessions (subagent logs too with ``children``: ``parent`` names
        theirs), newest first (mtime, then id)."""
        out: list[SessionSummary] = []
        for path in self._files():
            try:
                with open(path, "rb") as f:
                    first = f.readline()
                    if not first.endswith(b"\n"):
                        continue
                    try:
                        header = log_decoder.decode(first)
                    except (msgspec.DecodeError, RecursionError):
                        continue
                    if not isinstance(header, SessionHeader) or (header.parent_session is not None and not children):
                        continue
                    if cwd is not None and header.cwd != cwd:
                        continue
                    title = _title_of(f)
                    mtime = os.fstat(f.fileno()).st_mtime_ns
            except OSError:
                continue
            out.append(SessionSummary(id=header.id, cwd=header.cwd, title=title, updated_ns=mtime,
                                      created_at=header.created_at, parent=header.parent_session))
        out.sort(key=lambda s: (-s.updated_ns, s.id))
        return out

    async def summaries(self, *, cwd: str | None = None) -> list[SessionSummary]:
        return await anyio.to_thread.run_sync(lambda: self.summaries_sync(cwd=cwd))

    def read_header(self, path: Path) -> SessionHeader | None:
        try:
            with open(path, "rb") as f:
                first = f.readline()
        except OSError as exc:
            _warn(f"{path}: unreadable: {exc}")
            return None
        try:
            if not first.endswith(b"\n"):
                raise msgspec.DecodeError("torn header line")
            record = log_decoder.decode(first)
        except (msgspec.DecodeError, RecursionError) as exc:
            _warn(f"{path}: skipped, no readable header: {exc}")
            return None
        if not isinstance(record, SessionHeader):
            _warn(f"{path}: skipped, line 0 is not a session header")
            return None
        return record

    def resolve(self, session_id: str) -> Path:
        """The log of ``session_id``; a unique prefix of an id also works (for humans)."""
        path = self.path_for(session_id)
        if path.exists():
            return path
        matches = [p for p in self._files() if p.name.startswith(session_id)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            names = ", ".join(sorted(p.name[: -len(SUFFIX)] for p in matches)[:5])
            raise DshError(f"session id prefix {session_id!r} is ambiguous ({names}…)")
        raise DshError(f"no session {session_id!r} in {self.root} (see `dsh sessions list`)")

    def read_contents(self, session_id: str) -> SessionContents:
        path = self.resolve(session_id)
        contents = parse_log(path, path.read_bytes())
        if contents.torn is not None:
            _warn(
                f"{path}: line {contents.torn.line + 1} is torn ({len(contents.torn.data)} bytes, "
                "likely a crash mid-write); it was skipped"
            )
        for line, reason in contents.skipped:
            _warn(f"{path}:{line + 1}: skipped a record this version cannot decode: {reason}")
        return contents

    def _files(self) -> list[Path]:
        try:
            return sorted(p for p in self.root.iterdir() if p.name.endswith(SUFFIX) and p.is_file())
        except FileNotFoundError:
            return []
