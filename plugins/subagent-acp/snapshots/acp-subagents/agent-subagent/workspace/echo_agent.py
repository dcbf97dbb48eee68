"""The peer for bench/acp_roundtrip.py: a minimal echo agent on the official ACP SDK's agent side.

It does the least an agent can do per prompt (one agent_message_chunk, then end_turn),
so the comparison measures transport and framework overhead, not model work.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from acp import PROTOCOL_VERSION, run_agent, text_block, update_agent_message
from acp.schema import (
    AgentCapabilities,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
)


class EchoAgent:
    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, **kw: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=PROTOCOL_VERSION, agent_capabilities=AgentCapabilities())

    async def new_session(self, cwd: str, **kw: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id=uuid.uuid4().hex)

    async def prompt(self, session_id: str, prompt: list[Any], **kw: Any) -> PromptResponse:
        text = "".join(getattr(b, "text", "") for b in prompt)
        await self.conn.session_update(session_id, update_agent_message(text_block(f"echo: {text}")))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kw: Any) -> None:
        pass

    async def authenticate(self, method_id: str, **kw: Any) -> None:
        return None


if __name__ == "__main__":
    asyncio.run(run_agent(EchoAgent()))
