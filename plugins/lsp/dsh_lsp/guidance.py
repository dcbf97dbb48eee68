"""When to reach for ``lsp``: the system-prompt section (``dsh_register_guidance``) of the ``lsp``
tool, for every agent that has it."""

from __future__ import annotations

from dsh_core.types import Guidance

LSP = Guidance(
    name="tool:lsp",
    order=112,
    tools=("lsp",),
    text="For everyday browsing of code, search and read are enough. Turn to lsp when a text search gives "
    "ambiguous matches, or when a change you are about to make depends on knowing exactly where something is "
    "defined, implemented or referenced. Give the position as a line and a UTF-16 character, both counted from "
    "1 and pointing at the symbol itself: a position beside a symbol can come back empty. The results of "
    "findReferences always list the declaration as well.",
)

SECTIONS = (LSP,)
