"""dsh plugin ``hooks-codex``: run a user's existing Codex command hooks.

Codex's hook file is a subset of Claude Code's protocol, so this bridge runs on the shared core
in ``dsh_hooks.protocol`` (the dsh-hooks library) and only says what differs: the files (``files`` in
``[config.hooks-codex]``, and per session ``.codex/hooks.json`` under the session's cwd), the
event keys (``PreToolUse`` … as Codex writes them, and the snake_case ``pre_tool_use`` …),
matchers that are always regexes, snake_case payloads with ``model`` and ``turn_id`` and no
trailing newline, no environment or command substitution, plain stdout as context for
``SessionStart`` and ``UserPromptSubmit``, and ``PreToolUse`` honouring blocks only (no
allow/ask).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsh_hooks.protocol import POINTS, CommandHook, Dialect, DialectPlugin, HookConfig, transcript_path

PLUGIN = "hooks-codex"
SNAKE = {"SessionStart": "session_start", "UserPromptSubmit": "user_prompt_submit", "PreToolUse": "pre_tool_use",
         "PostToolUse": "post_tool_use", "Stop": "stop"}


class Codex(Dialect):
    def hook_entry(self, raw: Mapping[str, Any]) -> CommandHook | str | None:
        if raw.get("async") is True:
            return "async hook"
        if "timeout" not in raw and isinstance(raw.get("timeoutSec"), int | float):
            raw = {**raw, "timeout": raw["timeoutSec"]}  # Codex's alias
        return super().hook_entry(raw)

    def payload(self, point: str, session: Any, turn: int, fields: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "session_id": session.session_id,
            "transcript_path": transcript_path(session),
            "cwd": session.cwd,
            "hook_event_name": point,
            "model": session.route.model,
            "permission_mode": "default",
        }
        if point != "SessionStart":
            out["turn_id"] = str(turn)
        if point in ("PreToolUse", "PostToolUse"):
            command = fields["tool_input"].get("command")
            fields = {**fields, "tool_input": {"command": command if isinstance(command, str) else ""}}
        return {**out, **fields}


class CodexConfig(HookConfig):
    """[config.hooks-codex]"""


DIALECT = Codex(
    name="codex",
    plugin=PLUGIN,
    events={**{p: p for p in POINTS}, **{SNAKE[p]: p for p in POINTS}},
    literal_matchers=False,
    trailing_newline=False,
    honours_ask=False,
    stdout_context=frozenset({"SessionStart", "UserPromptSubmit"}),
    project_files=(".codex/hooks.json",),
    config_type=CodexConfig,
)

plugin = DialectPlugin(DIALECT)
"""The plugin object the ``dsh`` entry point names (see ``protocol.DialectPlugin``)."""
