"""ask_user_question in acp-editor: asked through the editor (ACP elicitation/create, form mode)
with the official SDK client over a real ``dsh run`` on stdio; absent without the client's
``elicitation.form`` capability, and in acp-agent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from acp import text_block
from acp.schema import (
    AcceptElicitationResponse,
    ClientCapabilities,
    DeclineElicitationResponse,
    ElicitationCapabilities,
    ElicitationFormCapabilities,
)

from dsh_testing import SHIPPED_EXAMPLES, Recorder, session_log

pytestmark = pytest.mark.anyio

FORMS = ClientCapabilities(elicitation=ElicitationCapabilities(form=ElicitationFormCapabilities()))
ASK = {"questions": [
    {"question": "Which database should the service use?", "header": "Database",
     "options": [{"label": "Postgres", "description": "the team knows it"}, {"label": "SQLite"}]},
    {"question": "Which checks must pass?", "options": [{"label": "unit"}, {"label": "lint"}, {"label": "types"}],
     "multi_select": True},
    {"question": "Anything else?"},
]}
SCRIPT = {"default": [{"tool": "ask_user_question", "args": ASK}, {"text": "{tool_result}"}]}


@dataclass
class Person(Recorder):
    answer: Any = None
    asked: list[Any] = field(default_factory=list)

    async def create_elicitation(self, message: str, mode: Any, **kw: Any) -> Any:
        self.asked.append((message, mode))
        return self.answer


async def test_the_person_answers_a_form_in_the_editor(acp_agent, scripted):
    person = Person(answer=AcceptElicitationResponse(action="accept", content={
        "q1": "Postgres", "q2": ["unit", "types"], "q3": "keep it small"}))
    async with acp_agent(scripted(SCRIPT), example="acp-editor", env=SHIPPED_EXAMPLES, client=person, unstable=True) as run:
        await run.conn.initialize(protocol_version=1, client_capabilities=FORMS)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("set up the service")])).stop_reason == "end_turn"
        assert await run.close_stdin() == 0
    (message, mode), = person.asked
    assert message == "3 questions from the agent"
    form = mode.root if hasattr(mode, "root") else mode
    assert form.session_id == sid and form.tool_call_id  # scoped to the session and the call
    asked = next(f for f in run.frames if f.get("method") == "elicitation/create")["params"]["requestedSchema"]
    assert asked["required"] == ["q1", "q2", "q3"]
    assert [o["const"] for o in asked["properties"]["q1"]["oneOf"]] == ["Postgres", "SQLite"]
    assert asked["properties"]["q2"]["items"]["enum"] == ["unit", "lint", "types"]
    assert asked["properties"]["q3"]["type"] == "string"
    answer = run.client.text(sid)[-1]
    assert answer.startswith("The person answered:") and "→ Postgres" in answer and "→ unit, types" in answer
    assert "→ keep it small" in answer


async def test_one_question_is_the_forms_message(acp_agent, scripted):
    one = {"default": [{"tool": "ask_user_question", "args": {"questions": [{"question": "Tabs or spaces?"}]}},
                       {"text": "{tool_result}"}]}
    person = Person(answer=AcceptElicitationResponse(action="accept", content={"q1": "spaces"}))
    async with acp_agent(scripted(one), example="acp-editor", env=SHIPPED_EXAMPLES, client=person, unstable=True) as run:
        await run.conn.initialize(protocol_version=1, client_capabilities=FORMS)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        await run.conn.prompt(session_id=sid, prompt=[text_block("format the code")])
        assert await run.close_stdin() == 0
    assert [m for m, _ in person.asked] == ["Tabs or spaces?"]
    assert run.client.text(sid)[-1] == "The person answered:\n- Tabs or spaces?\n  → spaces"


async def test_a_declined_question_is_an_answer_the_model_reads(acp_agent, scripted):
    person = Person(answer=DeclineElicitationResponse(action="decline"))
    async with acp_agent(scripted(SCRIPT), example="acp-editor", env=SHIPPED_EXAMPLES, client=person, unstable=True) as run:
        await run.conn.initialize(protocol_version=1, client_capabilities=FORMS)
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        await run.conn.prompt(session_id=sid, prompt=[text_block("set up the service")])
        assert await run.close_stdin() == 0
    assert run.client.text(sid)[-1].startswith("The person declined to answer")


@pytest.mark.parametrize("example, caps", [("acp-editor", None), ("acp-agent", FORMS)])
async def test_without_a_form_capable_editor_there_is_no_such_tool(acp_agent, scripted, example, caps):
    person = Person()
    env = SHIPPED_EXAMPLES if example == "acp-editor" else {}
    async with acp_agent(scripted(SCRIPT), example=example, env=env, client=person, unstable=True) as run:
        await run.conn.initialize(protocol_version=1, **({"client_capabilities": caps} if caps else {}))
        sid = (await run.conn.new_session(cwd=str(run.cwd), mcp_servers=[])).session_id
        await run.conn.prompt(session_id=sid, prompt=[text_block("set up the service")])
        assert await run.close_stdin() == 0
    assert person.asked == []
    headers = [e for e in session_log(acp_agent.home, sid) if e["type"] == "request/header"]
    assert all(t["name"] != "ask_user_question" for h in headers for t in h["tools"])
    (result,) = [e["result"] for e in session_log(acp_agent.home, sid) if e["type"] == "tool/result"]
    assert result["isError"]  # an unknown tool


def test_what_the_model_wrote_is_shown_without_controls_or_direction_marks():
    from dsh_session_controls import form_of

    form = form_of([{"question": "Delete\u202e the \x1b[2Jbranch?\nReally?", "header": "x" * 500,
                     "options": [{"label": "yes\u2066", "description": "d\x07"}, {"label": "no"}]}])
    field = form["properties"]["q1"]
    assert field["description"] == "Delete  the  [2Jbranch?\nReally?"  # newlines kept, the rest blanked
    assert len(field["title"]) == 200
    assert [(o["const"], o.get("description")) for o in field["oneOf"]] == [
        ("yes", "d"), ("no", None)]
