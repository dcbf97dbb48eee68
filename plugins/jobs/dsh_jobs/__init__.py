"""dsh plugin ``jobs``: background jobs for any tool — the host's ``Jobs`` seam (``dsh_jobs``).

``bash {…, run_in_background: true}`` (sandbox-tools) starts one (id ``bash-1``, ``bash-2``…) at
once; the command keeps running in the same sandbox, scrubbed environment and limits as a
foreground call, without its timeout. ``job_output`` reads what is new (``wait`` for the end),
``job_list`` lists the session's jobs, ``job_kill`` asks one to end (its whole process group:
SIGTERM, then SIGKILL) and answers at once. When a job ends by itself, the session is told once,
in the original harness's words: at its next model request, or, when it is idle, in a turn of
its own (at most ``max-wakes`` in a row before a person's next prompt). A session has at most
``max-live`` running or stopping jobs; closing or deleting it,
the client going away and the host exiting kill them all, and because every job runs through
a command server whose reaper holds the call, a ``kill -9`` of dsh kills them too. ``job/started``
and ``job/settled`` go to the session log. See README.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from msgspec import Meta

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.history import recorded_events
from dsh_core.spill import spill_path_for
from dsh_core.types import JobStarted, UserMessage

from .registry import BgJob, JobLog, JobRegistry, Limits, SessionJobs
from .tools import JobTools, read_new

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent, Host

__all__ = ["BgJob", "JobLog", "JobRegistry", "Limits", "SessionJobs", "read_new"]

NAME = "jobs"


class JobsConfig(PluginConfig):
    """[config.jobs]"""

    max_live: Annotated[int, Meta(ge=1, description="running background jobs per session")] = 10
    max_log_bytes: Annotated[int, Meta(ge=1024, description="bytes of a job's output kept on disk")] = 64 << 20
    read_bytes: Annotated[int, Meta(ge=256, description="bytes of new output one job_output shows (head and "
                                                          "tail past it)")] = 30_000
    wait_ms: Annotated[int, Meta(ge=0, description="job_output's default wait (with wait: true)")] = 30_000
    max_wait_ms: Annotated[int, Meta(ge=0, description="the longest wait job_output may ask for")] = 600_000
    max_wakes: Annotated[int, Meta(ge=0, description="completion notices that start a turn of an idle session, "
                                                      "in a row before a person's prompt")] = 3
    kill_grace_ms: Annotated[int, Meta(ge=0, description="job_kill: from SIGTERM to SIGKILL")] = 3000
    dir: Annotated[str | None, Meta(description="where job output goes (default: the host's spill root)")] = None


def registry_of(host: Host) -> JobRegistry:
    return host.state(JobRegistry)


dsh_config_type = config_type_hook(NAME, JobsConfig)


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    c = host.config_for(JobsConfig)
    limits = Limits(max_live=c.max_live, max_log_bytes=c.max_log_bytes, max_wakes=c.max_wakes,
                    kill_grace_s=c.kill_grace_ms / 1000, root=Path(c.dir) if c.dir else None)
    host.state(JobRegistry, lambda: JobRegistry(limits, host.spill_root))


@hookimpl
def dsh_jobs(host: Host) -> JobRegistry:
    return registry_of(host)


@hookimpl
def dsh_register_tools(register: Callable[[Any], None], host: Host) -> None:
    c = host.config_for(JobsConfig)
    for tool in JobTools(registry_of(host), limit=c.read_bytes, wait_ms=c.wait_ms,
                         max_wait_ms=max(c.max_wait_ms, c.wait_ms)).tools():
        register(tool)


@hookimpl
def dsh_session_artifacts(session_id: str, host: Host) -> list[Path]:
    """A deleted session's job logs: ``<root>/<session id>/``."""
    return [spill_path_for(registry_of(host).root, session_id, "x").parent]


class _Recall:
    """A resumed session's new jobs get ids its log has not used (``bash-1`` of an earlier
    process is not this one's ``bash-1``)."""

    def __init__(self, session: Agent) -> None:
        self.session = session

    async def decide(self) -> None:
        registry = registry_of(self.session.host)
        for ev in await recorded_events(self.session):  # none read back: the ids start over
            if isinstance(ev, JobStarted):
                registry.recall(ev.id)


@hookimpl
def dsh_session_start(session: Agent, source: str, turn: int) -> _Recall | None:
    return _Recall(session) if source == "resume" else None


@hookimpl
def dsh_prompt_submit(session: Agent, messages: list[UserMessage], turn: int) -> None:
    """A person's prompt entered a turn: its completion notices may start turns again."""
    if any(m.source == "user" for m in messages):
        registry_of(session.host).prompt_claimed(session)


@hookimpl
def dsh_register_guidance(register: Callable[[Any], None], host: Host) -> None:
    from .guidance import SECTIONS  # the text lives in its own module (guidance.py)

    for section in SECTIONS:
        register(section)

