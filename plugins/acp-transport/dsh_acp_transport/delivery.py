"""The per-session delivery chain (ACP-6, committed-only output): ``session/update`` frames
carrying committed assistant text and verified images leave in the order they were queued."""

from __future__ import annotations

import base64
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
from dsh_acp import wire
from dsh_acp.fdstream import TransportClosed
from dsh_acp.rpc import Peer

from dsh_core import AttachmentCorrupt
from dsh_core.types import ImageBlock, TextBlock

log = logging.getLogger("dsh.acp")

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Host


class Delivery:
    """A per-session ordered delivery chain (ACP-6, committed-only output): frames leave in the
    order they were queued.

    Queuing is synchronous (called from the agent's event observer). Text queued while nothing
    of the session waits is written at once; anything else waits in line for a worker task
    that re-reads assistant images from the store and writes each frame. The worker runs only
    while something waits and ends when the line is empty: an idle session holds no task, no
    stream and no event (a session's memory is most of what 1,000 open sessions cost).
    ``drain`` returns when everything queued so far is written (or failed).
    """

    __slots__ = (
        "_changed",
        "_closed",
        "_done",
        "_line",
        "_queued",
        "_working",
        "failure",
        "host",
        "peer",
        "session_id",
    )

    def __init__(self, peer: Peer, host: Host, session_id: str) -> None:
        self.peer = peer
        self.host = host
        self.session_id = session_id
        self._line: deque[tuple[int, Any]] | None = None  # waiting for the worker, in order (made when needed)
        self._queued = 0
        self._done = 0
        self._changed: anyio.Event | None = None  # set when _done moves (made by a drain that waits)
        self._working = False
        self._closed = False
        self.failure: str | None = None  # first failure since the last ``take_failure``

    def push(self, block: TextBlock | ImageBlock, message_id: str, *, user: bool = False) -> None:
        """Queue one committed block (``user``: a user message replayed by ``session/load``)."""
        if self._closed:
            raise anyio.ClosedResourceError
        self._queued += 1
        if self._done == self._queued - 1 and isinstance(block, TextBlock):
            # Nothing of this session is waiting: write text now, skipping the worker hop
            # (two event-loop iterations of the eight a prompt round trip takes).
            try:
                if self.peer.write_nowait(self._frame(wire.TextOut(text=block.text), message_id, user)):
                    self._finished(self._queued)
                    return
            except TransportClosed:
                self._finished(self._queued)
                return
        self._enqueue((self._queued, (block, message_id, user)))

    def push_update(self, update: Any) -> None:
        """Queue a non-chunk session update (``usage_update``, or one of ``dsh_present_event``)
        behind the output already queued."""
        if self._closed:
            raise anyio.ClosedResourceError
        self._queued += 1
        self._enqueue((self._queued, update))

    def _enqueue(self, item: tuple[int, Any]) -> None:
        if self._line is None:
            self._line = deque()
        self._line.append(item)
        if not self._working:
            try:
                self.peer.start_soon(self._work)
            except RuntimeError:  # the connection's task group has ended: nothing will be written
                self._line.clear()
                self._finished(self._queued)
                return
            self._working = True

    def _frame(self, content: Any, message_id: str, user: bool = False) -> wire.Notification:
        chunk = (wire.UserMessageChunk if user else wire.MessageChunk)(content=content, message_id=message_id)
        return wire.Notification(
            method="session/update", params=wire.SessionNotification(session_id=self.session_id, update=chunk)
        )

    def take_failure(self) -> str | None:
        failure, self.failure = self.failure, None
        return failure

    def _finished(self, n: int) -> None:
        self._done = n
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def drain(self) -> None:
        target = self._queued
        while self._done < target:
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

    def close(self) -> None:
        """No more pushes; what is queued is still written."""
        self._closed = True

    async def _work(self) -> None:
        line = self._line
        assert line is not None
        try:
            while line:
                n, item = line.popleft()
                try:
                    await self._deliver(item)
                except TransportClosed:
                    pass
                except Exception as exc:
                    if self.failure is None:
                        self.failure = str(exc)
                    log.warning(f"assistant output delivery failed: {exc}")
                finally:
                    self._finished(n)
        finally:
            self._working = False
            self._line = line or None  # what a cancelled worker left waits for the next one

    async def _deliver(self, item: Any) -> None:
        if not isinstance(item, tuple):  # a session update as it is (usage, or a presentation plugin's)
            await self.peer.notify(
                "session/update", wire.SessionNotification(session_id=self.session_id, update=item)
            )
            return
        block, message_id, user = item
        what = "a replayed user image" if user else "assistant image"
        if isinstance(block, TextBlock):
            content: Any = wire.TextOut(text=block.text)
        else:
            store = self.host.attachment_store
            if store is None:
                raise RuntimeError(f"cannot deliver {what}: no attachment store is mounted")
            try:
                data = await store.read_image(block)
            except (AttachmentCorrupt, OSError) as exc:
                raise RuntimeError(f"cannot deliver {what}: {exc}") from exc
            content = wire.ImageOut(data=base64.b64encode(data).decode("ascii"), mime_type=block.mime)
        await self.peer.write(self._frame(content, message_id, user))

