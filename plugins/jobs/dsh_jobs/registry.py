"""The job registry: a session's background jobs, their output logs, their ends.

A job is ``work(io)`` (``protocols.Jobs.start``) run as a task of the host's group inside a
cancel scope of its own; its id is its kind and a count of that kind (``bash-1``, ``bash-2``,
``subagent-1``), as the original harness mints them. Its output goes to
``<spill root>/<session>/<job id>.log`` as it arrives (capped on disk, never held in memory); ``job_output`` reads what is new since the
last read by offset, so a read costs the same for 10 KB as for 10 GB of output. A job ends in
exactly one ``settle``: the status, a ``job/settled`` event, and, unless a tool call already
showed that end, one notice: read at the session's next model request, or, when the session is
idle, a turn of its own (at most ``max_wakes`` in a row before a person's prompt).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import anyio

from dsh_core import ToolError
from dsh_core.display import escape_system, one_line
from dsh_core.protocols import JobEnd
from dsh_core.spill import spill_path_for
from dsh_core.types import JobSettled, JobStarted

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent, JobIO

log = logging.getLogger("dsh.jobs")

Status = Literal["running", "stopping", "completed", "failed", "killed"]
TITLE_MAX = 2000  # characters of a job's title (its command line) kept in the log and shown


@dataclass(frozen=True)
class Limits:
    max_live: int = 10  # running or stopping jobs per session (the original's maxConcurrentJobsPerOwner)
    max_log_bytes: int = 64 << 20  # output kept on disk per job; the rest is counted, not kept
    kill_grace_s: float = 3.0  # job_kill: how long a job may take to end after SIGTERM
    max_wakes: int = 3  # completion notices that start a turn of an idle session, in a row (the original's 3)
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
        self.forced = False  # the kill had to cancel the work (SIGKILL), not just ask it to stop (SIGTERM)
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

    def status_detail(self) -> str | None:
        """What the original puts after the status: ``exit code: N``, ``signal: SIGTERM``, a failure's why."""
        if self._status == "completed":
            return f"exit code: {self.exit_code}" if self.exit_code is not None else None
        if self._status == "killed":
            return f"signal: {'SIGKILL' if self.forced else 'SIGTERM'}"
        if self._status == "failed":
            return self.detail
        return None

    def status_line(self) -> str:
        """``[status: running]``, ``[status: completed, exit code: 0]``, ``[status: killed, signal: SIGTERM]``…"""
        detail = self.status_detail()
        return f"[status: {self._status}, {detail}]" if detail else f"[status: {self._status}]"

    async def wait(self) -> None:
        await self.settled.wait()

    def cancel_work(self) -> None:
        """End the work now (a kill without grace): its scope, or, before it began, its start."""
        self.forced = True
        if self.scope is not None:
            self.scope.cancel()
        else:
            self.cancel_early = True

    def request_kill(self, reason: str | None = None) -> bool:
        """Ask the job to stop and return at once (False: it had already ended). Its status is
        ``stopping`` until the work ends; the job's own task cancels the work if it has not ended
        ``kill_grace_s`` after the work's ``stopping`` was set (SIGTERM, then SIGKILL)."""
        if self.settled.is_set():
            return False
        if self.kill_reason is None:
            self.kill_reason = reason or "job_kill"
        if self._status == "running":
            self._status = "stopping"
        self._stopping.set()
        if self.scope is None:  # its task has not begun: the work never starts
            self.cancel_early = True
        return True

    async def kill(self, reason: str | None = None) -> None:
        """``request_kill``, then return when the job has settled (the ``Job`` seam's kill)."""
        self.request_kill(reason)
        with anyio.CancelScope(shield=True):
            await self.settled.wait()

    def finish(self, end: JobEnd | None) -> None:
        """Its one end (``JobEnd`` None: cancelled before it reported one)."""
        if self.kill_reason is not None:
            self._status = "killed"
        elif end is None:
            self._status, self.kill_reason, self.forced = "killed", "its session ended", True
        else:
            self._status, self.exit_code, self.detail = end.status, end.exit_code, end.detail
        self.log.close()
        self.settled.set()

    def __repr__(self) -> str:
        return f"<job {self.id} {self.kind} {self.status_line()}>"


@dataclass(eq=False)
class SessionJobs:
    """The jobs one session started (its state slot): every live one killed when it ends,
    before the session's other resources close (``CLOSES_FIRST``: a job runs inside them)."""

    CLOSES_FIRST: ClassVar[bool] = True
    jobs: dict[str, BgJob] = field(default_factory=dict)
    closed: bool = False

    def live(self) -> int:
        """What the cap counts: running and stopping jobs (the original's active jobs)."""
        return sum(1 for j in self.jobs.values() if j.status in ("running", "stopping"))

    async def aclose(self) -> None:
        self.closed = True
        running = [j for j in self.jobs.values() if not j.settled.is_set()]
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
        self.ids: set[str] = set()  # every id this host handed out (another session's is "not yours")
        self.counters: dict[str, int] = {}  # ids handed out per kind: ``bash-1``, ``bash-2``… (raised past a resumed log's)

    def mine(self, session: Agent) -> SessionJobs:
        found: SessionJobs = session.state(SessionJobs)
        return found

    def of(self, session: Agent) -> list[BgJob]:
        return list(self.mine(session).jobs.values())

    def get(self, session: Agent, jid: Any) -> BgJob | None:
        return self.mine(session).jobs.get(jid) if isinstance(jid, str) else None

    def owned_elsewhere(self, jid: str) -> bool:
        """``jid`` is a job of this host, but not of the asking session."""
        return jid in self.ids

    def start(self, session: Agent, *, kind: str, title: str, work: Callable[[JobIO], Awaitable[JobEnd]],
              call_id: str | None = None) -> BgJob:
        mine = self.mine(session)
        if mine.closed or session.disposed:
            raise ToolError("the session is closing: no job can start", code="SESSION_CLOSED")
        live, cap = mine.live(), self.limits.max_live
        if live >= cap:
            raise ToolError(
                f"background job limit reached for this owner (limit: {cap}); use job_kill to stop an unneeded "
                "job, wait for it to finish, then retry",
                code="JOB_LIMIT",
            )
        count = self.counters[kind] = self.counters.get(kind, 0) + 1
        jid = f"{kind}-{count}"
        title = one_line(title, TITLE_MAX)
        job = BgJob(jid, kind=kind, title=title, call_id=call_id, session=session,
                    log=JobLog(spill_path_for(self.root, session.session_id, jid), self.limits.max_log_bytes))
        mine.jobs[jid] = job
        self.ids.add(jid)
        session.emit(JobStarted(id=jid, kind=kind, title=title, call_id=call_id))
        session.host.task_group.start_soon(self._run, job, work, name=f"job {jid} of {session.session_id[:8]}")
        return job

    def recall(self, jid: str) -> None:
        """A resumed log names ``jid`` (``bash-3``): its kind's new ids start past it."""
        kind, _, number = jid.rpartition("-")
        if kind and number.isdigit():
            self.counters[kind] = max(self.counters.get(kind, 0), int(number))

    async def _run(self, job: BgJob, work: Callable[[JobIO], Awaitable[JobEnd]]) -> None:
        end: JobEnd | None = None
        try:
            with anyio.CancelScope() as scope:
                job.scope = scope
                if job.cancel_early:  # killed before its task began: the work never starts
                    return
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._enforce_kill, job, scope, name=f"kill of job {job.id}")
                    try:
                        end = await work(job)
                    except ToolError as exc:
                        end = JobEnd(status="failed", detail=str(exc))
                    except Exception as exc:  # a broken work function must not take the host down
                        log.warning(f"job {job.id} failed: {exc!r}")
                        end = JobEnd(status="failed", detail=f"{type(exc).__name__}: {exc}")
                    tg.cancel_scope.cancel()
        finally:
            self._settle(job, end)

    async def _enforce_kill(self, job: BgJob, scope: anyio.CancelScope) -> None:
        """The rest of a ``job_kill``, in the job's own task: the work was asked to stop
        (SIGTERM); past the grace period its work is cancelled (SIGKILL through its reaper)."""
        await job.stopping.wait()
        await anyio.sleep(self.limits.kill_grace_s)
        job.forced = True
        scope.cancel()

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
        # An idle session gets a turn of its own for it (the original's wakeup delivery), at most
        # max_wakes in a row until a person's prompt is claimed (a woken turn that starts a job
        # whose end wakes it again stops there); a busy one reads it at its next model request.
        # Dropped if, before that request, a tool result shows this end (a job_output right after
        # the job ended, in the same step): the model is told once.
        # (A busy session's notice still asks for a wake: if its turn ends before the next request,
        # the spine starts the turn that reads it, instead of leaving it for a person's prompt.)
        streak = session.state(WakeStreak)
        wake = streak.wakes < self.limits.max_wakes
        if wake and not session.busy:
            streak.wakes += 1
        session.notify(notice_text(job), unless=lambda: job.reported, wake=wake)

    def prompt_claimed(self, session: Agent) -> None:
        """A person's prompt entered a turn: completion notices may wake the session again."""
        session.state(WakeStreak).wakes = 0


@dataclass(eq=False)
class WakeStreak:
    """Turns completion notices started since a person's last prompt (a session's state slot of its
    own: a prompt must not create ``SessionJobs``, whose close kills jobs through the session's
    command servers and so must come before theirs — slots close newest first)."""

    wakes: int = 0


def notice_text(job: BgJob) -> str:
    """What the model reads when a job ends by itself, in the original's words."""
    return (f"background job {job.id} ({job.kind}: {escape_system(job.title)}) finished {job.status_line()}. "
            "Read its output with job_output.")
