"""The seven tools, by family: ``bash`` (bash.py), the file tools ``read``, ``write``, ``edit`` and
``read_image`` (files.py), and the search tools ``glob`` and ``grep`` (search.py), each a
``SandboxTool`` (base.py) over the host's ``Sandbox`` (sandbox.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import SandboxTool
from .bash import BashTool
from .files import EditTool, ReadImageTool, ReadTool, WriteTool
from .sandbox import Sandbox
from .search import GlobTool, GrepTool

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Jobs

__all__ = [
    "BashTool", "EditTool", "GlobTool", "GrepTool", "ReadImageTool", "ReadTool", "Sandbox", "SandboxTool",
    "WriteTool", "make_tools",
]


def make_tools(sb: Sandbox, jobs: Jobs | None = None) -> list[SandboxTool]:
    """One of each tool over ``sb``, in the order the model is offered them (``jobs``: the host's
    job registry, for ``bash``'s ``run_in_background``)."""
    bash: list[SandboxTool] = [BashTool(sb, jobs)] if sb.settings.bash else []
    return [*bash, ReadTool(sb), WriteTool(sb), EditTool(sb), GlobTool(sb), GrepTool(sb), ReadImageTool(sb)]
