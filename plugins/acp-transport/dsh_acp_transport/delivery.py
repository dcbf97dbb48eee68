"""The per-session delivery chain (ACP-6, committed-only output): ``session/update`` frames
carrying committed assistant text and verified images leave in the order they were queued."""

from __future__ import annotations

import base64
import logging
import math
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

    Queuing is synchronous (called from the agent's event observer); a worker task
    re-reads assistant images from the store and writes each frame. ``drain`` returns
    when everything queued so far is written (or failed).
    """

    def __init__(self, peer: Peer, host: Host, session_id: str) -> None:
        self.peer = peer
        self.host = host
        self.session_id = session_id
        self._send, self._recv = anyio.create_memory_object_stream[tuple[int, Any]](math.inf)
        self._queued = 0
        self._done = 0
        self._changed = anyio.Event()
        self.failure: str | None = None  # first failure since the last ``take_failure``

    def push(self, block: TextBlock | ImageBlock, message_id: str, *, user: bool = False) -> None:
        """Queue one committed block (``user``: a user message replayed by ``session/load``)."""
        self._queued += 1
        if self._done == self._queued - 1 and isinstance(block, TextBlock):
            # Nothing of this session is waiting: write text now, skipping the worker hop
            # (two event-loop iterations of the eight a prompt round trip takes).
            try:
                if self.peer.write_nowait(self._frame(wire.TextOut(text=block.text), message_id, user)):
                    self._done = self._queued
                    return
            except TransportClosed:
                self._done = self._queued
                return
        self._send.send_nowait((self._queued, (block, message_id, user)))

    def push_update(self, update: Any) -> None:
        """Queue a non-chunk session update (``usage_update``, or one of ``dsh_present_event``)
        behind the output already queued."""
        self._queued += 1
        self._send.send_nowait((self._queued, update))

    def _frame(self, content: Any, message_id: str, user: bool = False) -> wire.Notification:
        chunk = (wire.UserMessageChunk if user else wire.MessageChunk)(content=content, message_id=message_id)
        return wire.Notification(
            method="session/update", params=wire.SessionNotification(session_id=self.session_id, update=chunk)
        )

    def take_failure(self) -> str | None:
        failure, self.failure = self.failure, None
        return failure

    async def drain(self) -> None:
        target = self._queued
        while self._done < target:
            await self._changed.wait()

    def close(self) -> None:
        self._send.close()

    async def run(self) -> None:
        async with self._recv:
            async for n, block in self._recv:
                try:
                    await self._deliver(block)
                except TransportClosed:
                    pass
                except Exception as exc:
                    if self.failure is None:
                        self.failure = str(exc)
                    log.warning(f"assistant output delivery failed: {exc}")
                finally:
                    self._done = n
                    self._changed.set()
                    self._changed = anyio.Event()

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

