"""Hostile clients and tampered logs against the session lifecycle (issue 22 items 4, 5, 7, 8).

Two real ``dsh`` processes share one data dir, as two ACP clients (two editor windows, or acpx
and an orchestrator) on one machine do.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from acp import RequestError, text_block

STRESS = os.environ.get("DSH_STRESS") == "1"  # tox -e stress: the long variants

pytestmark = pytest.mark.anyio


async def delete_session(run, sid: str) -> None:
    from acp.schema import DeleteSessionRequest, DeleteSessionResponse
    from acp.utils import request_model_from_dict

    await request_model_from_dict(run.conn._conn, "session/delete", DeleteSessionRequest(session_id=sid),
                                  DeleteSessionResponse)


async def test_another_client_cannot_delete_or_resume_a_live_session(acp_agent, scripted):
    script = scripted({"default": [{"text": "PONG"}], "repeat_default": True})
    log = lambda sid: acp_agent.home / "sessions" / f"{sid}.jsonl"  # noqa: E731
    async with acp_agent(script) as a:
        sid = await a.start()
        await a.conn.prompt(session_id=sid, prompt=[text_block("one")])
        async with acp_agent(script) as b:
            await b.conn.initialize(protocol_version=1)
            for attempt in (lambda: delete_session(b, sid),
                            lambda: b.conn.resume_session(session_id=sid, cwd=str(b.cwd))):
                with pytest.raises(RequestError) as err:
                    await attempt()
                assert err.value.code == -32602
                details = err.value.data["details"]
                assert "open in another dsh process" in details and f"pid {a.proc.pid}" in details, details
            assert log(sid).is_file()
            # A goes on answering, into the same log
            reply = await a.conn.prompt(session_id=sid, prompt=[text_block("two")])
            assert reply.stop_reason == "end_turn"
            await a.conn.close_session(session_id=sid)
            # closed in A: now B may resume it, and then A may not delete it
            await b.conn.resume_session(session_id=sid, cwd=str(b.cwd))
            with pytest.raises(RequestError) as err:
                await delete_session(a, sid)
            assert f"pid {b.proc.pid}" in err.value.data["details"]
            await b.conn.close_session(session_id=sid)
            await delete_session(a, sid)
            assert not log(sid).exists()


async def test_a_killed_holder_holds_nothing(acp_agent, scripted):
    """kill -9 of the process that had the session open: the lock dies with it."""
    script = scripted({"default": [{"text": "PONG"}], "repeat_default": True})
    async with acp_agent(script, check=False) as a:
        sid = await a.start()
        await a.conn.prompt(session_id=sid, prompt=[text_block("one")])
        os.kill(a.proc.pid, signal.SIGKILL)
        await a.proc.wait()
    async with acp_agent(script) as b:
        await b.conn.initialize(protocol_version=1)
        await b.conn.resume_session(session_id=sid, cwd=str(b.cwd))
        reply = await b.conn.prompt(session_id=sid, prompt=[text_block("two")])
        assert reply.stop_reason == "end_turn"
        await b.conn.close_session(session_id=sid)
        await delete_session(b, sid)


async def test_a_session_without_a_prompt_can_be_listed_resumed_and_deleted_elsewhere(acp_agent, scripted):
    """acpx ``sessions new`` then ``prompt`` in another process: the session exists from session/new."""
    script = scripted({"default": [{"text": "PONG"}], "repeat_default": True})
    async with acp_agent(script) as a:
        sid = await a.start()
        assert (acp_agent.home / "sessions" / f"{sid}.jsonl").is_file()
        await a.conn.close_session(session_id=sid)
    async with acp_agent(script) as b:
        await b.conn.initialize(protocol_version=1)
        assert sid in [s.session_id for s in (await b.conn.list_sessions()).sessions]
        await b.conn.resume_session(session_id=sid, cwd=str(b.cwd))
        reply = await b.conn.prompt(session_id=sid, prompt=[text_block("first prompt, second process")])
        assert reply.stop_reason == "end_turn" and b.client.text(sid) == ["PONG"]
        await b.conn.close_session(session_id=sid)
        await delete_session(b, sid)
        assert not (acp_agent.home / "sessions" / f"{sid}.jsonl").exists()


async def test_resume_takes_the_route_from_the_agent_not_from_a_tampered_log(acp_agent, scripted):
    """A log edited to name another (scripted) model whose script runs bash: resuming must not obey it."""
    honest = scripted({"default": [{"text": "honest"}], "repeat_default": True})
    evil = scripted({"default": [{"tool": "bash", "args": {"command": "touch PWNED", "description": "x"}},
                                 {"text": "evil"}]})
    async with acp_agent(honest) as a:
        sid = await a.start()
        await a.conn.prompt(session_id=sid, prompt=[text_block("hi")])
        await a.conn.close_session(session_id=sid)
    path = acp_agent.home / "sessions" / f"{sid}.jsonl"
    tampered = path.read_text().replace(json.dumps(str(honest))[1:-1], json.dumps(str(evil))[1:-1])
    assert tampered != path.read_text()
    path.write_text(tampered)
    async with acp_agent(honest) as b:
        await b.conn.initialize(protocol_version=1)
        result = await b.conn.resume_session(session_id=sid, cwd=str(b.cwd))
        meta = (result.field_meta or {}).get("dsh", {})
        assert meta.get("route") == f"scripted/{honest}" and meta.get("recordedRoute") == f"scripted/{evil}", meta
        reply = await b.conn.prompt(session_id=sid, prompt=[text_block("again")])
        assert reply.stop_reason == "end_turn" and b.client.text(sid) == ["honest"]
        assert "resumes on this agent's route" in b.stderr.decode()
    assert not (b.cwd / "PWNED").exists()


@pytest.mark.parametrize("size", [100_000, 1_000_000] if STRESS else [100_000])
async def test_a_huge_session_id_is_not_echoed_back(acp_agent, scripted, size):
    from acp.schema import DeleteSessionRequest, DeleteSessionResponse
    from acp.utils import request_model_from_dict

    script = scripted({"default": [{"text": "PONG"}]})
    huge = "s" * size
    async with acp_agent(script) as run:
        await run.conn.initialize(protocol_version=1)
        attempts = [
            lambda: run.conn.prompt(session_id=huge, prompt=[text_block("x")]),
            lambda: run.conn.resume_session(session_id=huge, cwd=str(run.cwd)),
            lambda: request_model_from_dict(run.conn._conn, "session/delete", DeleteSessionRequest(session_id=huge),
                                            DeleteSessionResponse),
            lambda: run.conn.close_session(session_id=huge),
        ]
        for attempt in attempts:
            with pytest.raises(RequestError) as err:
                await attempt()
            text = json.dumps({"message": str(err.value), "data": err.value.data})
            assert len(text) < 1_000, text[:300]
            assert "unknown session" in text and f"{size:,} characters" in text
        await run.conn.cancel(session_id=huge)  # a notification: ignored, and the agent serves on
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("x")])).stop_reason == "end_turn"
    assert len(run.stderr) < 20_000
