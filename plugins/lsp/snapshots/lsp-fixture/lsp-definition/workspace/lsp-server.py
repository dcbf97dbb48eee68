"""The scenario's language server: every definition is two locations in the queried file (lines 1
and 2, characters 7 to 13), and every opened document gets an empty diagnostics publication."""

from lsprotocol import types as t
from pygls.lsp.server import LanguageServer

server = LanguageServer("lsp-definition-fixture", "0.1")


@server.feature(t.TEXT_DOCUMENT_DID_OPEN)
def opened(ls: LanguageServer, params: t.DidOpenTextDocumentParams) -> None:
    ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))


@server.feature(t.TEXT_DOCUMENT_DEFINITION)
def definition(ls: LanguageServer, params: t.DefinitionParams) -> list[t.Location]:
    return [t.Location(uri=params.text_document.uri, range=t.Range(start=t.Position(line=line, character=6),
                                                                   end=t.Position(line=line, character=12)))
            for line in (0, 1)]


server.start_io()
