"""The ``subagent`` tool on subagent-acp's ``acp`` provider: the child is a real ``dsh run
--example acp-agent`` process over real stdio (the seam against its process-backed peer)."""

from __future__ import annotations

import anyio
import pytest

from dsh_core.contracts import AgentSpec
from dsh_core.types import SubagentSettled, SubagentStarted, TextBlock, ToolResultEvent, UserMessage, UserMessageEvent
from dsh_testing import REPO, memory_host

pytestmark = pytest.mark.anyio

PLUGINS = ("scripted-model", "subagent-acp", "subagents")
SCRIPT = {"rules": [
    {"when": "^fg", "steps": [{"tool": "subagent", "args": {"description": "ask", "prompt": "child: answer",
                                                              "run_in_background": False}}, {"text": "{tool_result}"}]},
    {"when": "^bg", "steps": [{"tool": "subagent", "args": {"description": "ask", "prompt": "child: answer"}},
                              {"tool": "send_message", "args": {"subagent_id": "{started_id}", "message": "more"}},
                              {"text": "{tool_result}"}]},
    {"when": "^next", "steps": [{"text": "next"}]},
    {"when": "^child:", "steps": [{"text": "CHILD_OK"}]},
]}


async def test_the_acp_provider_delegates_to_a_real_process_in_the_foreground_and_the_background(
        scripted, tmp_path, monkeypatch, dsh_home):
    monkeypatch.setenv("DSH_EXAMPLES_PATH", str(REPO / "examples"))  # the child finds acp-agent (inherit-env)
    script = scripted(SCRIPT)
    config = {"subagents": {"provider": "acp"}, "subagent-acp": {"eof-grace": 1.0, "term-grace": 1.0}}
    async with memory_host(script, plugins=PLUGINS, config=config) as host:
        parent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        seen: list = []
        parent.subscribe(lambda a, e: seen.append(e))

        async def turn(text: str) -> None:
            parent.submit(UserMessage(id=f"u{len(seen)}", content=[TextBlock(text=text)]))
            with anyio.fail_after(60):
                await parent.wait_idle()

        await turn("fg")
        results = [e for e in seen if isinstance(e, ToolResultEvent)]
        assert [r.result.content[0].text for r in results] == ["CHILD_OK"]
        await turn("bg")
        started = [e for e in seen if isinstance(e, SubagentStarted)]
        assert [(s.provider, s.id, s.session) for s in started] == [("acp", "acp_1", None), ("acp", "acp_2", None)]
        sent = [e for e in seen if isinstance(e, ToolResultEvent)][-1]
        # an ACP child takes no follow-up turn
        assert sent.code == "NOT_RESUMABLE" and sent.result.content[0].text == 'Error: subagent "acp_2" is unavailable'
        with anyio.fail_after(60):
            while len([e for e in seen if isinstance(e, SubagentSettled)]) < 2:
                await anyio.sleep(0.05)
        await turn("next")
        notices = [e.message.content[0].text for e in seen
                   if isinstance(e, UserMessageEvent) and e.message.source == "notice"]
        assert notices == ["Background subagent acp_2 finished and will do no further work unless you send it more.\n"
                           "Its closing message:\nCHILD_OK"]
    # each child was its own dsh process: its own session log, written where DSH_HOME (passed on) says
    logs = sorted((dsh_home / "sessions").glob("*.jsonl"))
    assert len(logs) == 2 and all('"child: answer"' in p.read_text() for p in logs)
