"""One language server, started confined, spoken to with pygls's client and lsprotocol's types.

pygls does the protocol (framing, JSON-RPC ids, lsprotocol's (un)structuring, the server's own
requests); this module owns the process and every task: the server runs in its own process group
under a task of the host's task group, whose three child tasks pump bytes between the process's
pipes and pygls's protocol (no task of pygls's own: ``start_io`` is not used). ``aclose`` asks
the server to shut down, then kills the whole group; a server that exits by itself fails its
pending requests at once and is restarted by the next query.

Documents are synchronized whole (``didOpen`` once, then ``didChange`` with the full text when
the file changed), from the file's bytes on disk at each query, so what the server answers about
is what a ``read`` would show. ``publishDiagnostics`` is kept per document with a sequence number,
so a caller can wait for the publication that follows a change it made (``diagnostics_after``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from lsprotocol import types as t
from pygls.io_ import run_async
from pygls.lsp.client import LanguageClient
from pygls.protocol import LanguageServerProtocol

log = logging.getLogger("dsh.lsp")

STDERR_KEEP = 4000  # bytes of a server's stderr kept to explain why it died
LOG_KEEP = 50  # the server's last log messages (debugging)


class ServerFailed(Exception):
    """The server could not start, died, or did not answer in time."""


@dataclass
class Published:
    seq: int
    version: int | None
    items: list[t.Diagnostic]


@dataclass
class Document:
    version: int
    text: str


class _Reader:
    """``readline``/``readexactly`` (what pygls's ``run_async`` reads with) over an anyio stream."""

    def __init__(self, stream: anyio.abc.ByteReceiveStream) -> None:
        self._buf = BufferedByteReceiveStream(stream)

    async def readline(self) -> bytes:
        try:
            return await self._buf.receive_until(b"\n", 65536) + b"\n"
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return b""

    async def readexactly(self, n: int) -> bytes:
        try:
            return await self._buf.receive_exactly(n)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return b""


class _Protocol(LanguageServerProtocol):
    """pygls's protocol, except that a response lsprotocol cannot read fails its request at once
    (pygls logs it and leaves the request waiting for its timeout)."""

    def structure_message(self, data: dict[str, Any]) -> Any:
        try:
            return super().structure_message(data)
        except Exception:
            msg_id = data.get("id") if isinstance(data, dict) else None
            if msg_id is not None and "method" not in data:
                future = self._request_futures.pop(msg_id, None)
                if future is not None and not future.done():
                    future.set_exception(ServerFailed(
                        "the language server answered with a result that does not match the LSP specification"))
            raise


class _Writer:
    """pygls's synchronous writer: bytes go to a queue the pump task writes to the server's stdin."""

    def __init__(self, send: Any) -> None:
        self._send = send

    def write(self, data: bytes) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._send.send_nowait(data)  # (else the server is gone; its pending requests were failed)

    def close(self) -> None:
        self._send.close()


@dataclass
class Connection:
    """A running (or starting) server for one session, one language and one workspace root."""

    name: str
    root: str
    languages: dict[str, str]  # ".py" -> "python"
    settings: dict[str, Any] = field(default_factory=dict)
    initialization_options: Any = None
    docs: dict[str, Document] = field(default_factory=dict)
    published: dict[str, Published] = field(default_factory=dict)
    capabilities: t.ServerCapabilities | None = None
    failure: str | None = None  # why it stopped, once it did
    silent: bool = False  # it published no diagnostics for the first file it was given: no waiting for them
    stderr_tail: bytes = b""
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_KEEP))  # window/logMessage

    def __post_init__(self) -> None:
        self.client = LanguageClient("dsh", "0.1", protocol_cls=_Protocol)
        self._seq = 0
        self._changed = anyio.Event()
        self._stop = anyio.Event()
        self._done = anyio.Event()
        self._pid: int | None = None
        self._install_handlers()

    # ------------------------------------------------------------------ lifecycle

    @property
    def alive(self) -> bool:
        return self.capabilities is not None and self.failure is None

    @property
    def pid(self) -> int | None:
        return self._pid

    async def start(self, argv: list[str], env: dict[str, str], tg: anyio.abc.TaskGroup, timeout_s: float) -> None:
        """Start the process (its task lives in ``tg``) and initialize it; ServerFailed if it will not."""
        try:
            await tg.start(self._serve, argv, env, name=f"lsp {self.name} {self.root}")
        except OSError as exc:
            self.failure = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
            raise ServerFailed(self.failure) from None
        root_uri = Path(self.root).as_uri()
        params = t.InitializeParams(
            process_id=None, root_uri=root_uri, root_path=self.root,
            workspace_folders=[t.WorkspaceFolder(uri=root_uri, name=os.path.basename(self.root) or "/")],
            initialization_options=self.initialization_options,
            capabilities=t.ClientCapabilities(
                general=t.GeneralClientCapabilities(position_encodings=[t.PositionEncodingKind.Utf16]),
                workspace=t.WorkspaceClientCapabilities(configuration=True, workspace_folders=True),
                text_document=t.TextDocumentClientCapabilities(
                    synchronization=t.TextDocumentSyncClientCapabilities(did_save=True),
                    hover=t.HoverClientCapabilities(content_format=[t.MarkupKind.Markdown, t.MarkupKind.PlainText]),
                    definition=t.DefinitionClientCapabilities(link_support=True),
                    implementation=t.ImplementationClientCapabilities(link_support=True),
                    references=t.ReferenceClientCapabilities(),
                    publish_diagnostics=t.PublishDiagnosticsClientCapabilities(version_support=True),
                ),
            ),
        )
        try:
            result = await self.request(self.client.initialize_async(params), timeout_s)
        except BaseException:
            await self.aclose()
            raise
        self.capabilities = result.capabilities
        self.client.initialized(t.InitializedParams())
        if self.settings:
            self.client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings=self.settings))

    async def _serve(self, argv: list[str], env: dict[str, str], *,
                     task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        send, receive = anyio.create_memory_object_stream[bytes](math.inf)
        proc = await anyio.open_process(argv, cwd=self.root, env=env, start_new_session=True)
        self._pid = proc.pid
        self.client.protocol.set_writer(_Writer(send))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._pump_out, receive, proc)
                tg.start_soon(self._pump_in, proc)
                tg.start_soon(self._keep_stderr, proc)
                task_status.started()
                await self._stop.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                send.close()
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the group: a wrapper's children too
                with anyio.move_on_after(5):
                    await proc.wait()
                await proc.aclose()
                self._fail_pending(self.failure or "the language server was stopped")
                self._done.set()

    async def _pump_out(self, receive: Any, proc: anyio.abc.Process) -> None:
        assert proc.stdin is not None
        async with receive:
            async for data in receive:
                try:
                    await proc.stdin.send(data)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    return

    async def _pump_in(self, proc: anyio.abc.Process) -> None:
        assert proc.stdout is not None
        await run_async(stop_event=threading.Event(), reader=_Reader(proc.stdout), protocol=self.client.protocol,
                        logger=log)
        # end of its output: the server exited (or closed stdout, which is as good as dead)
        with anyio.move_on_after(1):
            await proc.wait()
        if self.failure is None:
            tail = self.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-3:]
            self.failure = (f"the language server {self.name!r} exited (code {proc.returncode})"
                            + (f": {' / '.join(tail)}" if tail else ""))
        self._fail_pending(self.failure)
        self._stop.set()

    async def _keep_stderr(self, proc: anyio.abc.Process) -> None:
        assert proc.stderr is not None
        try:
            async for chunk in proc.stderr:
                self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_KEEP:]
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    def _fail_pending(self, reason: str) -> None:
        for future in list(self.client.protocol._request_futures.values()):
            if not future.done():
                future.set_exception(ServerFailed(reason))
        self._signal()

    def _signal(self) -> None:
        """Wake every waiter of ``diagnostics_after`` (a publication, or the server's end)."""
        self._changed.set()
        self._changed = anyio.Event()

    async def aclose(self) -> None:
        """Shut the server down politely (bounded), then kill its process group; idempotent."""
        if self._pid is None or self._done.is_set():
            self._stop.set()
            return
        with anyio.CancelScope(shield=True):
            if self.alive:
                with anyio.move_on_after(2):
                    try:
                        await self.client.shutdown_async(None)
                        self.client.exit(None)
                        with anyio.move_on_after(1):
                            await self._stop.wait()  # set when its output ends: it exited
                    except Exception:
                        pass
            if self.failure is None:
                self.failure = "the language server was stopped"
            self._stop.set()
            await self._done.wait()

    # ------------------------------------------------------------------ requests

    async def request(self, awaitable: Any, timeout_s: float) -> Any:
        if self.failure is not None:
            awaitable.close()
            raise ServerFailed(self.failure)
        try:
            with anyio.fail_after(timeout_s):
                return await awaitable
        except TimeoutError:
            raise ServerFailed(f"the language server {self.name!r} did not answer within {timeout_s:g} s") from None
        except ServerFailed:
            raise
        except Exception as exc:  # an error response, or a result lsprotocol cannot read
            raise ServerFailed(f"the language server {self.name!r} answered with an error: {exc}") from None

    def language_of(self, path: str) -> str | None:
        return self.languages.get(os.path.splitext(path)[1].lower())

    def sync(self, path: str, text: str) -> tuple[str, int]:
        """Tell the server ``path`` now reads ``text`` (open it, or change it when it differs): (uri, version)."""
        uri = Path(path).as_uri()
        doc = self.docs.get(uri)
        if doc is None:
            self.docs[uri] = Document(1, text)
            self.client.text_document_did_open(t.DidOpenTextDocumentParams(text_document=t.TextDocumentItem(
                uri=uri, language_id=self.language_of(path) or "plaintext", version=1, text=text)))
            return uri, 1
        if doc.text != text:
            doc.version += 1
            doc.text = text
            self.client.text_document_did_change(t.DidChangeTextDocumentParams(
                text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=doc.version),
                content_changes=[t.TextDocumentContentChangeWholeDocument(text=text)]))
            self.client.text_document_did_save(t.DidSaveTextDocumentParams(
                text_document=t.TextDocumentIdentifier(uri=uri), text=None))
        return uri, doc.version

    # ------------------------------------------------------------------ diagnostics

    @property
    def seq(self) -> int:
        return self._seq

    async def diagnostics_after(self, uri: str, seq: int, version: int, wait_s: float,
                                settle_s: float = 0.2) -> list[t.Diagnostic] | None:
        """The diagnostics the server published for ``uri`` after publication ``seq`` (and for
        ``version`` or later, when it says), once it has been quiet for ``settle_s`` (a burst is
        followed at most until ``wait_s`` + ``settle_s``); None when none came within ``wait_s``
        or the server stopped."""
        def fresh() -> Published | None:
            pub = self.published.get(uri)
            if pub is None or pub.seq <= seq or (pub.version is not None and pub.version < version):
                return None
            return pub

        deadline = anyio.current_time() + wait_s
        with anyio.move_on_after(wait_s):
            while fresh() is None:
                if self.failure is not None:
                    return None
                changed = self._changed
                await changed.wait()
        pub = fresh()
        if pub is None:
            return None
        while True:  # a server may publish in passes (syntax, then semantics): take the last of a burst
            last = pub.seq
            with anyio.move_on_after(max(0.0, min(settle_s, deadline + settle_s - anyio.current_time()))):
                while self.published[uri].seq == last and self.failure is None:
                    await self._changed.wait()
            if self.published[uri].seq == last or self.failure is not None:
                return self.published[uri].items
            pub = self.published[uri]

    # ------------------------------------------------------------------ the server's messages

    def _install_handlers(self) -> None:
        client = self.client

        @client.feature(t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def _diagnostics(params: t.PublishDiagnosticsParams) -> None:
            self._seq += 1
            self.published[params.uri] = Published(self._seq, params.version, list(params.diagnostics))
            self._signal()

        @client.feature(t.WORKSPACE_CONFIGURATION)
        def _configuration(params: t.ConfigurationParams) -> list[Any]:
            return [_section(self.settings, item.section) for item in params.items]

        @client.feature(t.WINDOW_WORK_DONE_PROGRESS_CREATE)
        def _progress_create(params: Any) -> None:
            return None

        @client.feature(t.CLIENT_REGISTER_CAPABILITY)
        def _register(params: Any) -> None:
            return None

        @client.feature(t.CLIENT_UNREGISTER_CAPABILITY)
        def _unregister(params: Any) -> None:
            return None

        @client.feature(t.WORKSPACE_WORKSPACE_FOLDERS)
        def _folders(params: Any) -> list[t.WorkspaceFolder]:
            root_uri = Path(self.root).as_uri()
            return [t.WorkspaceFolder(uri=root_uri, name=os.path.basename(self.root) or "/")]

        @client.feature(t.WINDOW_LOG_MESSAGE)
        def _log(params: t.LogMessageParams) -> None:
            self.log_tail.append(params.message)

        for method in (t.WINDOW_SHOW_MESSAGE, t.PROGRESS, t.TELEMETRY_EVENT, t.LOG_TRACE):
            client.feature(method)(_ignore)


def _ignore(params: Any) -> None:
    return None


def _section(settings: dict[str, Any], section: str | None) -> Any:
    """``settings`` at a dotted ``section`` (``basedpyright.analysis``), None where it has none."""
    if not section:
        return settings
    value: Any = settings
    for part in section.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value
