"""Issue 42's ``session/fork`` and ``additionalDirectories`` rows of acp-editor, over a real
``dsh run`` with the official SDK client, each beside acp-agent's answer, which does not change
(``session/fork`` is an unknown method there, a non-empty ``additionalDirectories`` is ``-32602``).

The directories are proved with the real sandbox, once per mechanism (bubblewrap, Landlock): a
write into an added directory works, one into a sibling directory that was not added is refused,
by ``bash`` and by the file tools, and a resumed session keeps its directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from acp import RequestError, text_block
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from dsh_testing import SHIPPED_EXAMPLES, added_and_sibling_dirs

pytestmark = pytest.mark.anyio


def _log(home: Path, sid: str) -> list[dict]:
    return [json.loads(line) for line in (home / "sessions" / f"{sid}.jsonl").read_text().splitlines()]


async def _caps(run) -> dict:
    """initialize: the session capabilities as sent (the SDK's model dumped by alias)."""
    init = await run.conn.initialize(protocol_version=1)
    return init.agent_capabilities.session_capabilities.model_dump(by_alias=True, exclude_none=True)


# --------------------------------------------------------------------------- session/fork

FIRST = {"rules": [{"when": "REMEMBER", "steps": [{"text": "FIRST-ANSWER"}]},
                   {"when": "AND-NOW", "steps": [{"text": "FORK-ANSWER"}]}],
         "default": [{"text": "OLD-AGAIN"}]}


async def test_fork_starts_a_new_session_from_the_committed_history_and_settings(acp_agent, scripted):
    script = scripted(FIRST)
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES, unstable=True) as run:
        assert (await _caps(run))["fork"] == {}
        old = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        await run.conn.prompt(session_id=old, prompt=[text_block("REMEMBER-THIS")])
        await run.conn.set_session_mode(session_id=old, mode_id="read-only")
        before = (acp_agent.home / "sessions" / f"{old}.jsonl").read_bytes()
        forked = await run.conn.fork_session(session_id=old, cwd=str(run.cwd), mcp_servers=[])
        new = forked.session_id
        assert new != old and len(new) == 32
        assert forked.modes.current_mode_id == "read-only"  # the old one's settings, as resume takes them
        mode = next(o for o in forked.config_options if o.id == "mode")
        assert mode.current_value == "read-only"
        assert (acp_agent.home / "sessions" / f"{old}.jsonl").read_bytes() == before  # the old one untouched
        resp = await run.conn.prompt(session_id=new, prompt=[text_block("AND-NOW")])
        assert resp.stop_reason == "end_turn"
        await run.conn.prompt(session_id=old, prompt=[text_block("OLD-GOES-ON")])  # both live on, apart
        listed = {s.session_id for s in (await run.conn.list_sessions()).sessions}
        assert {old, new} <= listed
        assert await run.close_stdin() == 0
    assert "FORK-ANSWER" in run.client.text(new) and "FORK-ANSWER" not in run.client.text(old)
    fork_log = _log(acp_agent.home, new)
    assert fork_log[0]["type"] == "session" and fork_log[0]["forkedFrom"] == old
    inherited = next(e for e in fork_log if e["type"] == "history/forked")
    assert inherited["parentSession"] == old
    texts = json.dumps(inherited["messages"])
    assert "REMEMBER-THIS" in texts and "FIRST-ANSWER" in texts and "OLD-GOES-ON" not in texts
    settings = next(e for e in fork_log if e["type"] == "settings/changed")
    assert settings["settings"]["mode"] == "read-only" and settings["by"] == "fork"
    old_log = _log(acp_agent.home, old)
    assert "AND-NOW" not in json.dumps(old_log)


async def test_a_fork_of_a_closed_session_resumes_with_its_history(acp_agent, scripted):
    """The source may be closed (another process wrote it); the fork's own log carries the
    history, so the fork re-opens alone, and session/load shows the conversation it started from."""
    script = scripted(FIRST)
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        old = await run.start()
        await run.conn.prompt(session_id=old, prompt=[text_block("REMEMBER-THIS")])
        await run.conn.set_session_mode(session_id=old, mode_id="full-access")  # never taken from a file
        assert await run.close_stdin() == 0
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES, unstable=True) as run:
        await run.conn.initialize(protocol_version=1)
        forked = await run.conn.fork_session(session_id=old, cwd=str(run.cwd), mcp_servers=[])
        new = forked.session_id
        assert forked.modes.current_mode_id != "full-access"
        assert [u for s, u in run.client.updates if s == new and "message_chunk" in u.session_update] == []
        await run.conn.close_session(session_id=new)
        loaded = await run.conn.load_session(session_id=new, cwd=str(run.cwd), mcp_servers=[])
        assert loaded.modes.current_mode_id != "full-access"
        shown = [(u.session_update, u.content.text) for s, u in run.client.updates
                 if s == new and "message_chunk" in u.session_update]
        assert shown == [("user_message_chunk", "REMEMBER-THIS"), ("agent_message_chunk", "FIRST-ANSWER")]
        resp = await run.conn.prompt(session_id=new, prompt=[text_block("AND-NOW")])
        assert resp.stop_reason == "end_turn" and "FORK-ANSWER" in run.client.text(new)
        assert await run.close_stdin() == 0
    inherited = next(e for e in _log(acp_agent.home, new) if e["type"] == "history/forked")
    assert "REMEMBER-THIS" in json.dumps(inherited["messages"])


async def test_fork_refusals(acp_agent, scripted):
    async with acp_agent(scripted({"default": [{"text": "ok"}]}), example="acp-editor", env=SHIPPED_EXAMPLES,
                         unstable=True) as run:
        sid = await run.start()
        with pytest.raises(RequestError) as unknown:
            await run.conn.fork_session(session_id="0" * 32, cwd=str(run.cwd), mcp_servers=[])
        assert unknown.value.code == -32602 and "unknown session" in str(unknown.value.data)
        with pytest.raises(RequestError) as elsewhere:
            await run.conn.fork_session(session_id=sid, cwd="/", mcp_servers=[])
        assert elsewhere.value.code == -32602 and "recorded cwd" in str(elsewhere.value.data)
        assert await run.close_stdin() == 0


async def test_acp_agent_answers_fork_as_an_unknown_method(acp_agent, scripted):
    async with acp_agent(scripted({"default": [{"text": "ok"}]}), unstable=True) as run:
        caps = await _caps(run)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        assert "fork" not in caps and "additionalDirectories" not in caps
        with pytest.raises(RequestError) as failed:
            await run.conn.fork_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
        assert failed.value.code == -32601
        assert await run.close_stdin() == 0


# --------------------------------------------------------------------------- additionalDirectories


@pytest.fixture
def dirs():
    """An added directory and its sibling, outside every writable root (not under /tmp)."""
    with added_and_sibling_dirs("added") as pair:
        yield pair


def _writes(added: Path, sibling: Path, tag: str) -> dict:
    return {"default": [
        {"tool": "bash", "args": {"description": "Write", "command": f"printf in > {added}/{tag}-bash.txt"}},
        {"tool": "bash", "args": {"description": "Write", "command": f"printf out > {sibling}/{tag}-bash.txt"}},
        {"tool": "write", "args": {"file_path": f"{added}/{tag}-tool.txt", "content": "in"}},
        {"tool": "write", "args": {"file_path": f"{sibling}/{tag}-tool.txt", "content": "out"}},
        {"tool": "bash", "args": {"description": "Look", "command": "pwd > where.txt", "workdir": str(added)}},
        {"text": "done"},
    ]}


def _results(run, sid) -> list:
    return [u for s, u in run.client.updates if s == sid and u.session_update == "tool_call_update"
            and u.status in ("completed", "failed")]


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_additional_directories_are_roots_of_the_session_tier_and_no_more(acp_agent, scripted, dirs,
                                                                                mechanism):
    require_mechanism(mechanism)
    added, sibling = dirs
    env = {**SHIPPED_EXAMPLES, "DSH_SANDBOX_MECHANISM": mechanism}
    async with acp_agent(scripted(_writes(added, sibling, "new")), example="acp-editor", env=env) as run:
        assert (await _caps(run))["additionalDirectories"] == {}
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[],
                                          additional_directories=[str(added)])).session_id
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("go")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    assert (added / "new-bash.txt").read_text() == "in" and (added / "new-tool.txt").read_text() == "in"
    assert not (sibling / "new-bash.txt").exists() and not (sibling / "new-tool.txt").exists()
    assert (added / "where.txt").read_text().strip() == str(added)  # a workdir in an added directory
    cards = _results(run, sid)
    assert cards[1].raw_output["output"] and "new-bash.txt" in cards[1].raw_output["output"]  # the shell's refusal
    assert cards[3].status == "failed" and "outside the writable roots" in cards[3].raw_output["output"]
    header = _log(acp_agent.home, sid)[0]
    assert header["additionalDirectories"] == [str(added)]

    # resumed in another process without the field: the recorded directories are kept
    async with acp_agent(scripted(_writes(added, sibling, "resumed")), example="acp-editor", env=env) as run:
        await run.conn.initialize(protocol_version=1)
        await run.conn.resume_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("again")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    assert (added / "resumed-bash.txt").read_text() == "in" and (added / "resumed-tool.txt").read_text() == "in"
    assert not (sibling / "resumed-bash.txt").exists() and not (sibling / "resumed-tool.txt").exists()


async def test_additional_directories_in_read_only_are_read_only(acp_agent, scripted, dirs):
    added, _ = dirs
    (added / "notes.txt").write_text("READ-ME\n")
    script = scripted({"default": [
        {"tool": "read", "args": {"file_path": f"{added}/notes.txt"}},
        {"tool": "bash", "args": {"description": "Write", "command": f"printf in > {added}/ro.txt"}},
        {"text": "done"},
    ]})
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[],
                                          additional_directories=[str(added)])).session_id
        await run.conn.set_session_mode(session_id=sid, mode_id="read-only")
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("go")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    read, wrote = _results(run, sid)
    assert "READ-ME" in read.raw_output["output"]  # reads: as anywhere
    assert not (added / "ro.txt").exists() and "ro.txt" in wrote.raw_output["output"]  # writes: refused


async def test_bad_additional_directories_are_refused_by_name(acp_agent, scripted, dirs):
    added, sibling = dirs
    async with acp_agent(scripted({"default": [{"text": "ok"}]}), example="acp-editor", env=SHIPPED_EXAMPLES,
                         unstable=True) as run:
        sid = await run.start()
        for bad, why in (("relative/dir", "absolute"), (str(sibling / "missing"), "not a directory")):
            with pytest.raises(RequestError) as refused:
                await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[],
                                           additional_directories=[str(added), bad])
            assert refused.value.code == -32602
            assert bad in str(refused.value.data) and why in str(refused.value.data)
        await run.conn.close_session(session_id=sid)
        with pytest.raises(RequestError) as refused:
            await run.conn.resume_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[],
                                          additional_directories=[str(sibling / "missing")])
        assert refused.value.code == -32602 and "missing" in str(refused.value.data)
        # an explicit list replaces the recorded one, and the log says so for the next resume
        await run.conn.load_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[],
                                    additional_directories=[str(added)])
        # a fork takes the source's recorded directories, unless it names its own
        inherits = (await run.conn.fork_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])).session_id
        own = (await run.conn.fork_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[],
                                           additional_directories=[])).session_id
        assert await run.close_stdin() == 0
    notes = [e for e in _log(acp_agent.home, sid) if e["type"] == "note" and e["kind"] == "acp/additional-directories"]
    assert notes[-1]["data"]["directories"] == [str(added)]
    assert _log(acp_agent.home, inherits)[0]["additionalDirectories"] == [str(added)]
    assert "additionalDirectories" not in _log(acp_agent.home, own)[0]


async def test_acp_agent_still_refuses_additional_directories(acp_agent, scripted, dirs):
    added, _ = dirs
    async with acp_agent(scripted({"default": [{"text": "ok"}]})) as run:
        sid = await run.start()
        with pytest.raises(RequestError) as refused:
            await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[], additional_directories=[str(added)])
        assert refused.value.code == -32602 and "not supported" in str(refused.value.data)
        await run.conn.close_session(session_id=sid)
        with pytest.raises(RequestError) as refused:
            await run.conn.resume_session(session_id=sid, cwd=str(run.cwd), additional_directories=[str(added)])
        assert refused.value.code == -32602 and "not supported" in str(refused.value.data)
        assert await run.close_stdin() == 0
