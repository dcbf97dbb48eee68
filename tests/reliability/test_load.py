"""Load held (issue 45, item 5), over real stdio with the official ACP SDK client: many sessions
in ONE ``dsh run --example acp-agent``, each making a series of tool calls (sandboxed bash, read,
a foreground subagent, in turn), all at once. Every prompt settles ``end_turn`` with its last
result; every session's JSONL log parses and holds every call and its right result, in order,
and every delegated child's log is one completed turn; once the sessions are closed the dsh
process holds no more descriptors and has no more processes under it than before the load (and
none of the sandbox is left in the workspaces); and it still serves a sandboxed call.

CI's size (8 sessions x 10 calls) per confinement mechanism; ``DSH_STRESS=1`` (``tox -e
stress``) runs the benchmark's full 64 x 50. The figures of the full size: ``bench/load.py``.
The run itself is ``dsh_testing.load``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism
from raw_stdio import STRESS

from dsh_testing import live_processes
from dsh_testing.load import check_log, run_load

pytestmark = pytest.mark.anyio

SESSIONS, CALLS = (64, 50) if STRESS else (8, 10)


@pytest.mark.timeout(1200 if STRESS else 120)
@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_many_sessions_making_tool_calls_at_once_lose_nothing_and_leave_nothing(
        mechanism: str, tmp_path: Path) -> None:
    require_mechanism(mechanism)
    root = tmp_path / "load"
    report = await run_load(root, SESSIONS, CALLS, env={"DSH_SANDBOX_MECHANISM": mechanism})
    print(f"\n{mechanism}: {report.summary()}")
    assert report.problems == [], "\n".join(report.problems[:30])
    assert sum(map(len, report.latencies_ms.values())) == SESSIONS * CALLS
    assert report.processes["loaded"] > 0  # the sandbox's processes were there under load (so "after" means something)
    assert live_processes(lambda argv, cwd: cwd.startswith(str(root))) == []
    # the log check sees a lost record: drop one session's 5th tool result and its log fails it
    assert report.home is not None
    sid, prompt, ws = report.opened[0]
    log = report.home / "sessions" / f"{sid}.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    results = [i for i, line in enumerate(lines) if '"type":"tool/result"' in line]
    log.write_text("".join(line for i, line in enumerate(lines) if i != results[4]))
    problems, _ = check_log(report.home, sid, prompt, CALLS, ws)
    assert any("not seq" in p for p in problems) and any("tool records" in p for p in problems), problems
