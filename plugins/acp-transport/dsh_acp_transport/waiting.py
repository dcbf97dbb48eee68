"""``[config.acp-transport] waiting``: during a model call that has been silent for that many
seconds, the person is told the session is still waiting (acp-editor; 0, the default, for
acp-agent: nothing is sent).

The notice is an ``agent_thought_chunk``: Zed and Toad both render thoughts while a turn runs
(a "thinking" block that grows), a thought is never part of the answer the person copies or the
history the model reads, and unlike a ``plan`` update it does not replace the session's todo
list. One silence is one thought (one ``messageId``) that grows: "Still waiting for the model:
5 s, 10 s, 15 s". A model call is "silent" from when it starts (the turn's start, or the last
result of a step's tool calls) until its message commits, as long as no event of the session
happened (a retry, a compaction, a tool card) and, with ``stream = "live"``, no text arrived.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
from dsh_acp import wire

from dsh_core.contracts import new_id
from dsh_core.types import (
    AssistantMessageEvent,
    ModelCallFailed,
    RetryEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnEnd,
    TurnStart,
)

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent
    from dsh_core.types import LiveText

    from .state import Session


class Waiting:
    """One session's silence watch: ``observe`` and ``watch`` are the agent's observer and live
    watcher (synchronous), ``run`` the task that speaks up, ``close`` ends it."""

    def __init__(self, session: Session, after: float, live: bool) -> None:
        self.session, self.after, self.live = session, after, live
        self.calling = False
        self.running_tools = 0
        self.writing = False  # the model's text arrived (not shown: stream = "committed")
        self.last = 0.0  # when the silence began
        self.next_at = 0.0  # when to speak up next
        self.notice: str | None = None  # the message id of this silence's thought, once said
        self.closed = False
        self._wake = anyio.Event()

    def _activity(self, calling: bool | None = None) -> None:
        if calling is not None:
            self.calling = calling
        self.last = anyio.current_time()
        self.next_at = self.last + self.after
        self.notice = None
        self._wake.set()

    def observe(self, agent: Agent, event: Any) -> None:
        if agent is not self.session.agent:
            return
        if isinstance(event, TurnStart):
            self.running_tools, self.writing = 0, False
            self._activity(True)
        elif isinstance(event, ToolCallEvent):
            self.running_tools += 1
            self._activity(False)
        elif isinstance(event, ToolResultEvent):
            self.running_tools = max(0, self.running_tools - 1)
            self.writing = False
            self._activity(self.running_tools == 0)  # the step's last result: the next call starts
        elif isinstance(event, (AssistantMessageEvent, TurnEnd)):
            self._activity(False)
        elif isinstance(event, (RetryEvent, ModelCallFailed)):
            self._activity(self.calling)
        elif self.calling:
            self._activity()

    def watch(self, agent: Agent, piece: LiveText) -> None:
        if agent is not self.session.agent or not piece.text:
            return
        if self.live:
            self._activity()
        else:
            self.writing = True

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    async def run(self) -> None:
        while not self.closed:
            self._wake = anyio.Event()
            if not self.calling:
                await self._wake.wait()
                continue
            delay = self.next_at - anyio.current_time()
            if delay > 0:
                with anyio.move_on_after(delay):
                    await self._wake.wait()
                continue  # woken (activity, close) or due: look again
            self._say()
            self.next_at += self.after

    def _say(self) -> None:
        waited = f"{self.next_at - self.last:g}"  # as scheduled: 5 s, 10 s (a late wake-up does not skew it)
        what = "The model is still writing its answer" if self.writing else "Still waiting for the model"
        first = self.notice is None
        if first:
            self.notice = new_id("msg_")
        text = f"{what}: {waited} s" if first else f", {waited} s"
        assert self.notice is not None
        self.session.delivery.push_update(wire.ThoughtChunk(content=wire.TextOut(text=text), message_id=self.notice))
