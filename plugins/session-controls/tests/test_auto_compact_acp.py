"""The ``auto_compact`` config option (issue 42's boolean row), with the official SDK client over
a real ``dsh run`` of acp-editor on stdio (every frame validated against ACP's schema): listed
with its value as a ``boolean`` option for a client that takes them (a select of on/off for one
that does not), switched off with a boolean ``session/set_config_option`` (and a
``config_option_update``), after which a context past the threshold is not compacted while
``/compact`` still is, and a resumed session keeps it off."""

from __future__ import annotations

import pytest
from acp import RequestError, text_block
from acp.schema import (
    BooleanConfigOptionCapabilities,
    ClientCapabilities,
    ClientSessionCapabilities,
    SessionConfigOptionsCapabilities,
)

from dsh_testing import SHIPPED_EXAMPLES, session_log, until

pytestmark = pytest.mark.anyio

SCRIPT = {
    "capabilities": {"context_window": 20000},
    "rules": [{"when": "^<transcript>", "steps": [{"text": "The person sent long notes."}]}],
    "default": [{"text": "noted"}],
}
BOOLEANS = ClientCapabilities(session=ClientSessionCapabilities(
    config_options=SessionConfigOptionsCapabilities(boolean=BooleanConfigOptionCapabilities())))
NOTES = 6


def _option(options, option_id="auto_compact"):
    return next(o for o in options if o.id == option_id)


def _compactions(home, sid):
    return [e["reason"] for e in session_log(home, sid) if e["type"] == "compaction/summary"]


async def _fill(run, sid):
    """Notes that take the context past the threshold (0.8 of the window) on the last prompts."""
    for n in range(NOTES):
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block(f"note {n}: " + "z" * 9000)])
        assert resp.stop_reason == "end_turn"


async def test_auto_compact_is_a_boolean_option_switched_off_durably(acp_agent, scripted):
    script = scripted(SCRIPT)
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1, client_capabilities=BOOLEANS)
        on = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        await _fill(run, on)  # on (the default): the same notes are compacted
        assert _compactions(acp_agent.home, on) == ["pressure"]

        new = await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])
        sid = new.session_id
        option = _option(new.config_options)
        assert (option.type, option.current_value, option.name) == ("boolean", True, "Auto-compact")
        answer = await run.conn.set_config_option(config_id="auto_compact", session_id=sid, value=False)
        assert _option(answer.config_options).current_value is False
        await until(lambda: any(u.session_update == "config_option_update" for s, u in run.client.updates if s == sid))
        (update,) = [u for s, u in run.client.updates if s == sid and u.session_update == "config_option_update"]
        assert _option(update.config_options).current_value is False
        with pytest.raises(RequestError):  # a select takes no boolean
            await run.conn.set_config_option(config_id="mode", session_id=sid, value=True)
        await _fill(run, sid)
        assert _compactions(acp_agent.home, sid) == []  # past the threshold, and not compacted
        resp = await run.conn.prompt(session_id=sid, prompt=[text_block("/compact")])
        assert resp.stop_reason == "end_turn" and run.client.text(sid)[-1].startswith("Compacted:")
        assert _compactions(acp_agent.home, sid) == ["manual"]  # a person asking still compacts
        await run.conn.prompt(session_id=sid, prompt=[text_block("/status")])
        assert "\n- **Auto-compact:** off\n" in run.client.text(sid)[-1]
        changed = [e for e in session_log(acp_agent.home, sid) if e["type"] == "settings/changed"]
        assert [(e["changed"], e["settings"]) for e in changed] == [(["auto_compact"], {"autoCompact": False})]
        assert await run.close_stdin() == 0
    async with acp_agent(script, example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1, client_capabilities=BOOLEANS)
        resumed = await run.conn.resume_session(session_id=sid, cwd=str(run.cwd), mcp_servers=[])
        assert _option(resumed.config_options).current_value is False  # resume keeps it
        await _fill(run, sid)
        assert _compactions(acp_agent.home, sid) == ["manual"]
        answer = await run.conn.set_config_option(config_id="auto_compact", session_id=sid, value=True)
        assert _option(answer.config_options).current_value is True
        assert await run.close_stdin() == 0


async def test_a_client_without_boolean_options_gets_a_select_of_on_and_off(acp_agent, scripted):
    async with acp_agent(scripted(SCRIPT), example="acp-editor", env=SHIPPED_EXAMPLES) as run:
        await run.conn.initialize(protocol_version=1)
        new = await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])
        option = _option(new.config_options)
        assert (option.type, option.current_value, [o.value for o in option.options]) == ("select", "on", ["on", "off"])
        answer = await run.conn.set_config_option(config_id="auto_compact", session_id=new.session_id, value="off")
        assert _option(answer.config_options).current_value == "off"
        assert await run.close_stdin() == 0
