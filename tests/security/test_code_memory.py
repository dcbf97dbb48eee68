"""A program cannot make its host hold gigabytes (issue 22 item 6).

The per-message cap (16 MiB) and the in-flight cap (256 calls) allowed ~4 GiB of arguments per
run; 100 raw calls of 15 MB drove dsh to 1.15 GB. The host now bounds the bytes a run has
outstanding (arguments of calls not yet answered plus replies not yet written), and stops
reading the program's channel until they drain.
"""

from __future__ import annotations

import os
import textwrap

import pytest
from acp import text_block

pytestmark = pytest.mark.anyio

STRESS = os.environ.get("DSH_STRESS") == "1"
MiB = 1 << 20


def _hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("calls", [100, 250] if STRESS else [100])
async def test_raw_calls_with_huge_arguments_are_bounded(acp_agent, scripted, calls):
    program = textwrap.dedent(f'''
        import os, json, time
        fd = int(__import__("sys").argv[1])
        pad = "x" * (15 * 1024 * 1024)
        for i in range(1, {calls} + 1):
            msg = json.dumps({{"t": "call", "id": i, "name": "bash",
                               "args": {{"command": "sleep 0.05", "description": "d", "pad": pad}}}})
            view = memoryview((msg + "\\n").encode())
            while view:
                view = view[os.write(fd, view):]
        return "sent"
    ''')
    step = {"tool": "run_code", "args": {"code": program, "description": "flood"}}
    script = scripted({"default": [step, {"text": "done: {tool_result}"}]})
    env = {"DSH_PERMISSION_MODE": "workspace-write"}
    async with acp_agent(script, example="code-mode", env=env) as run:
        sid = await run.start()
        base = _hwm_kib(run.proc.pid)
        reply = await run.conn.prompt(session_id=sid, prompt=[text_block("flood")])
        assert reply.stop_reason == "end_turn"
        grown = (_hwm_kib(run.proc.pid) - base) * 1024
        # 64 MiB outstanding (the default budget) plus one message being read and decoded: far
        # below the ~1.5 GB 100 such calls cost before the bound.
        print(f"\n{calls} raw calls of 15 MB: dsh grew by {grown / MiB:.0f} MiB")
        assert grown < 400 * MiB, f"dsh grew by {grown / MiB:.0f} MiB"
        (answer,) = run.client.text(sid)
        assert answer.startswith("done:"), answer
