"""dsh: an agent harness built as a pluggy plugin host.

The public surface is small: ``hookimpl`` for plugin authors, the seams in
``dsh_core.protocols``, the Structs in ``dsh_core.types`` and the errors.

Read the spine bottom-up: ``types``/``errors``, then ``protocols`` (the seams and the values
that cross them; ``contracts`` re-exports the ones doors and tools hold), then ``hookspecs``
(the hooks and ``hookimpl``), then the agent loop (``agent``) and the ``host``, then the CLI
(``cli``, ``builtin.commands``, ``doctor``). No module imports one above it
(``tests/test_architecture.py``).
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
from .hookspecs import config_type_hook, hookimpl
from .host import Host, open_host
from .tools import FunctionTool
from .types import Guidance

try:
    __version__ = version("dsh-core")
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
    "Guidance",
    "Host",
    "ModelError",
    "RouteError",
    "SessionLogFailed",
    "ToolContext",
    "ToolError",
    "config_type_hook",
    "hookimpl",
    "open_host",
]
