"""``dsh batch --ray [ADDRESS]``: the same agent pool, as Ray actors.

Imported only with ``--ray`` (Ray is the optional extra ``dsh-batch[ray]``).

- ``ray.init``: ``local`` (no ADDRESS: a new local instance), ``auto`` (the cluster this
  machine belongs to), ``ray://host:port`` (Ray Client) or ``host:port``.
- ``A`` actors (``--ray-actors``, default one per alive node), spread over the nodes, each
  reserving one CPU and running a ``runner.Runner`` — the local engine's pool — so its agent
  processes (``dsh run --example …``) live on the actor's node, with ``ceil(N / A)``
  sessions of the ``--concurrency N`` each.
- Tasks are sharded one at a time to the actor with the fewest tasks in flight; each
  result comes back to the driver as soon as its task ends, and only the driver writes
  ``--out``, so resuming works exactly as with the local engine.
- Ctrl-C: every actor interrupts its sessions (they come back ``interrupted``). An actor
  that dies (its node lost) fails its tasks in flight as retryable ``agent_crashed``; they
  run again on the other actors.

**The workspace is a shared filesystem.** A task's ``cwd`` (and a scripted ``--model``
path) must be the same absolute path on every node — an NFS/CephFS mount, or the same
checkout at the same path. A cwd missing on the actor's node fails that task with class
``cwd_missing`` naming the node. Agents inherit the environment of the node's Ray worker
(so ``DEEPSEEK_API_KEY`` is set where ``ray start`` runs, never shipped by the driver); the
driver forwards only its non-secret ``DSH_*`` settings. Session logs are written under
``DSH_HOME`` on the actor's node; each result names it (``agent.node``).
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import asdict
from typing import Any, cast

import msgspec
import ray
from dsh_acp.client import CREDENTIAL_SHAPED

from .records import Agent, ErrorInfo, Task, from_builtins, to_builtins
from .runner import Defaults, Outcome


@ray.remote
class BatchActor:
    """One node's share of the pool: a ``Runner`` served on the actor's event loop."""

    def __init__(self, defaults: dict[str, Any], sessions_per_agent: int, recycle_after: int, verbose: bool) -> None:
        self._args = (Defaults(**defaults), sessions_per_agent, recycle_after, verbose)
        self._runner: Any = None
        self._serving: Any = None
        self._down: Any = None

    async def _ensure(self) -> Any:
        import asyncio

        import anyio

        from .runner import Runner

        if self._serving is None:
            up = asyncio.Event()
            self._down = anyio.Event()
            defaults, per_agent, recycle_after, verbose = self._args

            async def serve() -> None:
                async with Runner(defaults, sessions_per_agent=per_agent, recycle_after=recycle_after, verbose=verbose) as r:
                    self._runner = r
                    up.set()
                    await self._down.wait()

            self._serving = asyncio.ensure_future(serve())
            self._up = up
        await self._up.wait()
        return self._runner

    async def run(self, task: dict[str, Any], attempt: int, retried: list[dict[str, Any]]) -> dict[str, Any]:
        runner = await self._ensure()
        outcome: Outcome = await runner.execute(
            msgspec.convert(task, Task), attempt, [msgspec.convert(e, ErrorInfo) for e in retried]
        )
        return {"result": to_builtins(outcome.result), "retryable": outcome.retryable, "fatal": outcome.fatal}

    async def interrupt(self) -> None:
        if self._runner is not None:
            self._runner.interrupt()

    async def kill(self) -> None:
        if self._runner is not None:
            await self._runner.kill()

    async def close(self) -> None:
        if self._serving is not None:
            self._down.set()
            await self._serving

    def node(self) -> str:
        import socket

        return socket.gethostname()


def _forwarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("DSH_") and not CREDENTIAL_SHAPED.search(k)}


class RayExecutor:
    """The driver's side: ``async with RayExecutor(...) as ex: await ex.execute(task, …)``."""

    def __init__(
        self,
        address: str,
        defaults: Defaults,
        *,
        concurrency: int,
        sessions_per_agent: int,
        recycle_after: int,
        actors: int | None,
        verbose: bool,
        note: Any,
    ) -> None:
        self.address = address
        self.defaults = defaults
        self.concurrency = concurrency
        self.sessions_per_agent = sessions_per_agent
        self.recycle_after = recycle_after
        self.actors_wanted = actors
        self.verbose = verbose
        self.note = note
        self.actors: list[Any] = []
        self.inflight: dict[int, int] = {}
        self.dead: set[int] = set()
        self._started_ray = False

    async def __aenter__(self) -> RayExecutor:
        import anyio

        await anyio.to_thread.run_sync(self._start)
        return self

    def _start(self) -> None:
        kwargs: dict[str, Any] = {"log_to_driver": self.verbose, "logging_level": "warning"}
        if self.address == "local":
            kwargs["include_dashboard"] = False
        if not ray.is_initialized():
            ray.init(address=self.address, **kwargs)
            self._started_ray = True
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        count = self.actors_wanted or max(1, len(nodes))
        per_actor = math.ceil(self.concurrency / count)
        env = _forwarded_env()
        options: dict[str, Any] = {
            "num_cpus": 1,
            "scheduling_strategy": "SPREAD",
            "max_concurrency": max(16, per_actor * 2 + 8),
        }
        if env:
            options["runtime_env"] = {"env_vars": env}
        defaults = asdict(self.defaults)
        actor_class = cast(Any, BatchActor)  # @ray.remote made it a Ray ActorClass
        self.actors = [
            actor_class.options(**options).remote(defaults, self.sessions_per_agent, self.recycle_after, self.verbose)
            for _ in range(count)
        ]
        self.inflight = dict.fromkeys(range(count), 0)
        where = sorted(set(ray.get([a.node.remote() for a in self.actors])))
        self.note(f"ray: {count} actor(s) on {len(where)} node(s) ({', '.join(where)}), {per_actor} sessions each")

    async def __aexit__(self, *exc: Any) -> None:
        import anyio

        with anyio.CancelScope(shield=True):
            for i, actor in enumerate(self.actors):
                if i in self.dead:
                    continue
                with contextlib.suppress(Exception):
                    await actor.close.remote()
            if self._started_ray:
                await anyio.to_thread.run_sync(ray.shutdown)

    async def execute(self, task: Task, attempt: int, retried: list[ErrorInfo]) -> Outcome:
        live = [i for i in self.inflight if i not in self.dead]
        if not live:
            err = ErrorInfo(cls="agent_crashed", message="every Ray actor of this batch has died")
            return Outcome(_failed(task, attempt, retried, err), retryable=False)
        index = min(live, key=lambda i: self.inflight[i])
        self.inflight[index] += 1
        try:
            reply = await self.actors[index].run.remote(
                to_builtins(task), attempt, [msgspec.to_builtins(e) for e in retried]
            )
        except ray.exceptions.RayActorError as exc:
            self.dead.add(index)
            err = ErrorInfo(cls="agent_crashed", message=f"Ray actor {index} died: {exc}", agent=Agent())
            return Outcome(_failed(task, attempt, retried, err), retryable=True)
        finally:
            self.inflight[index] -= 1
        return Outcome(from_builtins(reply["result"]), retryable=reply["retryable"], fatal=reply.get("fatal", False))

    def interrupt(self) -> None:
        for i, actor in enumerate(self.actors):
            if i not in self.dead:
                actor.interrupt.remote()

    async def kill(self) -> None:
        for i, actor in enumerate(self.actors):
            if i not in self.dead:
                with contextlib.suppress(Exception):
                    await actor.kill.remote()


def _failed(task: Task, attempt: int, retried: list[ErrorInfo], err: ErrorInfo) -> Any:
    from .records import Result

    return Result(
        id=task.id, status="failed", stop_reason="error", text="", error=err, attempts=attempt, retried=list(retried)
    )
