"""Long-lived orchestrators (issue 17) over real stdio with the official SDK client:
``session/close`` in each state, memory returned after close, ``messageId`` on chunks,
turn usage in ``_meta`` and the opt-in ``usage_update``. Every stdout byte is
schema-checked when each run closes (``spawn_acp``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import pytest
from acp import RequestError, text_block
from dsh_jsonl_persistence.store import JsonlStore

from dsh_testing import Recorder, session_log
from dsh_testing import until as wait_for

pytestmark = pytest.mark.anyio

# A turn that is provably running: the `slow` tool (acp-testkit) writes `slow-started`, then sleeps.
HANG = {"rules": [{"when": "hang", "steps": [{"text": "working", "tool": "slow", "args": {"ms": 60000}}]}]}
PERMISSION_SCRIPT = {
    "rules": [
        {"when": "write", "steps": [
            {"tool": "guarded_write", "args": {"path": "out.txt", "content": "x"}},
            {"text": "done: {tool_result}"},
        ]}
    ]
}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


PING = {"rules": [{"when": "ping", "steps": [{"text": "PONG"}]}]}


async def two_sessions(run, advertised: str) -> tuple[str, str]:
    """initialize (the agent advertises the session capability ``advertised``), then two new sessions."""
    init = await run.conn.initialize(protocol_version=1)
    assert getattr(init.agent_capabilities.session_capabilities, advertised) is not None
    first, second = [(await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id for _ in range(2)]
    return first, second


async def assert_unknown(run, sid: str) -> None:
    with pytest.raises(RequestError) as err:
        await run.conn.prompt(session_id=sid, prompt=[text_block("ping")])
    assert err.value.code == -32602 and "unknown session" in str(err.value.data)


# --------------------------------------------------------------------------- session/close


async def test_close_is_advertised_and_closes_an_idle_session(acp_agent, scripted):
    async with acp_agent(scripted(PING)) as run:
        sid, other = await two_sessions(run, advertised="close")
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("ping")])).stop_reason == "end_turn"
        await run.conn.close_session(session_id=sid)
        await assert_unknown(run, sid)
        with pytest.raises(RequestError) as err:  # closing twice: a clear error, nothing else happens
            await run.conn.close_session(session_id=sid)
        assert err.value.code == -32602
        # the connection and the other session live on
        assert (await run.conn.prompt(session_id=other, prompt=[text_block("ping")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    types = [e["type"] for e in session_log(acp_agent.home, sid)]
    assert types[-1] == "turn/end" and types.count("turn/start") == 1


async def test_close_while_prompting_settles_the_prompt_cancelled(acp_agent, scripted):
    async with acp_agent(scripted(HANG), example="acp-testkit") as run:
        sid = await run.start()
        pending = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("hang")]))
        await wait_for(lambda: (run.cwd / "slow-started").exists())
        await asyncio.wait_for(run.conn.close_session(session_id=sid), 10)
        assert (await asyncio.wait_for(pending, 10)).stop_reason == "cancelled"
        await assert_unknown(run, sid)
        await run.conn.cancel(session_id=sid)  # a cancel for a closed session is ignored
        assert await run.close_stdin() == 0
    ends = [e for e in session_log(acp_agent.home, sid) if e["type"] == "turn/end"]
    assert [(e["reason"], e.get("abortKind")) for e in ends] == [("aborted", "disposed")]
    # the prompt's answer came before the close's answer
    answers = [f for f in run.frames if "result" in f and f.get("id") is not None]
    assert answers[-2]["result"].get("stopReason") == "cancelled" and answers[-1]["result"] == {}


async def test_close_while_waiting_for_permission_withdraws_the_request(acp_agent, scripted):
    async with acp_agent(scripted(PERMISSION_SCRIPT), example="acp-testkit") as run:
        sid, pending = await run.prompt_held_at_permission("write it")
        await asyncio.wait_for(run.conn.close_session(session_id=sid), 10)
        assert (await asyncio.wait_for(pending, 10)).stop_reason == "cancelled"
        assert await run.close_stdin() == 0
    perm = next(f for f in run.frames if f.get("method") == "session/request_permission")
    withdrawn = [f for f in run.frames if f.get("method") == "$/cancel_request"]
    assert [w["params"] for w in withdrawn] == [{"requestId": perm["id"]}]
    assert not (run.cwd / "out.txt").exists()
    decided = [e for e in session_log(acp_agent.home, sid) if e["type"] == "approval/decided"]
    assert [d["outcome"] for d in decided] == ["cancelled"]


async def test_concurrent_closes_of_one_session_both_succeed(acp_agent, scripted):
    """Two closes the agent reads before either is answered are one close: both succeed. (Written
    in one write: two SDK calls in a row may reach a loaded agent after the first close is done,
    and a close read after that is a close of an unknown session, as the test above says.)"""
    async with acp_agent(scripted(HANG), example="acp-testkit") as run:
        sid = await run.start()
        pending = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("hang")]))
        await wait_for(lambda: (run.cwd / "slow-started").exists())
        frames = b"".join(json.dumps({"jsonrpc": "2.0", "id": f"close-{x}", "method": "session/close",
                                      "params": {"sessionId": sid}}).encode() + b"\n" for x in "ab")
        run.proc.stdin.write(frames)
        await run.proc.stdin.drain()

        def answers() -> dict[str, dict]:
            out = {}
            for line in bytes(run.stdout).splitlines():
                frame = json.loads(line)
                if frame.get("id") in ("close-a", "close-b"):
                    out[frame["id"]] = frame
            return out

        await wait_for(lambda: len(answers()) == 2)
        assert [a.get("result") for a in answers().values()] == [{}, {}], answers()
        assert (await asyncio.wait_for(pending, 10)).stop_reason == "cancelled"


async def test_eof_during_a_close_exits_cleanly(acp_agent, scripted):
    async with acp_agent(scripted(HANG), example="acp-testkit") as run:
        sid = await run.start()
        pending = asyncio.create_task(run.conn.prompt(session_id=sid, prompt=[text_block("hang")]))
        await wait_for(lambda: (run.cwd / "slow-started").exists())
        closing = asyncio.create_task(run.conn.close_session(session_id=sid))
        await asyncio.sleep(0)
        assert await run.close_stdin() == 0
        for task in (pending, closing):
            # either answered or failed with the closed connection; the exit code is the point
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)


async def test_memory_returns_after_close(acp_agent, scripted):
    """Sessions opened, prompted and closed on one connection: RSS stays flat. Without close each
    session kept ~25 KB; 800 such sessions would add ~20 MB. (bench/session_churn.py: 10,000.)"""
    script = scripted(PING)
    n_warm, n = int(os.environ.get("DSH_CHURN_WARM", 150)), int(os.environ.get("DSH_CHURN", 500))

    async def churn(count: int) -> None:
        for _ in range(count):
            sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
            await run.conn.prompt(session_id=sid, prompt=[text_block("ping")])
            await run.conn.close_session(session_id=sid)

    async with acp_agent(script, check=False) as run:
        await run.conn.initialize(protocol_version=1)
        await churn(n_warm)  # allocator and caches warm
        start = rss_kib(run.proc.pid)
        await churn(n)
        grown = rss_kib(run.proc.pid) - start
        assert await run.close_stdin() == 0
    print(f"RSS grew {grown} KiB over {n} closed sessions")
    assert grown < n * 25 // 4, f"RSS grew {grown} KiB over {n} closed sessions"
    assert len(list((acp_agent.home / "sessions").glob("*.jsonl"))) == n_warm + n  # the logs stay, for list/resume
    free = JsonlStore(acp_agent.home / "sessions").locks  # and none is held open: each can be taken
    for log in (acp_agent.home / "sessions").glob("*.jsonl"):
        free.acquire(log.stem)


# --------------------------------------------------------------------------- messageId and usage


async def test_chunks_of_one_message_share_a_message_id_and_a_new_message_gets_a_new_one(acp_agent, scripted):
    script = scripted({"default": [
        {"text": "first", "tool": "slow", "args": {"ms": 1}},
        {"text": "second"},
    ]})
    async with acp_agent(script, example="acp-testkit") as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("go")])
        await run.conn.prompt(session_id=sid, prompt=[text_block("again")])
    chunks = [f["params"]["update"] for f in run.frames
              if f.get("method") == "session/update" and f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"]
    assert [c["content"]["text"] for c in chunks] == ["first", "second"] * 2  # two prompts, two messages each
    ids = [c["messageId"] for c in chunks]
    assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == 4
    logged = [e["message"]["id"] for e in session_log(acp_agent.home, sid) if e["type"] == "assistant/message"]
    assert ids == logged  # the id is the committed message's durable id


async def test_image_and_text_of_one_message_share_its_id(acp_agent, scripted, tmp_path):
    from dsh_testing import make_png

    (tmp_path / "red.png").write_bytes(make_png())
    script = scripted({"capabilities": {"image_input": True},
                       "default": [{"text": "look", "image": str(tmp_path / "red.png")}]})
    async with acp_agent(script) as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("draw")])
    chunks = [f["params"]["update"] for f in run.frames if f.get("method") == "session/update"]
    assert [c["content"]["type"] for c in chunks] == ["text", "image"]
    assert chunks[0]["messageId"] == chunks[1]["messageId"]


USAGE_SCRIPT = {"default": [
    {"text": "one", "tool": "slow", "args": {"ms": 1}, "usage": {"inputTokens": 100, "outputTokens": 7}},
    {"text": "two", "usage": {"inputTokens": 120, "outputTokens": 5, "cacheHitTokens": 100,
                              "cacheMissTokens": 20, "reasoningTokens": 2}},
]}


async def test_prompt_response_carries_the_turn_usage_and_no_usage_update_by_default(acp_agent, scripted):
    async with acp_agent(scripted(USAGE_SCRIPT), example="acp-testkit") as run:
        sid = await run.start()
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("go")])
        assert resp.field_meta["usage"] == {
            "inputTokens": 220, "outputTokens": 12, "totalTokens": 232, "cacheHitTokens": 100,
            "cacheMissTokens": 20, "reasoningTokens": 2, "modelCalls": 2,
        }
    kinds = [f["params"]["update"]["sessionUpdate"] for f in run.frames if f.get("method") == "session/update"]
    assert kinds == ["agent_message_chunk", "agent_message_chunk"]


async def test_usage_update_after_each_turn_when_the_example_enables_it(acp_agent, scripted):
    async with acp_agent(scripted(USAGE_SCRIPT), example="acp-usage") as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[text_block("go")])
    updates = [f["params"]["update"] for f in run.frames if f.get("method") == "session/update"]
    assert [u["sessionUpdate"] for u in updates] == ["agent_message_chunk", "agent_message_chunk", "usage_update"]
    assert updates[-1]["used"] == 125 and updates[-1]["size"] == 128_000
    # written before the prompt's answer
    order = [f.get("method") or "answer" for f in run.frames if f.get("method") == "session/update" or
             ("result" in f and "stopReason" in (f["result"] or {}))]
    assert order[-1] == "answer"


# --------------------------------------------------------------------------- session/list


def write_log(home: Path, sid: str, cwd: str, prompt: str | None, mtime: float, parent: str | None = None) -> None:
    from dsh_jsonl_persistence.store import encode_line

    from dsh_core.types import SessionHeader, TextBlock, UserMessage, UserMessageEvent

    root = home / "sessions"
    root.mkdir(parents=True, exist_ok=True)
    data = encode_line(SessionHeader(id=sid, cwd=cwd, provider="scripted", model="m", parent_session=parent))
    if prompt is not None:
        data += encode_line(UserMessageEvent(seq=1, message=UserMessage(id="msg_" + sid, content=[TextBlock(text=prompt)])))
    path = root / f"{sid}.jsonl"
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


async def test_list_pages_newest_first_with_cwd_filter_and_titles(acp_agent, scripted):
    home, work = acp_agent.home, acp_agent.work
    base = 1_700_000_000.0
    for i in range(120):  # s000 is the oldest
        write_log(home, f"s{i:03d}", str(work), f"task {i}\nsecond line", base + i)
    write_log(home, "other", "/elsewhere", "x" * 500, base + 500)  # newest, another cwd, a long title
    write_log(home, "child", str(work), "delegated", base + 600, parent="s001")  # subagent logs are not listed
    write_log(home, "silent", str(work), None, base + 0.5)
    async with acp_agent(scripted({})) as run:
        init = await run.conn.initialize(protocol_version=1)
        assert init.agent_capabilities.session_capabilities.list is not None
        seen, cursor, pages = [], None, 0
        while True:
            page = await run.conn.list_sessions(cwd=str(work), cursor=cursor)
            pages += 1
            seen += page.sessions
            cursor = page.next_cursor
            if cursor is None:
                break
        everything = await run.conn.list_sessions()
        with pytest.raises(RequestError) as err:
            await run.conn.list_sessions(cursor="not-a-cursor")
        assert err.value.code == -32602
        with pytest.raises(RequestError):
            await run.conn.list_sessions(cwd="relative/dir")
    assert pages == 3
    ids = [s.session_id for s in seen]
    assert ids == [f"s{i:03d}" for i in range(119, 0, -1)] + ["silent", "s000"]
    assert seen[0].title == "task 119" and seen[0].cwd == str(work)
    assert seen[0].updated_at.startswith("2023-11-14T22:15:19")  # base + 119 s, UTC
    assert next(s for s in seen if s.session_id == "silent").title is None
    assert everything.sessions[0].session_id == "other" and len(everything.sessions[0].title) == 100
    assert "child" not in ids


async def test_store_backed_methods_are_absent_and_refused_without_a_store(acp_agent, scripted):
    async with acp_agent(scripted({}), example="acp-nostore") as run:
        init = await run.conn.initialize(protocol_version=1)
        caps = init.agent_capabilities.session_capabilities
        assert caps.close is not None and caps.list is None and caps.resume is None and caps.delete is None
        assert init.agent_capabilities.load_session is False  # the SDK's default: not advertised
        with pytest.raises(RequestError) as err:
            await run.conn.list_sessions()
        assert err.value.code == -32601 and "jsonl-persistence" in err.value.data["details"]


# --------------------------------------------------------------------------- session/delete


async def delete_session(run, sid: str) -> None:
    """``session/delete`` through the SDK's connection (0.12 has the schema types, no helper)."""
    from acp.schema import DeleteSessionRequest, DeleteSessionResponse
    from acp.utils import request_model_from_dict

    await request_model_from_dict(run.conn._conn, "session/delete", DeleteSessionRequest(session_id=sid),
                                  DeleteSessionResponse)


async def test_delete_removes_a_closed_sessions_log_and_spill_files_and_refuses_an_open_one(acp_agent, scripted):
    async with acp_agent(scripted(PING)) as run:
        sid, keep = await two_sessions(run, advertised="delete")
        for s in (sid, keep):
            await run.conn.prompt(session_id=s, prompt=[text_block("ping")])
        with pytest.raises(RequestError) as err:
            await delete_session(run, sid)
        assert "is open" in err.value.data["details"]
        await run.conn.close_session(session_id=sid)
        spill = acp_agent.home / "spill" / sid
        spill.mkdir(parents=True)
        (spill / "call_1.log").write_text("lots of output")
        await delete_session(run, sid)
        assert not (acp_agent.home / "sessions" / f"{sid}.jsonl").exists() and not spill.exists()
        assert [s.session_id for s in (await run.conn.list_sessions()).sessions] == [keep]
        for again in (lambda: delete_session(run, sid),
                      lambda: run.conn.resume_session(session_id=sid, cwd=str(run.cwd))):
            with pytest.raises(RequestError) as err:
                await again()
            assert "unknown session" in err.value.data["details"]
        assert (await run.conn.prompt(session_id=keep, prompt=[text_block("ping")])).stop_reason == "end_turn"
    assert (acp_agent.home / "sessions" / f"{keep}.jsonl").exists()


async def test_restore_rebuilds_history_including_a_compaction(scripted, tmp_path):
    """``Agent.restore`` replays the log's history edits: a compaction summary replaces the span it covered."""
    from dsh_core.contracts import AgentSpec
    from dsh_core.types import (
        AssistantMessage,
        AssistantMessageEvent,
        CompactionSummary,
        InboxClaimed,
        TextBlock,
        TurnEnd,
        TurnStart,
        UserMessage,
        UserMessageEvent,
    )
    from dsh_testing import memory_host

    def user(i: str) -> UserMessage:
        return UserMessage(id=f"u{i}", content=[TextBlock(text=f"q{i}")])

    def said(i: str) -> AssistantMessage:
        return AssistantMessage(id=f"a{i}", content=[TextBlock(text=f"a{i}")])

    summary = UserMessage(id="s", content=[TextBlock(text="summary of turn 1")], source="plugin")
    events = []
    for n in ("1", "2"):
        t = int(n)
        events += [UserMessageEvent(message=user(n)), InboxClaimed(turn=t, message_ids=[f"u{n}"]), TurnStart(turn=t)]
        if n == "2":
            events.append(CompactionSummary(turn=2, step=1, reason="pressure", covered_from=0, covered_to=2,
                                            retained=1, message=summary))
        events += [AssistantMessageEvent(turn=t, step=1, message=said(n)), TurnEnd(turn=t, reason="completed")]
    for i, ev in enumerate(events, 1):
        ev.seq = i
    script = scripted({})
    async with memory_host(script) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        agent.restore(events)
        assert [m.id for m in agent.history] == ["s", "u2", "a2"]
        assert agent._seq == len(events) and agent._turn == 2


async def test_restore_as_a_fork_takes_the_committed_history_and_records_it(scripted, tmp_path):
    """``Agent.restore(events, fork_of=…)`` (ACP session/fork): a new session starts from the
    log's history up to its last ended turn (an open one is left out, nothing is interrupted),
    with its settings as resume takes them, and records both in its own log."""
    from dsh_core.contracts import AgentSpec
    from dsh_core.types import (
        AssistantMessage,
        AssistantMessageEvent,
        HistoryForked,
        InboxClaimed,
        SessionSettings,
        SettingsChanged,
        TextBlock,
        TurnEnd,
        TurnStart,
        UserMessage,
        UserMessageEvent,
    )
    from dsh_testing import memory_host

    events = [UserMessageEvent(message=UserMessage(id="u1", content=[TextBlock(text="q1")])),
              InboxClaimed(turn=1, message_ids=["u1"]), TurnStart(turn=1),
              AssistantMessageEvent(turn=1, step=1, message=AssistantMessage(id="a1", content=[TextBlock(text="a1")])),
              TurnEnd(turn=1, reason="completed"),
              SettingsChanged(settings=SessionSettings(mode="read-only"), changed=["mode"]),
              UserMessageEvent(message=UserMessage(id="u2", content=[TextBlock(text="q2")])),
              InboxClaimed(turn=2, message_ids=["u2"]), TurnStart(turn=2),
              AssistantMessageEvent(turn=2, step=1, message=AssistantMessage(id="a2", content=[TextBlock(text="a2")]))]
    for i, ev in enumerate(events, 1):
        ev.seq = i
    script = scripted({})
    async with memory_host(script) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script),
                                            forked_from="source"))
        seen: list = []
        agent.subscribe(lambda _a, ev: seen.append(ev))
        agent.restore(events, fork_of="source")
        assert [m.id for m in agent.history] == ["u1", "a1"]  # turn 2 was still open: not committed
        assert agent.settings.mode == "read-only"
        assert agent.header.forked_from == "source"
        forked, settings = seen
        assert isinstance(forked, HistoryForked) and forked.parent_session == "source"
        assert [m.id for m in forked.history()] == ["u1", "a1"]
        assert isinstance(settings, SettingsChanged) and settings.by == "fork" and settings.changed == ["mode"]
        assert forked.seq == 1 and agent._turn == 0  # its own log, numbered from the start


# --------------------------------------------------------------------------- session/load


async def test_session_load_replays_the_conversation_then_continues_it(acp_agent, scripted, tmp_path):
    """A client that only knows session/load (Toad, acpc): a fresh agent process re-opens a
    recorded session, shows its conversation as user/agent message chunks before answering
    (committed text only: no reasoning, tool calls or hook context), and the next prompt
    continues it."""
    script = scripted({"rules": [
        {"when": "^think", "steps": [{"reasoning": "hidden", "text": "thought about it"}]},
        {"when": "^tool", "steps": [{"tool": "nope", "args": {}}, {"text": "after a tool"}]},
    ], "default": [{"text": "echo: {prompt}"}]})
    async with acp_agent(script) as run:
        sid = await run.start()
        for text in ("think", "tool", "plain"):
            assert (await run.conn.prompt(session_id=sid, prompt=[text_block(text)])).stop_reason == "end_turn"
    client = Recorder()
    async with acp_agent(script, client=client) as run:
        init = await run.conn.initialize(protocol_version=1)
        assert init.agent_capabilities.load_session is True
        await run.conn.load_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
        shown = [(u.session_update, u.content.text) for _sid, u in client.updates]
        assert shown == [
            ("user_message_chunk", "think"), ("agent_message_chunk", "thought about it"),
            ("user_message_chunk", "tool"), ("agent_message_chunk", "after a tool"),
            ("user_message_chunk", "plain"), ("agent_message_chunk", "echo: plain"),
        ]
        ids = [u.message_id for _sid, u in client.updates]
        assert len(set(ids)) == 6 and all(ids)  # one message id per message, as live
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("again")])
        assert resp.stop_reason == "end_turn" and client.text(sid)[-1] == "echo: again"
        with pytest.raises(RequestError) as err:  # open here now: a second load is refused
            await run.conn.load_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
        assert err.value.code == -32602 and "already open" in str(err.value)
    turns = [e["turn"] for e in session_log(acp_agent.home, sid) if e["type"] == "turn/end"]
    assert turns == [1, 2, 3, 4]  # the same log, continued


async def test_session_load_is_refused_without_a_store(acp_agent, scripted):
    async with acp_agent(scripted({}), example="acp-nostore") as run:
        await run.conn.initialize(protocol_version=1)
        with pytest.raises(RequestError) as err:
            await run.conn.load_session(session_id="x", cwd=str(run.cwd), mcp_servers=[])
        assert err.value.code == -32601 and "jsonl-persistence" in err.value.data["details"]
