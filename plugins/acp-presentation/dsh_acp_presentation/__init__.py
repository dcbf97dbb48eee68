"""dsh plugin ``acp-presentation``: what an editor shows of a turn, projected from the session's
durable events through ``dsh_present_event`` (the ACP door asks; nothing here imports it).

- ``tool/call`` → ``tool_call`` (``pending``: kind, title such as ``bash: npm test`` or
  ``edit src/app.py``, locations, bounded ``rawInput``) and ``tool_call_update`` ``in_progress``;
- ``tool/result`` → ``tool_call_update`` ``completed`` or ``failed`` with ``rawOutput``
  (``{"output": text, "isError": bool}``, ``code`` when it has one, ``truncated`` when the
  text was cut to its last ``raw-output`` bytes), the tail of the text output and, for a successful ``write``/``edit`` inside the workspace, a whole-file ``diff``:
  the pair of texts the tool reported (``FileChanges``: the text it wrote over, the editor's
  unsaved buffer when the session reads through the editor, and the text it wrote), the same
  pair its permission request showed; else the file as it was when the call was made, and as
  the arguments change it;
- reasoning of a committed assistant message → ``agent_thought_chunk`` (``thoughts = false``
  hides it);
- a successful ``todo_write`` → ``plan`` with every entry's status;
- each model call's usage → ``usage_update`` (the context used of the route's window);
- a running call's progress (``dsh_present_progress``: the tail of a ``bash`` command's output so
  far, bounded and rate-limited by the tool) → ``tool_call_update`` ``in_progress`` with that
  tail as the card's content, while the card is open (the final update replaces it);
- ``compaction/start`` → ``agent_thought_chunk`` "Compacting the conversation (why)…", then
  ``compaction/summary`` (what it saved: messages summarised and kept, context tokens before →
  after) or ``compaction/failed`` (why; the conversation is unchanged) in the same thought;
- ``subagent/progress`` (a delegation's child committed text) → ``tool_call_update`` of the
  delegating call's card with the child's latest text, while the call runs;
- ``mcp/failed`` (one of the session's MCP servers did not start, or went away) →
  ``agent_message_chunk`` naming the server and why, once until it connects again, and once
  more when its link gives up; ``mcp/connected`` after a shown failure says it is back;
- ``llm/retry`` (a model call failed and is tried again) → ``agent_thought_chunk`` saying why,
  and when the next attempt starts;
- on ``session/load`` (``dsh_present_replay``), the recorded session again as it was shown
  live: each tool call's card with its final status, output and ``rawOutput``, a write's or
  edit's diff from the log (``dsh_after_tool`` records the pair of texts a card shows, up to
  256 KiB a text, as a ``note`` ``acp/file-change``), the thoughts, each plan, each model
  call's ``usage_update``, the title, each compaction;
- ``session/titled`` (a titler such as session-controls writes it after a new session's first
  turn) → ``session_info_update`` with the title, as ``session/list`` shows it.

Ids are the session log's: a card's ``toolCallId`` is the call's id (so a permission request
for the call lands on its card), a thought's ``messageId`` its message's.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

from dsh_acp import wire
from dsh_acp.display import bound_input, one_line, strip_unsafe
from msgspec import Meta

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.contracts import new_id
from dsh_core.paths import open_inside
from dsh_core.types import (
    AssistantMessageEvent,
    CompactionFailed,
    CompactionStart,
    CompactionSummary,
    FileChange,
    FileChanges,
    LiveText,
    McpConnected,
    McpFailed,
    Note,
    ReasoningBlock,
    RetryEvent,
    SessionTitled,
    SubagentProgress,
    TextBlock,
    ToolCallBlock,
    ToolCallEvent,
    ToolOutput,
    ToolProgress,
    ToolResultEvent,
)

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.protocols import Agent

PLUGIN = "acp-presentation"
TITLE_MAX = 200
TITLE_CHARS = 100  # a session's title, as session/list shows it
DIFF_MAX = 256 * 1024  # bytes of a file shown whole in a diff
PLAN_STATUSES = {"pending": "pending", "in_progress": "in_progress", "completed": "completed"}


class PresentationConfig(PluginConfig):
    """``[config.acp-presentation]``"""

    thoughts: Annotated[bool, Meta(description="send the model's committed reasoning as agent_thought_chunk")] = True
    output_bytes: Annotated[int, Meta(ge=0, le=1 << 20, description="bytes of a tool's text output shown on its card (its tail)")] = 4000
    usage: Annotated[bool, Meta(description="send usage_update (context used of the route's window) after every model call")] = True
    raw_output: Annotated[int, Meta(ge=0, le=1 << 20, description=(
        "bytes of a tool's text output sent whole (its tail beyond) as rawOutput on the call's final update; 0: none"))] = 65536


UNSHOWABLE = "\0unshowable"


@dataclass
class Shown:
    """The session's tool calls between their card and their result (this plugin's session slot):
    the tool and its arguments, and the text of the files the step's writes and edits touch.

    A step's calls are all recorded (``tool/call``) before the first runs, and their results all
    after the last: reading a file at either point would show a later or earlier call's work.
    So each file is read once, when the step's first call that changes it is made, and the
    changes are then applied here in call order, as the tools apply them (writes and edits run
    one at a time, in order): a card's diff is exactly what its call did."""

    calls: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    step: tuple[int, int] = (0, 0)
    files: dict[str, str | None] = field(default_factory=dict)  # full path -> text now (None: absent)
    cost: tuple[float, str] | None = None  # the calls priced so far in this process (amount, currency)
    live_thoughts: set[str] = field(default_factory=set)  # messages whose thinking went out live
    mcp_down: set[str] = field(default_factory=set)  # MCP servers whose failure the person was shown
    mcp_up: set[str] = field(default_factory=set)  # MCP servers that were connected once
    compacting: str | None = None  # the thought of the compaction under way (its messageId)


def title_of(name: str, args: dict[str, Any]) -> str:
    """``bash: npm test``, ``edit src/app.py``, ``grep TODO``, ``job_output job_2``: the tool and
    what it acts on (``bash (background): npm run dev`` for a job)."""
    if name == "bash" and isinstance(args.get("command"), str):
        how = "bash (background)" if args.get("run_in_background") is True else "bash"
        return one_line(f"{how}: {args['command']}", TITLE_MAX)
    for key in ("file_path", "path", "pattern", "query", "url", "description", "job_id", "name"):
        if isinstance(args.get(key), str) and args[key]:
            return one_line(f"{name} {args[key]}", TITLE_MAX)
    queries = args.get("queries")  # web_search
    if isinstance(queries, list) and queries and all(isinstance(q, str) for q in queries):
        return one_line(f"{name} {'; '.join(queries)}", TITLE_MAX)
    return one_line(name, TITLE_MAX)


def _where(cwd: str, args: dict[str, Any]) -> list[wire.ToolCallLocation]:
    """Where a call acts, from its arguments: the file tools' ``file_path`` (with ``read``'s
    ``offset`` as the line), else a search's ``path``."""
    path = args.get("file_path", args.get("path"))
    if not isinstance(path, str) or not path:
        return []
    full = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    offset = args.get("offset")
    whole = isinstance(offset, (int, float)) and not isinstance(offset, bool) and float(offset).is_integer()
    line = int(offset) if whole and isinstance(offset, (int, float)) and offset > 0 else None
    return [wire.ToolCallLocation(path=full, **({"line": line} if line else {}))]


def _text(cwd: str, path: Any) -> tuple[bool, str | None]:
    """(showable, text): a UTF-8 regular file inside the workspace, up to ``DIFF_MAX`` bytes
    (``(True, None)``: it does not exist yet). Never reads outside the session's directory."""
    if not isinstance(path, str) or not path:
        return False, None
    try:
        fd = open_inside(cwd, os.path.expanduser(path))
    except FileNotFoundError:
        return True, None
    except OSError:
        return False, None
    try:
        data = os.read(fd, DIFF_MAX + 1)
    except OSError:
        return False, None
    finally:
        os.close(fd)
    if len(data) > DIFF_MAX:
        return False, None
    try:
        return True, data.decode("utf-8")
    except UnicodeDecodeError:
        return False, None


def _args(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _full(cwd: str, path: str) -> str:
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))


def _start(session: Agent, event: ToolCallEvent) -> list[Any]:
    args = _args(event.arguments)
    shown = session.state(Shown)
    if shown.step != (event.turn, event.step):
        shown.step, shown.files = (event.turn, event.step), {}
    path = args.get("file_path")
    if event.name in ("write", "edit") and isinstance(path, str) and path and _full(session.cwd, path) not in shown.files:
        showable, text = _text(session.cwd, path)
        shown.files[_full(session.cwd, path)] = text if showable else UNSHOWABLE
    shown.calls[event.call_id] = (event.name, args)
    tool = session.tools.get(event.name)
    kind = tool.spec.kind if tool is not None and tool.spec.kind in wire.TOOL_KINDS else "other"
    locations = _where(session.cwd, args)
    return [
        wire.ToolCallStart(tool_call_id=event.call_id, title=title_of(event.name, args), kind=kind or "other",
                           status="pending", raw_input=bound_input(args), **({"locations": locations} if locations else {})),
        wire.ToolCallProgress(tool_call_id=event.call_id, status="in_progress"),
    ]


def _diff(session: Agent, name: str, args: dict[str, Any]) -> wire.DiffOut | None:
    """What a successful write or edit did to its file, from the text before the step and the
    step's earlier changes (see ``Shown``)."""
    path = args.get("file_path")
    if not isinstance(path, str) or not path:
        return None
    shown = session.state(Shown)
    full = _full(session.cwd, path)
    before = shown.files.get(full, UNSHOWABLE)
    if before == UNSHOWABLE:
        return None
    if name == "write" and isinstance(args.get("content"), str):
        after: str = args["content"]
    elif name == "edit" and before is not None and isinstance(args.get("old_string"), str) \
            and isinstance(args.get("new_string"), str) and args["old_string"] in before:
        count = -1 if args.get("replace_all") is True else 1
        after = before.replace(args["old_string"], args["new_string"], count)
    else:
        shown.files[full] = UNSHOWABLE  # no longer known exactly
        return None
    shown.files[full] = after
    if len(after.encode("utf-8", errors="replace")) > DIFF_MAX:
        return None
    return wire.DiffOut(path=full, old_text=before, new_text=after) if after != before else None


def _inside(session: Agent, path: str) -> bool:
    root = os.path.realpath(session.cwd)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def _too_big(change: FileChange) -> bool:
    return any(t is not None and len(t.encode("utf-8", errors="replace")) > DIFF_MAX for t in (change.before, change.after))


def _changed(session: Agent, change: FileChange) -> wire.DiffOut | None:
    """The change the tool reported making (``FileChanges``): the very text it wrote over (the
    editor's buffer when the session reads through the editor) and the text it wrote, for a file
    inside the workspace; later calls of the step build on it."""
    if not _inside(session, change.path):
        return None
    session.state(Shown).files[change.path] = change.after
    if _too_big(change) or change.after == change.before:
        return None
    return wire.DiffOut(path=change.path, old_text=change.before, new_text=change.after)


FILE_CHANGE = "acp/file-change"  # the note that keeps a card's diff for session/load


@hookimpl
def dsh_after_tool(session: Agent, call: ToolCallBlock, output: ToolOutput) -> None:
    """Before a write's or edit's result is committed: record in the log the pair of texts its
    card is about to show (``note`` ``acp/file-change``: ``callId``, ``path``, ``oldText``,
    ``newText``), so a reopened session shows the diff of then, not the disk of now. A text over
    256 KiB is not recorded (``skipped`` says why; the live card shows no diff either). Only a
    call that has a card (a model's call, not a program's nested one); nothing is decided."""
    if call.name not in ("write", "edit") or output.is_error or call.id not in session.state(Shown).calls:
        return None
    change = session.state(FileChanges).peek(call.id)
    if change is None or not _inside(session, change.path) or change.after == change.before:
        return None
    data: dict[str, Any] = {"callId": call.id, "path": change.path}
    if _too_big(change):
        data["skipped"] = f"a text of the change is over {DIFF_MAX // 1024} KiB"
    else:
        data |= {"oldText": change.before, "newText": change.after}
    session.emit(Note(kind=FILE_CHANGE, data=data))
    return None


def _raw_output(event: ToolResultEvent, text: str, raw_bytes: int) -> dict[str, Any]:
    """A call's result as ``rawOutput``: its text (the tail past ``raw_bytes``, with ``truncated``),
    whether it failed, and its error code."""
    raw: dict[str, Any] = {"output": "", "isError": event.result.is_error}
    data = text.encode("utf-8", errors="replace")
    if len(data) > raw_bytes:
        text = data[-raw_bytes:].decode("utf-8", errors="ignore") if raw_bytes else ""
        raw["truncated"] = True
    raw["output"] = strip_unsafe(text)
    if event.code:
        raw["code"] = event.code
    return raw


def _finish(session: Agent, event: ToolResultEvent, output_bytes: int, raw_bytes: int) -> list[Any]:
    result = event.result
    name, args = session.state(Shown).calls.pop(result.call_id, (result.name, {}))
    content: list[wire.ContentOut | wire.DiffOut] = []
    change = session.state(FileChanges).take(result.call_id)
    if name in ("write", "edit") and not result.is_error:
        diff = _changed(session, change) if change is not None else _diff(session, name, args)
        if diff is not None:
            content.append(diff)
    text = "\n".join(b.text for b in result.content if isinstance(b, TextBlock))
    if text and output_bytes:
        content.append(_tail(text, output_bytes))
    extra: dict[str, Any] = {"content": content} if content else {}
    if raw_bytes:
        extra["raw_output"] = _raw_output(event, text, raw_bytes)
    updates: list[Any] = [wire.ToolCallProgress(tool_call_id=result.call_id, status="failed" if result.is_error else "completed",
                                                **extra)]
    plan = _plan(name, args, result.is_error)
    if plan is not None:
        updates.append(plan)
    return updates


def _plan(name: str, args: dict[str, Any], is_error: bool) -> wire.PlanUpdate | None:
    """The plan a successful ``todo_write`` set, every entry with its status."""
    if name != "todo_write" or is_error or not isinstance(args.get("todos"), list):
        return None
    return wire.PlanUpdate(entries=[wire.PlanEntry(content=one_line(str(t.get("content", "")), 500), priority="medium",
                                                   status=PLAN_STATUSES.get(str(t.get("status")), "pending"))
                                    for t in args["todos"] if isinstance(t, dict)])


dsh_config_type = config_type_hook(PLUGIN, PresentationConfig)


def _title(event: SessionTitled) -> list[Any]:
    updated = datetime.fromtimestamp(event.time or time.time(), UTC).isoformat().replace("+00:00", "Z")
    return [wire.SessionInfoUpdate(title=one_line(event.title, TITLE_CHARS), updated_at=updated)]


def _priced(session: Agent, event: AssistantMessageEvent, so_far: tuple[float, str] | None) -> tuple[float, str] | None:
    """``so_far`` plus this call, as the session's provider prices it (``ModelProvider.cost``);
    None when it does not price; ``so_far`` when it prices this call in another currency."""
    price = getattr(session.provider, "cost", None)
    if price is None or event.usage is None:
        return None
    call = price(session.route.model, event.usage, event.time or time.time())
    if call is None or (so_far is not None and so_far[1] != call.currency):
        return so_far
    return (so_far[0] if so_far else 0.0) + call.amount, call.currency


def _cost(session: Agent, event: AssistantMessageEvent) -> tuple[float, str] | None:
    """The session's cost so far: this process's calls, after the log's when it was loaded."""
    shown = session.state(Shown)
    shown.cost = _priced(session, event, shown.cost) or shown.cost
    return shown.cost if getattr(session.provider, "cost", None) is not None else None


@hookimpl
def dsh_present_live(session: Agent, piece: LiveText) -> list[Any] | None:
    """With live text (the door's ``stream = "live"``): the model's thinking as it is written."""
    if not piece.reasoning or not session.host.config_for(PresentationConfig).thoughts:
        return None
    session.state(Shown).live_thoughts.add(piece.message_id)
    return [wire.ThoughtChunk(content=wire.TextOut(text=piece.text), message_id=piece.message_id)]


@hookimpl
def dsh_present_event(session: Agent, event: Any) -> list[Any] | None:
    cfg = session.host.config_for(PresentationConfig)
    if isinstance(event, SessionTitled):
        return _title(event)
    if isinstance(event, AssistantMessageEvent):
        updates: list[Any] = []
        live = session.state(Shown).live_thoughts
        if cfg.thoughts and event.message.id not in live:
            updates += [wire.ThoughtChunk(content=wire.TextOut(text=b.text), message_id=event.message.id)
                        for b in event.message.content if isinstance(b, ReasoningBlock) and b.text]
        live.discard(event.message.id)
        if cfg.usage and event.usage is not None:  # after every model call: the context it used of the window
            updates.append(_usage(session, event, _cost(session, event)))
        return updates or None
    if isinstance(event, ToolCallEvent):
        return _start(session, event)
    if isinstance(event, ToolResultEvent):
        return _finish(session, event, cfg.output_bytes, cfg.raw_output)
    if isinstance(event, SubagentProgress):
        return _progress(session, event, cfg.output_bytes)
    if isinstance(event, (McpFailed, McpConnected)):
        return _mcp(session, event)
    if isinstance(event, RetryEvent):
        return [_retry(event)]
    if isinstance(event, (CompactionStart, CompactionSummary, CompactionFailed)):
        return [_compaction(session.state(Shown), event)]
    return None


@hookimpl
def dsh_present_progress(session: Agent, progress: ToolProgress) -> list[Any] | None:
    """A running call's output so far, as its card's content (the tool bounds its size and rate);
    only while the card is open, so nothing lands on a card after its final update."""
    output_bytes = session.host.config_for(PresentationConfig).output_bytes
    if not output_bytes or progress.call_id not in session.state(Shown).calls:
        return None
    text = progress.text
    data = text.encode("utf-8", errors="replace")
    if len(data) > output_bytes:  # whole lines of its last output_bytes bytes
        text = data[-output_bytes:].decode("utf-8", errors="ignore")
        text = text.split("\n", 1)[1] if "\n" in text[:-1] else text
    return [wire.ToolCallProgress(tool_call_id=progress.call_id, status="in_progress",
                                  content=[wire.ContentOut(content=wire.TextOut(text=strip_unsafe(text)))])]


@dataclass
class Replayed:
    """A session being shown again (``dsh_present_replay``; its state slot; of ``Shown`` only the
    cost is set, the log's total, for the live count to go on from): its calls between their card and their result (the tool and its arguments), the
    diffs recorded for them, and the cost of the calls replayed so far."""

    calls: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    compacting: str | None = None  # the thought of the compaction being replayed
    diffs: dict[str, wire.DiffOut] = field(default_factory=dict)
    cost: tuple[float, str] | None = None
    after: list[Any] = field(default_factory=list)  # what goes out after the door's text of the event before


def _recorded_diff(session: Agent, event: Note) -> tuple[str, wire.DiffOut] | None:
    """A card's diff as ``dsh_after_tool`` recorded it (None: not recorded, or not what it
    records: a log is a file, so a path outside the workspace or a text over the bound is not
    shown)."""
    data = event.data
    call_id, path, old, new = data.get("callId"), data.get("path"), data.get("oldText"), data.get("newText")
    if not (isinstance(call_id, str) and isinstance(path, str) and os.path.isabs(path) and isinstance(new, str)
            and (old is None or isinstance(old, str))):
        return None
    change = FileChange(path=path, before=old, after=new)
    if not _inside(session, path) or _too_big(change):
        return None
    return call_id, wire.DiffOut(path=path, old_text=old, new_text=new)


def _replayed_cost(session: Agent, event: AssistantMessageEvent) -> tuple[float, str] | None:
    """The cost of the log's calls up to this one, priced as live (``_cost``). The live count
    goes on from it: after a load, the next call's ``usage_update`` adds to what the person saw."""
    replayed = session.state(Replayed)
    replayed.cost = _priced(session, event, replayed.cost) or replayed.cost
    session.state(Shown).cost = replayed.cost
    return replayed.cost if getattr(session.provider, "cost", None) is not None else None


def _usage(session: Agent, event: AssistantMessageEvent, cost: tuple[float, str] | None) -> wire.UsageUpdate:
    assert event.usage is not None
    return wire.UsageUpdate(used=event.usage.input_tokens + event.usage.output_tokens, size=session.route.context_window,
                            **({"cost": wire.CostOut(amount=round(cost[0], 6), currency=cost[1])}
                               if cost is not None else {}))


@hookimpl
def dsh_present_replay(session: Agent, event: Any) -> list[Any] | None:
    """A reopened session shown again as it was live: each tool call's card with its final status,
    output, ``rawOutput`` and the diff recorded for it, the model's thoughts, each plan, each model
    call's usage (so the last is the session's), the title, each compaction with what it saved.

    The door replays a message's text after what this returns for it; live, a call's usage came
    after its text, so it goes out with the next event (a completed turn's log ends with
    ``turn/end``)."""
    replayed = session.state(Replayed)
    before, replayed.after = replayed.after, []
    updates = _replay(session, event, replayed)
    return before + (updates or []) or None


def _replay(session: Agent, event: Any, replayed: Replayed) -> list[Any] | None:
    cfg = session.host.config_for(PresentationConfig)
    if isinstance(event, SessionTitled):
        return _title(event)
    if isinstance(event, AssistantMessageEvent):
        if cfg.usage and event.usage is not None:
            replayed.after.append(_usage(session, event, _replayed_cost(session, event)))
        if not cfg.thoughts:
            return None
        return [wire.ThoughtChunk(content=wire.TextOut(text=b.text), message_id=event.message.id)
                for b in event.message.content if isinstance(b, ReasoningBlock) and b.text] or None
    if isinstance(event, (CompactionStart, CompactionSummary, CompactionFailed)):  # a fact of the thread, shown again
        return [_compaction(replayed, event)]
    if isinstance(event, Note):
        if event.kind == FILE_CHANGE and (recorded := _recorded_diff(session, event)) is not None:
            replayed.diffs[recorded[0]] = recorded[1]
        return None
    calls = replayed.calls
    if isinstance(event, ToolCallEvent):
        args = _args(event.arguments)
        calls[event.call_id] = (event.name, args)
        tool = session.tools.get(event.name)
        kind = tool.spec.kind if tool is not None and tool.spec.kind in wire.TOOL_KINDS else "other"
        locations = _where(session.cwd, args)
        return [wire.ToolCallStart(tool_call_id=event.call_id, title=title_of(event.name, args), kind=kind or "other",
                                   status="pending", raw_input=bound_input(args),
                                   **({"locations": locations} if locations else {}))]
    if isinstance(event, ToolResultEvent):
        result = event.result
        name, args = calls.pop(result.call_id, (result.name, {}))
        diff = replayed.diffs.pop(result.call_id, None)
        text = "\n".join(b.text for b in result.content if isinstance(b, TextBlock))
        content: list[wire.ContentOut | wire.DiffOut] = [diff] if diff is not None and not result.is_error else []
        if text and cfg.output_bytes:
            content.append(_tail(text, cfg.output_bytes))
        extra: dict[str, Any] = {"content": content} if content else {}
        if cfg.raw_output:
            extra["raw_output"] = _raw_output(event, text, cfg.raw_output)
        updates: list[Any] = [wire.ToolCallProgress(tool_call_id=result.call_id,
                                                    status="failed" if result.is_error else "completed", **extra)]
        plan = _plan(name, args, result.is_error)
        return updates + ([plan] if plan is not None else [])
    return None


def _say(text: str) -> wire.MessageChunk:
    """A message of the harness to the person (a message of its own: never part of an answer)."""
    return wire.MessageChunk(content=wire.TextOut(text=text), message_id=new_id("msg_"))


def _mcp(session: Agent, event: McpFailed | McpConnected) -> list[Any] | None:
    """An MCP server the person should know about: it failed (the first time, and when its link
    gives up), or it is back after a failure they were shown. A failure reaches the person as an
    agent message because it happens outside any turn (at session/new), where a tool card or a
    thought has nothing to belong to."""
    down, up = session.state(Shown).mcp_down, session.state(Shown).mcp_up
    name = one_line(event.server, 100)
    if isinstance(event, McpConnected):
        up.add(event.server)
        if event.server not in down:
            return None
        down.discard(event.server)
        return [_say(f"MCP server **{name}** is connected again ({event.tools} tools).")]
    why = one_line(strip_unsafe(event.error), 1000)
    if event.retry_in is None:
        down.add(event.server)
        return [_say(f"MCP server **{name}** is not available: {why}. Its tools are gone for the rest of this "
                     "session.")]
    if event.server in down:
        return None
    down.add(event.server)
    what = "went away" if event.server in up else "failed to start"
    return [_say(f"MCP server **{name}** {what}: {why}. Its tools are unavailable until it "
                 f"connects (next try in {event.retry_in:g} s).")]


def _retry(event: RetryEvent) -> wire.ThoughtChunk:
    """A model call that failed and is tried again, said where thinking shows: the person sees a
    retry (and why), not a hang."""
    why = one_line(strip_unsafe(event.failure), 300)
    return wire.ThoughtChunk(content=wire.TextOut(
        text=f"The model call failed ({why}); trying again in {event.delay_ms / 1000:g} s "
             f"(retry {event.retry} of {event.max_retries}).\n"), message_id=new_id("msg_"))


COMPACTION_WHY = {
    "overflow": "the model refused the request as too long for its context",
    "manual": "asked for with /compact",
}


def _compaction(shown: Shown | Replayed, event: CompactionStart | CompactionSummary | CompactionFailed) -> wire.ThoughtChunk:
    """A compaction, said where thinking shows (one thought from its start to its outcome): that
    the conversation is being summarised and why, then what that saved, or why it failed."""
    if isinstance(event, CompactionStart):
        shown.compacting = new_id("msg_")
        why = COMPACTION_WHY.get(event.reason) or (
            f"about {event.estimated_tokens:,} of the model's {event.context_window:,} tokens of context are in use"
            if event.context_window else "the context is nearly full")
        return wire.ThoughtChunk(content=wire.TextOut(text=f"Compacting the conversation ({why})…\n"),
                                 message_id=shown.compacting)
    message_id, shown.compacting = shown.compacting or new_id("msg_"), None
    if isinstance(event, CompactionFailed):
        why = one_line(strip_unsafe(event.error), 300)
        text = f"The compaction failed: {why}. The conversation is unchanged.\n"
    else:
        covered = event.covered_to - event.covered_from
        text = (f"Compacted: {covered} older message{'s' if covered != 1 else ''} summarised, "
                f"{event.retained} kept as they were; the context went from about {event.tokens_before:,} "
                f"to about {event.tokens_after:,} tokens.\n")
    return wire.ThoughtChunk(content=wire.TextOut(text=text), message_id=message_id)


def _progress(session: Agent, event: SubagentProgress, output_bytes: int) -> list[Any] | None:
    """A delegation's card shows its child's latest text while the call runs (a background
    child's card closed when the call returned; its outcome comes as a notice)."""
    if event.call_id is None or event.call_id not in session.state(Shown).calls or not output_bytes:
        return None
    return [wire.ToolCallProgress(tool_call_id=event.call_id, status="in_progress",
                                  content=[_tail(event.text, output_bytes)])]


def _tail(text: str, output_bytes: int) -> wire.ContentOut:
    """A card's text: its last ``output_bytes`` bytes (``…`` first when cut), nothing that disguises it."""
    data = text.encode("utf-8", errors="replace")
    if len(data) > output_bytes:
        text = "…" + data[-output_bytes:].decode("utf-8", errors="ignore")
    return wire.ContentOut(content=wire.TextOut(text=strip_unsafe(text)))
