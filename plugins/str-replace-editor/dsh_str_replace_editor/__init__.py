"""dsh plugin ``str-replace-editor``: the original's ``str_replace_editor`` tool (``view``,
``create``, ``str_replace``, ``insert`` on absolute paths), for models trained on that tool.

What the model sees is the original's: the tool name, the argument names, types and required
set, and the result and error texts. The description is our own words. The work is done in
``editor.py``; every write goes through the spine's ``Confinement`` seam (sandbox-tools provides it
with the write its ``write`` and ``edit`` use: the session's tier, its writable roots, ``openat2``
beneath the root), and ``str_replace``/``insert`` need a file this session has read and not changed
since, on the spine's ``ReadRecords`` that ``read``/``write``/``edit`` keep too. See README.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from msgspec import Meta

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig

from .editor import DEFAULT_MAX_OUTPUT_CHARS, StrReplaceEditor

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Host

PLUGIN = "str-replace-editor"


class EditorConfig(PluginConfig):
    """[config.str-replace-editor]"""

    max_output_chars: Annotated[int, Meta(ge=1, description=(
        "characters of a file or directory view kept before it is clipped with the <response clipped> note"))] = (
        DEFAULT_MAX_OUTPUT_CHARS)
    description: Annotated[str, Meta(pattern=r"\S", description=(
        "the tool description the model reads (default: the plugin's own)"))] | None = None


dsh_config_type = config_type_hook(PLUGIN, EditorConfig)


@hookimpl
def dsh_register_tools(register: Callable[[Any], None], host: Host) -> None:
    config = host.config_for(EditorConfig)
    register(StrReplaceEditor(max_output_chars=config.max_output_chars,
                              description=config.description))


__all__ = ["EditorConfig", "StrReplaceEditor"]
