"""dsh plugin ``hooks-claude-code``: run a user's existing Claude Code command hooks.

Reads Claude Code's hook format — a ``hooks.json`` or a settings file with a ``hooks`` key —
from the files named in ``[config.hooks-claude-code] files`` and, per session, from the
project files under the session's cwd (``project-files``; default ``.claude/settings.json``
and ``.claude/settings.local.json``). Events: ``SessionStart``, ``UserPromptSubmit``,
``PreToolUse``, ``PostToolUse``, ``Stop``, mapped onto the spine's interception points. The
protocol itself (running, decoding, folding, records) is ``dsh_hooks_claude_code.protocol``,
which the Codex bridge shares.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dsh_core import hookimpl

from .protocol import POINTS, Bridge, CommandHook, Dialect, Settings, transcript_path

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Host

PLUGIN = "hooks-claude-code"
PROJECT_DIR_TOKEN = "${CLAUDE_PROJECT_DIR}"


class ClaudeCode(Dialect):
    def command(self, hook: CommandHook, session: Any, project_dir: str) -> str:
        return hook.command.replace(PROJECT_DIR_TOKEN, project_dir)

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


DIALECT = ClaudeCode(
    name="claude-code",
    plugin=PLUGIN,
    events={p: p for p in POINTS},
    literal_matchers=True,
    trailing_newline=True,
    honours_ask=True,
    stdout_context=frozenset(),
    project_files=(".claude/settings.json", ".claude/settings.local.json"),
)

_bridges: weakref.WeakKeyDictionary[Any, Bridge] = weakref.WeakKeyDictionary()


@hookimpl
def dsh_configure(config: Mapping[str, Mapping[str, Any]], host: Host) -> None:
    _bridges[host] = Bridge(DIALECT, Settings.from_config(config.get(PLUGIN), DIALECT))


def _bridge(session: Any) -> Bridge | None:
    return _bridges.get(session.host)


@hookimpl
def dsh_session_start(session: Any, source: str, turn: int) -> Any:
    b = _bridge(session)
    return b.session_start(session, source, turn) if b else None


@hookimpl
def dsh_prompt_submit(session: Any, messages: list[Any], turn: int) -> Any:
    b = _bridge(session)
    return b.prompt_submit(session, messages, turn) if b else None


@hookimpl
def dsh_before_tool(session: Any, name: str, args: dict[str, Any], call_id: str, turn: int, step: int) -> Any:
    b = _bridge(session)
    return b.before_tool(session, name, args, call_id, turn) if b else None


@hookimpl
def dsh_after_tool(session: Any, call: Any, output: Any) -> Any:
    b = _bridge(session)
    return b.after_tool(session, call, output, session.turn) if b else None


@hookimpl
def dsh_before_stop(session: Any, turn: int, step: int, continued: int) -> Any:
    b = _bridge(session)
    return b.before_stop(session, turn, continued) if b else None
