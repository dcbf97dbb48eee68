"""The load run (issue 45, item 5): many sessions in ONE ``dsh run --example acp-agent`` process
over real stdio, driven by the official ACP SDK client, each session making a scripted series of
tool calls — sandboxed ``bash``, ``read`` and a foreground ``subagent``, in turn — all sessions at
once. Used by ``tests/reliability/test_load.py`` (small) and ``bench/load.py`` (64 x 50).

``run_load`` returns a ``LoadReport``: every check that failed is a line in ``problems`` (an
unanswered prompt, a wrong or missing tool result, a log that does not parse or lacks a call, a
descriptor or process left after the sessions closed, a process that stopped serving), and the
figures: per-call latency (from each session's JSONL log: ``tool/result`` time minus
``tool/call`` time), total time, peak RSS of the dsh process, fds and processes before/after.

"Before" is measured after a warm-up session (the same series of calls) was closed: what the process
keeps once for all sessions (the sandbox probe, a log directory handle) is not a leak; what grows
with the sessions and outlives them is.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("bash", "read", "subagent")


def load_script(calls: int) -> dict[str, Any]:
    """A scripted-model script: a prompt ``load …`` makes ``calls`` tool calls (bash, read,
    subagent in turn; each result names the session and the call) and answers ``done: <last
    result>``; a delegated ``child: …`` answers ``CHILD <its prompt>``; ``ping`` runs one bash
    call and answers with its output."""
    steps: list[dict[str, Any]] = []
    for k in range(calls):
        kind = KINDS[k % len(KINDS)]
        if kind == "bash":
            steps.append({"tool": "bash", "args": {"description": "Echo", "command": f"echo {{prompt}} call {k}"}})
        elif kind == "read":
            steps.append({"tool": "read", "args": {"file_path": "{cwd}/data.txt"}})
        else:
            steps.append({"tool": "subagent", "args": {"description": f"call {k}", "prompt": f"child: {{prompt}} call {k}",
                                                       "run_in_background": False}})
    steps.append({"text": "done: {tool_result}"})
    return {"rules": [
        {"when": "^child: ", "steps": [{"text": "CHILD {prompt}"}]},
        {"when": "^load ", "steps": steps},
        {"when": "^ping", "steps": [{"tool": "bash", "args": {"description": "Echo", "command": "echo pong"}},
                                    {"text": "{tool_result}"}]},
    ]}


def expected_result(kind: str, prompt: str, k: int, workspace: Path) -> str:
    """The text the ``k``-th call's result must carry (for read: contain)."""
    if kind == "bash":
        return f"{prompt} call {k}\n"
    if kind == "read":
        return f"1: data of {workspace.name}\n"
    return f"CHILD child: {prompt} call {k}"


@dataclass
class LoadReport:
    sessions: int
    calls: int
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)  # per kind
    total_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of the dsh process itself during the load (user + system)
    peak_rss_kib: int = 0
    fds: dict[str, int] = field(default_factory=dict)  # "initialized", "before", "loaded", "after"
    processes: dict[str, int] = field(default_factory=dict)  # descendants of the dsh process, same moments
    loaded: dict[str, int] = field(default_factory=dict)  # the processes under dsh under load, by program
    problems: list[str] = field(default_factory=list)
    home: Path | None = None  # the run's DSH_HOME (its sessions/ holds the logs)
    opened: list[tuple[str, str, Path]] = field(default_factory=list)  # (session id, prompt, workspace) of the load

    def all_latencies(self) -> list[float]:
        return sorted(x for xs in self.latencies_ms.values() for x in xs)

    def pct(self, q: float, kind: str | None = None) -> float:
        xs = sorted(self.latencies_ms.get(kind, [])) if kind else self.all_latencies()
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]

    def summary(self) -> str:
        lines = [f"{self.sessions} sessions x {self.calls} calls: {sum(map(len, self.latencies_ms.values()))} calls "
                 f"in {self.total_s:.2f} s (dsh CPU {self.cpu_s:.2f} s); call latency p50 {self.pct(0.5):.1f} ms, p99 {self.pct(0.99):.1f} ms"]
        for kind in KINDS:
            if self.latencies_ms.get(kind):
                lines.append(f"  {kind:<9} p50 {self.pct(0.5, kind):7.1f} ms   p99 {self.pct(0.99, kind):7.1f} ms   "
                             f"({len(self.latencies_ms[kind])} calls)")
        lines.append(f"  peak RSS of the dsh process {self.peak_rss_kib / 1024:.1f} MiB")
        lines.append("  fds " + ", ".join(f"{k} {v}" for k, v in self.fds.items()))
        lines.append("  processes under dsh " + ", ".join(f"{k} {v}" for k, v in self.processes.items())
                     + " (under load: " + ", ".join(f"{v}x {k}" for k, v in sorted(self.loaded.items())) + ")")
        lines.append(f"  problems: {len(self.problems)}" + "".join(f"\n    {p}" for p in self.problems[:20]))
        return "\n".join(lines)


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def descendants(pid: int) -> list[int]:
    """Live (not zombie) processes under ``pid``, at any depth (seen from outside any sandbox)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            parent[int(entry)] = int(fields[1])
    found, frontier = [], {pid}
    while frontier:
        nxt = {p for p, pp in parent.items() if pp in frontier}
        found += sorted(nxt)
        frontier = nxt
    return found


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _gapless(records: list[dict[str, Any]]) -> bool:
    return [r.get("seq") for r in records[1:]] == list(range(1, len(records)))


def _check_calls(sid: str, tool: list[dict[str, Any]], calls: int, prompt: str, workspace: Path,
                 lat: dict[str, list[float]]) -> list[str]:
    """Each call followed by its own right result, in order; latencies into ``lat``."""
    problems: list[str] = []
    for k in range(min(calls, len(tool) // 2)):
        call, result = tool[2 * k], tool[2 * k + 1]
        kind, cid = KINDS[k % len(KINDS)], f"call_{k + 1}"
        res = result.get("result") or {}
        if call.get("type") != "tool/call" or call.get("callId") != cid or call.get("name") != kind \
                or result.get("type") != "tool/result" or res.get("callId") != cid:
            return [*problems, f"{sid}: records {2 * k}, {2 * k + 1} are {call.get('type')} {call.get('callId')} "
                               f"{call.get('name')}, {result.get('type')} {res.get('callId')}: want {cid} ({kind}) and its result"]
        text = "".join(b.get("text", "") for b in res.get("content", []))
        want = expected_result(kind, prompt, k, workspace)
        good = (want in text) if kind == "read" else (text == want)
        if res.get("isError") or result.get("code") or not good:
            problems.append(f"{sid}: {cid} ({kind}) answered {text[:200]!r} (code {result.get('code')}), want {want!r}")
        lat[kind].append((result["time"] - call["time"]) * 1000)
    return problems


def _check_children(home: Path, sid: str, records: list[dict[str, Any]], calls: int) -> list[str]:
    """Every delegation settled ``completed``, and each child's log is one completed turn under ``sid``."""
    problems: list[str] = []
    settled = [r for r in records if r.get("type") == "subagent/settled"]
    problems += [f"{sid}: subagent {r.get('id')} settled {r.get('stop')}" for r in settled if r.get("stop") != "completed"]
    want = sum(1 for k in range(calls) if KINDS[k % len(KINDS)] == "subagent")
    if len({r.get("id") for r in settled}) != want:
        problems.append(f"{sid}: {len(settled)} subagents settled, want {want}")
    for child in sorted({r.get("id", "") for r in settled}):
        try:
            crecords = _records(home / "sessions" / f"{child}.jsonl")
        except (OSError, ValueError) as exc:
            problems.append(f"{sid}: child {child}'s log unreadable: {exc}")
            continue
        ends = [r.get("reason") for r in crecords if r.get("type") == "turn/end"]
        if crecords[0].get("parentSession") != sid or ends != ["completed"] or not _gapless(crecords):
            problems.append(f"{sid}: child {child}'s log is not one completed turn under its parent")
    return problems


def check_log(home: Path, sid: str, prompt: str, calls: int, workspace: Path) -> tuple[list[str], dict[str, list[float]]]:
    """The problems in one session's log (every record, seq without a gap; every call and its
    right result, in order; one completed turn; each delegated child's log whole) and its per-kind
    call latencies (ms)."""
    lat: dict[str, list[float]] = {k: [] for k in KINDS}
    try:
        records = _records(home / "sessions" / f"{sid}.jsonl")
    except (OSError, ValueError) as exc:
        return [f"{sid}: log unreadable: {exc}"], lat
    problems = [] if _gapless(records) else [f"{sid}: the log's records are not seq 1..{len(records) - 1} without a gap"]
    tool = [r for r in records if r.get("type") in ("tool/call", "tool/result")]
    if len(tool) != 2 * calls:
        problems.append(f"{sid}: {len(tool)} tool records in the log, want {2 * calls}")
    problems += _check_calls(sid, tool, calls, prompt, workspace, lat)
    ends = [r.get("reason") for r in records if r.get("type") == "turn/end"]
    if ends != ["completed"]:
        problems.append(f"{sid}: turn ends {ends}, want ['completed']")
    return problems + _check_children(home, sid, records, calls), lat


def programs(pids: list[int]) -> dict[str, int]:
    """How many of ``pids`` run each program (its argv[0] and argv[1], by name)."""
    out: dict[str, int] = {}
    for p in pids:
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        name = " ".join(Path(a.decode(errors="replace")).name for a in argv[:2])
        out[name] = out.get(name, 0) + 1
    return out


def check_answers(client: Any, opened: list[tuple[str, str, Path]], answers: list[Any], calls: int) -> list[str]:
    """Every prompt settled ``end_turn`` and said ``done: <its last result>``."""
    problems: list[str] = []
    last = calls - 1
    kind = KINDS[last % len(KINDS)]
    for (sid, prompt, ws), answer in zip(opened, answers, strict=True):
        if isinstance(answer, BaseException):
            problems.append(f"{sid}: prompt failed: {answer!r}")
            continue
        if answer.stop_reason != "end_turn":
            problems.append(f"{sid}: stop reason {answer.stop_reason}")
        said = "".join(client.text(sid))
        want = expected_result(kind, prompt, last, ws)
        if not said.startswith("done: ") or ((want not in said) if kind == "read" else said != "done: " + want):
            problems.append(f"{sid}: answered {said[:200]!r}, want {want!r}")
    return problems


async def settle(pid: int, report: LoadReport, grace_s: float = 10.0) -> None:
    """What the closes let go of goes within a moment; what is still there after ``grace_s`` stays."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (fd_count(pid) > report.fds["before"]
                                           or len(descendants(pid)) > report.processes["before"]):
        await asyncio.sleep(0.05)


def left_behind(pid: int, report: LoadReport) -> list[str]:
    problems: list[str] = []
    if report.fds["after"] > report.fds["before"]:
        left = sorted(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
        problems.append(f"fds: {report.fds['before']} before the load, {report.fds['after']} after: {left}")
    if report.processes["after"] > report.processes["before"]:
        left_p = [Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:120] for p in descendants(pid)]
        problems.append(f"processes under dsh: {report.processes['before']} before, "
                        f"{report.processes['after']} after: {left_p}")
    return problems


async def run_load(root: Path, sessions: int, calls: int, *, env: dict[str, str] | None = None,
                   at_once: bool = True, timeout: float = 600) -> LoadReport:
    """``sessions`` sessions in one ``dsh run`` under ``root`` (its home, script, one workspace per
    session), each prompted once to make ``calls`` tool calls, all at once; then every session is
    closed and the process is asked one more bash call. Returns the report (``problems`` empty
    when everything held). ``at_once=False``: the peer, the same sessions and
    calls with one prompt in flight at a time (the next session starts when the last answered)."""
    from acp import text_block

    from .harness import spawn_acp

    report = LoadReport(sessions=sessions, calls=calls)
    home, work = root / "home", root / "work"
    report.home = home
    work.mkdir(parents=True, exist_ok=True)
    script = root / "load-script.json"
    script.write_text(json.dumps(load_script(calls)))
    full_env = {"DSH_HOME": str(home), "DSH_PERMISSION_MODE": "workspace-write", **(env or {})}

    def workspace(name: str) -> Path:
        ws = work / name
        ws.mkdir(exist_ok=True)
        (ws / "data.txt").write_text(f"data of {name}\n")
        return ws

    async with spawn_acp(script, cwd=work, env=full_env) as run:
        pid = run.proc.pid
        conn = run.conn

        def snapshot(moment: str) -> None:
            report.fds[moment] = fd_count(pid)
            report.processes[moment] = len(descendants(pid))

        async def one(name: str) -> tuple[str, str, Path]:
            ws = workspace(name)
            sid = (await conn.new_session(cwd=str(ws), mcp_servers=[])).session_id
            return sid, f"load {name}", ws

        await conn.initialize(protocol_version=1)
        snapshot("initialized")
        # warm-up: one session makes the same series of calls, then closes
        warm = workspace("warm")
        wsid = (await conn.new_session(cwd=str(warm), mcp_servers=[])).session_id
        await asyncio.wait_for(conn.prompt(session_id=wsid, prompt=[text_block("load warm")]), timeout)
        await conn.close_session(session_id=wsid)
        snapshot("before")

        opened = report.opened = [await one(f"s{i:03d}") for i in range(sessions)]

        async def prompt_one(sid: str, prompt: str) -> Any:
            return await conn.prompt(session_id=sid, prompt=[text_block(prompt)])

        t0, c0 = time.perf_counter(), cpu_s(pid)
        if at_once:
            answers = await asyncio.wait_for(
                asyncio.gather(*(prompt_one(sid, p) for sid, p, _ in opened), return_exceptions=True), timeout)
        else:
            answers = [(await asyncio.wait_for(asyncio.gather(prompt_one(sid, p), return_exceptions=True), timeout))[0]
                       for sid, p, _ in opened]
        report.total_s = time.perf_counter() - t0
        report.cpu_s = cpu_s(pid) - c0
        report.peak_rss_kib = peak_rss_kib(pid)
        snapshot("loaded")
        report.loaded = programs(descendants(pid))
        report.problems += check_answers(run.client, opened, answers, calls)
        for sid, _, _ in opened:
            await conn.close_session(session_id=sid)
        await settle(pid, report)
        snapshot("after")
        report.problems += left_behind(pid, report)
        # still serving: a fresh session makes a sandboxed call
        ping = workspace("ping")
        psid = (await conn.new_session(cwd=str(ping), mcp_servers=[])).session_id
        pong = await asyncio.wait_for(conn.prompt(session_id=psid, prompt=[text_block("ping")]), 60)
        if pong.stop_reason != "end_turn" or "".join(run.client.text(psid)) != "pong\n":
            report.problems.append(f"after the load: ping answered {run.client.text(psid)!r} ({pong.stop_reason})")
        if run.client.permission_requests:
            report.problems.append(f"{len(run.client.permission_requests)} permission requests (none expected)")
        code = await run.close_stdin()
        if code != 0:
            report.problems.append(f"dsh exited {code}: {bytes(run.stderr[-2000:]).decode(errors='replace')}")

    for sid, prompt, ws in opened:
        problems, lat = check_log(home, sid, prompt, calls, ws)
        report.problems += problems
        for kind, xs in lat.items():
            report.latencies_ms.setdefault(kind, []).extend(xs)
    return report


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
