"""A plugin whose slash commands change: ``/turns`` appears once the session has a history
(a test of ``available_commands_update`` being sent again when the set changes)."""

from __future__ import annotations

from typing import Any

from dsh_core import hookimpl
from dsh_core.protocols import CommandResult, SlashCommand


async def _turns(session: Any, text: str) -> CommandResult:
    return CommandResult(reply=f"{len(session.history)} messages so far")


@hookimpl
def dsh_slash_commands(session: Any, host: Any) -> list[SlashCommand]:
    if not session.history:
        return []
    return [SlashCommand(name="turns", description="Count the messages so far", run=_turns)]
