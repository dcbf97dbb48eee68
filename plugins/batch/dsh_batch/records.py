"""Task lines in, result lines out: the two JSONL formats of ``dsh batch`` and the results file.

A task line is one JSON object: ``id`` and ``prompt`` (non-empty strings), optionally
``cwd``, ``example``, ``provider``, ``model``, ``timeout_s`` and ``approve`` (``allow`` or
``deny``). Unknown keys, wrong types and repeated ids make the line *invalid*: it is reported
with its line number and skipped.

A result line is one ``Result`` (camelCase keys). ``status`` is ``ok`` (the turn ended
``end_turn``), ``failed`` (anything else: an agent error, a timeout, another stop reason)
or ``interrupted`` (the batch itself was stopped with Ctrl-C/SIGTERM while the task ran).

The results file is append-only while a batch runs: each line reaches the kernel in one
``write`` on an ``O_APPEND`` descriptor, so kill -9 leaves at most a torn last line. At the
start of a run the file is read back; the ids it holds are done, except ``interrupted``
ones (and ``failed`` ones with ``--retry-failed``), which are run again. When a line is
to be superseded (or torn), the file is first rewritten without it (a temporary file
renamed over it), so every id appears at most once at any moment.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec


class Task(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    id: str
    prompt: str
    cwd: str | None = None
    example: str | None = None
    provider: str | None = None
    model: str | None = None
    timeout_s: float | None = None
    approve: Literal["allow", "deny"] | None = None


class Agent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Which agent process ran an attempt: pid and node (hostname) — `dsh sessions show`
    finds the log under that node's DSH_HOME."""

    pid: int | None = None
    node: str | None = None


class ErrorInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    # class: agent_error (the agent answered a JSON-RPC error; code set), agent_crashed
    # (the process or connection went away), agent_start (spawn/initialize failed),
    # session_new, cwd_missing, timeout, stop (another stop reason), interrupted
    cls: str = msgspec.field(name="class")
    message: str
    code: int | None = None
    agent: Agent | None = None


class Permission(msgspec.Struct, kw_only=True, omit_defaults=True):
    tool_call_id: str = msgspec.field(name="toolCallId", default="")
    title: str | None = None
    verdict: str = ""


class CostInfo(msgspec.Struct, kw_only=True):
    """What a task's model calls cost, as their provider prices them (``ModelProvider.cost``)."""

    amount: float
    currency: str


class Result(msgspec.Struct, kw_only=True, rename="camel"):
    id: str
    status: Literal["ok", "failed", "interrupted"]
    stop_reason: str
    text: str
    error: ErrorInfo | None = None
    usage: dict[str, int] | None = None
    duration_ms: int = 0
    attempts: int = 1
    session_id: str | None = None
    permissions: list[Permission] = msgspec.field(default_factory=list)
    agent: Agent | None = None
    retried: list[ErrorInfo] = msgspec.field(default_factory=list)  # the errors of earlier attempts
    # From the session log (dsh_batch.stats), null without one; result lines written before
    # these keys existed decode with them null, and `dsh batch report` reads the log then.
    turns: int | None = None
    tool_calls: int | None = None
    model_calls: int | None = None
    cost: CostInfo | None = None  # null: no log, or a call its provider does not price


result_encoder = msgspec.json.Encoder()
_result_decoder = msgspec.json.Decoder(Result)


def encode_result(result: Result) -> bytes:
    return result_encoder.encode(result) + b"\n"


# --------------------------------------------------------------------------- tasks file


@dataclass
class TaskList:
    tasks: list[Task]
    invalid: list[tuple[int, str]]  # (1-based line number, reason)


def _reason(exc: Exception) -> str:
    text = str(exc)
    return text.replace("Object contains unknown field", "unknown key").replace("`$.", "`")


def load_tasks(path: str | os.PathLike[str]) -> TaskList:
    """Parse TASKS.jsonl; blank lines are ignored, bad lines are collected with their numbers."""
    decoder = msgspec.json.Decoder(Task)
    tasks: list[Task] = []
    invalid: list[tuple[int, str]] = []
    first_line: dict[str, int] = {}
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                task = decoder.decode(raw)
            except msgspec.ValidationError as exc:
                invalid.append((n, _reason(exc)))
                continue
            except msgspec.DecodeError as exc:
                invalid.append((n, f"not a JSON object: {exc}"))
                continue
            problem = _check(task)
            if problem is None and task.id in first_line:
                problem = f"duplicate id {task.id!r} (first on line {first_line[task.id]})"
            if problem is not None:
                invalid.append((n, problem))
                continue
            first_line[task.id] = n
            tasks.append(task)
    return TaskList(tasks, invalid)


def _check(task: Task) -> str | None:
    if not task.id.strip():
        return "`id` is empty"
    if not task.prompt.strip():
        return "`prompt` is empty"
    if task.timeout_s is not None and not task.timeout_s > 0:
        return "`timeout_s` must be a positive number of seconds"
    for key in ("cwd", "example", "provider", "model"):
        value = getattr(task, key)
        if value is not None and not value.strip():
            return f"`{key}` is empty"
    return None


# --------------------------------------------------------------------------- results file


@dataclass
class ResultsFile:
    """The --out file, locked for this run (a second batch on the same file is refused)."""

    path: Path
    fd: int
    kept: dict[str, Result] = field(default_factory=dict)  # id → its result line still in the file
    dropped_lines: list[tuple[int, str]] = field(default_factory=list)  # unreadable lines removed

    def append(self, result: Result) -> None:
        data = encode_result(result)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        self.kept[result.id] = result

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ResultsLocked(Exception):
    pass


def open_results(path: str | os.PathLike[str], *, rerun: Iterable[str] = ()) -> ResultsFile:
    """Open (creating) and lock --out, read what it holds, and drop the lines of ids to run
    again (``rerun``), torn or undecodable lines, and older duplicates — by an atomic rewrite,
    only when something is dropped. ``rerun`` is a predicate set of statuses."""
    path = Path(path)
    lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        raise ResultsLocked(f"{path} is in use by another `dsh batch`") from None
    rerun_statuses = set(rerun)
    raw = path.read_bytes()
    kept: dict[str, Result] = {}
    lines: dict[str, bytes] = {}
    dropped: list[tuple[int, str]] = []
    rewrite = False
    for n, line, result in _result_lines(raw):
        if isinstance(result, Exception):
            dropped.append((n, f"unreadable result line removed ({result})"))
            rewrite = True
            continue
        if result.id in lines:
            rewrite = True  # an older line of the same id: the later one wins, at its place
            del lines[result.id], kept[result.id]
        kept[result.id] = result
        lines[result.id] = line
    if raw and not raw.endswith(b"\n"):
        rewrite = True
    for rid in [rid for rid, r in kept.items() if r.status in rerun_statuses]:
        del kept[rid], lines[rid]
        rewrite = True
    if rewrite:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(line + b"\n" for line in lines.values()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        # The lock lives on the old inode; take it on the new file before anyone else can.
        new_fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        fcntl.flock(new_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(lock_fd)
        lock_fd = new_fd
    return ResultsFile(path=path, fd=lock_fd, kept=kept, dropped_lines=dropped)


def _result_lines(raw: bytes) -> Iterator[tuple[int, bytes, Result | msgspec.MsgspecError]]:
    """Each non-blank line of a results file: its number (from 1), its bytes, and its ``Result``
    or why it does not decode to one."""
    for n, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            result = _result_decoder.decode(line)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            yield n, line, exc
            continue
        yield n, line, result


def read_results(path: str | os.PathLike[str]) -> tuple[list[Result], list[tuple[int, str]]]:
    """A results file as it is, read-only (no lock, nothing rewritten): its results in file
    order (a later line of an id replaces the earlier one, at the later place) and the
    unreadable lines (number, reason)."""
    kept: dict[str, Result] = {}
    dropped: list[tuple[int, str]] = []
    for n, _, result in _result_lines(Path(path).read_bytes()):
        if isinstance(result, Exception):
            dropped.append((n, f"unreadable result line skipped ({result})"))
            continue
        kept.pop(result.id, None)
        kept[result.id] = result
    return list(kept.values()), dropped


def to_builtins(record: Task | Result) -> dict[str, Any]:
    return msgspec.to_builtins(record)


def from_builtins(obj: Any) -> Result:
    return msgspec.convert(obj, Result)
