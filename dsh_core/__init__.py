"""dsh: an agent harness built as a pluggy plugin host.

The public surface is small: ``hookimpl`` for plugin authors, the seams in
``dsh_core.protocols``, the Structs in ``dsh_core.types`` and the errors.
"""

from importlib.metadata import PackageNotFoundError, version

from .agent import Agent
from .contracts import AgentSpec, ToolContext
from .errors import (
    AgentDisposed,
    AttachmentCorrupt,
    AttachmentError,
    CompositionError,
    ConfigError,
    DshError,
    ModelError,
    RouteError,
    SessionLogFailed,
    ToolError,
)
from .host import Host, hookimpl, open_host
from .tools import FunctionTool

try:
    __version__ = version("dsh")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"

__all__ = [
    "Agent",
    "AgentDisposed",
    "AgentSpec",
    "AttachmentCorrupt",
    "AttachmentError",
    "CompositionError",
    "ConfigError",
    "DshError",
    "FunctionTool",
    "Host",
    "ModelError",
    "RouteError",
    "SessionLogFailed",
    "ToolContext",
    "ToolError",
    "hookimpl",
    "open_host",
]
