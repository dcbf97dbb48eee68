"""dsh plugin ``hooks-claude-code``: run a user's existing Claude Code command hooks.

Reads Claude Code's hook format — a ``hooks.json`` or a settings file with a ``hooks`` key —
from the files named in ``[config.hooks-claude-code] files`` and, per session, from the
project files under the session's cwd (``project-files``; default ``.claude/settings.json``
and ``.claude/settings.local.json``). Events: ``SessionStart``, ``UserPromptSubmit``,
``PreToolUse``, ``PostToolUse``, ``Stop``, mapped onto the spine's interception points. The
protocol itself (running, decoding, folding, records) is ``dsh_hooks.protocol`` (the dsh-hooks library),
which the Codex bridge shares.
"""

from __future__ import annotations

from typing import Any

from dsh_hooks.protocol import POINTS, Dialect, DialectPlugin, HookConfig, transcript_path

PLUGIN = "hooks-claude-code"


class ClaudeCode(Dialect):
    # ``${CLAUDE_PROJECT_DIR}`` in a command is left for ``/bin/sh`` to expand from the
    # environment, as Claude Code does: pasting the directory into the command text would let a
    # directory named ``ws $(touch X)`` choose commands (the command stays the file's own text).
    def env(self, session: Any, project_dir: str) -> dict[str, str]:
        return {"CLAUDE_PROJECT_DIR": project_dir}

    def payload(self, point: str, session: Any, turn: int, fields: dict[str, Any]) -> dict[str, Any]:
        base: dict[str, Any] = {
            "session_id": session.session_id,
            "transcript_path": transcript_path(session) or "",
            "cwd": session.cwd,
            "hook_event_name": point,
        }
        if point == "Stop":
            fields = {"stop_hook_active": fields["stop_hook_active"]}
        return {**base, **fields}


class ClaudeCodeConfig(HookConfig):
    """[config.hooks-claude-code]"""


DIALECT = ClaudeCode(
    name="claude-code",
    plugin=PLUGIN,
    events={p: p for p in POINTS},
    literal_matchers=True,
    trailing_newline=True,
    honours_ask=True,
    stdout_context=frozenset(),
    project_files=(".claude/settings.json", ".claude/settings.local.json"),
    config_type=ClaudeCodeConfig,
)

plugin = DialectPlugin(DIALECT)
"""The plugin object the ``dsh`` entry point names (see ``protocol.DialectPlugin``)."""
