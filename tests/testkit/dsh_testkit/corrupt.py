"""Corrupts every assistant image in the attachment store as soon as its message is committed,
so the ACP door's re-read-and-verify step has something real to catch."""

from __future__ import annotations

from typing import Any

from dsh_core import hookimpl
from dsh_core.paths import data_home
from dsh_core.types import AssistantMessageEvent, ImageBlock


@hookimpl
def dsh_session_event(session: Any, event: Any) -> None:
    if not isinstance(event, AssistantMessageEvent):
        return
    for block in event.message.content:
        if isinstance(block, ImageBlock):
            hexdigest = block.digest.split(":", 1)[1]
            for path in (data_home() / "attachments").rglob(hexdigest):
                path.write_bytes(b"corrupted")
