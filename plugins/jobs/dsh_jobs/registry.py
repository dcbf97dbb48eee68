"""The job registry: a session's background jobs, their output logs, their ends.

A job is ``work(io)`` (``protocols.Jobs.start``) run as a task of the host's group inside a
cancel scope of its own. Its output goes to ``<spill root>/<session>/<job id>.log`` as it
arrives (capped on disk, never held in memory); ``job_output`` reads what is new since the
last read by offset, so a read costs the same for 10 KB as for 10 GB of output. A job ends in
exactly one ``settle``: the status, a ``job/settled`` event, and, unless a tool call already
showed that end, one notice in the session's next model request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio

from dsh_core import ToolError
from dsh_core.display import escape_system, one_line
from dsh_core.protocols import JobEnd
from dsh_core.spill import spill_path_for
from dsh_core.types import JobSettled, JobStarted

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent, JobIO

log = logging.getLogger("dsh.jobs")

Status = Literal["running", "completed", "failed", "killed"]
TITLE_MAX = 2000  # characters of a job's title (its command line) kept in the log and shown


@dataclass(frozen=True)
class Limits:
    max_live: int = 10  # running jobs per session (the original's maxConcurrentJobsPerOwner)
    max_log_bytes: int = 64 << 20  # output kept on disk per job; the rest is counted, not kept
    notice_tail: int = 2000  # bytes of unread output a completion notice shows
    kill_grace_s: float = 3.0  # job_kill: how long a job may take to end after SIGTERM
    root: Path | None = None  # where the logs go (None: the host's spill root)


class JobLog:
    """A job's output file: appended as it arrives, up to ``cap`` bytes; read by offset."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path = path
        self.cap = cap
        self.size = 0  # bytes in the file
        self.dropped = 0  # bytes written past the cap (counted, not kept)
        self._fd = -1
        self._rfd = -1
        self._closed = False

    def write(self, data: bytes) -> None:
        if self._closed or not data:
            return
        room = self.cap - self.size
        if room <= 0:
            self.dropped += len(data)
            return
        if len(data) > room:
            self.dropped += len(data) - room
            data = data[:room]
        if self._fd < 0:
            self._open()
        view = memoryview(data)
        while view:  # an unbuffered append: a reader sees every byte once ``size`` says so
            view = view[os.write(self._fd, view):]
        self.size += len(data)

    def _open(self) -> None:
        # Never through a symlink, and read back through the same open file (not the path): a
        # process that can write in the spill directory cannot swap the log for a link to
        # something dsh can read and the model should not.
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        self._rfd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDONLY | os.O_CLOEXEC)

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of what was written (``end`` ≤ ``size``)."""
        if end <= start or self._rfd < 0:
            return b""
        return os.pread(self._rfd, end - start, start)

    def close(self) -> None:
        """No more writes (the job ended); it stays readable until ``release``."""
        self._closed = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def release(self) -> None:
        """The session is gone: nothing reads it any more."""
        self.close()
        if self._rfd >= 0:
            os.close(self._rfd)
            self._rfd = -1


class BgJob:
    """One job: what it is, its log and where it stands. It is the work's ``JobIO`` too."""

    def __init__(self, jid: str, *, kind: str, title: str, call_id: str | None, session: Agent, log: JobLog) -> None:
        self.id = jid
        self.kind = kind
        self.title = title
        self.call_id = call_id
        self.session = session
        self.log = log
        self._status: Status = "running"
        self.exit_code: int | None = None
        self.detail: str | None = None
        self.read_offset = 0  # what job_output has returned so far
        self._stopping = anyio.Event()
        self.settled = anyio.Event()
        self.scope: anyio.CancelScope | None = None
        self.cancel_early = False  # killed before its task began: its work never runs
        self.kill_reason: str | None = None  # set when a kill was asked (job_kill, its session ending)
        self.watchers = 0  # job_output calls waiting for its end (they report it: no notice)
        self.reported = False  # a tool result has shown its end

    # JobIO
    def write(self, data: bytes) -> None:
        self.log.write(data)

    @property
    def stopping(self) -> anyio.Event:
        return self._stopping

    @property
    def status(self) -> Status:
        return self._status

    def status_text(self) -> str:
        """``running``, ``completed (exit N)``, ``failed: why``, ``killed (reason)``."""
        if self._status == "completed":
            return f"completed (exit {self.exit_code})" if self.exit_code is not None else "completed"
        if self._status == "failed":
            return "failed" + (f": {self.detail}" if self.detail else "")
        if self._status == "killed":
            return "killed" + (f" ({self.kill_reason})" if self.kill_reason else "")
        return "running"

    async def wait(self) -> None:
        await self.settled.wait()

    def cancel_work(self) -> None:
        """End the work now (a kill without grace): its scope, or, before it began, its start."""
        if self.scope is not None:
            self.scope.cancel()
        else:
            self.cancel_early = True

    async def kill(self, reason: str | None = None, *, grace_s: float = 3.0) -> None:
        """SIGTERM (the work's ``stopping``), then cancel the work after ``grace_s``; returns settled."""
        if self.settled.is_set():
            return
        if self.kill_reason is None:
            self.kill_reason = reason or "job_kill"
        self._stopping.set()
        if grace_s > 0:
            with anyio.move_on_after(grace_s):
                await self.settled.wait()
        self.cancel_work()
        with anyio.CancelScope(shield=True):
            await self.settled.wait()

    def finish(self, end: JobEnd | None) -> None:
        """Its one end (``JobEnd`` None: cancelled before it reported one)."""
        if self.kill_reason is not None:
            self._status = "killed"
        elif end is None:
            self._status, self.kill_reason = "killed", "its session ended"
        else:
            self._status, self.exit_code, self.detail = end.status, end.exit_code, end.detail
        self.log.close()
        self.settled.set()

    def __repr__(self) -> str:
        return f"<job {self.id} {self.kind} {self.status_text()}>"


@dataclass(eq=False)
class SessionJobs:
    """The jobs one session started (its state slot): every live one killed when it ends."""

    jobs: dict[str, BgJob] = field(default_factory=dict)
    closed: bool = False

    def live(self) -> int:
        return sum(1 for j in self.jobs.values() if j.status == "running")

    async def aclose(self) -> None:
        self.closed = True
        running = [j for j in self.jobs.values() if j.status == "running"]
        with anyio.CancelScope(shield=True):
            # One after another, oldest first (SIGKILL through each call's reaper, no grace; a
            # few ms each): the log records their ends in the order they were started.
            for job in running:
                if job.kill_reason is None:
                    job.kill_reason = "its session ended"
                job.cancel_work()
                await job.settled.wait()
        for job in self.jobs.values():
            job.log.release()


class JobRegistry:
    """The host's ``Jobs`` seam (its state slot): ids, the cap, the tasks, the ends."""

    def __init__(self, limits: Limits, spill_root: Path) -> None:
        self.limits = limits
        self.root = limits.root if limits.root is not None else spill_root
        self.started = 0  # ids handed out: ``job_1``, ``job_2``… (raised past a resumed log's)

    def mine(self, session: Agent) -> SessionJobs:
        found: SessionJobs = session.state(SessionJobs)
        return found

    def of(self, session: Agent) -> list[BgJob]:
        return list(self.mine(session).jobs.values())

    def get(self, session: Agent, jid: Any) -> BgJob | None:
        return self.mine(session).jobs.get(jid) if isinstance(jid, str) else None

    def start(self, session: Agent, *, kind: str, title: str, work: Callable[[JobIO], Awaitable[JobEnd]],
              call_id: str | None = None) -> BgJob:
        mine = self.mine(session)
        if mine.closed or session.disposed:
            raise ToolError("the session is closing: no job can start", code="SESSION_CLOSED")
        live, cap = mine.live(), self.limits.max_live
        if live >= cap:
            raise ToolError(
                f"background job limit reached: this session already has {live} running job"
                f"{'s' if live != 1 else ''} and the limit is {cap} per session. Wait for one to end "
                "(job_output with wait) or stop one (job_kill), then start this one again.",
                code="JOB_LIMIT",
            )
        self.started += 1
        jid = f"job_{self.started}"
        title = one_line(title, TITLE_MAX)
        job = BgJob(jid, kind=kind, title=title, call_id=call_id, session=session,
                    log=JobLog(spill_path_for(self.root, session.session_id, jid), self.limits.max_log_bytes))
        mine.jobs[jid] = job
        session.emit(JobStarted(id=jid, kind=kind, title=title, call_id=call_id))
        session.host.task_group.start_soon(self._run, job, work, name=f"job {jid} of {session.session_id[:8]}")
        return job

    async def _run(self, job: BgJob, work: Callable[[JobIO], Awaitable[JobEnd]]) -> None:
        end: JobEnd | None = None
        try:
            with anyio.CancelScope() as scope:
                job.scope = scope
                if job.cancel_early:  # killed before its task began: the work never starts
                    return
                try:
                    end = await work(job)
                except ToolError as exc:
                    end = JobEnd(status="failed", detail=str(exc))
                except Exception as exc:  # a broken work function must not take the host down
                    log.warning(f"job {job.id} failed: {exc!r}")
                    end = JobEnd(status="failed", detail=f"{type(exc).__name__}: {exc}")
        finally:
            self._settle(job, end)

    def _settle(self, job: BgJob, end: JobEnd | None) -> None:
        job.finish(end)
        session = job.session
        try:
            session.emit(JobSettled(id=job.id, status=job.status, exit_code=job.exit_code,
                                    detail=job.detail if job.status != "killed" else job.kill_reason,
                                    output_bytes=job.log.size + job.log.dropped))
        except Exception as exc:  # a session whose log has closed: nothing to record it in
            log.debug(f"job {job.id} settled after its session's log closed: {exc!r}")
        if job.watchers or job.kill_reason is not None or session.disposed:
            return  # a waiting job_output or job_kill shows this end; or nobody is left to tell
        # Dropped if, before the next request, a tool result shows this end (a job_output right
        # after the job ended, in the same step): the model is told once.
        session.notify(notice_text(job, self.limits.notice_tail), unless=lambda: job.reported)


def notice_text(job: BgJob, tail: int) -> str:
    """What the model reads in its next request when a job ends: id, status, the unread tail."""
    unread = job.log.size - job.read_offset
    head = f"[background job {job.id} {job.status_text()}] {job.kind}: {one_line(job.title, 200)}"
    if unread <= 0:
        return f"{head}\n(no output since your last job_output)"
    start = max(job.read_offset, job.log.size - tail)
    text = escape_system(job.log.read(start, job.log.size).decode("utf-8", errors="replace"))
    more = (f"(the last {job.log.size - start} of {unread} unread bytes; job_output "
            f'{{"job_id": "{job.id}"}} returns all of them)') if start > job.read_offset else \
        f'(job_output {{"job_id": "{job.id}"}} returns it again)'
    return f"{head}\noutput:\n{text.rstrip()}\n{more}"
