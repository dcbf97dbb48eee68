"""A test ACP agent on the official SDK's agent side that tries what a confined child must not
do: its prompt names a file outside the workspace to write. It answers one line saying what
happened, a write inside the workspace beside it, and which credential-shaped variables it saw.
Everything but the prompt is the SDK echo agent of the agent-subagent scenario's workspace."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

from acp import run_agent, text_block, update_agent_message
from acp.schema import PromptResponse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "snapshots" / "acp-subagents" / "agent-subagent" / "workspace"))
from echo_agent import EchoAgent


def attempt(fn: Any) -> str:
    try:
        fn()
        return "ok"
    except OSError as exc:
        return f"denied ({exc.strerror})"


class Probe(EchoAgent):
    async def prompt(self, session_id: str, prompt: list[Any], **kw: Any) -> PromptResponse:
        outside = "".join(getattr(b, "text", "") for b in prompt).strip()

        def write() -> None:
            with open(outside, "w") as f:
                f.write("escaped")

        keys = sorted(k for k in os.environ if re.search("KEY|TOKEN|SECRET|PASSWORD", k, re.I))
        def write_inside() -> None:
            with open("inside.txt", "w") as f:
                f.write("fine")

        text = f"inside: {attempt(write_inside)}; outside: {attempt(write)}; keys: {keys}"
        await self.conn.session_update(session_id, update_agent_message(text_block(text)))
        return PromptResponse(stop_reason="end_turn")


if __name__ == "__main__":
    asyncio.run(run_agent(Probe()))
