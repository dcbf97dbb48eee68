"""Background jobs in one host: bash's ``run_in_background`` on the real sandbox (bubblewrap,
Landlock, and unconfined in danger-full-access), the job tools, notices, the cap, kills and
teardown, judged by the processes the kernel still has (``/proc``)."""

from __future__ import annotations

import json
import secrets
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from dsh_jobs import JobLog, JobRegistry, Limits, read_new
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from dsh_core import ToolError
from dsh_core.contracts import AgentSpec
from dsh_core.protocols import JobEnd
from dsh_core.types import JobSettled, JobStarted, TextBlock, ToolResultEvent, UserMessage, UserMessageEvent
from dsh_testing import live_processes, memory_host, new_sleep_marker, sleepers
from dsh_testing import sleepers_gone as gone

pytestmark = pytest.mark.anyio

PLUGINS = ("scripted-model", "sandbox-tools", "jobs")
TIERS = [*MECHANISMS, "unconfined"]  # unconfined: danger-full-access (a command server without confinement)


def new_marker() -> str:
    return new_sleep_marker(3000)


def tier_config(tier: str, jobs: dict | None = None) -> dict:
    if tier != "unconfined":
        require_mechanism(tier)
        sandbox = {"mechanism": tier, "permission-mode": "workspace-write"}
    else:
        sandbox = {"permission-mode": "danger-full-access"}
    return {"sandbox-tools": sandbox, "jobs": jobs or {}}


class Session:
    def __init__(self, host, agent):
        self.host, self.agent, self.events = host, agent, []
        agent.subscribe(lambda a, e: self.events.append(e))

    async def turn(self, text: str, within: float = 30) -> list:
        before = len(self.results())
        self.agent.submit(UserMessage(id=f"u{len(self.events)}", content=[TextBlock(text=text)]))
        with anyio.fail_after(within):
            await self.agent.wait_idle()
        return self.results()[before:]

    def results(self) -> list:
        return [e.result for e in self.events if isinstance(e, ToolResultEvent)]

    def of(self, kind) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    def notices(self) -> list[str]:
        return [e.message.content[0].text for e in self.events
                if isinstance(e, UserMessageEvent) and e.message.source == "notice"]

    async def settled(self, n: int = 1, within: float = 10) -> None:
        with anyio.fail_after(within):
            while len(self.of(JobSettled)) < n:
                await anyio.sleep(0.01)


@asynccontextmanager
async def session(scripted, cwd, rules, config):
    script = scripted({"rules": rules})
    async with memory_host(script, plugins=PLUGINS, config=config) as host:
        agent = host.create_agent(AgentSpec(cwd=str(cwd), provider="scripted", model=str(script)))
        yield Session(host, agent)


def bg(command: str) -> dict:
    return {"tool": "bash", "args": {"description": "Run the command", "command": command, "run_in_background": True}}


def text(result) -> str:
    return result.content[0].text


@pytest.mark.parametrize("tier", TIERS)
async def test_a_background_command_answers_at_once_and_is_read_as_it_goes(scripted, tmp_path, tier):
    gate = ("echo one; touch printed; while [ ! -e gate ]; do sleep 0.01; done; echo two; "
            "echo to-stderr >&2; exit 3")
    rules = [{"when": "^go", "steps": [
        bg(gate),
        {"tool": "bash", "args": {"description": "Run the command", "command": "while [ ! -e printed ]; do sleep 0.01; done"}},
        {"tool": "job_output", "args": {"job_id": "{started_id}"}},
        {"tool": "bash", "args": {"description": "Run the command", "command": "touch gate"}},
        {"tool": "job_output", "args": {"job_id": "{started_id}", "wait": True, "timeout_ms": 20000}},
        {"tool": "job_output", "args": {"job_id": "{started_id}"}},
        {"tool": "job_list", "args": {}},
        {"text": "done"}]}]
    async with session(scripted, tmp_path, rules, tier_config(tier)) as s:
        started, _, first, _, final, again, listed = await s.turn("go")
    assert text(started) == "started background job bash-1" and not started.is_error  # the original's ids: kind and count
    assert text(first) == "one\n[status: running]"
    assert text(final) == "two\nto-stderr\n[status: completed, exit code: 3]"  # since the last read, both streams
    assert text(again) == "(no new output)\n[status: completed, exit code: 3]"
    assert text(listed) == f"bash-1 [bash] completed — {gate}"
    (st,) = s.of(JobStarted)
    (end,) = s.of(JobSettled)
    assert (st.id, st.kind, st.title, st.call_id) == ("bash-1", "bash", gate, "call_1")
    assert (end.id, end.status, end.exit_code, end.output_bytes) == ("bash-1", "completed", 3, 18)
    # (whether the end was also a notice depends on whether the job settled before the waiting
    # job_output's request was built: both are right; test_an_end_read_… pins the rule)


@pytest.mark.parametrize("tier", MECHANISMS)
async def test_a_job_runs_in_the_sessions_sandbox_with_the_scrubbed_environment(scripted, tmp_path, tier,
                                                                                 monkeypatch):
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-job-secret")
    outside = Path("/var/tmp") / f"dsh-job-escape-{secrets.token_hex(4)}"
    command = (f"echo inside > inside.txt && echo wrote-inside; echo outside > {outside} || echo refused-outside; "
               "echo key=${DEEPSEEK_API_KEY:-none} sandbox=$DSH_SANDBOX")
    rules = [{"when": "^go", "steps": [
        bg(command), {"tool": "job_output", "args": {"job_id": "{started_id}", "wait": True}}, {"text": "done"}]}]
    try:
        async with session(scripted, tmp_path, rules, tier_config(tier)) as s:
            _, out = await s.turn("go")
        got = text(out)
        assert "wrote-inside" in got and "refused-outside" in got and "key=none sandbox=workspace-write" in got
        assert "sk-job-secret" not in got
        assert not outside.exists() and (tmp_path / "inside.txt").read_text() == "inside\n"
    finally:
        outside.unlink(missing_ok=True)


async def test_over_the_cap_the_call_says_so_and_a_stopping_job_still_counts(scripted, tmp_path):
    """The original's background-job-admission: a limit of one, a second background call is
    refused naming it; job_kill answers at once and the job counts while it is stopping (a
    command that ignores SIGTERM: until the SIGKILL after the grace period); then a new one starts."""
    marker = new_marker()
    rules = [{"when": "^go", "steps": [
        bg(f"trap '' TERM; touch trapped; sleep {marker}"), bg("echo second"),
        {"tool": "bash", "args": {"description": "Run the command", "command": "while [ ! -e trapped ]; do sleep 0.01; done"}},  # TERM is ignored now
        {"tool": "job_kill", "args": {"job_id": "bash-1", "reason": "make room"}},
        {"tool": "job_list", "args": {}},
        bg("echo third"),
        {"tool": "job_output", "args": {"job_id": "bash-1", "wait": True}},
        bg("echo fourth"), {"text": "done"}]}]
    config = tier_config("unconfined", {"max-live": 1, "kill-grace-ms": 500})
    async with session(scripted, tmp_path, rules, config) as s:
        first, second, _trapped, killed, stopping, third, waited, fourth = await s.turn("go")
        await s.settled(2)
    assert text(first) == "started background job bash-1"
    limit = ("Error: background job limit reached for this owner (limit: 1); use job_kill to stop an unneeded "
             "job, wait for it to finish, then retry")
    assert second.is_error and text(second) == limit and third.is_error and text(third) == limit
    assert [e.code for e in s.events if isinstance(e, ToolResultEvent)][1] == "JOB_LIMIT"
    assert text(killed) == "requested cancellation of job bash-1"
    assert text(stopping) == f"bash-1 [bash] stopping — trap '' TERM; touch trapped; sleep {marker}"
    assert text(waited) == "(no new output)\n[status: killed, signal: SIGKILL]"  # it ignored SIGTERM
    assert text(fourth) == "started background job bash-2"  # ids count the jobs that started, per kind
    assert not sleepers(marker)
    assert [(e.id, e.status, e.detail) for e in s.of(JobSettled)] == [("bash-1", "killed", "make room"),
                                                                      ("bash-2", "completed", None)]


@pytest.mark.parametrize("tier", TIERS)
async def test_job_kill_ends_the_group_and_what_escaped_it(scripted, tmp_path, tier):
    marker = new_marker()
    command = f"sleep {marker} & setsid sleep {marker} & (sleep {marker} &); touch started; sleep {marker}"
    rules = [
        {"when": "^start", "steps": [
            bg(command), {"tool": "bash", "args": {"description": "Run the command", "command": "while [ ! -e started ]; do sleep 0.01; done"}},
            {"text": "started"}]},
        {"when": "^kill", "steps": [{"tool": "job_kill", "args": {"job_id": "bash-1"}},
                                    {"tool": "job_output", "args": {"job_id": "bash-1", "wait": True}},
                                    {"tool": "job_kill", "args": {"job_id": "bash-1"}}, {"text": "killed"}]}]
    async with session(scripted, tmp_path, rules, tier_config(tier)) as s:
        await s.turn("start")
        with anyio.fail_after(10):
            while len(sleepers(marker)) < 4:
                await anyio.sleep(0.02)
        assert s.agent.turn == 1 and len(sleepers(marker)) == 4  # the turn ended; the job runs on
        killed, out, again = await s.turn("kill")
        assert text(killed) == "requested cancellation of job bash-1"
        assert text(out) == "(no new output)\n[status: killed, signal: SIGTERM]"
        assert text(again) == "job bash-1 had already finished [status: killed, signal: SIGTERM]"
        assert not sleepers(marker)


@pytest.mark.parametrize("tier", TIERS)
async def test_closing_the_session_kills_its_jobs(scripted, tmp_path, tier):
    marker = new_marker()
    rules = [{"when": "^start", "steps": [
        bg(f"setsid sleep {marker} & touch started; sleep {marker}"),
        {"tool": "bash", "args": {"description": "Run the command", "command": "while [ ! -e started ]; do sleep 0.01; done"}}, {"text": "ok"}]}]
    async with session(scripted, tmp_path, rules, tier_config(tier)) as s:
        await s.turn("start")
        with anyio.fail_after(10):  # `touch started` may run before both sleeps have exec'd
            while len(sleepers(marker)) < 2:
                await anyio.sleep(0.02)
        with anyio.fail_after(10):
            await s.agent.dispose()
        assert not sleepers(marker)  # dispose returns after every process of the job is gone
        (end,) = s.of(JobSettled)
        assert (end.status, end.detail) == ("killed", "its session ended")


async def test_a_job_that_ends_between_turns_is_one_notice_in_the_next_request(scripted, tmp_path):
    command = "printf 'line %s\\n' $(seq 1 500); exit 7"
    rules = [
        {"when": "^start", "steps": [bg(command), {"text": "started"}]},
        {"when": "^next", "steps": [{"text": "next turn"}]}]
    async with session(scripted, tmp_path, rules, tier_config("unconfined", {"max-wakes": 0})) as s:
        await s.turn("start")
        await s.settled()
        await s.turn("next")
        await s.turn("next")
        (notice,) = s.notices()
        assert notice == (f"background job bash-1 (bash: {command}) finished [status: completed, exit code: 7]. "
                          "Read its output with job_output.")
        assert s.agent.history[-1].content[0].text == "next turn"
        # in the next request only, after that turn's prompt; the turn after has none
        users = [m for m in s.agent.history if getattr(m, "source", None) in ("notice", "user")]
        assert [m.source for m in users] == ["user", "user", "notice", "user"]


async def test_ten_megabytes_of_output_are_read_as_head_and_tail_naming_the_file(scripted, tmp_path):
    rules = [{"when": "^go", "steps": [
        bg("head -c 10000000 /dev/zero | tr '\\0' x; echo; echo THE-END"),
        {"tool": "job_output", "args": {"job_id": "{started_id}", "wait": True}}, {"text": "done"}]}]
    async with session(scripted, tmp_path, rules, tier_config("unconfined")) as s:
        _, out = await s.turn("go")
    body = text(out)
    assert len(body.encode()) < 31_000 and body.endswith("THE-END\n[status: completed, exit code: 0]")
    (path,) = [w for w in body.split() if w.endswith("bash-1.log")]
    assert "bytes omitted; all of the job's output is in " in body and "(this read: bytes 0–10000009)" in body
    assert Path(path).stat().st_size == 10_000_009


async def test_no_usable_sandbox_refuses_the_background_call_before_any_job(scripted, tmp_path):
    """The original's missing-sandbox-runner, foreground and background: both calls fail closed
    with SANDBOX_UNAVAILABLE; no job is left to chase."""
    rules = [{"when": "^go", "steps": [
        {"tool": "bash", "args": {"description": "Run the command", "command": "echo hi"}}, bg("echo hi"), {"tool": "job_list", "args": {}},
        {"text": "done"}]}]
    config = {"sandbox-tools": {"mechanism": "none", "permission-mode": "workspace-write"}}
    async with session(scripted, tmp_path, rules, config) as s:
        fg, back, listed = await s.turn("go")
    for result in (fg, back):
        assert result.is_error and 'sandbox mode "workspace-write" is requested but no sandbox backend is usable' \
            in text(result)
    assert text(listed) == "(no background jobs)" and not s.of(JobStarted)


async def test_bash_offers_run_in_background_only_with_a_job_registry(scripted, tmp_path):
    script = scripted({"default": [{"text": "hi"}]})
    async with memory_host(script, plugins=PLUGINS) as host:
        assert "run_in_background" in host.tools["bash"].spec.parameters["properties"]
        assert {"job_output", "job_list", "job_kill"} <= set(host.tools)
    async with memory_host(script, plugins=("scripted-model", "sandbox-tools")) as host:
        assert host.jobs is None and "run_in_background" not in host.tools["bash"].spec.parameters["properties"]


async def test_another_sessions_jobs_are_not_found(scripted, tmp_path):
    marker = new_marker()
    rules = [{"when": "^start", "steps": [bg(f"sleep {marker}"), {"text": "ok"}]},
             {"when": "^peek", "steps": [{"tool": "job_output", "args": {"job_id": "bash-1"}},
                                         {"tool": "job_kill", "args": {"job_id": "bash-9"}}, {"text": "ok"}]}]
    async with session(scripted, tmp_path, rules, tier_config("unconfined")) as s:
        other = Session(s.host, s.host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted",
                                                               model=s.agent.spec.model)))
        await s.turn("start")
        with anyio.fail_after(10):
            while not sleepers(marker):
                await anyio.sleep(0.02)
        read, kill = await other.turn("peek")
        assert read.is_error and text(read) == "Error: job bash-1 belongs to another session"
        assert kill.is_error and text(kill) == "Error: unknown job bash-9"
        assert len(sleepers(marker)) == 1
    assert await gone(marker)  # the host closed: its sessions and their jobs with it


# ------------------------------------------------------------------ the registry alone (races)


class FakeSession:
    """What the registry uses of a session: state slots, emit, notify, the host's task group."""

    def __init__(self, tg):
        from dsh_core.state import StateSlots

        self._slots = StateSlots()
        self.session_id = "s-" + secrets.token_hex(4)
        self.disposed = False
        self.emitted: list = []
        self.notified: list[str] = []
        self.wakes: list[bool] = []  # what each notify asked: a turn of its own or not
        self.busy = False
        self.host = type("H", (), {"task_group": tg})()

    def state(self, cls, factory=None):
        return self._slots.get(cls, factory)

    def emit(self, ev):
        self.emitted.append(ev)

    def notify(self, text, *, unless=None, wake=False):
        self.notified.append(text)
        self.wakes.append(wake)


async def test_a_kill_before_the_job_began_settles_it_killed_without_running_it(tmp_path):
    ran = []

    async def work(io):
        ran.append(1)
        return JobEnd(status="completed", exit_code=0)

    async with anyio.create_task_group() as tg:
        registry = JobRegistry(Limits(), tmp_path)
        s = FakeSession(tg)
        job = registry.start(s, kind="test", title="t", work=work)
        await job.kill("at once")  # its task has not run yet
        assert job.status == "killed" and ran == [] and s.notified == []
        assert [type(e).__name__ for e in s.emitted] == ["JobStarted", "JobSettled"]


async def test_a_read_while_the_job_settles_and_two_readers_never_share_bytes(tmp_path):
    release = anyio.Event()

    async def work(io):
        for i in range(200):
            io.write(f"{i:04d}\n".encode())
            if i % 10 == 0:
                await anyio.sleep(0)
        await release.wait()
        io.write("é".encode()[:1])  # half a character, completed below
        await anyio.sleep(0)
        io.write("é".encode()[1:] + b"\n")
        return JobEnd(status="completed", exit_code=0)

    async with anyio.create_task_group() as tg:
        s = FakeSession(tg)
        job = JobRegistry(Limits(), tmp_path).start(s, kind="test", title="t", work=work)
        parts: list[str] = []

        async def reader():
            while job.status == "running" or job.read_offset < job.log.size:
                parts.append(read_new(job, 30_000)[0])
                if job.log.size >= 1000:
                    release.set()
                await anyio.sleep(0)

        tg.start_soon(reader)
        tg.start_soon(reader)
        await job.wait()
    assert "".join(parts) == "".join(f"{i:04d}\n" for i in range(200)) + "é\n"  # each byte once, in order
    assert not any("\ufffd" in p for p in parts)  # a character cut by a write is read whole, later


async def test_a_job_that_raises_a_tool_error_settles_failed_and_says_why(tmp_path):
    async def work(io):
        io.write(b"partial\n")
        raise ToolError("the sandbox command server failed: lost the call", code="SANDBOX_FAILED")

    async with anyio.create_task_group() as tg:
        s = FakeSession(tg)
        job = JobRegistry(Limits(), tmp_path).start(s, kind="bash", title="x", work=work)
        await job.wait()
    assert job.status_line() == "[status: failed, the sandbox command server failed: lost the call]"
    (notice,) = s.notified
    assert notice == ("background job bash-1 (bash: x) finished [status: failed, the sandbox command server failed: "
                      "lost the call]. Read its output with job_output.")


def test_a_log_keeps_its_cap_on_disk_and_counts_the_rest(tmp_path):
    log = JobLog(tmp_path / "s" / "j.log", cap=1024)
    for _ in range(10):
        log.write(b"x" * 300)
    log.close()
    assert (log.size, log.dropped, (tmp_path / "s" / "j.log").stat().st_size) == (1024, 1976, 1024)
    assert oct((tmp_path / "s" / "j.log").stat().st_mode & 0o777) == "0o600"


# ------------------------------------------------------------------ escalation, resume, code mode


class Approve:
    def __init__(self):
        self.asked = []

    from dsh_core import hookimpl

    @hookimpl
    def dsh_check_approval(self, request):
        self.asked.append(request)
        return "allow"


@pytest.mark.parametrize("tier", MECHANISMS)
async def test_an_escalated_job_runs_once_in_the_wider_tier_on_a_server_of_its_own(scripted, tmp_path, tier):
    require_mechanism(tier)
    policy = Approve()
    rules = [{"when": "^go", "steps": [
        {"tool": "bash", "args": {"description": "Run the command", "command": "echo made > made.txt && echo wrote", "run_in_background": True,
                                  "sandbox_permissions": "workspace-write", "justification": "write the file"}},
        {"tool": "job_output", "args": {"job_id": "{started_id}", "wait": True}},
        {"tool": "bash", "args": {"description": "Run the command", "command": "echo again > again.txt || echo refused"}},
        {"text": "done"}]}]
    script = scripted({"rules": rules})
    config = {"sandbox-tools": {"mechanism": tier, "permission-mode": "read-only"}}
    async with memory_host(script, policy, plugins=PLUGINS, config=config) as host:
        s = Session(host, host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script))))
        started, out, after = await s.turn("go")
        assert text(started) == "started background job bash-1"
        (asked,) = policy.asked
        assert asked.tool_name == "bash" and asked.tier == "workspace-write"
        assert text(out) == "wrote\n[status: completed, exit code: 0]" and (tmp_path / "made.txt").read_text() == "made\n"
        assert "refused" in text(after) and not (tmp_path / "again.txt").exists()  # one call, once
        def servers() -> list[int]:
            return live_processes(lambda argv, cwd: any(a.endswith(b"_cmdserver.py") for a in argv)
                                  and cwd == str(tmp_path))

        assert servers()  # the session's read-only one (the last call ran in it)
        await s.agent.dispose()  # no command server of the session's cwd is left, the job's own included
        assert not servers()


async def test_a_resumed_session_never_reuses_a_job_id(scripted, tmp_path, dsh_home):
    rules = [{"when": "^go", "steps": [bg("echo hi"), {"tool": "job_output", "args": {"job_id": "{started_id}",
                                                                                      "wait": True}},
                                       {"text": "ok"}]}]
    script = scripted({"rules": rules})
    plugins = (*PLUGINS, "jsonl-persistence")
    config = tier_config("unconfined")
    async with memory_host(script, plugins=plugins, config=config) as host:
        first = Session(host, host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script))))
        assert text((await first.turn("go"))[0]) == "started background job bash-1"
        sid = first.agent.session_id
    async with memory_host(script, plugins=plugins, config=config) as host:  # another process, later
        _, events = await host.session_store.read(sid)
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script), session_id=sid))
        agent.restore(events)
        again = Session(host, agent)
        started, out = await again.turn("go")
        assert text(started) == "started background job bash-2" and text(out) == "hi\n[status: completed, exit code: 0]"


async def test_programs_in_code_mode_start_and_read_jobs(scripted, tmp_path):
    program = ('started = await tools.bash(description="Run the command", command="echo from-a-program", run_in_background=True)\n'
               'out = await tools.job_output(job_id=started["job_id"], wait=True)\n'
               'return [out["status"], out["exit_code"], out["output"]]')
    rules = [{"when": "^go", "steps": [{"tool": "run_code", "args": {"description": "start and read a job", "code": program}}, {"text": "{tool_result}"}]}]
    script = scripted({"rules": rules})
    config = {**tier_config("unconfined"), "code-mode": {"mode": "code"}}
    async with memory_host(script, plugins=(*PLUGINS, "code-mode"), config=config) as host:
        s = Session(host, host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script))))
        (result,) = await s.turn("go")
    assert not result.is_error, text(result)
    assert json.loads(text(result)) == ["completed", 0, "from-a-program\n"]


async def test_a_background_subagent_is_not_a_job(scripted, tmp_path):
    """As the original: a continuable background child stays outside the job budget. With a cap
    of one job taken, a background subagent still starts, and job_list shows only the bash job."""
    marker = new_marker()
    rules = [
        {"when": "^start", "steps": [
            bg(f"sleep {marker}"),
            {"tool": "subagent", "args": {"description": "helper", "prompt": "child: work"}},
            {"tool": "job_list", "args": {}},
            {"text": "ok"}]},
        {"when": "^child: work", "steps": [{"text": "CHILD_DONE"}]},
    ]
    script = scripted({"rules": rules})
    config = tier_config("unconfined", {"max-live": 1})
    async with memory_host(script, plugins=(*PLUGINS, "subagents"), config=config) as host:
        s = Session(host, host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script))))
        _, started, listed = await s.turn("start")
        assert not started.is_error and text(started).startswith("started subagent ")
        assert text(listed) == f"bash-1 [bash] running — sleep {marker}"
    assert await gone(marker)


async def test_completion_notices_wake_an_idle_session_at_most_max_wakes_times_in_a_row(tmp_path):
    """The original's wakeup delivery: an idle owner's notice asks for a turn of its own, a busy
    one's does not; after max-wakes wakes in a row the rest wait for the next request, until a
    person's prompt refills the budget."""
    async def work(io):
        return JobEnd(status="completed", exit_code=0)

    async with anyio.create_task_group() as tg:
        registry = JobRegistry(Limits(max_wakes=2), tmp_path)
        s = FakeSession(tg)
        for _ in range(3):
            await registry.start(s, kind="bash", title="true", work=work).wait()
        s.busy = True
        await registry.start(s, kind="bash", title="true", work=work).wait()
        s.busy = False
        registry.prompt_claimed(s)
        await registry.start(s, kind="bash", title="true", work=work).wait()
    assert s.wakes == [True, True, False, False, True]
    assert s.notified[0] == ("background job bash-1 (bash: true) finished [status: completed, exit code: 0]. "
                             "Read its output with job_output.")


def test_a_log_is_never_written_through_a_link_nor_read_back_through_its_path(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not show\n")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "linked.log").symlink_to(secret)
    linked = JobLog(tmp_path / "s" / "linked.log", cap=1024)
    with pytest.raises(OSError):
        linked.write(b"x")  # O_NOFOLLOW: the link's target is not truncated
    assert secret.read_text() == "do not show\n"
    log = JobLog(tmp_path / "s" / "j.log", cap=1024)
    log.write(b"the job's own output\n")
    (tmp_path / "s" / "j.log").unlink()
    (tmp_path / "s" / "j.log").symlink_to(secret)  # swapped for a link after the fact
    assert log.read(0, log.size) == b"the job's own output\n"
    log.release()


async def test_an_end_read_before_the_next_request_is_not_told_again(scripted, tmp_path):
    """The job ends while another call runs (its notice is queued), then job_output shows the end
    in the same step: the queued notice is dropped, the model is told once."""
    rules = [{"when": "^go", "steps": [
        bg("echo fast"),
        {"tools": [{"name": "bash", "args": {"description": "Run the command", "command": "sleep 0.5"}},  # one step: run in order
                   {"name": "job_output", "args": {"job_id": "bash-1"}}]},
        {"text": "done"}]},
        {"when": "^next", "steps": [{"text": "next"}]}]
    async with session(scripted, tmp_path, rules, tier_config("unconfined")) as s:
        _, _, out = await s.turn("go")
        assert text(out) == "fast\n[status: completed, exit code: 0]"
        await s.turn("next")
        assert s.notices() == []
