"""Property-based fuzzing of the ACP reader (issue 12, "no frame crashes the agent").

Random and mutated frames, deep nesting, odd ids, bad UTF-8 and lone surrogates, blank and
CRLF lines, split and merged writes. For every batch: each well-formed request is answered
exactly once, no line gets more than one answer, every stdout byte is a schema-valid ACP
frame, and a real prompt works afterwards.

In process (the real Peer and Bridge, fed exact chunks) for speed, and once through a real
`dsh run` over stdio. Light by default; ``DSH_STRESS=1`` (``tox -e stress``) runs >= 100k
frames and prints the figures.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest
from acp_harness import (
    SCRIPT,
    STRESS,
    Ids,
    batches,
    check_answers,
    finish,
    in_process,
    render,
    schema_checked,
    spawn_raw,
    split,
)
from hypothesis import HealthCheck, given, settings

SETUP_IDS = {"init", "new", "sentinel", "ping"}
FUZZ_SETTINGS = settings(
    max_examples=1000 if STRESS else 40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=not STRESS,  # the default run is reproducible; the stress run explores
    database=None,
)
BATCH = (20, 60, 4) if STRESS else (10, 40, 2)  # min and max drawn frames, copies
LONG = pytest.mark.timeout(3600 if STRESS else 120)


async def _one_batch(script: Path, specs, cuts, crlf, cwd: Path) -> int:
    async with in_process(script) as conn:
        assert "result" in await conn.call("init", "initialize", {"protocolVersion": 1})
        sid = (await conn.call("new", "session/new", {"cwd": str(cwd), "mcpServers": []}))["result"]["sessionId"]
        data, exact, lo, hi = render(specs, sid, Ids(), crlf)
        for piece in split(data, cuts):
            await conn.write(piece)
            await anyio.sleep(0)  # let the reader see this write on its own
        # the stream goes on: everything before the sentinel has been read when it is answered
        await conn.call("sentinel", "authenticate", {})
        await conn.idle()
        check_answers(conn.frames, exact, lo, hi, SETUP_IDS)
        # … and a real prompt works afterwards
        done = await conn.call("ping", "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "ping"}]})
        assert done.get("result") == {"stopReason": "end_turn"}, done
        chunk = conn.frames[-2]
        assert chunk["method"] == "session/update" and chunk["params"]["update"]["content"]["text"] == "PONG"
        out = conn.output()
    frames = schema_checked(out)  # every byte the agent wrote is a valid ACP frame
    assert frames == conn.frames
    return len(specs)


@LONG
def test_fuzzed_frames_in_process(scripted, tmp_path):
    script = scripted(SCRIPT)
    figures = {"batches": 0, "frames": 0}

    @FUZZ_SETTINGS
    @given(batches(*BATCH))
    def run(batch):
        specs, cuts, crlf = batch
        figures["frames"] += anyio.run(_one_batch, script, specs, cuts, crlf, tmp_path)
        figures["batches"] += 1

    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    print(f"\nreader fuzz (in process): {figures['frames']} frames in {figures['batches']} batches, "
          f"{elapsed:.1f}s, {figures['frames'] / elapsed:.0f} frames/s; every request answered once, stdout valid")
    if STRESS:
        assert figures["frames"] >= 100_000


@LONG
def test_fuzzed_frames_over_real_stdio(scripted, tmp_path):
    """The same hostile stream through a real `dsh run` (stdin/stdout pipes, the stdio door)."""
    script = scripted(SCRIPT)
    raw = spawn_raw(script, cwd=tmp_path, home=tmp_path / "home")
    ids = Ids()
    figures = {"batches": 0, "frames": 0}
    try:
        sid = raw.start(tmp_path)

        @settings(max_examples=300 if STRESS else 20, deadline=None, derandomize=not STRESS, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(batches(*BATCH))
        def run(batch):
            specs, cuts, crlf = batch
            data, exact, lo, hi = render(specs, sid, ids, crlf)
            before = len(raw.frames)
            for piece in split(data, cuts):
                raw.write(piece)
            n = figures["batches"]
            raw.call(f"sentinel-{n}", "authenticate", {})
            # a fuzzed prompt may still be running: prompt until the session is ours again
            for attempt in range(100):
                resp = raw.call(f"drain-{n}-{attempt}", "session/prompt",
                                {"sessionId": sid, "prompt": [{"type": "text", "text": "ping"}]})
                if "result" in resp:
                    break
            assert resp.get("result") == {"stopReason": "end_turn"}, resp
            mine = [f for f in raw.frames[before:]
                    if not (isinstance(f.get("id"), str) and f["id"].startswith(("sentinel-", "drain-")))]
            check_answers(mine, exact, lo, hi, set())
            figures["frames"] += len(specs)
            figures["batches"] += 1

        started = time.perf_counter()
        run()
        elapsed = time.perf_counter() - started
        done = raw.call("final", "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "ping"}]})
        assert done.get("result") == {"stopReason": "end_turn"}
        assert raw.frames[-2]["params"]["update"]["content"]["text"] == "PONG"
    finally:
        code = finish(raw)
    assert code == 0, bytes(raw.err).decode(errors="replace")[-2000:]
    schema_checked(bytes(raw.out))
    print(f"\nreader fuzz (real stdio): {figures['frames']} frames in {figures['batches']} batches, "
          f"{elapsed:.1f}s; every request answered once, stdout valid, exit 0")


@pytest.mark.parametrize("depth", [129, 1000, 100_000])
def test_nesting_bound_does_not_cost_a_frame_of_ordinary_json(depth):
    """The bound counts only brackets outside strings, so text full of brackets passes."""
    from dsh_acp.rpc import MAX_DEPTH, nesting_depth_exceeds

    assert nesting_depth_exceeds(b"[" * depth + b"]" * depth)
    assert not nesting_depth_exceeds(b'{"t":"' + b"[" * depth + b'"}')
    assert not nesting_depth_exceeds(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    assert not nesting_depth_exceeds(json.dumps([[1]] * depth).encode())  # wide, not deep
