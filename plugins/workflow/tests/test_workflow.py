"""workflow and ralph in one host: the script runs in code-mode's real confined runtime (on each
sandbox mechanism the machine has, where it matters), members are real in-process children played
by the scripted model (rules match each member's prompt)."""

from __future__ import annotations

import json

import anyio
import pytest
from dsh_sandbox_tools.testing import MECHANISMS, require_mechanism

from dsh_core.contracts import AgentSpec
from dsh_core.types import Note, TextBlock, ToolResultEvent, TurnEnd, UserMessage
from dsh_testing import memory_host, prompt_once

pytestmark = pytest.mark.anyio

CONTINUE = {"status": "continue", "summary": "did the first half", "evidence": ["a.txt written"],
            "nextSteps": ["write b.txt"], "blocker": ""}
COMPLETE = {"status": "complete", "summary": "did the rest", "evidence": ["b.txt written"], "nextSteps": [],
            "blocker": ""}
META = {"name": "fan", "description": "fan out"}
PLUGINS = ("scripted-model", "sandbox-tools", "code-mode", "subagents", "workflow")
MEMBERS = [
    {"when": "^member: one", "steps": [{"text": "ONE"}]},
    {"when": "^member: two", "steps": [{"text": "TWO"}]},
    {"when": "^member: json", "steps": [{"text": "```json\n{\"n\": 7}\n```"}]},
    {"when": "^member: notjson", "steps": [{"text": "seven"}]},
    {"when": "^member: hang", "steps": [{"partial": "WORKING", "mark": "member-started", "delay_ms": 600000}]},
    {"when": "round: 1 of", "steps": [{"text": json.dumps(CONTINUE)}]},
    {"when": "round: 2 of", "steps": [{"text": json.dumps(COMPLETE)}]},
]


def _value(text: str) -> object:
    """The return value of a workflow's result text (after its ``Return value:`` line)."""
    head, _, value = text.partition("\nReturn value:\n")
    assert head.startswith("workflow \"fan\" completed ("), text
    return json.loads(value)


def _script(scripted, tool: str, args: dict) -> object:
    return scripted({"rules": [{"when": "^go", "steps": [{"tool": tool, "args": args}, {"text": "{tool_result}"}]},
                               *MEMBERS]})


async def _go(host, workspace, script):
    agent, seen = await prompt_once(host, workspace, script, timeout=60)
    (result,) = [e for e in seen if isinstance(e, ToolResultEvent)]
    return agent, seen, result


def _config(mechanism: str | None = None, **workflow):
    return {"code-mode": {"mode": "runtime"}, "sandbox-tools": {"mechanism": mechanism} if mechanism else {},
            "workflow": {k.replace("_", "-"): v for k, v in workflow.items()}}


FANOUT = '''
phase("gather")
answers = await parallel([lambda: agent("member: one", label="one"), lambda: agent("member: two", label="two")])
data = await agent("member: json", schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
bad = await agent("member: notjson", schema={"type": "object"})
piped = await pipeline(["a", "b"], lambda x: agent("member: one " + x))
log("all in")
return {"answers": answers, "n": data["n"], "bad": bad, "piped": piped, "args": args}
'''


async def test_a_workflow_fans_out_checks_structured_answers_and_records_each_member(scripted, tmp_path):
    script = _script(scripted, "workflow", {"meta": META, "script": FANOUT, "args": {"k": [1, 2]}})
    async with memory_host(script, plugins=PLUGINS, config=_config()) as host:
        agent, seen, result = await _go(host, tmp_path, script)
        text = result.result.content[0].text
        assert not result.result.is_error, text
        assert text.startswith('workflow "fan" completed (6 agents).\nReturn value:\n{\n  "answers": [\n'), text
        assert _value(text) == {"answers": ["ONE", "TWO"], "n": 7, "bad": None, "piped": ["ONE", "ONE"],
                                "args": {"k": [1, 2]}}
        notes = [(e.kind, e.data) for e in seen if isinstance(e, Note)]
        kinds = [k for k, _ in notes]
        assert kinds[0] == "workflow/start" and kinds[-1] == "workflow/end" and kinds.count("workflow/member") == 6
        assert ("workflow/phase", {"title": "gather"}) in notes and ("workflow/log", {"message": "all in"}) in notes
        members = [d for k, d in notes if k == "workflow/member"]
        assert {m["label"] for m in members if m.get("phase") == "gather"} >= {"one", "two"}
        assert next(m for m in members if not m["ok"])["problem"] == "its answer is not one JSON value"
        assert notes[-1][1]["outcome"] == "completed" and not agent.children  # every member disposed


@pytest.mark.parametrize(("script", "message"), [
    ("await agent('member: one')\nawait agent('member: one')\nawait agent('member: one')\nreturn 1",
     "Error: workflow run failed: this run reached its total agent cap (2) — a runaway-loop backstop; raise max-agents "
     "in [config.workflow] if the scale is intentional"),
    ("return await parallel([lambda: 1, lambda: 2, lambda: 3])",
     "Error: workflow run failed: parallel() received 3 items — over the per-call cap (2); split the work or raise "
     "max-items in [config.workflow]"),
    ("return await pipeline(range(3), lambda x: x)", "Error: workflow run failed: pipeline() received 3 items"),
    ("await agent(123)\nreturn 1", "Error: workflow run failed: agent() needs a prompt: a non-empty string"),
    ("x = 1\nraise ValueError('nope')", "Error: workflow run failed: ValueError: nope (program line 2)"),
])
async def test_a_tripped_cap_a_misused_hook_or_an_exception_ends_the_script_with_a_clear_error(
        scripted, tmp_path, script, message):
    tool = _script(scripted, "workflow", {"meta": META, "script": script})
    async with memory_host(tool, plugins=PLUGINS, config=_config(max_agents=2, max_items=2)) as host:
        agent, _seen, result = await _go(host, tmp_path, tool)
        text = result.result.content[0].text
        assert result.result.is_error and text.startswith(message), text
        assert not agent.children


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_the_script_itself_writes_nothing(scripted, tmp_path, mechanism):
    """Read-only, whatever the session may do: the agents do the work, not the script."""
    require_mechanism(mechanism)
    body = ("try:\n    open('by-script.txt', 'w').write('x')\n    return 'wrote'\n"
            "except OSError as exc:\n    return type(exc).__name__")
    script = _script(scripted, "workflow", {"meta": META, "script": body})
    async with memory_host(script, plugins=PLUGINS, config=_config(mechanism)) as host:
        _, _, result = await _go(host, tmp_path, script)
        text = result.result.content[0].text
        assert _value(text) in ("OSError", "PermissionError"), text
        assert not (tmp_path / "by-script.txt").exists()


async def test_cancel_reaches_every_member(scripted, tmp_path):
    body = "return await parallel([lambda: agent('member: hang a'), lambda: agent('member: hang b')])"
    script = _script(scripted, "workflow", {"meta": META, "script": body})
    async with memory_host(script, plugins=PLUGINS, config=_config(concurrency=2)) as host:
        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        seen: list = []
        agent.subscribe(lambda a, e: seen.append(e))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        with anyio.fail_after(30):
            while len(agent.children) < 2 or not (tmp_path / "member-started").exists():
                await anyio.sleep(0.01)
        children = list(agent.children)
        ends: list = []
        for child in children:
            child.subscribe(lambda a, e: ends.append(e.reason) if isinstance(e, TurnEnd) else None)
        agent.cancel()
        with anyio.fail_after(30):
            await agent.wait_idle()
        assert ends == ["aborted", "aborted"] and all(c.disposed for c in children) and not agent.children
        end = [e.data for e in seen if isinstance(e, Note) and e.kind == "workflow/end"]
        assert end and end[0]["outcome"] == "cancelled"


def _pretty(report: dict) -> str:
    return json.dumps(report, indent=2)


async def test_ralph_runs_fresh_rounds_until_one_reports_completion(scripted, tmp_path):
    script = _script(scripted, "ralph", {"objective": "make it work", "maxRounds": 3})
    async with memory_host(script, plugins=PLUGINS, config=_config()) as host:
        agent, seen, result = await _go(host, tmp_path, script)
        assert not result.result.is_error
        assert result.result.content[0].text == ("Ralph worker reported completion after 2 rounds.\nFinal report:\n"
                                                 + _pretty(COMPLETE))
        members = [e.data for e in seen if isinstance(e, Note) and e.kind == "ralph/member"]
        assert [m["label"] for m in members] == ["Ralph round 1", "Ralph round 2"] and all(m["ok"] for m in members)
        assert not agent.children


def test_round_prompt_carries_the_objective_the_round_and_the_previous_handoff_only():
    from dsh_workflow.ralph import round_prompt

    first = round_prompt("ship it", 1, 4, None)
    assert "ship it" in first and "Ralph round: 1 of 4." in first and "first round" in first
    later = round_prompt("ship it", 2, 4, CONTINUE)
    assert json.dumps(CONTINUE) in later and "Ralph round: 2 of 4." in later


def _ralph(scripted, args: dict, *rounds: object) -> object:
    return scripted({"rules": [
        {"when": "^go", "steps": [{"tool": "ralph", "args": args}, {"text": "{tool_result}"}]},
        *[{"when": f"round: {n} of", "steps": [{"text": r if isinstance(r, str) else json.dumps(r)}]}
          for n, r in enumerate(rounds, 1)]]})


async def test_ralph_reports_a_blocker_and_stops_there(scripted, tmp_path):
    blocked = {"status": "blocked", "summary": "need a key", "evidence": [], "nextSteps": [], "blocker": "no API key"}
    script = _ralph(scripted, {"objective": "call the API", "maxRounds": 5}, CONTINUE, blocked, COMPLETE)
    async with memory_host(script, plugins=PLUGINS, config=_config()) as host:
        _, _, result = await _go(host, tmp_path, script)
        assert not result.result.is_error
        assert result.result.content[0].text == ("Ralph worker reported a blocker after 2 rounds.\nFinal report:\n"
                                                 + _pretty(blocked))


async def test_ralph_says_so_when_the_rounds_run_out(scripted, tmp_path):
    script = _ralph(scripted, {"objective": "never", "maxRounds": 2}, CONTINUE, CONTINUE)
    async with memory_host(script, plugins=PLUGINS, config=_config()) as host:
        _, _, result = await _go(host, tmp_path, script)
        assert not result.result.is_error
        assert result.result.content[0].text == ("Ralph reached its 2 rounds limit; the worker reported work "
                                                 "remaining.\nFinal report:\n" + _pretty(CONTINUE))


async def test_ralph_stops_at_the_first_failed_round_with_the_last_handoff(scripted, tmp_path):
    script = _ralph(scripted, {"objective": "x", "maxRounds": 4}, CONTINUE, "not a report", COMPLETE)
    async with memory_host(script, plugins=PLUGINS, config=_config()) as host:
        _, seen, result = await _go(host, tmp_path, script)
        assert result.result.is_error and result.code == "RALPH_ROUND_FAILED"
        assert result.result.content[0].text == ("Error: Ralph round 2 child failed before producing a structured report."
                                                 "\nLast successful handoff:\n" + _pretty(CONTINUE))
        assert len([e for e in seen if isinstance(e, Note) and e.kind == "ralph/member"]) == 2
    script = _ralph(scripted, {"objective": "x"}, {"status": "done"})
    async with memory_host(script, plugins=PLUGINS, config=_config()) as host:
        _, _, result = await _go(host, tmp_path, script)
        assert result.result.content[0].text == ("Error: Ralph round 1 child failed before producing a structured report."
                                                 "\nNo previous handoff was available.")


async def test_a_report_that_breaks_the_rules_ends_the_run(scripted, tmp_path):
    no_steps = {**CONTINUE, "nextSteps": []}
    script = _ralph(scripted, {"objective": "x", "maxRounds": 2}, no_steps)
    async with memory_host(script, plugins=PLUGINS, config=_config()) as host:
        _, _, result = await _go(host, tmp_path, script)
        assert result.result.is_error and result.result.content[0].text == (
            "Error: Ralph workflow failed: a continuing Ralph report needs nextSteps and an empty blocker")


@pytest.mark.parametrize(("args", "message"), [
    ({"objective": "x", "maxRounds": 11}, "Ralph maxRounds 11 exceeds the deployment ceiling 10"),
    ({"objective": "x", "maxRounds": 0}, "Ralph maxRounds must be a positive safe integer"),
    ({"objective": "x", "maxRounds": 2.5}, "Ralph maxRounds must be a positive safe integer"),
    ({"objective": "  "}, "Ralph objective must be a non-empty string"),
])
async def test_ralph_refuses_a_round_count_over_the_ceiling(scripted, tmp_path, args, message):
    script = _ralph(scripted, args)
    async with memory_host(script, plugins=PLUGINS, config=_config(max_rounds=10)) as host:
        _, seen, result = await _go(host, tmp_path, script)
        assert result.result.is_error and result.result.content[0].text == "Error: " + message
        assert not [e for e in seen if isinstance(e, Note) and e.kind == "ralph/member"]


async def test_ralph_runs_the_ceiling_by_default(scripted, tmp_path):
    script = _ralph(scripted, {"objective": "x"}, CONTINUE, CONTINUE, CONTINUE)
    async with memory_host(script, plugins=PLUGINS, config=_config(max_rounds=3)) as host:
        _, _, result = await _go(host, tmp_path, script)
        assert result.result.content[0].text.startswith("Ralph reached its 3 rounds limit;")


@pytest.mark.parametrize(("meta", "message"), [
    (None, "missing required argument 'meta'"),
    ({"name": "x"}, "invalid meta: meta.description must be a non-empty string"),
    ({"name": "", "description": "d", "extra": 1, "phases": [{"detail": 2}]},
     "invalid meta: meta.extra is not a recognized field (name/description/whenToUse/phases); meta.name must be a "
     "non-empty string; meta.phases[0].title must be a non-empty string; meta.phases[0].detail must be a string"),
])
async def test_workflow_checks_meta_as_the_original_does(scripted, tmp_path, meta, message):
    args = {"script": "return 1", **({"meta": meta} if meta is not None else {})}
    script = _script(scripted, "workflow", args)
    async with memory_host(script, plugins=PLUGINS, config=_config()) as host:
        _agent, _seen, result = await _go(host, tmp_path, script)
        text = result.result.content[0].text
        assert result.result.is_error and message in text, text


async def test_a_long_return_value_is_capped(scripted, tmp_path):
    script = _script(scripted, "workflow", {"meta": META, "script": "return 'x' * 100"})
    async with memory_host(script, plugins=PLUGINS, config=_config(max_result_chars=10)) as host:
        _, _, result = await _go(host, tmp_path, script)
        assert result.result.content[0].text == ('workflow "fan" completed (0 agents).\nReturn value:\n"xxxxxxxxx'
                                                 '\n… [truncated: 92 more characters]')


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_the_script_reaches_no_server(scripted, tmp_path, mechanism):
    """No internet sockets in the script (TCP to a loopback server, UDP, IPv6), on each mechanism and
    as root: a seccomp filter on the run, irrevocable, whatever the sandbox does with the network.
    A plain run_code program of the same session still can (the filter is the workflow's alone)."""
    require_mechanism(mechanism)
    import socket as pysocket

    server = pysocket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    body = ("import socket\nout = []\n"
            f"for make in (lambda: socket.create_connection(('127.0.0.1', {port}), timeout=5),\n"
            "             lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM),\n"
            "             lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM)):\n"
            "    try:\n        make().close()\n        out.append('open')\n"
            "    except OSError as exc:\n        out.append(type(exc).__name__)\n"
            "a, b = socket.socketpair()\nout.append('unix ok')\nreturn out")
    program = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=5)\ns.close()\n"
               "return 'connected'")
    script = scripted({"rules": [
        {"when": "^go", "steps": [{"tool": "workflow", "args": {"meta": META, "script": body}},
                                  {"tool": "run_code", "args": {"code": program, "description": "connect"}},
                                  {"text": "{tool_result}"}]}]})
    config = {**_config(mechanism), "code-mode": {"mode": "both"}}
    try:
        async with memory_host(script, plugins=PLUGINS, config=config) as host:
            _, seen = await prompt_once(host, tmp_path, script, timeout=60)
            flow, plain = [e.result.content[0].text for e in seen if isinstance(e, ToolResultEvent)]
    finally:
        server.close()
    assert _value(flow) == ["PermissionError", "PermissionError", "PermissionError",
                                                    "unix ok"], flow
    assert plain == "connected"


async def test_a_member_runs_only_on_a_model_its_provider_lists(scripted, tmp_path):
    """``agent(model=…)`` never turns a script's string into a route the provider would pass through
    (a scripted provider's model is a file path): a model the provider does not list fails the member."""
    body = "return [await agent('member: one', model='/tmp/some-other-script.json'), await agent('member: two')]"
    script = _script(scripted, "workflow", {"meta": META, "script": body})
    async with memory_host(script, plugins=PLUGINS, config=_config()) as host:
        _, seen, result = await _go(host, tmp_path, script)
        assert _value(result.result.content[0].text) == [None, "TWO"]
        (failed,) = [e.data for e in seen if isinstance(e, Note) and e.kind == "workflow/member" and not e.data["ok"]]
        assert failed["problem"] == "model '/tmp/some-other-script.json' is not one scripted lists"
