"""dsh plugin ``todo``: ``todo_write`` keeps the session's todo list; only the model sees it.

``todo_write {todos: [{content, status}]}`` (status ``pending`` | ``in_progress`` |
``completed``) replaces the whole list and answers with it rendered. Later, while items
remain open, the current list is appended after a tool result (``dsh_after_tool``) every
``remind-every`` tool results (default 10) since the model last saw it — appended, never a
rewrite of earlier history, so the prefix cache keeps hitting. Nothing reaches the ACP wire
beyond what every tool call already shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from msgspec import Meta

from dsh_core import FunctionTool, ToolError, config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.types import AfterTool

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import Agent, Host, Tool
    from dsh_core.types import ToolCallBlock, ToolOutput

PLUGIN = "todo"
TOOL = "todo_write"
STATUSES = ("pending", "in_progress", "completed")
MARKS = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]"}
DEFAULT_REMIND_EVERY = 10
MAX_ITEMS = 100
MAX_CONTENT = 1000


@dataclass
class TodoState:
    items: list[tuple[str, str]] = field(default_factory=list)  # (content, status)
    since_shown: int = 0


def state(session: Agent) -> TodoState:
    """The session's todo list (its state slot: created on first use, dropped with the session)."""
    return session.state(TodoState)


def render(items: list[tuple[str, str]]) -> str:
    if not items:
        return "The todo list is empty."
    done = sum(1 for _, s in items if s == "completed")
    lines = [f"{MARKS[s]} {c}" for c, s in items]
    return f"Todo list ({done}/{len(items)} completed):\n" + "\n".join(lines)


def parse(args: dict[str, Any]) -> list[tuple[str, str]]:
    todos = args.get("todos")
    if not isinstance(todos, list):
        raise ToolError("todos must be an array of {content, status} objects", code="INVALID_ARGUMENTS")
    if len(todos) > MAX_ITEMS:
        raise ToolError(f"at most {MAX_ITEMS} todos", code="INVALID_ARGUMENTS")
    items = []
    for i, t in enumerate(todos):
        if not isinstance(t, dict):
            raise ToolError(f"todos[{i}] must be an object with content and status", code="INVALID_ARGUMENTS")
        content, status = t.get("content"), t.get("status")
        if not isinstance(content, str) or not content.strip():
            raise ToolError(f"todos[{i}].content must be a non-empty string", code="INVALID_ARGUMENTS")
        if status not in STATUSES:
            raise ToolError(f"todos[{i}].status must be one of {', '.join(STATUSES)}", code="INVALID_ARGUMENTS")
        items.append((content.strip()[:MAX_CONTENT], status))
    return items


async def _todo_write(args: dict[str, Any], ctx: ToolContext) -> str:
    items = parse(args)
    st = state(ctx.agent)
    st.items = items
    st.since_shown = 0
    return "Todo list replaced.\n" + render(items)


def make_tool() -> FunctionTool:
    return FunctionTool(
        TOOL,
        "Replace this session's todo list with `todos` (the whole list, every time). Use it to plan "
        "multi-step work and track progress: keep exactly one item in_progress while working, mark "
        "items completed as soon as they are done. Only you see the list.",
        {
            "type": "object",
            "properties": {
                "todos": {
                    "type": "array",
                    "description": "The complete new list, in order.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "content": {"type": "string", "description": "What to do, imperative and short."},
                            "status": {"type": "string", "enum": list(STATUSES)},
                        },
                        "required": ["content", "status"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["todos"],
            "additionalProperties": False,
        },
        _todo_write,
    )


class TodoConfig(PluginConfig):
    """[config.todo]"""

    remind_every: Annotated[int, Meta(ge=1, description="tool results between reminders of an open list")] = (
        DEFAULT_REMIND_EVERY)


dsh_config_type = config_type_hook(PLUGIN, TodoConfig)


@hookimpl(trylast=True)  # after the workspace tools: the tool list the model saw before only grows at its end
def dsh_register_tools(register: Callable[[Tool], None], host: Host) -> None:
    register(make_tool())


@hookimpl
def dsh_after_tool(session: Agent, call: ToolCallBlock, output: ToolOutput) -> AfterTool | None:
    if call.name == TOOL:
        return None
    st = state(session)
    if not st.items or all(s == "completed" for _, s in st.items):
        return None
    st.since_shown += 1
    if st.since_shown < session.host.config_for(TodoConfig).remind_every:
        return None
    st.since_shown = 0
    return AfterTool(context=["Your current todo list (update it with todo_write as you progress):\n" + render(st.items)])
