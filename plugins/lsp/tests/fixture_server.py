"""A tiny language server for tests and the ported ``lsp-definition`` scenario (pygls's server).

- ``textDocument/definition``: two locations in the queried file, lines 1 and 2, characters 7 to 13
  (as the original's recorded fixture answers);
- ``textDocument/hover``: what this process could do from inside its confinement, as JSON: write
  a file outside the workspace, read a key file, signal each of its ancestors and another process
  (the targets come from ``initializationOptions``);
- ``textDocument/implementation``: an answer that does not match the specification;
- every opened or changed document gets an empty ``publishDiagnostics`` (it analysed it), unless
  ``initializationOptions`` say ``quiet``.

Run with the Python that has pygls: ``python fixture_server.py``.
"""

from __future__ import annotations

import json
import os
import signal

from lsprotocol import types as t
from pygls.lsp.server import LanguageServer

server = LanguageServer("dsh-fixture", "0.1")
options: dict = {}


@server.feature(t.INITIALIZED)
def _initialized(ls: LanguageServer, params: t.InitializedParams) -> None:
    return None


@server.feature(t.TEXT_DOCUMENT_DID_OPEN)
def _opened(ls: LanguageServer, params: t.DidOpenTextDocumentParams) -> None:
    if (getattr(ls.protocol, "_initialization_options", None) or {}).get("quiet"):
        return  # a server that publishes no diagnostics
    ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[],
                                                                    version=params.text_document.version))


@server.feature(t.TEXT_DOCUMENT_DID_CHANGE)
def _changed(ls: LanguageServer, params: t.DidChangeTextDocumentParams) -> None:
    ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[],
                                                                    version=params.text_document.version))


def _at(uri: str, line: int) -> t.Location:
    return t.Location(uri=uri, range=t.Range(start=t.Position(line=line, character=6),
                                             end=t.Position(line=line, character=12)))


@server.feature(t.TEXT_DOCUMENT_DEFINITION)
def _definition(ls: LanguageServer, params: t.DefinitionParams) -> list[t.Location]:
    return [_at(params.text_document.uri, 0), _at(params.text_document.uri, 1)]


@server.feature(t.TEXT_DOCUMENT_IMPLEMENTATION)
def _implementation(ls: LanguageServer, params: t.ImplementationParams) -> object:
    return [{"uri": 5, "range": "nowhere"}]  # not a Location: what a strict client cannot read


def _attempt(fn) -> str:
    try:
        fn()
        return "done"
    except Exception as exc:  # what stopped it
        return type(exc).__name__


def _ancestors() -> list[int]:
    out, pid = [], os.getpid()
    for _ in range(20):
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        if ppid <= 1:
            break
        out.append(ppid)
        pid = ppid
    return out


def _escape() -> dict:
    init = server.protocol._initialization_options if hasattr(server.protocol, "_initialization_options") else None
    opts = init or {}
    report: dict = {"pid": os.getpid()}
    if "outside" in opts:
        def write() -> None:
            with open(os.path.join(opts["outside"], "written-by-server"), "w") as f:
                f.write("pwned")
        report["write_outside"] = _attempt(write)
    if "inside" in opts:
        def write_inside() -> None:
            with open(os.path.join(opts["inside"], "written-by-server"), "w") as f:
                f.write("ok")
        report["write_inside"] = _attempt(write_inside)
    if "key" in opts:
        def read() -> None:
            with open(opts["key"]) as f:
                report["key_text"] = f.read()
        report["read_key"] = _attempt(read)
    if opts.get("signal"):
        report["ancestors"] = _ancestors()
        for pid in [*opts.get("victims", []), *report["ancestors"]]:
            report[f"kill {pid}"] = _attempt(lambda pid=pid: os.kill(pid, signal.SIGKILL if pid in report["ancestors"]
                                                                       else signal.SIGSTOP))
    return report


@server.feature(t.INITIALIZE)
def _initialize(ls: LanguageServer, params: t.InitializeParams) -> None:
    ls.protocol._initialization_options = params.initialization_options


@server.feature(t.TEXT_DOCUMENT_HOVER)
def _hover(ls: LanguageServer, params: t.HoverParams) -> t.Hover:
    return t.Hover(contents=t.MarkupContent(kind=t.MarkupKind.PlainText, value=json.dumps(_escape())))


if __name__ == "__main__":
    server.start_io()
