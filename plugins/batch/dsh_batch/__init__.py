"""dsh-batch: ``dsh batch TASKS.jsonl --out RESULTS.jsonl``.

Fans a JSONL task list out over fresh ACP sessions of ``dsh run --example …`` agent
processes (through ``dsh_acp.client``, the module ``dsh ask`` uses), appends one
result line per task, and resumes from the results file. ``--ray [ADDRESS]`` runs the
agent pool as Ray actors instead; Ray is the optional extra ``dsh-batch[ray]`` and is
imported only then. This module stays import-light: ``dsh`` loads it for every command.
"""

from __future__ import annotations

from typing import Any

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig


class BatchConfig(PluginConfig):
    """``[config.batch]``: no options (``dsh batch`` takes its settings on the command line)."""


dsh_config_type = config_type_hook("batch", BatchConfig)


@hookimpl
def dsh_register_commands(commands: Any) -> None:
    from . import cli

    commands.add(
        "batch",
        help="run a JSONL list of tasks over ACP sessions, resumable, locally or on Ray",
        description=cli.DESCRIPTION,
        setup=cli.setup,
        run=cli.run,
    )
