"""The shipped code runtime: each run a fresh fork of the session's warm confined process.

The session's warm process (``_warm.py``, host side in ``warm.py``) is started once through
the spine's ``Confinement`` seam (``host.confinement``, provided by sandbox-tools: the
session's permission mode, bubblewrap or Landlock, the scrubbed environment), already past
interpreter start-up and imports; each run is a fork of it, in a session of its own, bounded
by ``ProcessBound`` (its cgroup, joined before anything of the run starts) and the rlimits the
program side applies (CPU seconds, address space), with a reaper that kills and reaps every
process of the run before it reports the exit. Tool calls cross a private socketpair (JSON
lines, see ``_child.py``); stdout and stderr are a separate pipe, captured as the program's
output. Everything the program sends is hostile input: every line is bounded, decoded
strictly into one of two message types, and checked (increasing call ids, known tools,
outstanding-call and total-call caps). The first of done / failure / budget / cancel ends
the run: every process of it is killed at once (the reaper's view and the cgroup's),
outstanding calls are cancelled and drained, and the result is returned once nothing of the
run can run any more (every thread in its cgroup gone or exiting; without a cgroup, once the
reaper reported every process gone); the reaper's report, the cgroup's removal and the
descriptors' close then finish in the session's task.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec

from dsh_core.errors import CodeCallError, ToolError
from dsh_core.types import CodeRunError, CodeRunResult

from .limits import Limits, ProcessBound
from .warm import Launched, Ready, WarmError, WarmSlot, Where, warm_argv

KINDS_FROM_CHILD = ("exception", "timeout", "output-limit")
DRAIN_GRACE_S = 0.5  # after the end, how long the last output may still take to arrive
# While more of a program's calls wait for a worker, the writer lets the event loop go round this
# many times before sending the replies it has: those that finish meanwhile leave in the same
# write. Each write wakes the program process, on another CPU (its own: see _child.AsyncChannel);
# 100 gathered reads 10.2 -> 10.0 ms with 2-8 turns (bench/floor_code_mode.py reads, alternating).
# Bounded in turns, not time: a reply is never held for a slow call, only for calls already running.
REPLY_HOLD_TURNS = 3
# How many calls a worker runs before it sends the replies it has and lets the loop go round
# (a call admitted at once takes no loop turn of its own: ``dsh_core.schedule``). 100 gathered reads, A/B
# in one session: a slice of 4 cost 0.5 ms more than 8, 16 0.26 ms less than 8, 24 and 32 about
# what 16 does; 16 reads hold the event loop ~1.5 ms, a burst of native calls all of its time.
WORKER_SLICE = 16
CHANNEL_GRACE_S = 5.0  # after the process exits, how long the rest of the channel may take to read
# What a run leaves for the session's task (the next run made ready, the ended run's teardown)
# starts this many loop turns after the run returns: its result goes first (the tool dispatch
# yields twice before it records it, and their forks, threads and messages ran in those yields:
# from the run's return to its result event 0.16 -> 0.06 ms, medians of 15 runs of 100 reads).
DEFER_TURNS = 4
# While the program's next message is due (its first after ``go``; the next once every call is
# answered, often ``done``), the event loop is kept turning this long rather than left to block
# in epoll: other tasks run as ever, but the CPU does not go idle. Idle, this VM halts it at once
# (no halt-polling: guest_halt_poll_ns is 0) and waking it took 0.1-0.3 ms: ``done`` was seen
# 0.28 ms after the program wrote it (median of 14), 0.009 ms with the loop turning; host idle in
# a run of 100 gathered reads 0.55 -> 0.07 ms; the floors row 1.20x -> 1.18x (medians of four
# alternating runs). A program slower than this to send its next message costs it once.
SPIN_S = 0.0005


class _Call(msgspec.Struct, tag="call", tag_field="t", forbid_unknown_fields=True):
    id: int
    name: str
    args: msgspec.Raw  # kept as sent: decoded once for the tool, logged as is (never re-encoded)


class _Done(msgspec.Struct, tag="done", tag_field="t", forbid_unknown_fields=True):
    ok: bool
    value: Any = None
    kind: str = ""
    error: str = ""


_decode = msgspec.json.Decoder(_Call | _Done | Ready).decode
_decode_args = msgspec.json.Decoder(dict[str, Any]).decode
_encode = msgspec.json.Encoder().encode


MAX_DEPTH = 100  # JSON nesting a value may have (the child checks it too; a hostile one may not)


def _too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests deeper than ``limit``: checked without recursion, because a value
    that deep would overflow every recursive encoder it meets later (a host traceback)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, list):
            continue
        if d >= limit:
            return True
        stack.extend((x, d + 1) for x in v)
    return False


_libc = ctypes.CDLL(None, use_errno=True)


def _this_cpu() -> int:
    """The CPU this thread (the event loop's) runs on now, -1 when unknown: the program process
    keeps off it while its calls overlap (``_child.AsyncChannel``)."""
    try:
        return int(_libc.sched_getcpu())
    except AttributeError:  # a libc without it
        return -1


def _program_message(program: str, names: list[str], limits: Limits, nproc: int) -> bytes:
    return _encode({"t": "program", "program": program, "names": names, "limits": {
        "cpu_seconds": limits.compute_seconds, "address_space_bytes": limits.address_space_bytes,
        "nproc": nproc, "max_value_bytes": limits.max_value_bytes, "network": limits.network}})


def _offer(spare: Any, message: bytes) -> bytes | None:
    """Send ``message`` (and its newline) to a run made ready, as far as its socket takes it at
    once (never blocking); what is left, for ``execute`` to send. None: not sent, because another
    run offered it its program already (and failed before taking it: ``WarmSlot.take`` discards it)."""
    if spare.offered:
        return None
    spare.offered = True
    spare.keep_off(_this_cpu())
    data = message + b"\n"
    try:
        spare.channel.setblocking(False)
        return data[spare.channel.send(data):]
    except BlockingIOError:
        return data
    except OSError:  # gone: take() finds it dead and makes another
        return data


class _Ended(Exception):
    pass


def _cancel_soon(scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` from the event loop's next turn, not from this task: anyio (4.16) writes
    the cancelling task's repr into the scope's reason, its coroutine and frame formatted, and a
    callback has no task. A run's way from ``done`` to its return: 0.455 -> 0.379 ms of host CPU
    (medians of 30 alternating runs of 100 gathered reads). On another backend: at once."""
    loop = asyncio._get_running_loop()
    if loop is None:
        scope.cancel()
    else:
        loop.call_soon(scope.cancel)


class PythonRuntime:
    """``CodeRuntime`` for Python: each run a fresh fork of the session's warm confined process.

    With ``session``, the warm process lives in the session's ``WarmSlot`` (started by the
    first run, replaced when the confinement changes or it died, closed with the session) and
    runs in the session's tier (the mode it chose: plan and read-only sessions run programs
    read-only); without one, each run starts and ends a warm process of its own. ``mode``
    narrows the tier further (``confined_to``), never widens it.
    """

    language = "python"

    def __init__(self, host: Any, cwd: str, limits: Limits | None = None, *, session: Any = None,
                 mode: str | None = None, owner: Any = None) -> None:
        self.host = host
        self.cwd = cwd
        self.limits = limits or Limits()
        self.session = session
        self.mode = mode
        self.owner = owner if owner is not None else session  # whose tier applies

    def confined_to(self, mode: str, *, network: bool = True) -> PythonRuntime:
        """This runtime narrowed to ``mode`` (e.g. ``read-only`` for a workflow script), in a warm
        process of its own per run (the session's stays as it is); ``network=False`` also denies
        the program's processes every internet socket (``_child.cut_network``)."""
        limits = self.limits if network else replace(self.limits, network=False)
        return PythonRuntime(self.host, self.cwd, limits, mode=mode, owner=self.owner)

    async def _where(self) -> Where:
        confinement = self.host.confinement
        if confinement is None:  # never unconfined: the spine's Confinement seam is required
            raise ToolError("run_code needs a plugin that provides confinement (mount sandbox-tools); "
                            "it never runs a program unconfined", code="SANDBOX_UNAVAILABLE")
        confined = await confinement.confine(warm_argv(), cwd=self.cwd, mode=self.mode, session=self.owner)
        return Where(argv=tuple(confined.argv), env=tuple(sorted(confined.env.items())),
                     cwd=os.path.realpath(self.cwd), max_processes=self.limits.max_processes,
                     confined=confined.mechanism is not None)

    async def prestart(self) -> None:
        """Start the session's warm process and make its first run ready now, before any program
        comes (a task of the session: see ``WarmStart``), so its first run costs what a later one
        does. Only for a session's runtime; a failure is left for the first run to meet (it
        tries again, and says why it cannot)."""
        if self.session is None:
            return
        await self.session.state(WarmSlot).refill(await self._where())

    async def keep_ready(self) -> None:
        """The session's warm start and its refills, as one task of the session (``WarmStart``,
        until it is disposed): start the warm process and make the first run ready now, then,
        whenever a run that took the one made ready has ended, make the next one ready — in this
        task, not the run's, so a run's result never waits for the next run's forks and cgroup."""
        if self.session is None:
            return
        keeper = self.session.state(_Keeper)
        async with anyio.create_task_group() as teardowns:  # ended runs' teardowns: awaited when it ends
            keeper.running = True
            keeper.teardowns = teardowns
            try:
                try:
                    await self.prestart()
                except (WarmError, ToolError) as exc:  # the first run meets it again and says why
                    logging.getLogger("dsh.code-mode").debug("could not start the warm runtime ahead: %r", exc)
                while True:
                    await keeper.wake.wait()
                    keeper.wake = anyio.Event()
                    await _after_the_result()
                    keeper.tear_down_ended()
                    where, keeper.want = keeper.want, None
                    if where is not None:
                        await _refill(self.session.state(WarmSlot), where)
            finally:
                keeper.tear_down_ended()  # awaited with the rest as the task group ends (each shielded)
                keeper.running = False
                keeper.teardowns = None

    async def run(self, program: str, bindings: Any, cancel: anyio.Event | None = None) -> CodeRunResult:
        slot = self.session.state(WarmSlot) if self.session is not None else WarmSlot()
        keeper = self.session.state(_Keeper) if self.session is not None else None
        names = list(bindings.names)
        # The program goes to the run made ready before its confinement is confirmed: it compiles
        # it meanwhile (nothing of it runs before ``go``; a run that no longer matches is killed
        # unstarted). 100 gathered reads: the first call came ~0.15 ms sooner.
        spare = slot.spare
        offered = _offer(spare, _program_message(program, names, self.limits, spare.bound.nproc)) \
            if spare is not None else None
        where = await self._where()
        try:
            try:
                prepared = await slot.take(where, spare if offered is not None else None)
            except WarmError as exc:
                raise ToolError(f"run_code could not start its confined runtime ({exc}); nothing was run",
                                code="SANDBOX_UNAVAILABLE") from None
            run = _Run(self.limits, bindings, prepared.launched, prepared.bound, keeper, readied=prepared.readied)
            if prepared is not spare:
                offered = None
            if keeper is not None and keeper.running:
                # The session's task makes the next run ready once this one has ended, not while it
                # runs: on two CPUs, the next run's forks, cgroup and rehearsal took CPU from this
                # run's program and calls (100 gathered reads: 11.7 -> 10.5 ms, run_code call to
                # result, bench/profile_code_reads.py). A model's answer comes between two
                # programs of a session, far longer than the ~5 ms it takes.
                try:
                    return await run.execute(prepared.channel, program, names, cancel, offered)
                finally:
                    keeper.want = where
                    keeper.wake.set()
            async with anyio.create_task_group() as tg:  # no session task: made ready while this one runs
                tg.start_soon(_refill, slot, where)
                result = await run.execute(prepared.channel, program, names, cancel, offered)
            return result
        finally:
            if self.session is None:
                await slot.aclose()


@dataclass
class _Keeper:
    """A session's state slot: whether its ``keep_ready`` task runs, and the next run it should
    make ready (where the last run ran)."""

    running: bool = False
    want: Where | None = None
    wake: anyio.Event = field(default_factory=anyio.Event)
    teardowns: anyio.abc.TaskGroup | None = None  # where ended runs finish being torn down (its task's)
    ended: list[_Run] = field(default_factory=list)  # runs whose teardown is left to the session's task

    def tear_down_ended(self) -> None:
        """Start the teardown of the runs that ended (``_Run._stop_shielded``), in ``teardowns``."""
        ended, self.ended = self.ended, []
        if self.teardowns is not None:
            for run in ended:
                self.teardowns.start_soon(run._stop_shielded)


async def _after_the_result() -> None:
    """Let the run's result be recorded first (``DEFER_TURNS``)."""
    for _ in range(DEFER_TURNS):
        await anyio.lowlevel.checkpoint()


async def _refill(slot: WarmSlot, where: Where) -> None:
    """Make the session's next run ready; a failure costs this run nothing (the next run makes
    its own, or says why it cannot)."""
    try:
        await slot.refill(where)
    except WarmError:
        pass
    except Exception as exc:  # e.g. out of descriptors: reported, never the program's failure
        logging.getLogger("dsh.code-mode").warning("could not make the next run ready: %r", exc)


class _Run:
    def __init__(self, limits: Limits, bindings: Any, launched: Launched, bound: ProcessBound,
                 keeper: _Keeper | None = None, *, readied: bool = False) -> None:
        self.limits = limits
        self.keeper = keeper
        self.emptied = False  # nothing of the run can run any more (its cgroup settled)
        self.killing: list[int] = []  # pidfds of the cgroup's members signalled at the end, not yet waited for
        self.bindings = bindings
        self.launched = launched
        self.bound = bound
        self.output = bytearray()
        self.output_total = 0
        self.channel_closed = anyio.Event()
        self.error: CodeRunError | None = None
        self.value: Any = None
        self.finished = False
        self.last_id = 0
        self.readied = readied  # the program process's ready line was read (it says so once, first)
        self.spinning = True  # the loop is kept turning while the next message is due (``_awaiting_next``)
        self.calls = 0
        self.pending = 0
        self.messages = 0
        self.outbox: deque[bytes] = deque()
        self.outbox_ready = anyio.Event()
        self.sock: socket.socket | None = None
        self.writing = False  # the writer task owns the socket's send side (a backlog is queued)
        self.names: set[str] = set()
        self.queue: deque[tuple[int, str, Awaitable[Any], int]] = deque()  # calls waiting for a worker
        self.workers = 0
        parallel = getattr(bindings, "max_parallel", None)  # optional: how many calls may run at once
        self.max_workers = min(parallel, limits.max_pending_calls) if isinstance(parallel, int) and parallel > 0 \
            else limits.max_pending_calls
        self.outstanding = 0  # bytes held for the run: unanswered calls' arguments + unwritten replies
        self.room = anyio.Event()  # set when ``outstanding`` went down

    # ------------------------------------------------------------------ ending

    def fail(self, kind: str, message: str) -> None:
        if not self.finished:
            self.finished = True
            self.error = CodeRunError(kind=kind, message=message)  # type: ignore[arg-type]
            self._end_now()
        raise _Ended

    def succeed(self, value: Any) -> None:
        """The program said ``done``: it ends its process itself at once, so what is left of the
        run is killed once the run's tasks have unwound (``_kill_all``), not before."""
        if not self.finished:
            self.finished = True
            self.value = value
        raise _Ended

    def _end_now(self) -> None:
        """The run failed or was stopped: its processes are killed at once (the reaper told, the
        cgroup's members signalled) while the host unwinds the run's tasks; ``_kill_all`` then
        waits for them."""
        self.launched.kill()
        pids = self.bound.members()
        if pids:
            self.killing = self.bound.kill_members(pids)

    def kill(self) -> None:
        """Everything of the run dies now: the reaper kills its processes (the cgroup's: ``_end_now``, ``_kill_all``)."""
        self.launched.kill()

    async def _kill_all(self) -> bool:
        """Where the run has a cgroup: SIGKILL every process in it, again until nothing of it can
        run any more, each waited for through its pidfd (readable once the process has exited).
        Nothing can once every thread listed is gone or exiting (``ProcessBound.settled``): an
        empty cgroup is final, a process leaves it only by exiting, and one still forking is
        listed before it can exit. A program that ended itself is exiting by now: it is not
        waited for. True once settled; False without a cgroup, or when it did not settle within
        ``DRAIN_GRACE_S`` (then the reaper's report is awaited)."""
        with anyio.move_on_after(DRAIN_GRACE_S):
            while (settled := self.bound.settled()) is not None:
                if settled:
                    return True
                fds, self.killing = self.killing, []
                fds += self.bound.kill_members(self.bound.members() or [])
                if not fds:  # listed, yet neither ours to signal nor exiting: look again a turn later
                    await anyio.lowlevel.checkpoint()
                try:
                    for fd in fds:
                        await anyio.wait_readable(fd)
                finally:
                    for fd in fds:
                        os.close(fd)
        return False

    async def _stop_shielded(self) -> None:
        """``stop`` as a task of the session's ``keep_ready``: never cancelled half-way (the
        session's end waits for it), and a failure is reported, never the keeper's end."""
        with anyio.CancelScope(shield=True):
            await _after_the_result()
            try:
                await self.stop()
            except Exception as exc:
                logging.getLogger("dsh.code-mode").warning("could not finish tearing a run down: %r", exc)

    async def stop(self) -> None:
        """Kill every process of the run and wait until it is gone: the reaper's report (it reaps
        all it started, setsid'd and double-forked ones included), then the cgroup's view."""
        self.launched.kill()
        with anyio.move_on_after(5):
            await self.launched.wait()
        if self.bound.cgroup is not None:
            # Kills anything left in it, then removes it: in a worker thread even when it is empty,
            # because a cgroup's rmdir waits for the kernel's cgroup lock, which anything moving a
            # process between cgroups meanwhile may hold through an RCU grace period: measured in
            # the event loop, 1-10 ms of every session's time in most runs while runs joined
            # through cgroup.procs (bench/profile_code_reads.py, end>result).
            await anyio.to_thread.run_sync(self.bound.close)
        self.launched.close()

    # ------------------------------------------------------------------ the run

    async def execute(self, sock: socket.socket, program: str, names: list[str], cancel: anyio.Event | None,
                      offered: bytes | None = None) -> CodeRunResult:
        """Run ``program`` over ``sock`` (the host's end of the channel, closed here); ``offered``:
        its ``program`` message was sent already (``_offer``), all but these bytes of it."""
        # A plain non-blocking socket, not a stream: a reply is written at once from the task that
        # has it (no hop through a writer task while the socket has room), and a failed write
        # never discards what the program already sent (an asyncio transport drops its unread
        # input when a write fails, and with it a ``done`` that raced a late reply).
        sock.setblocking(False)
        self.sock = sock
        self.names = set(names)
        lim = self.limits
        # The program first (unless it went ahead), then ``go``: the program process starts on it
        # while the tasks below are set up (what the socket does not take now, the writer sends
        # once it runs).
        if offered is None:
            self._post(_program_message(program, names, lim, self.bound.nproc))
        elif offered:
            self._write(offered)
        self._send({"t": "go", "host_cpu": _this_cpu()})
        try:
            try:
                with anyio.fail_after(lim.wall_seconds):
                    # The program's calls, the writer, the output's reader and the watchers, in one
                    # group: the first watcher that ends the run cancels it all (outstanding calls
                    # are cancelled, drained). The channel is read in this task (a task fewer to
                    # start and stop; so is the output's end, below: one group to unwind, not two).
                    async with anyio.create_task_group() as calls:
                        stop = calls.cancel_scope
                        calls.start_soon(self._writer)
                        calls.start_soon(self._read_output)
                        if cancel is not None:
                            calls.start_soon(self._watching, stop, self._watch_cancel, cancel)
                        calls.start_soon(self._watching, stop, self._watch_exit)
                        await self._watching(stop, self._read_channel, calls)
            except TimeoutError:
                self._set("timeout", f"the program ran past its wall-clock budget of {lim.wall_seconds:g} s")
            finally:
                self._drop_queued()
            # The program is done one way or another: kill what is left. Once nothing of it can
            # run (its cgroup settled), nothing writes to the output any more: what is in the pipe
            # is all of it. Without a cgroup, once the reaper reported every process gone, the
            # rest is read to the output's end; the reaper is told only then (it is told in the
            # teardown anyway): it wakes for it, on another CPU.
            self.emptied = await self._kill_all()
            if self.emptied:
                self._took_output(self.launched.available(lim.max_output_bytes + 1))
            else:
                self.kill()
                with anyio.move_on_after(DRAIN_GRACE_S):
                    await self.launched.wait()
                with anyio.move_on_after(DRAIN_GRACE_S):
                    await self._read_output()
        finally:
            with anyio.CancelScope(shield=True):
                sock.close()
                for fd in self.killing:  # signalled, never waited for (the run was cancelled meanwhile)
                    os.close(fd)
                self.killing = []
                keeper = self.keeper
                if self.emptied and keeper is not None and keeper.teardowns is not None:
                    # Nothing of the run runs any more: the result need not wait for the reaper's
                    # report, the cgroup's removal and the descriptors' close. The session's task
                    # finishes them (its end awaits them); the next run does not wait for them.
                    # That task starts it, once the result is in: starting a task here was 37 us
                    # of a run's way from ``done`` to its return (medians of 25 runs).
                    keeper.ended.append(self)
                    keeper.wake.set()
                else:
                    await self.stop()
        text = bytes(self.output[: lim.max_output_bytes]).decode("utf-8", errors="replace")
        logs = text.rstrip("\n").split("\n") if text.strip("\n") else []
        return CodeRunResult(logs=logs, value=None if self.error else self.value, error=self.error)

    def _set(self, kind: str, message: str) -> None:
        if not self.finished:
            self.finished = True
            self.error = CodeRunError(kind=kind, message=message)  # type: ignore[arg-type]

    @staticmethod
    async def _watching(stop: anyio.CancelScope, watch: Callable[..., Awaitable[None]], *args: Any) -> None:
        """One of the run's watchers: the first that ends the run stops the others (a cancel, not
        an exception through the task group: no exception group to make and match)."""
        try:
            await watch(*args)
        except _Ended:
            _cancel_soon(stop)

    async def _watch_cancel(self, cancel: anyio.Event) -> None:
        await cancel.wait()
        self.fail("abort", "the program was aborted")

    async def _watch_exit(self) -> None:
        code = await self.launched.wait()  # the reaper reports once every process of the run is gone
        with anyio.move_on_after(CHANNEL_GRACE_S):  # a done message written before the exit is still read
            await self.channel_closed.wait()
        self.fail("worker-exit", f"the program's process ended without finishing (exit status {code})")

    async def _read_output(self) -> None:
        """The program's output as it comes, until its end (every writer gone)."""
        try:
            while chunk := await self.launched.read():
                self._took_output(chunk)
        except OSError:
            pass

    def _took_output(self, chunk: bytes) -> None:
        self.output_total += len(chunk)
        room = self.limits.max_output_bytes - len(self.output)
        if room > 0:
            self.output += chunk[:room]
        if self.output_total > self.limits.max_output_bytes and not self.finished:
            self._set("output-limit", f"the program printed more than {self.limits.max_output_bytes} bytes")
            self.kill()

    async def _read_channel(self, calls: anyio.abc.TaskGroup) -> None:
        assert self.sock is not None
        buf = bytearray()
        spin_until = 0.0  # the first message is looked for with the loop turning (``SPIN_S``)
        scanned = 0
        limit = self.limits.max_message_bytes
        while True:
            while self.outstanding >= self.limits.max_outstanding_bytes:
                # Back-pressure: the program's writes block until calls are answered and replies read.
                self.room = anyio.Event()
                await self.room.wait()
            try:
                chunk = self.sock.recv(1 << 16)
            except BlockingIOError:
                if not self.last_id:
                    now = time.perf_counter()
                    spin_until = spin_until or now + SPIN_S
                    if now < spin_until:
                        await anyio.lowlevel.checkpoint()
                        continue
                await anyio.wait_readable(self.sock)
                continue
            except OSError:  # reset by a program that went away: as good as end-of-file
                chunk = b""
            if not chunk:
                self.channel_closed.set()
                await anyio.sleep_forever()  # the exit watcher reports how the process ended
            buf += chunk
            start = 0  # where the next line starts: the lines read are removed once, not one by one
            while True:
                nl = buf.find(b"\n", scanned)
                if nl < 0:
                    del buf[:start]
                    scanned = len(buf)
                    if len(buf) > limit:
                        self.fail("output-limit", f"the program sent a message larger than {limit} bytes")
                    break
                line = bytes(buf[start:nl])
                start = scanned = nl + 1
                if len(line) > limit:
                    self.fail("output-limit", f"the program sent a message larger than {limit} bytes")
                self._handle(line, calls)

    def _handle(self, line: bytes, calls: anyio.abc.TaskGroup) -> None:
        try:
            msg = _decode(line)
        except RecursionError:
            self.fail("invalid-output", "the program's runtime sent an invalid message (nested too deeply to decode)")
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.fail("invalid-output", f"the program's runtime sent an invalid message ({str(exc)[:200]})")
        if isinstance(msg, Ready):
            if self.readied or self.last_id:
                self.fail("invalid-output", "the program's runtime said it was ready again")
            self.readied = True  # said before the program came, and not read then (``Prepared.keep_off``)
            return
        args = self._arguments(msg) if isinstance(msg, _Call) else {}
        # (nesting deeper than MAX_DEPTH takes more than MAX_DEPTH brackets: a short line cannot)
        if len(line) > MAX_DEPTH and _too_deep(msg.value if isinstance(msg, _Done) else args):
            self.fail("invalid-output", f"the program's runtime sent a value nested deeper than {MAX_DEPTH} levels")
        if isinstance(msg, _Done):
            if msg.ok:
                size = len(line)
                if size > self.limits.max_value_bytes + 64:
                    self.fail("output-limit", f"the return value is larger than {self.limits.max_value_bytes} bytes")
                self.succeed(msg.value)
            kind = msg.kind if msg.kind in KINDS_FROM_CHILD else "invalid-output"
            self.fail(kind, msg.error[:16_000] or "the program failed")
        assert isinstance(msg, _Call)
        if msg.id <= self.last_id:
            self.fail("invalid-output", f"the program's runtime reused call id {msg.id}")
        self.last_id = msg.id
        self.messages += 1
        if self.messages > 2 * self.limits.max_calls:  # refusals cost a reply each: bound them too
            self.fail("output-limit", f"the program sent more than {2 * self.limits.max_calls} tool calls")
        if msg.name not in self.names:
            self._reply_error(msg.id, msg.name, f"no tool {msg.name!r}", "UNKNOWN_TOOL")
            return
        if self.calls >= self.limits.max_calls:
            self._reply_error(msg.id, msg.name,
                              f"this program already made {self.limits.max_calls} tool calls; no more are allowed",
                              "TOO_MANY_CALLS")
            return
        if self.pending >= self.limits.max_pending_calls:
            self._reply_error(msg.id, msg.name,
                              f"{self.limits.max_pending_calls} tool calls are already in flight; await some first",
                              "TOO_MANY_CALLS")
            return
        self.calls += 1
        self.pending += 1
        self._hold(len(line))  # the decoded arguments live until the call is answered
        arguments = bytes(msg.args).decode()  # valid UTF-8: its strings were just decoded into ``args``
        awaitable = self.bindings.call(msg.name, args, arguments)  # takes its place in line now, in program order
        self.queue.append((msg.id, msg.name, awaitable, len(line)))
        if self.workers < self.max_workers:
            self.workers += 1
            calls.start_soon(self._work)

    async def _work(self) -> None:
        """Run queued calls in their order until none is left. At most as many workers as calls
        can run at once (the bindings' ``max_parallel``): a task per worker, not per call (an
        anyio task costs about as much as the rest of a call's way through this bridge). The
        calls keep their order: each took its place in the scheduler's line when it came, and
        workers take them first come first served, so the call at the head of the line is
        always held by a worker."""
        try:
            done = 0
            while self.queue:
                if done == WORKER_SLICE:
                    # The replies so far leave now, and the loop gets a turn (the other workers,
                    # the reader, other sessions), every WORKER_SLICE calls: calls admitted at once
                    # take no loop turn each (``dsh_core.schedule.Ticket``).
                    done = 0
                    self._send_queued()
                    await anyio.lowlevel.checkpoint()
                    continue
                done += 1
                call_id, name, awaitable, size = self.queue.popleft()
                try:
                    value = await awaitable
                except CodeCallError as exc:
                    self._reply_error(call_id, name, exc.message, exc.code)
                    continue
                except Exception as exc:  # a bindings bug answers this call, it does not end the run
                    self._reply_error(call_id, name, f"internal error: {exc!r}", "INTERNAL")
                    continue
                finally:
                    self.pending -= 1
                    self._release(size)
                self._reply(call_id, name, value)
            if not self.pending and not self.queue:
                await self._awaiting_next()
        finally:
            self.workers -= 1

    async def _awaiting_next(self) -> None:
        """Every call is answered: keep the event loop turning until the program's next message
        has come (the reader takes it) or ``SPIN_S`` has passed (see there). Once it has passed
        in vain, the run does not do it again: a program that takes its time between calls
        costs the host one ``SPIN_S``, not one per call."""
        if not self.spinning:
            return
        seen = self.last_id
        deadline = time.perf_counter() + SPIN_S
        while not self.finished and self.last_id == seen:
            if time.perf_counter() >= deadline:
                self.spinning = False
                return
            await anyio.lowlevel.checkpoint()

    def _drop_queued(self) -> None:
        """Calls still queued when the program ended never started: close them unstarted."""
        while self.queue:
            awaitable = self.queue.popleft()[2]
            close = getattr(awaitable, "close", None)
            if close is not None:
                close()

    def _arguments(self, msg: _Call) -> dict[str, Any]:
        try:
            return _decode_args(msg.args)
        except RecursionError:
            self.fail("invalid-output", "the program's runtime sent an invalid message (nested too deeply to decode)")
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.fail("invalid-output", f"the program's runtime sent an invalid message (call arguments: "
                                        f"{str(exc)[:200]})")
        raise AssertionError("unreachable")

    def _hold(self, size: int) -> None:
        self.outstanding += size

    def _release(self, size: int) -> None:
        self.outstanding -= size
        self.room.set()

    def _reply(self, call_id: int, name: str, value: Any) -> None:
        try:
            data = _encode({"t": "reply", "id": call_id, "ok": True, "value": value})
        except (TypeError, msgspec.EncodeError) as exc:
            self._reply_error(call_id, name, f"the result cannot be encoded: {exc}", "INTERNAL")
            return
        if len(data) > self.limits.max_message_bytes:
            self._reply_error(call_id, name, f"the result is larger than {self.limits.max_message_bytes} bytes",
                              "RESULT_TOO_LARGE")
            return
        self._post(data)

    def _reply_error(self, call_id: int, name: str, message: str, code: str | None) -> None:
        self._send({"t": "reply", "id": call_id, "ok": False, "tool": name, "error": message, "code": code})

    def _send(self, msg: dict[str, Any]) -> None:
        self._post(_encode(msg))

    def _post(self, data: bytes) -> None:
        """Queue one message for the writer, or, when no other call is in flight (a program
        awaiting one call at a time), send it now as far as the socket takes it. Replies that
        finish together leave in one write (measured: a send per reply cost 39 us each, most of
        a burst's overhead). Never blocks the caller, so a program that does not read its replies
        cannot deadlock the host (what waits is bounded by the call caps and back-pressure)."""
        self._write(data + b"\n")

    def _write(self, data: bytes) -> None:
        """``_post`` for bytes that end a message already (the rest of one sent in part)."""
        if not self.writing and self.pending == 0 and self.sock is not None:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:  # the program's end is gone: nobody will read it
                return
            if sent == len(data):
                return
            data = data[sent:]
        self.outbox.append(data)
        self._hold(len(data))
        self.writing = True
        self.outbox_ready.set()

    def _send_queued(self) -> bool:
        """Send the queued replies, in order, as far as the socket takes them now (at most 1 MiB a
        write); True when none is left."""
        assert self.sock is not None
        while self.outbox:
            batch = [self.outbox.popleft()]
            size = len(batch[0])
            while self.outbox and size < (1 << 20):
                batch.append(self.outbox.popleft())
                size += len(batch[-1])
            data = b"".join(batch)
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                sent = len(data)  # gone: drop it, and the rest as it comes
            self._release(sent)
            if sent < len(data):
                self.outbox.appendleft(data[sent:])
                return False
        return True

    async def _writer(self) -> None:
        """Send what is queued, as much as the socket takes at once (after up to
        ``REPLY_HOLD_TURNS`` turns of the loop while calls still wait for a worker); wait until it
        has room only when it had none (not before every batch: an epoll registration and a loop
        turn each)."""
        assert self.sock is not None
        while True:
            await self.outbox_ready.wait()
            self.outbox_ready = anyio.Event()
            for _ in range(REPLY_HOLD_TURNS):
                if not self.queue:
                    break
                await anyio.lowlevel.checkpoint()
            while not self._send_queued():
                await anyio.wait_writable(self.sock)
            self.writing = False
