"""acp-editor on the DeepSeek route, end to end: the official SDK client over real stdio, the
loopback fake DeepSeek server as the model. The model and thinking pickers (config options)
change what the next request carries, every change is durable and a resumed session gets it
back, usage_update carries the cost, and a turn the output limit cut answers ``max_tokens``.
Every frame is validated against ACP's schema when the run closes."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from fake_deepseek import FakeDeepSeek, Turn

from dsh_testing import REPO, session_log, spawn_acp

acp = pytest.importorskip("acp")

pytestmark = pytest.mark.anyio


def _options(options: list) -> dict[str, tuple[str, list[str]]]:
    return {o.id: (o.current_value, [c.value for c in o.options]) for o in options}


def _env(fake: FakeDeepSeek, home: Path) -> dict[str, str]:
    """acp-editor as shipped, but titled from the first prompt: the fake answers requests in
    order, and a title call running beside the turn would take an answer meant for the turn
    (test_deepseek_login.py's titled test is the one with a title call)."""
    examples = home.parent / "examples"
    (examples / "acp-editor").mkdir(parents=True, exist_ok=True)
    (examples / "acp-editor" / "example.toml").write_text(
        (REPO / "examples" / "acp-editor" / "example.toml").read_text() + '\n[config.session-controls]\ntitles = "prompt"\n')
    (examples / "acp-agent").mkdir(exist_ok=True)
    (examples / "acp-agent" / "example.toml").write_text((REPO / "examples" / "acp-agent" / "example.toml").read_text())
    return {"DSH_HOME": str(home), "DEEPSEEK_BASE_URL": fake.base_url, "DEEPSEEK_API_KEY": fake.api_key,
            "DSH_EXAMPLES_PATH": str(examples)}


async def test_the_model_and_thinking_pickers_drive_the_requests_and_survive_a_resume(fake: FakeDeepSeek,
                                                                                      tmp_path: Path):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    fake.push(Turn(content="on flash"), Turn(content="on pro, no thinking"), Turn(content="still pro"))
    async with spawn_acp(None, cwd=work, env=_env(fake, home), example="acp-editor") as run:
        await run.conn.initialize(protocol_version=1)
        new = await run.conn.new_session(cwd=str(work), mcp_servers=[])
        sid = new.session_id
        opts = _options(new.config_options)
        assert opts["model"] == ("deepseek-flash", ["deepseek-flash", "deepseek-v4-pro"])
        assert opts["thought_level"] == ("high", ["off", "low", "high", "max"])
        assert opts["mode"][0] == "workspace-write"
        assert new.modes.current_mode_id == "workspace-write"
        assert [m.id for m in new.modes.available_modes] == ["read-only", "workspace-write", "full-access", "plan"]
        categories = {o.id: o.category for o in new.config_options}
        assert categories == {"model": "model", "thought_level": "thought_level", "mode": "mode", "auto_compact": None}

        resp = await run.conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        assert resp.stop_reason == "end_turn"
        u = resp.usage  # the standard field, beside _meta.usage
        assert u.input_tokens > 0 and u.output_tokens > 0 and u.total_tokens == u.input_tokens + u.output_tokens
        assert resp.field_meta["usage"]["inputTokens"] == u.input_tokens
        first = fake.chat_requests[-1].body
        assert first["model"] == "deepseek-flash" and first["thinking"] == {"type": "enabled"}
        assert first["reasoning_effort"] == "high"

        changed = await run.conn.set_config_option(config_id="model", session_id=sid, value="deepseek-v4-pro")
        assert _options(changed.config_options)["model"][0] == "deepseek-v4-pro"
        changed = await run.conn.set_config_option(config_id="thought_level", session_id=sid, value="off")
        assert _options(changed.config_options)["thought_level"][0] == "off"
        with pytest.raises(acp.RequestError) as bad:
            await run.conn.set_config_option(config_id="model", session_id=sid, value="gpt-5")
        assert bad.value.code == -32602 and "not a value of model" in str(bad.value.data)

        resp = await run.conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
        second = fake.chat_requests[-1].body
        assert second["model"] == "deepseek-v4-pro" and second["thinking"] == {"type": "disabled"}
        assert "reasoning_effort" not in second
        assert second["messages"][:2] == first["messages"][:2]  # the same prefix: nothing was rewritten

        updates = [u for s, u in run.client.updates if s == sid]
        option_updates = [u for u in updates if u.session_update == "config_option_update"]
        assert [_options(u.config_options)["model"][0] for u in option_updates] == ["deepseek-v4-pro"] * 2
        usage = [u for u in updates if u.session_update == "usage_update"]
        assert usage and all(u.cost is not None and u.cost.currency == "USD" and u.cost.amount > 0 for u in usage)
        assert usage[-1].cost.amount > usage[0].cost.amount  # cumulative over the session
        assert await run.close_stdin() == 0

    changes = [e for e in session_log(home, sid) if e["type"] == "settings/changed"]
    assert [(c["changed"], c.get("cache", "kept"), c.get("by", "client")) for c in changes] == [
        (["model"], "broken", "client"), (["effort"], "broken", "client")]
    headers = [e for e in session_log(home, sid) if e["type"] == "request/header"]
    assert [h["model"] for h in headers] == ["deepseek-flash", "deepseek-v4-pro"] and headers[1].get("reason") == "model"

    async with spawn_acp(None, cwd=work, env=_env(fake, home), example="acp-editor") as run:
        await run.conn.initialize(protocol_version=1)
        resumed = await run.conn.resume_session(session_id=sid, cwd=str(work), mcp_servers=[])
        opts = _options(resumed.config_options)
        assert opts["model"][0] == "deepseek-v4-pro" and opts["thought_level"][0] == "off"
        await run.conn.prompt(session_id=sid, prompt=[acp.text_block("and now?")])
        third = fake.chat_requests[-1].body
        assert third["model"] == "deepseek-v4-pro" and third["thinking"] == {"type": "disabled"}
        assert await run.close_stdin() == 0


async def test_a_turn_cut_by_the_output_limit_answers_max_tokens_in_the_editor_only(fake: FakeDeepSeek,
                                                                                   tmp_path: Path):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    for example, expected in (("acp-editor", "max_tokens"), ("acp-agent", "end_turn")):
        fake.push(Turn(content="a long answer that was cut", finish_reason="length"))
        async with spawn_acp(None, cwd=work, env=_env(fake, home), example=example) as run:
            sid = await run.start()
            resp = await run.conn.prompt(session_id=sid, prompt=[acp.text_block("write a lot")])
            assert resp.stop_reason == expected, example
            assert (resp.usage is None) == (example == "acp-agent")  # acp-agent: _meta.usage only, as always
            assert "".join(run.client.text(sid)) == "a long answer that was cut"  # streamed as written
            assert await run.close_stdin() == 0


async def test_the_title_is_a_short_call_on_the_sessions_route(fake: FakeDeepSeek, tmp_path: Path):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    fake.push(Turn(content="Login bug fix"), Turn(content="Login bug fix"))  # the turn and the title, in either order
    env = {"DSH_HOME": str(home), "DEEPSEEK_BASE_URL": fake.base_url, "DEEPSEEK_API_KEY": fake.api_key,
           "DSH_EXAMPLES_PATH": str(REPO / "examples")}
    async with spawn_acp(None, cwd=work, env=env, example="acp-editor") as run:
        sid = await run.start()
        await run.conn.prompt(session_id=sid, prompt=[acp.text_block("the login fails on empty passwords")])
        assert await run.close_stdin() == 0
    (titled,) = [e for e in session_log(home, sid) if e["type"] == "session/titled"]
    assert titled["title"] == "Login bug fix" and titled.get("by", "model") == "model"
    (title_call,) = [r.body for r in fake.chat_requests if not r.body.get("tools")]
    assert title_call["thinking"] == {"type": "disabled"} and title_call["max_tokens"] == 40
    assert title_call["messages"][-1]["content"] == "the login fails on empty passwords"
    kinds = [e["type"] for e in session_log(home, sid)]
    assert kinds.index("session/titled") < kinds.index("turn/end")  # written before the first turn ends


async def test_a_switch_to_a_model_that_cannot_read_the_conversations_images_is_refused(fake: FakeDeepSeek,
                                                                                      tmp_path: Path):
    from dsh_testing import make_png

    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    fake.push(Turn(content="a red square"))
    async with spawn_acp(None, cwd=work, env=_env(fake, home), example="acp-editor") as run:
        sid = await run.start()
        image = acp.image_block(base64.b64encode(make_png()).decode(), "image/png")
        resp = await run.conn.prompt(session_id=sid, prompt=[acp.text_block("what is this?"), image])
        assert resp.stop_reason == "end_turn"
        with pytest.raises(acp.RequestError) as refused:
            await run.conn.set_config_option(config_id="model", session_id=sid, value="deepseek-v4-pro")
        assert refused.value.code == -32602 and "holds images" in str(refused.value.data)
        changed = await run.conn.set_config_option(config_id="thought_level", session_id=sid, value="low")
        assert _options(changed.config_options)["model"][0] == "deepseek-flash"  # still the model that reads them
        assert await run.close_stdin() == 0


async def test_a_loaded_session_shows_its_cost_and_the_next_call_adds_to_it(fake: FakeDeepSeek, tmp_path: Path):
    """session/load in a new process replays each call's usage_update with the cost the person
    saw live (acp-presentation), and the next call's cost goes on from that total."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    fake.push(Turn(content="one"), Turn(content="two"), Turn(content="three"))
    async with spawn_acp(None, cwd=work, env=_env(fake, home), example="acp-editor") as run:
        await run.conn.initialize(protocol_version=1)
        sid = (await run.conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        for text in ("hi", "again"):
            assert (await run.conn.prompt(session_id=sid, prompt=[acp.text_block(text)])).stop_reason == "end_turn"
        live = [(u.used, u.cost.amount) for s, u in run.client.updates if s == sid and u.session_update == "usage_update"]
        assert await run.close_stdin() == 0
    assert len(live) == 2 and live[1][1] > live[0][1] > 0
    async with spawn_acp(None, cwd=work, env=_env(fake, home), example="acp-editor") as run:
        await run.conn.initialize(protocol_version=1)
        await run.conn.load_session(session_id=sid, cwd=str(work), mcp_servers=[])
        replayed = [(u.used, u.cost.amount) for s, u in run.client.updates if s == sid and u.session_update == "usage_update"]
        assert replayed == live
        assert (await run.conn.prompt(session_id=sid, prompt=[acp.text_block("more")])).stop_reason == "end_turn"
        after = [u.cost.amount for s, u in run.client.updates if s == sid and u.session_update == "usage_update"][-1]
        assert await run.close_stdin() == 0
    assert after > live[-1][1]  # the session's total went on, not this process's alone
