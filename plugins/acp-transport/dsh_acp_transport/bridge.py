"""The ACP bridge: one connection's sessions, tied together from its topics —
``admission`` (initialize, the session lifecycle), ``content`` (prompt admission),
``settlement`` (a prompt to its answer, cancel, permission), ``delivery`` (committed-only
output) — plus teardown. ACP-n cites a rule of the door's contract,
docs/acp-contract.md (anchor #acp-n).

It programs the interface-level services of the host (``create_agent``, ``Agent``,
the approval seam, the attachment store), never the concrete loop.
"""


from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
from dsh_acp.rpc import Peer

from .admission import Admission
from .config import TransportConfig
from .settlement import Settlement
from .state import BridgeState, Session

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Host

__all__ = ["Bridge"]


class Bridge(Admission, Settlement):
    """Owns one connection's sessions. One instance per ``serve``."""

    name = "acp"  # recorded as ``answeredBy`` in approval/decided events

    def __init__(self, host: Host, peer: Peer, settings: TransportConfig | None = None) -> None:
        BridgeState.__init__(self, host, peer, settings)
        self._quiesced: anyio.Event | None = None
        self._teardown_error: BaseException | None = None
        dispatcher = peer.dispatcher
        for method, handler in {
            "initialize": self.initialize,
            "authenticate": self.authenticate,
            "session/new": self.new_session,
            "session/prompt": self.prompt,
            "session/close": self.close_session,
            "session/list": self.list_sessions,
            "session/resume": self.resume_session,
            "session/load": self.load_session,
            "session/delete": self.delete_session,
            "session/set_config_option": self.set_config_option,
            "session/set_mode": self.set_mode,
        }.items():
            dispatcher.on_request(method, handler)
        if self.settings.login:  # acp-editor's; acp-agent answers logout as any unknown method
            dispatcher.on_request("logout", self.logout)
        if self.settings.fork:  # acp-editor's (unstable ACP); acp-agent answers it as any unknown method
            dispatcher.on_request("session/fork", self.fork_session)
        dispatcher.on_notification("session/cancel", self.cancel)
        dispatcher.gate = self._gate
        dispatcher.on_cancel_request = self._cancel_request
        dispatcher.cancelled_by_handler = frozenset({"session/prompt"})  # _cancel_request takes each

    # ------------------------------------------------------------------ teardown (ACP-11)

    async def quiesce(self) -> None:
        """The one memoized teardown routine shared by EOF, transport failure and disposal."""
        if self._quiesced is not None:
            await self._quiesced.wait()
            if self._teardown_error is not None:
                raise self._teardown_error
            return
        self._quiesced = anyio.Event()
        try:
            self.closed = True  # 1. close the doors
            sessions = list(self.sessions.values())
            closing = [s.closed for s in self.closing.values() if s.closed is not None]
            for s in sessions:  # 2. settle pending prompts as cancelled, stop agents
                if s.slot is not None:
                    self._cancel_session(s, "disposed")
                else:
                    s.agent.cancel("disposed")
            async with anyio.create_task_group() as tg:  # … and bring them to rest
                for s in sessions:
                    if s.agent.busy:  # a task per busy session only: 10,000 idle ones cost no tasks
                        tg.start_soon(s.agent.wait_idle)
            with anyio.move_on_after(2.0):
                for s in sessions:
                    await s.delivery.drain()
            errors: list[Exception] = []

            async def dispose(s: Session) -> None:  # 3+4. children first (Agent.dispose), in parallel
                try:
                    await s.agent.dispose()
                except Exception as exc:
                    errors.append(exc)
                finally:
                    s.unsubscribe()
                    s.delivery.close()
                    self.host.forget(s.agent)

            async with anyio.create_task_group() as tg:
                for s in sessions:
                    if s.agent.children:
                        tg.start_soon(dispose, s)  # may wait on its children: in parallel
                    else:
                        await dispose(s)  # at rest already: completes without suspending
                for event in closing:  # sessions the client closed: their close finishes them
                    tg.start_soon(event.wait)
            if errors:
                self._teardown_error = ExceptionGroup(
                    f"ACP agent teardown failed for {len(errors)} session(s)", errors
                )
                raise self._teardown_error
        finally:
            self._quiesced.set()
