"""The agent pool: run one task in one fresh ACP session of a pooled agent process.

Used in-process by the local engine and inside every Ray actor, so both engines run tasks
the same way. Agent processes are ``dsh run --example E [--provider P --model M]`` spawned
through ``dsh_acp.client`` (the module ``dsh ask`` uses), one pool of processes
per (example, provider, model). Each process carries up to ``sessions_per_agent`` sessions
at once.

**Sessions are not leaked.** A task's session is closed with ``session/close`` when the
agent advertises ``sessionCapabilities.close``. dsh does not (yet), so every process is
*recycled* after ``recycle_after`` sessions: it takes no new session, and once its last
one settles its stdin is closed and the whole process tree is shut down. Memory and open
files per process stay bounded however long the batch.

**A crash fails only its own tasks.** When a process dies (or its connection breaks),
the prompts in flight on it settle ``error`` with class ``agent_crashed`` and
``retryable=True``; the process is never leased again, so the engine's retry lands on a
fresh process. A process that cannot start is ``agent_start``, retryable too.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
import anyio.to_thread
from dsh_acp.client import AcpClient, AcpClientError, PermissionAsk, open_client

from dsh_core.compose import example_argument

from .records import Agent, ErrorInfo, Permission, Result, Task
from .stats import Pricer, read_log

CANCEL_GRACE = 5.0  # after session/cancel (timeout, Ctrl-C): how long a prompt gets to settle
START_TIMEOUT = 60.0  # initialize / session/new

AgentKey = tuple[str, str | None, str | None]  # (example, provider, model)


@dataclass
class Defaults:
    """Per-task settings a task line may override."""

    example: str = "acp-agent"
    provider: str | None = None
    model: str | None = None
    cwd: str = field(default_factory=os.getcwd)
    timeout_s: float | None = None
    approve: str = "deny"


def agent_argv(key: AgentKey) -> list[str]:
    example, provider, model = key
    argv = [sys.executable, "-m", "dsh_core.cli", "run", "--example", example_argument(example)]
    if provider:
        argv += ["--provider", provider]
    if model:
        argv += ["--model", model]
    return argv


def resolve(task: Task, defaults: Defaults) -> tuple[AgentKey, str, float | None, str]:
    """(agent key, absolute cwd, timeout, approve) for a task."""
    model = task.model if task.model is not None else defaults.model
    if model and os.path.exists(model):  # a script path relative to where `dsh batch` runs
        model = os.path.abspath(model)
    key = (task.example or defaults.example, task.provider or defaults.provider, model)
    cwd = os.path.abspath(os.path.join(defaults.cwd, task.cwd)) if task.cwd else defaults.cwd
    timeout = task.timeout_s if task.timeout_s is not None else defaults.timeout_s
    return key, cwd, timeout, task.approve or defaults.approve


@dataclass(eq=False)
class _Proc:
    key: AgentKey
    ready: anyio.Event = field(default_factory=anyio.Event)
    stop: anyio.Event = field(default_factory=anyio.Event)
    client: AcpClient | None = None
    failure: str | None = None
    fatal: bool = False  # it could not start, and no agent of its key ever will (see _serve)
    active: int = 0
    leased: int = 0
    limit: float = math.inf
    dead: bool = False
    retiring: bool = False

    @property
    def pid(self) -> int | None:
        return self.client.pid if self.client is not None else None

    def usable(self, per_agent: int) -> bool:
        if self.client is not None and not self.client.alive:  # crashed: never lease it again
            self.dead = True
        return not (self.dead or self.retiring) and self.active < per_agent and self.leased < self.limit


class _StartFailed(Exception):
    def __init__(self, message: str, *, fatal: bool) -> None:
        super().__init__(message)
        self.fatal = fatal


@dataclass
class Outcome:
    result: Result
    retryable: bool = False
    fatal: bool = False  # no task of this run can start: the engine stops dispatching


def _echo_stderr(data: bytes) -> None:
    sys.stderr.buffer.write(data)


class Runner:
    """A pool of agent processes inside one task group (``async with Runner(...) as r``)."""

    def __init__(
        self,
        defaults: Defaults,
        *,
        sessions_per_agent: int = 4,
        recycle_after: int = 250,
        env: dict[str, str] | None = None,
        verbose: bool = False,
        on_agent: Callable[[str, int | None], None] | None = None,
    ) -> None:
        self.defaults = defaults
        self.per_agent = max(1, sessions_per_agent)
        self.recycle_after = max(1, recycle_after)
        self.env = dict(os.environ) if env is None else env
        self.verbose = verbose
        self.on_agent = on_agent  # ("spawned" | "exited", pid) for tests and progress
        self.node = socket.gethostname()
        self.procs: dict[AgentKey, list[_Proc]] = {}
        self.interrupting = False
        self._waiters: set[anyio.CancelScope] = set()
        self._lock = anyio.Lock()
        self._tg: anyio.abc.TaskGroup | None = None
        self._cm: Any = None
        self.spawned = 0
        self.pricer = Pricer()

    async def __aenter__(self) -> Runner:
        self._cm = anyio.create_task_group()
        self._tg = await self._cm.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        for procs in self.procs.values():
            for proc in procs:
                proc.retiring = True
                if proc.active == 0:
                    proc.stop.set()
        return await self._cm.__aexit__(*exc)

    # ------------------------------------------------------------------ processes

    async def _serve(self, proc: _Proc) -> None:
        try:
            async with open_client(
                agent_argv(proc.key),
                cwd=os.getcwd(),
                env=self.env,
                on_stderr=_echo_stderr if self.verbose else None,
            ) as client:
                proc.client = client
                if self.on_agent is not None:
                    self.on_agent("spawned", client.pid)
                await client.initialize(timeout=START_TIMEOUT)
                if not client.can_close_sessions:
                    proc.limit = self.recycle_after
                proc.ready.set()
                await proc.stop.wait()
        except Exception as exc:  # AcpClientError, or a tree that survived SIGKILL
            proc.failure = str(exc) or type(exc).__name__
            # Deterministic: the command cannot be spawned, or dsh refused its arguments (exit
            # status 2: unknown example or provider, a bad config table). A fresh agent would fail
            # the same way, so the batch stops instead of retrying every task.
            code = proc.client.process.returncode if proc.client is not None else None
            proc.fatal = not proc.ready.is_set() and (proc.client is None or code == 2)
        finally:
            proc.dead = True
            proc.ready.set()
            if self.on_agent is not None and proc.client is not None:
                self.on_agent("exited", proc.client.pid)
            procs = self.procs.get(proc.key, [])
            if proc in procs:
                procs.remove(proc)

    async def _lease(self, key: AgentKey) -> _Proc:
        async with self._lock:
            procs = self.procs.setdefault(key, [])
            candidates = [p for p in procs if p.usable(self.per_agent)]
            if candidates:
                proc = max(candidates, key=lambda p: p.active)  # fill a process before opening another
            else:
                proc = _Proc(key)
                procs.append(proc)
                self.spawned += 1
                assert self._tg is not None
                self._tg.start_soon(self._serve, proc)
            proc.active += 1
            proc.leased += 1
        await proc.ready.wait()
        if proc.dead or proc.client is None:
            self._release(proc)
            raise _StartFailed(proc.failure or "the agent exited during start-up", fatal=proc.fatal)
        return proc

    def _release(self, proc: _Proc, *, broken: bool = False) -> None:
        proc.active -= 1
        if broken:
            proc.dead = True
        if proc.leased >= proc.limit:
            proc.retiring = True
        if (proc.dead or proc.retiring) and proc.active == 0:
            proc.stop.set()

    # ------------------------------------------------------------------ control

    def interrupt(self) -> None:
        """Stop every prompt in flight: each sends ``session/cancel`` and settles as
        ``interrupted`` (within ``CANCEL_GRACE``)."""
        self.interrupting = True
        for scope in list(self._waiters):
            scope.cancel()

    async def kill(self) -> None:
        """Second Ctrl-C: SIGKILL every agent tree now; in-flight prompts settle at once."""
        self.interrupting = True
        async with anyio.create_task_group() as tg:
            for procs in list(self.procs.values()):
                for proc in list(procs):
                    if proc.client is not None:
                        tg.start_soon(lambda c: c.shutdown(kill_now=True), proc.client)

    # ------------------------------------------------------------------ one task

    async def execute(self, task: Task, attempt: int = 1, retried: list[ErrorInfo] | None = None) -> Outcome:
        started = time.monotonic()
        key, cwd, timeout, approve = resolve(task, self.defaults)
        retried = list(retried or [])

        def finish(
            status: str,
            stop: str,
            text: str = "",
            error: ErrorInfo | None = None,
            *,
            session_id: str | None = None,
            permissions: list[Permission] | None = None,
            agent: Agent | None = None,
            retryable: bool = False,
            fatal: bool = False,
            usage: dict[str, int] | None = None,
            **numbers: Any,
        ) -> Outcome:
            result = Result(
                id=task.id,
                status=status,  # type: ignore[arg-type]
                stop_reason=stop,
                text=text,
                error=error,
                usage=usage,
                duration_ms=round((time.monotonic() - started) * 1000),
                attempts=attempt,
                session_id=session_id,
                permissions=permissions or [],
                agent=agent,
                retried=retried,
                **numbers,
            )
            return Outcome(result, retryable=retryable and not self.interrupting, fatal=fatal)

        if self.interrupting:
            return finish("interrupted", "cancelled", error=ErrorInfo(cls="interrupted", message="the batch was interrupted before the task started"))
        if not os.path.isdir(cwd):
            return finish("failed", "error", error=ErrorInfo(cls="cwd_missing", message=f"cwd {cwd!r} is not a directory on node {self.node}"))
        try:
            proc = await self._lease(key)
        except _StartFailed as exc:
            status = "interrupted" if self.interrupting else "failed"
            return finish(status, "error", error=ErrorInfo(cls="agent_start", message=str(exc), agent=Agent(node=self.node)),
                          retryable=not exc.fatal, fatal=exc.fatal)
        client = proc.client
        assert client is not None
        agent = Agent(pid=client.pid, node=self.node)
        broken = False
        try:
            return await self._run_session(task, proc, client, agent, cwd, timeout, approve, finish)
        except _Broken as exc:
            broken = True
            status = "interrupted" if self.interrupting else "failed"
            return finish(status, "error", exc.text, ErrorInfo(cls="agent_crashed", message=exc.message, agent=agent), session_id=exc.session_id, agent=agent, retryable=True)
        finally:
            self._release(proc, broken=broken or not client.alive)

    async def _run_session(
        self,
        task: Task,
        proc: _Proc,
        client: AcpClient,
        agent: Agent,
        cwd: str,
        timeout: float | None,
        approve: str,
        finish: Callable[..., Outcome],
    ) -> Outcome:
        async def policy(ask: PermissionAsk) -> Literal["allow", "reject"]:
            return "allow" if approve == "allow" else "reject"

        try:
            session = await client.new_session(cwd, on_permission=policy, timeout=START_TIMEOUT)
        except AcpClientError as exc:
            if not client.alive:
                raise _Broken(str(exc), "", None) from None
            return finish("failed", "error", error=ErrorInfo(cls="session_new", message=str(exc), agent=agent), agent=agent)

        box: list[Any] = []
        done = anyio.Event()

        async def go() -> None:
            try:
                box.append(await session.prompt(task.prompt, cancel_grace=0.1))
            finally:
                done.set()

        cause = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(go)
                with anyio.CancelScope(deadline=time.monotonic() + timeout if timeout else math.inf) as waiter:
                    self._waiters.add(waiter)
                    try:
                        if self.interrupting:
                            waiter.cancel()
                        await done.wait()
                    finally:
                        self._waiters.discard(waiter)
                if not done.is_set():
                    cause = "interrupted" if self.interrupting else "timeout"
                    await session.cancel()
                    with anyio.move_on_after(CANCEL_GRACE):
                        await done.wait()
                    if not done.is_set():  # the agent does not settle: give up on this process
                        proc.retiring = True
                        tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await session.close()

        permissions = [
            Permission(tool_call_id=ask.tool_call_id, title=ask.title, verdict=verdict) for ask, verdict in session.permissions
        ]
        pr = box[0] if box else None
        text = pr.text if pr is not None else session.text
        stop = pr.stop_reason if pr is not None else "cancelled"
        sid = session.session_id
        common: dict[str, Any] = dict(session_id=sid, permissions=permissions, agent=agent)
        log = read_log(sid)
        if log is not None:
            cost = await anyio.to_thread.run_sync(self.pricer.price, proc.key[0], log.calls) if log.calls else None
            common.update(usage=log.usage, turns=log.turns, tool_calls=log.tool_calls, model_calls=log.model_calls, cost=cost)
        if pr is not None and pr.stop_reason == "error":
            if pr.error_kind == "closed" or not client.alive:
                raise _Broken(pr.error or "the agent went away", text, sid)
            cls = "agent_error" if pr.error_kind == "rpc" else "protocol"
            return finish("failed", "error", text, ErrorInfo(cls=cls, message=pr.error or "", code=pr.error_code, agent=agent), **common)
        if stop == "end_turn":  # settled before (or while) a cancel went out: the answer stands
            return finish("ok", stop, text, **common)
        if cause == "interrupted" or (self.interrupting and stop == "cancelled"):
            return finish("interrupted", stop, text, ErrorInfo(cls="interrupted", message="cancelled: the batch was interrupted", agent=agent), **common)
        if cause == "timeout":
            settled = "" if pr is not None else f" (it did not settle within {CANCEL_GRACE:g} s)"
            err = ErrorInfo(cls="timeout", message=f"timed out after {timeout:g} s; the session was cancelled{settled}", agent=agent)
            return finish("failed", stop, text, err, **common)
        return finish("failed", stop, text, ErrorInfo(cls="stop", message=f"the agent stopped with {stop!r}", agent=agent), **common)


class _Broken(Exception):
    def __init__(self, message: str, text: str, session_id: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.text = text
        self.session_id = session_id
