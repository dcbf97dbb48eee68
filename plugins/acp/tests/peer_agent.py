"""A third-party ACP agent for tests, written with the official SDK's agent side (``acp``).

``python peer_agent.py MODE`` — what it does on ``session/prompt``:

- ``answer``: a thought, a tool-call update, then the text ``peer: <prompt>`` in two chunks; end_turn.
- ``env``: answers a JSON object describing the environment it was given.
- ``permission``: asks ``session/request_permission`` (allow_once / allow_always / reject_once),
  answers ``peer permission: <outcome>``.
- ``crash``: sends ``partial`` and exits with status 3 mid-prompt.
- ``big``: writes 1 MiB to stderr, then a 5 MiB text chunk; end_turn.
- ``hang``: sends ``partial``, waits for ``session/cancel`` → ``cancelled``.
- ``stubborn``: like hang, but ignores cancel, stdin EOF and SIGTERM, and has two children
  (one in its process group, one in a new session), so only SIGKILL of the tree ends it.
- ``version``: answers ``initialize`` with protocol version 2.
- ``stop:<reason>``: answers ``text`` and the given stop reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from acp import (
    run_agent,
    update_agent_message_text,
    update_agent_thought_text,
)
from acp.schema import (
    AgentCapabilities,
    InitializeResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ToolCallProgress,
    ToolCallUpdate,
)

MODE = sys.argv[1] if len(sys.argv) > 1 else "answer"
MARK = os.environ.get("PEER_MARK")  # a file to write our pid to once a prompt arrives


class Peer:
    def __init__(self) -> None:
        self.conn: Any = None
        self.cancelled = asyncio.Event()

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, **kw: Any) -> InitializeResponse:
        version = 2 if MODE == "version" else 1
        return InitializeResponse(protocol_version=version, agent_capabilities=AgentCapabilities())

    async def new_session(self, cwd: str, **kw: Any) -> NewSessionResponse:
        self.cwd = cwd
        return NewSessionResponse(session_id="peer-session-1")

    async def authenticate(self, method_id: str, **kw: Any) -> None:
        return None

    async def cancel(self, session_id: str, **kw: Any) -> None:
        if MODE != "stubborn":
            self.cancelled.set()

    async def say(self, sid: str, text: str) -> None:
        await self.conn.session_update(session_id=sid, update=update_agent_message_text(text))

    async def prompt(self, prompt: list[Any], session_id: str, **kw: Any) -> PromptResponse:
        sid = session_id
        text = "".join(getattr(b, "text", "") for b in prompt)
        if MARK:
            Path(MARK).write_text(str(os.getpid()))
        if MODE == "answer":
            await self.conn.session_update(session_id=sid, update=update_agent_thought_text("thinking hard"))
            await self.conn.session_update(
                session_id=sid,
                update=ToolCallProgress(session_update="tool_call_update", tool_call_id="t1", status="completed"),
            )
            await self.say(sid, "peer: ")
            await self.say(sid, text)
            return PromptResponse(stop_reason="end_turn")
        if MODE == "env":
            env = dict(os.environ)
            report = {
                "has_deepseek_key": "DEEPSEEK_API_KEY" in env,
                "has_secret": any(k for k in env if "SECRET" in k),
                "depth": env.get("DSH_SUBAGENT_DEPTH"),
                "max_depth": env.get("DSH_SUBAGENT_MAX_DEPTH"),
                "dsh_vars": sorted(k for k in env if k.startswith("DSH_")),
                "extra": env.get("PEER_EXTRA"),
                "cwd": os.getcwd(),
                "session_cwd": self.cwd,
            }
            await self.say(sid, json.dumps(report, sort_keys=True))
            return PromptResponse(stop_reason="end_turn")
        if MODE == "permission":
            resp = await self.conn.request_permission(
                session_id=sid,
                tool_call=ToolCallUpdate(tool_call_id="peer-call-7", title="rm -rf build", kind="execute"),
                options=[
                    PermissionOption(option_id="always", name="Always", kind="allow_always"),
                    PermissionOption(option_id="once", name="Once", kind="allow_once"),
                    PermissionOption(option_id="no", name="No", kind="reject_once"),
                ],
            )
            outcome = resp.outcome
            chosen = getattr(outcome, "option_id", None) or outcome.outcome
            await self.say(sid, f"peer permission: {chosen}")
            return PromptResponse(stop_reason="end_turn")
        if MODE == "crash":
            await self.say(sid, "partial")
            await asyncio.sleep(0.05)
            os._exit(3)
        if MODE == "big":
            os.write(2, b"e" * (1 << 20))
            await self.say(sid, "x" * (5 << 20))
            return PromptResponse(stop_reason="end_turn")
        if MODE in ("hang", "stubborn"):
            await self.say(sid, "partial")
            await self.cancelled.wait()
            return PromptResponse(stop_reason="cancelled")
        if MODE.startswith("stop:"):
            await self.say(sid, "text")
            return PromptResponse(stop_reason=MODE.split(":", 1)[1])  # type: ignore[arg-type]  # any reason, on purpose
        raise RuntimeError(f"unknown mode {MODE}")


async def main() -> None:
    if MODE == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        kids = [
            subprocess.Popen(["sleep", "300"]),
            subprocess.Popen(["sleep", "301"], start_new_session=True),
        ]
        if MARK:
            Path(MARK + ".kids").write_text(" ".join(str(k.pid) for k in kids))
    await run_agent(Peer())  # type: ignore[arg-type]  # the SDK types its Agent protocol narrowly
    if MODE == "stubborn":  # ignore stdin EOF too
        while True:
            await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main())
