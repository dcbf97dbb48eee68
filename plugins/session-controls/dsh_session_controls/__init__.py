"""dsh plugin ``session-controls``: what a person changes of a session from an editor, and the
commands that need no model.

Controls (``dsh_session_controls``; the ACP door shows them as config options, and the mode
also as legacy modes):

- ``model`` (category ``model``): the routes the session's provider lists (``models()``);
  a switch to a model that cannot read images is refused while the conversation holds images.
- ``thought_level``: the route's reasoning efforts (DeepSeek: off, low, high, max).
- ``mode`` (category ``mode``): ``read-only``, ``workspace-write``, ``full-access`` and ``plan``
  (``[config.session-controls] modes`` picks and orders them). The tier is sandbox-tools'
  (``plan`` runs read-only); the model is told of a change in an appended message, so the prefix
  and the provider's cache stay. ``full-access`` chosen here is never taken back from a log.
- ``auto_compact`` (a boolean: ``on``/``off``), in a composition with a history policy
  (compaction): off, the history is never compacted unasked (``/compact`` still works).

Plan mode: only tools that read run (``read``/``search``/``fetch``/``think`` kinds, ``bash``
and ``run_code`` confined read-only, ``todo_write``); ``exit_plan_mode {plan}`` puts the plan to
the person (a one-shot permission request: switch to workspace-write, or keep planning).

Commands (``dsh_slash_commands``): ``/status`` (route, effort, mode and sandbox, context used,
session id: no model call) and ``/init`` (a turn that writes AGENTS.md for the workspace).
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio
import msgspec
from msgspec import Meta

from dsh_core import FunctionTool, ToolError, config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.contracts import new_id
from dsh_core.display import cut, strip_unsafe
from dsh_core.interception import BeforeTool
from dsh_core.protocols import BOOLEAN, Choice, CommandResult, Control, SlashCommand
from dsh_core.types import (
    AssistantMessageEvent,
    CompactionSummary,
    ImageBlock,
    McpConnected,
    McpFailed,
    ModelRequest,
    SessionTitled,
    TextBlock,
    TextDelta,
    UserMessage,
    UserMessageEvent,
)

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import Agent, Host

log = logging.getLogger("dsh.session-controls")

PLUGIN = "session-controls"
Mode = Literal["read-only", "workspace-write", "full-access", "plan"]
MODES: dict[str, tuple[str, str]] = {
    "read-only": ("Read only", "Commands and file tools read anywhere and write nowhere"),
    "workspace-write": ("Workspace write", "Writes inside the workspace and the temporary directory"),
    "full-access": ("Full access", "No sandbox: commands and file tools run with your rights"),
    "plan": ("Plan", "Only reading tools run; the model proposes a plan for you to approve"),
}
TIER_MODE = {"read-only": "read-only", "workspace-write": "workspace-write", "danger-full-access": "full-access"}
EFFORTS = {"off": "Off (no thinking)", "low": "Low", "high": "High", "max": "Max"}
PLAN_KINDS = frozenset({"read", "search", "fetch", "think"})
PLAN_TOOLS = frozenset({"bash", "run_code", "todo_write", "exit_plan_mode"})  # confined read-only, or harmless

TELL = {
    "read-only": "The person set this session's permission mode to read-only: commands and file tools may "
                 "read anywhere and write nowhere. If one call really must write, call it again with "
                 'sandbox_permissions="workspace-write" (inside the workspace) and a justification; the person '
                 "approves or rejects that single call.",
    "workspace-write": "The person set this session's permission mode to workspace-write: commands and the "
                       "write/edit tools may write inside the workspace and the temporary directory.",
    "full-access": "The person set this session's permission mode to full-access: commands and file tools run "
                   "without a sandbox, with the person's rights. Be careful with anything outside the workspace.",
    "plan": "The person switched this session to plan mode. Only reading tools run (read, grep, glob, bash and "
            "run_code confined read-only, todo_write): investigate, then call exit_plan_mode with the plan. "
            "The person approves it before anything is changed.",
}

INIT = (
    "Write AGENTS.md at the root of this workspace: the guide a coding agent reads before working here. "
    "First look around (the README, the build and test files, the layout, how the tests run, the style the "
    "code follows). Then write a short file (under 150 lines) with: what the project is, how to set it up, "
    "build, run and test it (exact commands), the layout, and the conventions a change must follow. If "
    "AGENTS.md exists, improve it rather than starting over. Do not invent commands you have not seen."
)


class ControlsConfig(PluginConfig):
    """``[config.session-controls]``"""

    titles: Annotated[Literal["model", "prompt"], Meta(
        description="a new session's title: a short model call on its route, or its first prompt's first line")] = "model"
    modes: Annotated[list[Mode], Meta(min_length=1, description="the permission modes offered, in order")] = (
        msgspec.field(default_factory=lambda: ["read-only", "workspace-write", "full-access", "plan"]))


dsh_config_type = config_type_hook(PLUGIN, ControlsConfig)


# --------------------------------------------------------------------------- controls


def default_mode(host: Host) -> str | None:
    tier = getattr(host.confinement, "default_mode", None)
    return TIER_MODE.get(tier) if isinstance(tier, str) else None


def current_mode(session: Agent) -> str | None:
    return session.settings.mode or default_mode(session.host)


def _model(session: Agent) -> Control:
    listed = getattr(session.provider, "models", None)
    routes = list(listed()) if listed is not None else []
    if all(r.model != session.route.model for r in routes):
        routes.insert(0, session.route)

    def apply(value: str) -> None:
        route = session.provider.resolve(value)
        if not route.image_input and any(isinstance(b, ImageBlock) for m in session.history
                                         for b in getattr(m, "content", ())):
            raise ValueError(f"the conversation holds images and {value} cannot read them; start a new session "
                             "to use it")
        session.configure(model=value)

    return Control(id="model", name="Model", category="model", current=session.route.model, apply=apply,
                   choices=tuple(Choice(value=r.model, name=r.model, description=_describe(r)) for r in routes))


def _describe(route: Any) -> str:
    w = route.context_window
    window = f"{w / (1 << 20):.3g}M context" if w >= 1 << 20 else f"{w // 1000}K context"
    return ", ".join([window, *(["reads images"] if route.image_input else []), *(["thinking"] if route.thinking else [])])


def _effort(session: Agent) -> Control | None:
    route = session.route
    if not route.efforts:
        return None
    current = session.settings.effort or route.effort or route.efforts[-1]

    def apply(value: str) -> None:
        session.configure(effort=value)

    return Control(id="thought_level", name="Thinking", category="thought_level", current=current,
                   choices=tuple(Choice(value=e, name=EFFORTS.get(e, e)) for e in route.efforts), apply=apply,
                   description="How much the model reasons before it answers")


def _mode(session: Agent) -> Control | None:
    current = current_mode(session)
    if current is None:  # no sandbox-tools: nothing a mode would change
        return None
    offered: list[str] = list(session.host.config_for(ControlsConfig).modes)
    if current not in offered:
        offered.insert(0, current)

    def apply(value: str) -> None:
        if value not in offered:
            raise ValueError(f"this agent offers the modes {', '.join(offered)}")
        if value != current_mode(session):
            session.configure(mode=value, tell_model=TELL[value])

    return Control(id="mode", name="Mode", category="mode", current=current, apply=apply,
                   choices=tuple(Choice(value=m, name=MODES[m][0], description=MODES[m][1]) for m in offered),
                   description="What the session's tools may do")


def _auto_compact(session: Agent) -> Control | None:
    """Automatic compaction on or off, in a composition with a history policy (compaction)."""
    if not session.host.pm.hook.dsh_history_policy.get_hookimpls():
        return None

    def apply(value: str) -> None:
        session.configure(auto_compact=value == "on")

    return Control(id="auto_compact", name="Auto-compact", current="off" if session.settings.auto_compact is False else "on",
                   choices=BOOLEAN, apply=apply, boolean=True,
                   description="Summarise the older conversation when the context fills up (off: only /compact does)")


@hookimpl
def dsh_session_controls(session: Agent, host: Host) -> list[Control]:
    return [c for c in (_model(session), _effort(session), _mode(session), _auto_compact(session)) if c is not None]


# --------------------------------------------------------------------------- plan mode


@hookimpl
def dsh_before_tool(session: Agent, name: str, args: dict[str, Any], call_id: str, turn: int,
                    step: int) -> BeforeTool | None:
    if session.settings.mode != "plan" or name in PLAN_TOOLS:
        return None
    tool = session.tools.get(name)
    if tool is not None and tool.spec.kind in PLAN_KINDS:
        return None
    return BeforeTool(decision="deny", reason=f"the session is in plan mode: {name} does not run until the person "
                                              "approves a plan (call exit_plan_mode with it)")


async def _exit_plan_mode(args: dict[str, Any], ctx: ToolContext) -> str:
    plan = args.get("plan")
    if not isinstance(plan, str) or not plan.strip():
        raise ToolError("plan must be the plan, as Markdown text", code="INVALID_ARGUMENTS")
    session = ctx.agent
    if session.settings.mode != "plan":
        raise ToolError(f"the session is not in plan mode (it is {current_mode(session)}); carry on",
                        code="NOT_IN_PLAN_MODE")
    outcome = await ctx.approve(
        "switch to workspace-write and carry out this plan", kind="switch_mode", subject="approve the plan",
        args={"plan": plan}, justification=plan.strip(), choices=("Switch to workspace-write", "Keep planning"))
    if outcome == "allowed-once":
        session.configure(mode="workspace-write", by="exit_plan_mode")
        return ("The person approved the plan; the session is now in workspace-write mode (writes inside the "
                "workspace are allowed). Carry out the plan.")
    if outcome == "rejected":
        return "The person chose to keep planning: the session stays in plan mode. Ask what to change, or refine the plan."
    raise ToolError(f"the plan could not be put to the person ({outcome}); the session stays in plan mode",
                    code="APPROVAL_UNAVAILABLE")


def make_exit_plan_mode() -> FunctionTool:
    return FunctionTool(
        "exit_plan_mode",
        "In plan mode, present your plan to the person for approval. If they approve, the session switches to "
        "workspace-write and you carry it out; otherwise keep planning. Call it only when the plan is complete.",
        {"type": "object",
         "properties": {"plan": {"type": "string", "description": "The plan, in Markdown: the steps, the files "
                                                                  "each one changes, how to check the result."}},
         "required": ["plan"], "additionalProperties": False},
        _exit_plan_mode, kind="switch_mode",
    )


@hookimpl(trylast=True)  # after the workspace tools: the tool list only grows at its end
def dsh_register_tools(register: Any, host: Host) -> None:
    if "plan" in host.config_for(ControlsConfig).modes:
        register(make_exit_plan_mode())


# --------------------------------------------------------------------------- titles

TITLE_CHARS = 100  # as session/list shows a title
TITLE_ASK_CHARS = 4000  # of the first prompt, sent to the title call
TITLE_WAIT = 10.0  # seconds the first completed turn waits for a title call still running (then the first line)
TITLE_SYSTEM = ("You name conversations. Reply with a title of at most eight words for the request you are "
                "given: plain words, no quotes, no punctuation at the end, no markdown. Nothing else.")
def clean_title(text: str) -> str:
    """One short line a list can show: the first non-empty line, control and bidirectional
    characters dropped, quotes and markdown marks trimmed, at most ``TITLE_CHARS`` characters."""
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    return cut(" ".join(strip_unsafe(line, " ").split()).strip("\"'`*#_ ").rstrip("."), TITLE_CHARS)


class _Titler:
    """A new session's title (its state slot): the first prompt, and the title call's task. The
    call starts with the first turn and runs beside it; the first turn that completes waits for it
    (``dsh_before_stop``) and records the title, so the title is in the log, and on the wire, in
    the same place every run: before that turn's end."""

    def __init__(self) -> None:
        self.first: str | None = None
        self.scope: anyio.CancelScope | None = None
        self.title: tuple[str, str] | None = None  # (title, by) once the call ended
        self.done = anyio.Event()
        self.written = False

    async def aclose(self) -> None:  # the session is disposed: its title call ends with it
        if self.scope is not None:
            self.scope.cancel()
            await self.done.wait()


def _title_event(session: Agent, event: Any) -> None:
    if not isinstance(event, UserMessageEvent) or event.message.source != "user":
        return
    titler = session.state(_Titler)
    if titler.first is not None or len(session.history) > 0:
        return  # titled already, or a resumed session (its log has its title)
    titler.first = "\n".join(b.text for b in event.message.content if isinstance(b, TextBlock))
    titler.scope = anyio.CancelScope()
    session.host.task_group.start_soon(_call_title, session, titler, name=f"title {session.session_id[:8]}")


async def _call_title(session: Agent, titler: _Titler) -> None:
    first = titler.first or ""
    try:
        assert titler.scope is not None
        with titler.scope:
            asked = ""
            if session.host.config_for(ControlsConfig).titles == "model" and first.strip():
                asked = await _ask_title(session, first)
            titler.title = (asked, "model") if asked else (clean_title(first), "prompt")
    finally:
        titler.done.set()


class _WriteTitle:
    """``dsh_before_stop``'s answer on the first completed turn: wait for the title call (it has
    had the whole turn), record the title, let the turn end."""

    def __init__(self, session: Agent, titler: _Titler) -> None:
        self.session, self.titler = session, titler

    async def decide(self) -> None:
        titler = self.titler
        with anyio.move_on_after(TITLE_WAIT):
            await titler.done.wait()
        if titler.written:
            return
        titler.written = True
        title, by = titler.title or (clean_title(titler.first or ""), "prompt")
        if title:
            self.session.emit(SessionTitled(title=title, by=by))  # type: ignore[arg-type]


@hookimpl
def dsh_before_stop(session: Agent, turn: int, step: int, continued: int) -> _WriteTitle | None:
    titler = session.state(_Titler)
    if titler.scope is None or titler.written:
        return None
    return _WriteTitle(session, titler)


async def _ask_title(session: Agent, first: str) -> str:
    """A short call on the session's route: no tools, thinking off where the route allows it, 40
    tokens. Any failure leaves the first line as the title (logged on stderr, never raised)."""
    route = session.route
    request = ModelRequest(
        route=route, system=TITLE_SYSTEM, tools=[], session_id=f"{session.session_id}:title", cwd=session.cwd,
        messages=[UserMessage(id=new_id("msg_"), content=[TextBlock(text=first[:TITLE_ASK_CHARS])])],
        max_output=40, effort="off" if "off" in route.efforts else None)
    pieces: list[str] = []
    try:
        with anyio.fail_after(60):
            async with contextlib.aclosing(session.provider.stream(request)) as deltas:
                async for delta in deltas:
                    if isinstance(delta, TextDelta):
                        pieces.append(delta.text)
    except Exception as exc:  # a provider's failure or bug costs the title, never the session
        log.warning(f"session {session.session_id}: the title call failed ({exc!r}); the first prompt names it")
        return ""
    return clean_title("".join(pieces))


# --------------------------------------------------------------------------- questions to the person

MAX_QUESTIONS = 4
QUESTIONS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"questions": {
        "type": "array", "minItems": 1, "maxItems": MAX_QUESTIONS,
        "description": "One to four questions, asked together in one form.",
        "items": {"type": "object", "properties": {
            "question": {"type": "string", "description": "The whole question, as the person should read it."},
            "header": {"type": "string", "description": "A very short label for it (at most 12 characters)."},
            "options": {"type": "array", "minItems": 2, "maxItems": 6, "description": "Choices, when the answer is one "
                        "of a few (leave out for a free answer).",
                        "items": {"type": "object", "properties": {
                            "label": {"type": "string", "description": "The choice, in a few words."},
                            "description": {"type": "string", "description": "What choosing it means."}},
                            "required": ["label"], "additionalProperties": False}},
            "multi_select": {"type": "boolean", "description": "The person may pick several options."}},
            "required": ["question"], "additionalProperties": False}}},
    "required": ["questions"], "additionalProperties": False,
}


def shown(text: str, limit: int = 2000) -> str:
    """Model-written text as a form shows it to a person: control and bidirectional characters
    (which could make a question read differently from what it says) become spaces; bounded."""
    return cut(strip_unsafe(text, " ").strip(), limit)


def form_of(questions: list[dict[str, Any]]) -> dict[str, Any]:
    """The elicitation form for ``questions``: one field each (``q1``…), a choice when it has
    options (several when ``multi_select``), else free text; every field required. What the model
    wrote is shown through ``shown`` (an option's label is also its value)."""
    properties: dict[str, Any] = {}
    for i, q in enumerate(questions, start=1):
        field: dict[str, Any] = {"title": shown(q.get("header") or q["question"], 200),
                                 "description": shown(q["question"])}
        options = q.get("options") or []
        labels = [shown(o["label"], 200) for o in options]
        if labels and q.get("multi_select"):
            field |= {"type": "array", "items": {"type": "string", "enum": labels}, "minItems": 1}
        elif labels:
            field |= {"type": "string", "oneOf": [
                {"const": label, "title": label, **({"description": shown(o["description"], 500)}
                                                     if isinstance(o.get("description"), str) and o["description"] else {})}
                for label, o in zip(labels, options, strict=True)]}
        else:
            field |= {"type": "string"}
        properties[f"q{i}"] = field
    return {"type": "object", "properties": properties, "required": list(properties)}


def _questions(args: dict[str, Any]) -> list[dict[str, Any]]:
    qs = args.get("questions")
    if not isinstance(qs, list) or not 1 <= len(qs) <= MAX_QUESTIONS:
        raise ToolError(f"questions must be a list of 1 to {MAX_QUESTIONS} questions", code="INVALID_ARGUMENTS")
    for i, q in enumerate(qs):
        if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not q["question"].strip():
            raise ToolError(f"questions[{i}].question must be the question's text", code="INVALID_ARGUMENTS")
        options = q.get("options") or []
        if not isinstance(options, list) or not all(isinstance(o, dict) and isinstance(o.get("label"), str)
                                                    and o["label"].strip() for o in options):
            raise ToolError(f"questions[{i}].options must be objects with a label", code="INVALID_ARGUMENTS")
        if len({shown(o["label"], 200) for o in options}) != len(options):
            raise ToolError(f"questions[{i}].options has two options with one label", code="INVALID_ARGUMENTS")
    return qs


async def _ask_user_question(args: dict[str, Any], ctx: ToolContext) -> str:
    questions = _questions(args)
    asker = ctx.agent.spec.questions
    if asker is None:  # the tool is published only with an asker; a stale call after it went away
        raise ToolError("no person can be asked here", code="UNAVAILABLE")
    message = shown(questions[0]["question"]) if len(questions) == 1 else f"{len(questions)} questions from the agent"
    action, answers = await asker.ask(message, form_of(questions), call_id=ctx.call_id)
    if action == "decline":
        return "The person declined to answer. Do not ask again; go on with your best judgement, or stop and say why."
    if action != "accept":
        return "The question was dismissed without an answer (cancelled). Go on with your best judgement, or stop."
    lines = []
    for i, q in enumerate(questions, start=1):
        answer = answers.get(f"q{i}")
        said = ", ".join(map(str, answer)) if isinstance(answer, list) else ("(no answer)" if answer in (None, "")
                                                                           else str(answer))
        lines.append(f"- {q['question']}\n  → {said}")
    return "The person answered:\n" + "\n".join(lines)


ASK_TOOL = FunctionTool(
    "ask_user_question",
    "Ask the person one to four questions in a form their editor shows, and wait for the answers. Use it when a "
    "choice is theirs to make (an approach, a name, a trade-off) or a requirement is unclear; give options when "
    "the answer is one of a few. Do not use it for permission to run a tool (that is asked for you).",
    QUESTIONS_SCHEMA, _ask_user_question, kind="think",
)


class _AskSource:
    """``ask_user_question`` for a session whose front door can ask its person (``AgentSpec.questions``)."""

    name = "session-controls"

    async def serve(self, session: Agent, ready: Any) -> None:
        session.publish_tools(self.name, [ASK_TOOL])
        ready()


@hookimpl
def dsh_session_tools(session: Agent, host: Host) -> _AskSource | None:
    # a subagent never asks the person directly (the original's user-questions guard): its parent does
    if session.spec.questions is None or session.spec.parent is not None:
        return None
    return _AskSource()


# --------------------------------------------------------------------------- commands


def context_used(session: Agent) -> int | None:
    """Tokens in context after the session's last model call (its prompt plus its answer), or as
    compaction counted them after it rewrote the history."""
    return session.state(_Metered).tokens


class _Servers(dict[str, str]):
    """The session's MCP servers as their last event left them (name -> what /status says)."""


class _Metered:
    def __init__(self) -> None:
        self.tokens: int | None = None


@hookimpl
def dsh_session_event(session: Agent, event: Any) -> None:
    if isinstance(event, UserMessageEvent):
        _title_event(session, event)
    elif isinstance(event, AssistantMessageEvent) and event.usage is not None:
        session.state(_Metered).tokens = event.usage.input_tokens + event.usage.output_tokens
    elif isinstance(event, CompactionSummary):  # the policy's own count of what is left
        session.state(_Metered).tokens = event.tokens_after
    elif isinstance(event, McpConnected):
        how = {None: "", "none": "; unconfined: no sandbox", "danger-full-access":
               "; unconfined: the session runs in danger-full-access"}.get(event.confinement, f"; confined: {event.confinement}")
        session.state(_Servers)[event.server] = f"connected ({event.transport}, {event.tools} tools{how})"
    elif isinstance(event, McpFailed):
        why = cut(strip_unsafe(event.error, " ").replace("\n", " "), 500)
        then = f"; next try in {event.retry_in:g} s" if event.retry_in is not None else "; its tools are gone"
        session.state(_Servers)[event.server] = f"**failed** ({event.transport}): {why}{then}"


async def _status(session: Agent, text: str) -> CommandResult:
    route = session.route
    describe = getattr(session.host.confinement, "describe", None)
    sandbox = await describe(session) if describe is not None else "no sandbox plugin"
    used = context_used(session)
    window = route.context_window
    context = (f"{used:,} of {window:,} tokens ({used / window:.0%})" if used is not None
               else f"no model call yet (window {window:,} tokens)")
    effort = session.settings.effort or route.effort
    rows = [
        ("Session", code(session.session_id)),
        ("Workspace", code(session.cwd)),
        ("Route", code(f"{route.provider}/{route.model}") + (f" (thinking: {effort})" if effort else "")),
        ("Mode", f"{current_mode(session) or 'none'} — sandbox {sandbox}"),
        ("Context", context),
        *([("Auto-compact", auto.current)] if (auto := _auto_compact(session)) is not None else []),
        ("Tools", str(len(session.tools))),
    ]
    rows += [(f"MCP server {code(name)}", state) for name, state in session.state(_Servers).items()]
    # Markdown, one list item per line: editors render the reply as Markdown, where single
    # newlines fold into one paragraph.
    return CommandResult(reply="\n".join(f"- **{name}:** {value}" for name, value in rows))


def code(text: str) -> str:
    """``text`` as a Markdown code span, whatever backticks it holds."""
    text = strip_unsafe(text, " ")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


async def _init(session: Agent, text: str) -> CommandResult:
    return CommandResult(prompt=INIT + (f"\n\nAlso: {text}" if text else ""))


@hookimpl
def dsh_slash_commands(session: Agent, host: Host) -> list[SlashCommand]:
    return [
        SlashCommand(name="status", description="Show the route, mode, sandbox, context used and session id",
                     run=_status),
        SlashCommand(name="init", description="Write AGENTS.md for this workspace (a turn of the model)",
                     run=_init, hint="anything the guide should cover"),
    ]


__all__ = ["ControlsConfig", "current_mode", "make_exit_plan_mode"]
