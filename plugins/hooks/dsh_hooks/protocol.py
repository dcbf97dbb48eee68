"""The dialect-neutral core of command hooks, shared by ``hooks-claude-code`` and ``hooks-codex``.

Codex's hook files are a deliberate subset of Claude Code's protocol: the same matcher groups,
the same exit-code and stdout contract, the same command execution. So the core lives here, in
the Claude Code distribution, and ``dsh-hooks-codex`` depends on it; each dialect only says how
its files are named and keyed, how its payloads look, and which decisions it honours.

What is shared:

- **config**: ``{"hooks": {Event: [{"matcher": …, "hooks": [{"type": "command", "command": …,
  "timeout": seconds}]}]}}`` (or the bare event map). Only ``command`` hooks run (others are
  skipped with one warning). A file that cannot be read or parsed, or whose matcher is not a
  valid regex, is rejected *whole* (one warning naming the file, event and pattern).
- **matchers**: absent, ``""`` and ``"*"`` match every tool; otherwise an unanchored regex
  (Claude Code also reads a pure ``[A-Za-z0-9_|]+`` pattern as exact names separated by ``|``).
- **running**: ``/bin/sh -c COMMAND`` in the session's cwd, confined exactly like the session's
  ``bash`` (sandbox-tools' ``confine``: the session's permission tier, its writable roots, the
  scrubbed environment). A hook is the user's own command, but its file may arrive with the
  repository, so it gets no more than the agent's own commands get — never an approval's
  escalation. Own process group; killed (group-wide) at its timeout (default 10 minutes), when
  the turn is cancelled, and whatever it left running is killed when it exits. The JSON payload
  goes to stdin; stdout and stderr are read to the end but only ``output-limit`` bytes are kept.
- **decoding**: exit 0 → stdout JSON is read (``decision`` approve/block, ``reason``,
  ``continue``, ``stopReason``, ``systemMessage``, ``hookSpecificOutput`` with
  ``permissionDecision`` allow/deny/ask, ``permissionDecisionReason``, ``additionalContext``) —
  fields under a ``hookSpecificOutput`` naming another event are ignored; exit 2 → block with
  stderr as the reason; anything else (or no exit: timeout, cancel, no sandbox) is a non-blocking
  error.
- **folding**: hooks of one point run serially in file order; deny > ask > allow, the reasons of
  the winning decision joined by blank lines, context texts in order; ``continue: false`` from
  any hook halts the turn after that point (the spine's ``halt``, which wins over every
  decision), with the first halting hook's ``stopReason`` for the user.
- **not honoured**: ``updatedInput`` and ``systemMessage`` (as in the original harness): one
  warning per hook file and field, the first time a hook of that file returns it.
- **records**: a ``hook/invoked`` and a ``hook/result`` durable event per hook run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.abc
import msgspec
from msgspec import Meta

from dsh_core import hookimpl
from dsh_core.config import PluginConfig
from dsh_core.config import decode as decode_config
from dsh_core.errors import DshError
from dsh_core.interception import (
    BLOCKED_PROMPT,
    BLOCKED_RESULT,
    BLOCKED_STOP,
    BLOCKED_TOOL,
    BeforeStop,
    BeforeTool,
    PromptSubmit,
    SessionStart,
)
from dsh_core.types import AfterTool, AssistantMessage, HookInvoked, HookResult, TextBlock

POINTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop")
MATCHED = frozenset({"SessionStart", "PreToolUse", "PostToolUse"})  # the others have no matcher subject
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_OUTPUT_LIMIT = 1024 * 1024  # bytes kept of each of stdout and stderr
CONTEXT_LIMIT = 10_000  # characters of one hook's context the model may see
STDERR_SUMMARY = 500  # characters of stderr kept in hook/result
BLOCKING_EXIT = 2

_LITERAL = re.compile(r"^[A-Za-z0-9_|]+$")


# --------------------------------------------------------------------------- config


class HookConfigError(Exception):
    """A hook file that is rejected whole."""


@dataclass(frozen=True)
class CommandHook:
    command: str
    timeout_s: float | None = None


@dataclass(frozen=True)
class Group:
    matcher: str | None
    hooks: tuple[CommandHook, ...]


@dataclass
class HookFile:
    path: str
    points: dict[str, list[Group]] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)  # unsupported output fields already warned about


def matcher_problem(pattern: str | None, literal: bool) -> str | None:
    """Why ``pattern`` cannot be used (None: it can)."""
    if pattern in (None, "", "*") or (literal and _LITERAL.match(pattern or "")):
        return None
    try:
        re.compile(pattern or "")
    except re.error as exc:
        return f"invalid matcher regex {json.dumps(pattern)} ({exc})"
    return None


def matches(pattern: str | None, query: str, literal: bool) -> bool:
    if pattern in (None, "", "*"):
        return True
    assert pattern is not None
    if literal and _LITERAL.match(pattern):
        return query in pattern.split("|")
    try:
        return re.search(pattern, query) is not None
    except re.error:  # parse rejects these; a direct caller still gets no match, not a crash
        return False


@dataclass(frozen=True)
class Dialect:
    """What differs between hook dialects. Subclass and override the payload methods."""

    name: str  # "claude-code" | "codex": the ``dialect`` of hook/* records
    plugin: str  # the plugin (config key) name
    events: Mapping[str, str]  # a key in the file -> one of POINTS
    literal_matchers: bool
    trailing_newline: bool
    honours_ask: bool  # PreToolUse ask/allow (Codex honours only blocks)
    stdout_context: frozenset[str]  # points where plain (non-JSON) stdout on exit 0 is context
    project_files: tuple[str, ...]  # default per-session files, relative to the session's cwd
    config_type: type[HookConfig]  # the dialect's own [config.<plugin>] Struct (a HookConfig subclass)

    def hook_entry(self, raw: Mapping[str, Any]) -> CommandHook | str | None:
        """A runnable hook, a reason it is skipped, or None (malformed: ignored)."""
        kind = raw.get("type", "command")
        if kind != "command":
            return f'"{kind}" hook'
        if not isinstance(raw.get("command"), str):
            return None
        timeout = raw.get("timeout")
        return CommandHook(raw["command"], float(timeout) if isinstance(timeout, int | float) and timeout > 0 else None)

    def command(self, hook: CommandHook, session: Any, project_dir: str) -> str:
        return hook.command

    def env(self, session: Any, project_dir: str) -> dict[str, str]:
        return {}

    def payload(self, point: str, session: Any, turn: int, fields: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


def parse_hooks(raw: Any, path: str, dialect: Dialect) -> tuple[HookFile, list[str]]:
    """Parse one hook file's JSON value. Raises ``HookConfigError`` (the whole file is rejected);
    returns the file and the skipped hooks' descriptions."""
    if not isinstance(raw, dict):
        raise HookConfigError("the file is not a JSON object")
    table = raw.get("hooks", raw)  # a settings file's "hooks" key, or the bare event map
    if not isinstance(table, dict):
        raise HookConfigError('"hooks" is not an object')
    out = HookFile(path=path)
    skipped: list[str] = []
    for key, groups in table.items():
        point = dialect.events.get(key)
        if point is None:
            continue  # an event this bridge does not map: ignored, it cannot invalidate the file
        if not isinstance(groups, list):
            raise HookConfigError(f"event {key}: expected a list of matcher groups")
        for group in groups:
            if not isinstance(group, dict) or not isinstance(group.get("hooks"), list):
                raise HookConfigError(f"event {key}: a matcher group needs a \"hooks\" list")
            hooks: list[CommandHook] = []
            for entry in group["hooks"]:
                parsed = dialect.hook_entry(entry) if isinstance(entry, dict) else None
                if isinstance(parsed, CommandHook):
                    hooks.append(parsed)
                elif isinstance(parsed, str):
                    skipped.append(f"{parsed} on {key}")
            if not hooks:
                continue
            matcher = group.get("matcher") if point in MATCHED else None
            if matcher is not None and not isinstance(matcher, str):
                raise HookConfigError(f"event {key}: matcher {json.dumps(matcher)} is not a string")
            problem = matcher_problem(matcher, dialect.literal_matchers)
            if problem:
                raise HookConfigError(f"event {key}: {problem}")
            out.points.setdefault(point, []).append(Group(matcher or None, tuple(hooks)))
    return out, skipped


def load_hook_file(path: str, dialect: Dialect) -> HookFile | None:
    """Read and parse ``path``; on any failure one warning naming the file, and None."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        hook_file, skipped = parse_hooks(raw, path, dialect)
    except (OSError, UnicodeDecodeError, ValueError, HookConfigError) as exc:
        logging.getLogger(f"dsh.{dialect.plugin}").warning(f"hook file {path} rejected, none of its hooks run: {exc}")
        return None
    if skipped:
        logging.getLogger(f"dsh.{dialect.plugin}").warning(f"{path}: only command hooks run; skipped " + ", ".join(skipped))
    return hook_file


# --------------------------------------------------------------------------- running


@dataclass
class HookOutput:
    """One hook run, decoded (dialect-neutral)."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    decision: str | None = None  # approve | block | allow | deny | ask
    reason: str | None = None
    cont: bool | None = None
    stop_reason: str | None = None
    system_message: str | None = None
    context: str | None = None
    updated_input: dict[str, Any] | None = None
    duration_ms: int = 0


def decode(exit_code: int | None, stdout: str, stderr: str, event: str | None) -> HookOutput:
    out = HookOutput(exit_code=exit_code, stdout=stdout.strip(), stderr=stderr.strip())
    if exit_code == BLOCKING_EXIT:
        out.decision = "block"
        out.reason = out.stderr or None
    if exit_code != 0 or not out.stdout.startswith("{"):
        return out
    try:
        data = json.loads(out.stdout)
    except ValueError:
        return out  # not JSON after all: plain stdout
    if not isinstance(data, dict):
        return out
    if isinstance(data.get("continue"), bool):
        out.cont = data["continue"]
    for key, attr in (("stopReason", "stop_reason"), ("systemMessage", "system_message"), ("reason", "reason")):
        if isinstance(data.get(key), str):
            setattr(out, attr, data[key])
    if data.get("decision") in ("approve", "block"):  # allow/deny/ask belong to permissionDecision only
        out.decision = data["decision"]
    specific = data.get("hookSpecificOutput")
    if isinstance(specific, dict) and (event is None or specific.get("hookEventName") == event):
        if specific.get("permissionDecision") in ("allow", "deny", "ask"):
            out.decision = specific["permissionDecision"]
        if isinstance(specific.get("permissionDecisionReason"), str):
            out.reason = specific["permissionDecisionReason"]
        if isinstance(specific.get("additionalContext"), str):
            out.context = specific["additionalContext"]
        if isinstance(specific.get("updatedInput"), dict):
            out.updated_input = specific["updatedInput"]
    return out


async def run_command(
    command: str, *, session: Any, cwd: str, stdin: bytes, env: Mapping[str, str], timeout_s: float,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
) -> tuple[int | None, str, str, bool]:
    """Run ``command`` with ``/bin/sh -c``, confined like the session's bash, through the spine's
    ``Confinement`` seam (the session's warm command server: no launcher per hook). Returns
    (exit code or None, stdout, stderr, timed out). Cancellation kills everything it started."""
    confinement = session.host.confinement
    if confinement is None:
        raise DshError("no plugin provides confinement (mount sandbox-tools); a hook never runs unconfined")
    done = await confinement.run(["/bin/sh", "-c", command], session=session, cwd=cwd, stdin=stdin, env=env,
                                 timeout_s=timeout_s, output_limit=output_limit)
    code = done.exit_code
    if code is not None and code < 0:
        code = None  # died by a signal: no exit code to act on
    return code, done.stdout, done.stderr, done.timed_out


# --------------------------------------------------------------------------- folding


@dataclass
class Merged:
    decision: str | None = None  # deny | ask | allow | None
    reason: str | None = None
    stop: bool = False
    stop_reason: str | None = None
    context: list[str] = field(default_factory=list)


_RANK = {"block": 3, "deny": 3, "ask": 2, "allow": 1, "approve": 1}


def merge(outputs: Iterable[HookOutput]) -> Merged:
    merged = Merged()
    top = 0
    reasons: dict[int, list[str]] = {}
    for o in outputs:
        rank = _RANK.get(o.decision or "", 0)
        top = max(top, rank)
        if rank >= 2 and o.reason:
            reasons.setdefault(rank, []).append(o.reason)
        if o.cont is False and not merged.stop:
            merged.stop, merged.stop_reason = True, o.stop_reason
        if o.context:
            merged.context.append(_bounded(o.context))
    merged.decision = {3: "deny", 2: "ask", 1: "allow"}.get(top)
    merged.reason = "\n\n".join(reasons.get(top, [])) or None
    return merged


def _halt(m: Merged) -> dict[str, Any]:
    """``continue: false`` as the spine's ``halt`` (its ``stopReason`` is for the user)."""
    return {"halt": True, "halt_reason": m.stop_reason} if m.stop else {}


def _bounded(text: str) -> str:
    if len(text) <= CONTEXT_LIMIT:
        return text
    return text[:CONTEXT_LIMIT] + f"\n[… hook output truncated: {len(text) - CONTEXT_LIMIT} more characters]"


def _summary(stderr: str) -> str | None:
    text = stderr.strip()
    if not text:
        return None
    return text if len(text) <= STDERR_SUMMARY else text[:STDERR_SUMMARY] + "…"


# --------------------------------------------------------------------------- the bridge


class HookConfig(PluginConfig):
    """A hook plugin's table (each dialect declares its own subclass, so each has its own slot)."""

    files: Annotated[list[str] | str, Meta(description="process-level hook files (absolute, or relative to dsh's cwd)")] = (
        msgspec.field(default_factory=list))
    project_files: Annotated[list[str] | None, Meta(
        description="per-session hook files under the session's cwd (default: the dialect's own)")] = None
    default_timeout: Annotated[float, Meta(gt=0, description="seconds a hook may run when its file sets no timeout")] = (
        DEFAULT_TIMEOUT_S)
    output_limit: Annotated[int, Meta(ge=1024, description="bytes of a hook's stdout and of its stderr kept")] = (
        DEFAULT_OUTPUT_LIMIT)
    project_dir: Annotated[str | None, Meta(description="CLAUDE_PROJECT_DIR (default: the session's cwd)")] = None


@dataclass
class Settings:
    files: list[str]  # process-level hook files (the example's config)
    project_files: list[str]  # per-session files under the session's cwd
    default_timeout_s: float = DEFAULT_TIMEOUT_S
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    project_dir: str | None = None

    @classmethod
    def from_typed(cls, config: HookConfig, dialect: Dialect) -> Settings:
        files = [config.files] if isinstance(config.files, str) else config.files
        project = list(dialect.project_files) if config.project_files is None else config.project_files
        return cls(files=[os.path.abspath(f) for f in files], project_files=project,
                   default_timeout_s=float(config.default_timeout), output_limit=config.output_limit,
                   project_dir=config.project_dir)

    @classmethod
    def from_config(cls, table: Mapping[str, Any] | None, dialect: Dialect) -> Settings:
        """Settings from a raw table (ConfigError naming the key when it is bad)."""
        return cls.from_typed(decode_config(dialect.plugin, dialect.config_type, table, where="example"), dialect)


@dataclass
class _SessionState:
    files: list[HookFile]
    counter: int = 0
    points: frozenset[str] = frozenset()  # the points any of the files has hooks for

    def __post_init__(self) -> None:
        self.points = frozenset(p for f in self.files for p, groups in f.points.items() if groups)


class HookSessions(dict[str, _SessionState]):
    """A session's hook state by dialect name (the session's state slot, dropped with it)."""


class HookBridges(dict[str, "Bridge"]):
    """A host's Bridge by dialect name (the host's state slot): two hosts in one process keep
    their own configuration, and a disposed host takes its Bridges with it."""


class Bridge:
    """One dialect's hooks for one host: the process-level files, parsed once, plus each
    session's project files, parsed when the session first needs them."""

    def __init__(self, dialect: Dialect, settings: Settings) -> None:
        self.dialect = dialect
        self.settings = settings
        self.global_files = [f for f in (load_hook_file(p, dialect) for p in settings.files) if f]

    def state(self, session: Any) -> _SessionState:
        sessions: HookSessions = session.state(HookSessions)
        st = sessions.get(self.dialect.name)
        if st is None:
            files = list(self.global_files)
            for rel in self.settings.project_files:
                path = os.path.join(session.cwd, rel)
                if os.path.isfile(path) and os.path.abspath(path) not in self.settings.files:
                    loaded = load_hook_file(path, self.dialect)
                    if loaded:
                        files.append(loaded)
            st = sessions[self.dialect.name] = _SessionState(files)
        return st

    def selected(self, session: Any, point: str, query: str) -> list[tuple[HookFile, Group]]:
        st = self.state(session)
        if point not in st.points:  # the usual case: no hook of this point at all
            return []
        return [(f, g) for f in st.files for g in f.points.get(point, [])
                if matches(g.matcher, query, self.dialect.literal_matchers)]

    def project_dir(self, session: Any) -> str:
        return self.settings.project_dir or session.cwd

    async def run_point(self, session: Any, point: str, selected: list[tuple[HookFile, Group]], turn: int,
                        fields: dict[str, Any]) -> Merged:
        st = self.state(session)
        d = self.dialect
        payload = json.dumps(d.payload(point, session, turn, fields)) + ("\n" if d.trailing_newline else "")
        project_dir = self.project_dir(session)
        env = d.env(session, project_dir)
        outputs: list[HookOutput] = []
        for hook_file, group in selected:
            for hook in group.hooks:
                st.counter += 1
                handler = f"{d.name}:{point}:{st.counter}"
                session.emit(HookInvoked(turn=turn, point=point, dialect=d.name, handler_id=handler,
                                         matcher=group.matcher, source=hook_file.path))
                started = time.monotonic()
                try:
                    code, stdout, stderr, timed_out = await run_command(
                        d.command(hook, session, project_dir), session=session, cwd=session.cwd,
                        stdin=payload.encode(), env=env, timeout_s=hook.timeout_s or self.settings.default_timeout_s,
                        output_limit=self.settings.output_limit)
                except anyio.get_cancelled_exc_class():
                    session.emit(HookResult(turn=turn, point=point, handler_id=handler, decision="cancelled",
                                            duration_ms=int((time.monotonic() - started) * 1000)))
                    raise
                except Exception as exc:  # it could not start (no sandbox, no /bin/sh): a non-blocking error
                    logging.getLogger(f"dsh.{d.plugin}").warning(f"{point} hook could not run: {exc}")
                    code, stdout, stderr, timed_out = None, "", str(exc), False
                out = decode(code, stdout, stderr, point)
                out.timed_out = timed_out
                if timed_out:
                    out.stderr = (out.stderr + f"\n[killed: timed out after {hook.timeout_s or self.settings.default_timeout_s:g}s]").strip()
                if (point in d.stdout_context and code == 0 and out.context is None and out.stdout
                        and not out.stdout.startswith("{")):
                    out.context = out.stdout
                self._warn_unsupported(hook_file, point, out)
                outputs.append(out)
                recorded = "stop" if out.cont is False else out.decision or "pass"
                session.emit(HookResult(turn=turn, point=point, handler_id=handler, decision=recorded,
                                        exit_code=code, stderr_summary=_summary(out.stderr),
                                        duration_ms=int((time.monotonic() - started) * 1000), timed_out=timed_out,
                                        stop_reason=out.stop_reason if out.cont is False else None))
        return merge(outputs)

    def _warn_unsupported(self, hook_file: HookFile, point: str, out: HookOutput) -> None:
        for name, given in (("updatedInput", out.updated_input is not None), ("systemMessage", bool(out.system_message))):
            if given and name not in hook_file.warned:
                hook_file.warned.add(name)
                logging.getLogger(f"dsh.{self.dialect.plugin}").warning(f"{hook_file.path}: a {point} hook returned {name}, which dsh does not "
                     "honour (ignored; not warned again for this file)")

    # ---------------------------------------------------------------- the interception points

    def _pending(self, session: Any, point: str, query: str, turn: int, fields: Callable[[], dict[str, Any]],
                 mapper: Callable[[Merged], Any]) -> _Pending | None:
        """A decision to await when a hook of ``point`` matches ``query``, else None. ``fields``
        (the payload's point-specific part) is built only then: most prompts run no hook, and a
        Stop payload walks the history (bench/profile_prompt.py)."""
        selected = self.selected(session, point, query)
        if not selected:
            return None
        return _Pending(self, session, point, selected, turn, fields(), mapper)

    def session_start(self, session: Any, source: str, turn: int) -> _Pending | None:
        return self._pending(session, "SessionStart", source, turn, lambda: {"source": source},
                             lambda m: SessionStart(context=m.context, **_halt(m)) if m.context or m.stop else None)

    def prompt_submit(self, session: Any, messages: list[Any], turn: int) -> _Pending | None:
        if "UserPromptSubmit" not in self.state(session).points:  # no hook of this point: nothing to build
            return None

        def fields() -> dict[str, Any]:
            return {"prompt": "\n".join(b.text for m in messages for b in m.content if isinstance(b, TextBlock))}

        def decided(m: Merged) -> PromptSubmit:
            if m.decision == "deny":
                return PromptSubmit(block=m.reason or BLOCKED_PROMPT, **_halt(m))
            return PromptSubmit(context=m.context, **_halt(m))

        return self._pending(session, "UserPromptSubmit", "", turn, fields, decided)

    def before_tool(self, session: Any, name: str, args: dict[str, Any], call_id: str, turn: int) -> _Pending | None:
        if "PreToolUse" not in self.state(session).points:  # no hook of this point: nothing to build
            return None
        honours_ask = self.dialect.honours_ask

        def decided(m: Merged) -> BeforeTool | None:
            if m.decision == "deny":
                return BeforeTool(decision="deny", reason=m.reason or BLOCKED_TOOL, **_halt(m))
            if m.decision in ("ask", "allow") and honours_ask:
                return BeforeTool(decision=m.decision, reason=m.reason, **_halt(m))  # type: ignore[arg-type]
            return BeforeTool(**_halt(m)) if m.stop else None

        return self._pending(session, "PreToolUse", name, turn,
                             lambda: {"tool_name": name, "tool_input": args, "tool_use_id": call_id}, decided)

    def after_tool(self, session: Any, call: Any, output: Any, turn: int) -> _Pending | None:
        if "PostToolUse" not in self.state(session).points:  # no hook of this point: nothing to build
            return None

        def fields() -> dict[str, Any]:
            try:
                args = json.loads(call.arguments) if call.arguments.strip() else {}
            except ValueError:
                args = {}
            response = "\n".join(b.text for b in output.content if isinstance(b, TextBlock))
            return {"tool_name": call.name, "tool_input": args if isinstance(args, dict) else {},
                    "tool_use_id": call.id, "tool_response": response}

        def decided(m: Merged) -> AfterTool:
            if m.decision == "deny":
                return AfterTool(block=m.reason or BLOCKED_RESULT, context=m.context, **_halt(m))
            return AfterTool(context=m.context, **_halt(m))

        return self._pending(session, "PostToolUse", call.name, turn, fields, decided)

    def before_stop(self, session: Any, turn: int, continued: int) -> _Pending | None:
        if "Stop" not in self.state(session).points:  # no hook of this point: nothing to build
            return None

        def fields() -> dict[str, Any]:
            last = ""
            history = getattr(session, "history", [])
            for i in range(len(history) - 1, -1, -1):  # the latest assistant message, without copying
                message = history[i]
                if isinstance(message, AssistantMessage):
                    last = "".join(b.text for b in message.content if isinstance(b, TextBlock))
                    break
            return {"stop_hook_active": continued > 0, "last_assistant_message": last}

        def decided(m: Merged) -> BeforeStop | None:
            if m.decision == "deny":
                return BeforeStop(block=m.reason or BLOCKED_STOP, **_halt(m))
            return BeforeStop(**_halt(m)) if m.stop else None

        return self._pending(session, "Stop", "", turn, fields, decided)


class _Pending:
    def __init__(self, bridge: Bridge, session: Any, point: str, selected: list[tuple[HookFile, Group]], turn: int,
                 fields: dict[str, Any], mapper: Callable[[Merged], Any]) -> None:
        self.bridge, self.session, self.point, self.selected = bridge, session, point, selected
        self.turn, self.fields, self.mapper = turn, fields, mapper

    async def decide(self) -> Any:
        merged = await self.bridge.run_point(self.session, self.point, self.selected, self.turn, self.fields)
        return self.mapper(merged)


def transcript_path(session: Any) -> str | None:
    path = getattr(getattr(session, "log", None), "path", None)
    return str(path) if path is not None else None


class DialectPlugin:
    """One dialect's pluggy plugin (the object its entry point names): the spine's interception
    points, each answered by the host's ``Bridge``. ``dsh_configure`` makes one Bridge per host,
    kept in the host's ``HookBridges`` slot."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        # The last host asked about and its Bridge: the interception points run on every prompt
        # (weak: a closed host is not kept alive by the plugin object).
        self._last: tuple[weakref.ref[Any], Bridge | None] | None = None

    def _bridge(self, session: Any) -> Bridge | None:
        host = session.host
        last = self._last
        if last is not None and last[0]() is host:
            return last[1]
        bridges: HookBridges = host.state(HookBridges)
        bridge = bridges.get(self.dialect.name)
        self._last = (weakref.ref(host), bridge)
        return bridge

    def _at(self, session: Any, point: str) -> Bridge | None:
        """The host's Bridge when ``session`` has a hook of ``point``, else None (the usual case),
        read off the session's hook state before any Bridge method is called: three calls per
        point and dialect where six were made (eight points a tool turn, bench/profile_prompt.py --bash)."""
        st = session.state(HookSessions).get(self.dialect.name)
        if st is not None and point not in st.points:
            return None
        b = self._bridge(session)
        return b if b is not None and point in b.state(session).points else None

    @hookimpl
    def dsh_configure(self, config: Mapping[str, Mapping[str, Any]], host: Any) -> None:
        settings = Settings.from_typed(host.config_for(self.dialect.config_type), self.dialect)
        host.state(HookBridges)[self.dialect.name] = Bridge(self.dialect, settings)
        self._last = None

    @hookimpl
    def dsh_config_type(self) -> tuple[str, type[PluginConfig]]:
        return self.dialect.plugin, self.dialect.config_type

    @hookimpl
    def dsh_session_start(self, session: Any, source: str, turn: int) -> Any:
        b = self._bridge(session)
        return b.session_start(session, source, turn) if b else None

    @hookimpl
    def dsh_prompt_submit(self, session: Any, messages: list[Any], turn: int) -> Any:
        b = self._at(session, "UserPromptSubmit")
        return b.prompt_submit(session, messages, turn) if b else None

    @hookimpl
    def dsh_before_tool(self, session: Any, name: str, args: dict[str, Any], call_id: str, turn: int, step: int) -> Any:
        b = self._at(session, "PreToolUse")
        return b.before_tool(session, name, args, call_id, turn) if b else None

    @hookimpl
    def dsh_after_tool(self, session: Any, call: Any, output: Any) -> Any:
        b = self._at(session, "PostToolUse")
        return b.after_tool(session, call, output, session.turn) if b else None

    @hookimpl
    def dsh_before_stop(self, session: Any, turn: int, step: int, continued: int) -> Any:
        b = self._at(session, "Stop")
        return b.before_stop(session, turn, continued) if b else None
