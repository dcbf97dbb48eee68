"""What the door lends a session from the person's editor, when the client advertised it and the
composition asks: the open files (``protocols.EditorBuffers`` over ``fs/read_text_file`` and
``fs/write_text_file``, ``[config.acp-transport] buffers``; only paths inside the session's
workspace, and commands never run through the client: that would bypass the sandbox), and the
person's answers (``protocols.PersonQuestions`` over ``elicitation/create``, ``questions``)."""

from __future__ import annotations

import logging
import os
from typing import Any

import msgspec
from dsh_acp import wire
from dsh_acp.fdstream import TransportClosed
from dsh_acp.rpc import Peer, RpcFailure

log = logging.getLogger("dsh.acp")

TIMEOUT = 10.0  # seconds an editor has to answer a read or a write before the disk is used alone


class ClientBuffers:
    def __init__(self, peer: Peer, session_id: str, cwd: str, *, read: bool, write: bool) -> None:
        self.peer, self.session_id = peer, session_id
        self.root = os.path.realpath(cwd)
        self.can_read, self.can_write = read, write

    def _inside(self, path: str) -> bool:
        return os.path.commonpath([self.root, path]) == self.root if os.path.isabs(path) else False

    async def read(self, path: str) -> str | None:
        if not self.can_read or not self._inside(path):
            return None
        try:
            raw = await self.peer.request("fs/read_text_file",
                                          wire.ReadTextFileParams(session_id=self.session_id, path=path),
                                          timeout=TIMEOUT)
            return msgspec.json.decode(raw, type=wire.ReadTextFileResult).content
        except (RpcFailure, TransportClosed, TimeoutError, msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.debug(f"fs/read_text_file {path}: {exc!r}; reading the disk")
            return None

    async def wrote(self, path: str, text: str) -> None:
        if not self.can_write or not self._inside(path):
            return
        try:
            await self.peer.request("fs/write_text_file",
                                    wire.WriteTextFileParams(session_id=self.session_id, path=path, content=text),
                                    timeout=TIMEOUT)
        except (RpcFailure, TransportClosed, TimeoutError) as exc:
            log.warning(f"the editor did not take the write of {path} ({exc!r}); the file on disk is written")


def client_buffers(capabilities: dict[str, Any], peer: Peer, session_id: str, cwd: str) -> ClientBuffers | None:
    fs = capabilities.get("fs")
    if not isinstance(fs, dict):
        return None
    read, write = fs.get("readTextFile") is True, fs.get("writeTextFile") is True
    return ClientBuffers(peer, session_id, cwd, read=read, write=write) if read or write else None


class ClientQuestions:
    """``protocols.PersonQuestions`` over ACP's ``elicitation/create`` (form mode), for a client
    that advertised ``elicitation.form`` (``[config.acp-transport] questions``)."""

    def __init__(self, peer: Peer, session_id: str, timeout: float) -> None:
        self.peer, self.session_id, self.timeout = peer, session_id, timeout

    async def ask(self, message: str, schema: dict[str, Any], *, call_id: str | None = None) -> tuple[str, dict[str, Any]]:
        params = wire.ElicitationParams(session_id=self.session_id, mode="form", message=message,
                                         requested_schema=schema)
        if call_id:
            params.tool_call_id = call_id
        try:
            raw = await self.peer.request("elicitation/create", params, timeout=self.timeout)
            answer = msgspec.json.decode(raw, type=wire.ElicitationResult)
        except (RpcFailure, TransportClosed, TimeoutError, msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning(f"elicitation/create failed: {exc!r}; the question counts as cancelled")
            return "cancel", {}
        if answer.action == "accept":
            return "accept", answer.content if isinstance(answer.content, dict) else {}
        return ("decline", {}) if answer.action == "decline" else ("cancel", {})


def client_questions(capabilities: dict[str, Any], peer: Peer, session_id: str, timeout: float) -> ClientQuestions | None:
    elicitation = capabilities.get("elicitation")
    if isinstance(elicitation, dict) and isinstance(elicitation.get("form"), dict):
        return ClientQuestions(peer, session_id, timeout)
    return None
