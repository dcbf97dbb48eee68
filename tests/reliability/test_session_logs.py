"""Session logs under pressure (issue 12, item 7 and the kill -9 runs), over real stdio:

- the number of sessions never costs durability: 1,300 sessions under a soft fd limit of 256
  all get a complete log;
- a log that cannot be written fails that session's prompt with a clear JSON-RPC error, and
  the process keeps serving the other sessions;
- kill -9 in the middle of appends leaves every log readable (a torn last line at most), with
  every acknowledged prompt on disk. ``DSH_STRESS=1`` runs 120 kills.
"""

from __future__ import annotations

import random
import resource
import signal
import time
from pathlib import Path

import pytest
from dsh_jsonl_persistence import JsonlStore
from raw_stdio import STRESS, RawAgent, agent_dirs, frame

SCRIPT = {"default": [{"text": "echo: {prompt}"}]}


@pytest.fixture
def setup(tmp_path: Path):
    return agent_dirs(tmp_path, SCRIPT)


def _limits(nofile: int | None = None, fsize: int | None = None):
    def apply() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return apply


def _pipelined(agent: RawAgent, frames: list[tuple[int, bytes]], timeout: float = 120) -> dict[int, dict]:
    """Write all frames in one go, then collect the responses to their ids."""
    agent.send(b"".join(f for _, f in frames))
    want = {rid for rid, _ in frames}
    got: dict[int, dict] = {}
    for msg in agent._lines(timeout):
        if msg.get("id") in want and ("result" in msg or "error" in msg):
            got[msg["id"]] = msg
            if len(got) == len(want):
                return got
    raise AssertionError("unreachable")


def _ids(agent: RawAgent, n: int) -> list[int]:
    first = agent._next + 1
    agent._next += n
    return list(range(first, first + n))


def _types(events) -> list[str]:
    return [type(e).__name__ for e in events]


def test_1300_sessions_under_a_256_fd_soft_limit_all_get_their_logs(setup) -> None:
    ws, script, home = setup
    n = 1300
    with RawAgent(script, ws, home, preexec=_limits(nofile=256)) as agent:
        assert "result" in agent.call("initialize", {"protocolVersion": 1})
        ids = _ids(agent, n)
        news = _pipelined(agent, [(rid, frame("session/new", {"cwd": str(ws), "mcpServers": []}, rid)) for rid in ids])
        sids = [news[rid]["result"]["sessionId"] for rid in ids]
        for round_ in range(2):  # every session is prompted twice, interleaved with all the others
            pids = _ids(agent, n)
            answers = _pipelined(agent, [
                (rid, frame("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": f"r{round_}"}]}, rid))
                for rid, sid in zip(pids, sids, strict=True)])
            bad = [a for a in answers.values() if a.get("result", {}).get("stopReason") != "end_turn"]
            assert bad == [], bad[:3]
        agent.close_stdin()
        assert agent.wait_exit() == 0, agent.stderr_tail()
        assert b"session log of" not in agent.proc.stderr.read()  # no log failed
    store = JsonlStore(home / "sessions")
    missing, short = [], []
    for sid in sids:
        try:
            contents = store.read_contents(sid)
        except Exception as exc:
            missing.append((sid, str(exc)))
            continue
        if _types(contents.events).count("TurnEnd") != 2 or not contents.intact:
            short.append((sid, _types(contents.events)))
    assert missing == [] and short == [], (len(missing), missing[:2], len(short), short[:2])


def test_a_log_that_cannot_be_written_fails_its_prompt_and_the_rest_keep_serving(setup) -> None:
    ws, script, home = setup
    # RLIMIT_FSIZE: no file of this process may grow past 48 KiB, so one big prompt breaks its own log
    # (the other session's three small turns, with the request header, its tool schemas and the tools'
    # guidance sections, must fit).
    with RawAgent(script, ws, home, preexec=_limits(fsize=49152)) as agent:
        big, small = agent.start(), agent.new_session()
        resp = agent.call("session/prompt", {"sessionId": big, "prompt": [{"type": "text", "text": "x" * 100000}]})
        assert resp["error"]["code"] == -32603, resp
        message = resp["error"]["message"]
        assert "session log cannot be written" in message and "File too large" in message, message
        again = agent.call("session/prompt", {"sessionId": big, "prompt": [{"type": "text", "text": "hi"}]})
        assert "start a new session" in again["error"]["message"], again
        for i in range(3):  # the other session (and the process) go on
            ok = agent.call("session/prompt", {"sessionId": small, "prompt": [{"type": "text", "text": f"hi {i}"}]})
            assert ok["result"]["stopReason"] == "end_turn", ok
        agent.close_stdin()
        assert agent.wait_exit() == 0
    store = JsonlStore(home / "sessions")
    assert _types(store.read_contents(small).events).count("TurnEnd") == 3


@pytest.mark.timeout(1200 if STRESS else 120)  # the long (stress) version runs for minutes
def test_kill_9_during_appends_leaves_every_log_readable(setup) -> None:
    ws, script, home = setup
    runs = 120 if STRESS else 4
    rng = random.Random(12)
    store = JsonlStore(home / "sessions")
    torn = acknowledged = 0
    for _run in range(runs):
        with RawAgent(script, ws, home) as agent:
            assert "result" in agent.call("initialize", {"protocolVersion": 1})
            ids = _ids(agent, 20)
            news = _pipelined(agent, [(rid, frame("session/new", {"cwd": str(ws), "mcpServers": []}, rid)) for rid in ids])
            sids = [news[rid]["result"]["sessionId"] for rid in ids]
            # A stream of prompts over 20 sessions (one in flight per session), then SIGKILL at a random moment.
            done: dict[str, int] = {sid: 0 for sid in sids}
            inflight: dict[int, str] = {}
            for sid in sids:
                rid = _ids(agent, 1)[0]
                inflight[rid] = sid
                agent.send(frame("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "p" * rng.randrange(1, 3000)}]}, rid))
            deadline = time.monotonic() + rng.uniform(0.02, 0.4)
            for msg in agent._lines(30):
                sid = inflight.pop(msg.get("id"), None)
                if sid is not None:
                    assert msg.get("result", {}).get("stopReason") == "end_turn", msg
                    done[sid] += 1
                    rid = _ids(agent, 1)[0]
                    inflight[rid] = sid
                    agent.send(frame("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "q" * rng.randrange(1, 3000)}]}, rid))
                if time.monotonic() > deadline:
                    break
            agent.proc.send_signal(signal.SIGKILL)
            agent.proc.wait()
        for sid in sids:
            if not store.path_for(sid).exists():
                assert done[sid] == 0  # never got an answer, so nothing was promised
                continue
            contents = store.read_contents(sid)  # raises on a corrupt record in the middle
            torn += contents.torn is not None
            ends = _types(contents.events).count("TurnEnd")
            assert ends >= done[sid], (sid, ends, done[sid])  # every acknowledged prompt is on disk
            acknowledged += done[sid]
    print(f"\nkill -9: {runs} runs, {acknowledged} acknowledged prompts all on disk, {torn} torn tails tolerated")
