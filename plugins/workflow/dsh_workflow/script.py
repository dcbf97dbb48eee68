"""``workflow {script, meta, args}``: a model-written orchestration script.

The script is the body of an async Python function (top-level ``await``, ending ``return <JSON
value>``) run in the code runtime (``dsh_code_runtime``, code-mode's confined Python), narrowed
to read-only and without internet sockets: it writes nothing and reaches no server; the agents
it starts do the work. Its hooks:

- ``await agent(prompt, *, schema=None, label=None, phase=None, provider=None, model=None)``: a
  fresh one-shot child; its final text, or the JSON value it answered checked against
  ``schema``, or None when it failed;
- ``await parallel(thunks)``: the results of zero-argument callables, run side by side;
- ``await pipeline(items, *stages)``: each item through the stages in turn, items side by side;
- ``phase(title)``, ``log(message)``: recorded in the session log; ``args``: the call's ``args``.

``meta`` is checked as the original harness checks it (every violation named). Caps on total
agents, on agents at once and on items per ``parallel``/``pipeline`` call; a misused hook or a
tripped cap ends the script with a clear error. Cancelling the call cancels every member.
``workflow/start``, each ``workflow/member`` and ``workflow/end`` go to the session log. The
result is ``workflow "<name>" completed (N agents).`` and the return value as JSON, capped."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable
from typing import Any

import anyio

from dsh_core import ToolError
from dsh_core.display import one_line
from dsh_core.errors import CodeCallError
from dsh_core.protocols import ToolContext
from dsh_core.types import CodeRunResult, Note, ToolOutput

from .members import Caps, Members, Tripped

HOOKS = ("agent", "phase", "log", "cap")
_PRELUDE = '''import asyncio as __asyncio
import json as __json
args = __json.loads({args!r})
async def __items(hook, items):
    items = list(items)
    if len(items) > {max_items}:
        await tools.cap(hook=hook, items=len(items))
    return items
async def agent(prompt, *, schema=None, label=None, phase=None, provider=None, model=None):
    return await tools.agent(prompt=prompt, schema=schema, label=label, phase=phase, provider=provider, model=model)
async def parallel(thunks):
    thunks = await __items("parallel", thunks)
    if not all(callable(t) for t in thunks):
        raise TypeError("parallel() takes zero-argument callables, e.g. [lambda: agent('a'), lambda: agent('b')]")
    return list(await __asyncio.gather(*[t() for t in thunks]))
async def pipeline(items, *stages):
    async def __one(item):
        for stage in stages:
            item = await stage(item)
        return item
    return list(await __asyncio.gather(*[__one(i) for i in await __items("pipeline", items)]))
def phase(title):
    tools.phase(title=str(title))
def log(message):
    tools.log(message=str(message))
'''
_LINE = re.compile(r"\bline (\d+)")


def program(script: str, args: Any, max_items: int = 4096) -> tuple[str, int]:
    """The program the runtime runs (the hooks, then the script) and how many lines precede the script."""
    prelude = _PRELUDE.format(args=json.dumps(args, ensure_ascii=False), max_items=max_items)
    return prelude + script, prelude.count("\n")


class Hooks:
    """``CodeBindings`` of a workflow run: ``agent``, ``phase``, ``log`` (and ``cap``, the
    prelude's item check); a misuse or a cap
    trips the run (``tripped``, and the runtime is told to abort)."""

    names = HOOKS

    def __init__(self, members: Members, abort: anyio.Event) -> None:
        self.members = members
        self.abort = abort
        self.tripped: str | None = None
        self.phase: str | None = None

    def call(self, name: str, args: dict[str, Any], arguments: str | None = None) -> Awaitable[Any]:
        if name == "phase":
            self.phase = one_line(str(args.get("title", "")), 200)
            self.members.ctx.emit(Note(kind="workflow/phase", data={"title": self.phase}))
            return self._done(None)
        if name == "log":
            self.members.ctx.emit(Note(kind="workflow/log", data={"message": str(args.get("message", ""))[:4000]}))
            return self._done(None)
        if name == "cap":  # the prelude's parallel()/pipeline() got more items than the cap
            return self._raise(self._trip(
                f"{args.get('hook')}() received {args.get('items')} items — over the per-call cap "
                f"({self.members.caps.max_items}); split the work or raise max-items in [config.workflow]"))
        return self._agent(args)

    async def _done(self, value: Any) -> Any:
        return value

    async def _raise(self, error: Exception) -> Any:
        raise error

    def _trip(self, message: str) -> CodeCallError:
        if self.tripped is None:
            self.tripped = message
            self.abort.set()
        return CodeCallError("agent", message, code="WORKFLOW_ABORTED")

    async def _agent(self, args: dict[str, Any]) -> Any:
        prompt, schema = args.get("prompt"), args.get("schema")
        strings = {k: args.get(k) for k in ("label", "phase", "provider", "model")}
        if not isinstance(prompt, str) or not prompt.strip():
            raise self._trip("agent() needs a prompt: a non-empty string")
        if schema is not None and not isinstance(schema, dict):
            raise self._trip("agent(schema=…) must be a JSON Schema object (a dict)")
        bad = [k for k, v in strings.items() if v is not None and not isinstance(v, str)]
        if bad:
            raise self._trip(f"agent({bad[0]}=…) must be a string")
        try:
            return await self.members.ask(prompt, schema=schema, label=strings["label"],
                                          phase=strings["phase"] or self.phase, provider=strings["provider"],
                                          model=strings["model"])
        except Tripped as exc:
            raise self._trip(str(exc)) from None


def renumber(message: str, offset: int) -> str:
    """Line numbers as the model wrote the script (the hooks precede it in the program)."""
    return _LINE.sub(lambda m: f"line {max(1, int(m.group(1)) - offset)}", message)


def render(name: str, started: int, value: Any, max_chars: int) -> str:
    """The original's result text: the name, the agents started, the value as 2-space JSON (capped)."""
    shown = json.dumps(value, indent=2, ensure_ascii=False)
    if len(shown) > max_chars:
        shown = f"{shown[:max_chars]}\n… [truncated: {len(shown) - max_chars} more characters]"
    return f'workflow "{name}" completed ({started} agent{"" if started == 1 else "s"}).\nReturn value:\n{shown}'


def outcome(result: CodeRunResult, hooks: Hooks, offset: int, name: str, max_chars: int) -> ToolOutput:
    members = hooks.members
    if hooks.tripped is not None:
        return ToolOutput.text(f"Error: workflow run failed: {hooks.tripped}", is_error=True, code="WORKFLOW_ABORTED")
    if result.error is not None:
        kind = "" if result.error.kind == "exception" else f" ({result.error.kind})"
        return ToolOutput.text(f"Error: workflow run failed{kind}: {renumber(result.error.message, offset)}", is_error=True,
                               code="WORKFLOW_" + result.error.kind.upper().replace("-", "_"))
    return ToolOutput.text(render(name, members.started, result.value, max_chars))


def check_meta(meta: Any) -> list[str]:
    """Every way ``meta`` breaks its contract, named as the original names them (empty: none)."""
    if not isinstance(meta, dict):
        return ["meta must be an object"]
    problems = [f"meta.{key} is not a recognized field (name/description/whenToUse/phases)"
                for key in meta if key not in ("name", "description", "whenToUse", "phases")]
    for key in ("name", "description"):
        if not isinstance(meta.get(key), str) or not meta[key]:
            problems.append(f"meta.{key} must be a non-empty string")
    if "whenToUse" in meta and not isinstance(meta["whenToUse"], str):
        problems.append("meta.whenToUse must be a string")
    phases = meta.get("phases", [])
    if not isinstance(phases, list):
        return [*problems, "meta.phases must be an array"]
    for index, phase in enumerate(phases):
        where = f"meta.phases[{index}]"
        if not isinstance(phase, dict):
            problems.append(f"{where} must be an object")
            continue
        problems += [f"{where}.{key} is not a recognized field" for key in phase
                     if key not in ("title", "detail", "provider", "model")]
        if not isinstance(phase.get("title"), str) or not phase["title"]:
            problems.append(f"{where}.title must be a non-empty string")
        problems += [f"{where}.{key} must be a string" for key in ("detail", "provider", "model")
                     if key in phase and not isinstance(phase[key], str)]
    return problems


async def run_workflow(args: dict[str, Any], ctx: ToolContext, caps: Caps, *,
                       max_result_chars: int = 50_000) -> ToolOutput:
    meta, script, given = args.get("meta"), args.get("script"), args.get("args")
    if not isinstance(script, str) or not script.strip():
        raise ToolError("workflow needs `script`: the body of an async Python function", code="INVALID_ARGUMENTS")
    problems = check_meta(meta)
    if problems:
        raise ToolError(f"invalid meta: {'; '.join(problems)}", code="META_INVALID")
    if given is not None and not isinstance(given, dict):
        raise ToolError("workflow `args` must be a JSON object (wrap a bare list as a field, e.g. {\"files\": [...]})",
                        code="INVALID_ARGUMENTS")
    runtime = ctx.host.pm.hook.dsh_code_runtime(session=ctx.agent, host=ctx.host)
    narrow = getattr(runtime, "confined_to", None)
    if runtime is None or narrow is None:
        raise ToolError("workflow needs a code runtime that can run scripts read-only (mount code-mode)",
                        code="NO_CODE_RUNTIME")
    text, offset = program(script, given, caps.max_items)
    members = Members(ctx=ctx, caps=caps, kind="workflow")
    hooks = Hooks(members, anyio.Event())
    name = str(meta["name"]) if isinstance(meta, dict) else "workflow"  # (check_meta made it a string)
    ctx.emit(Note(kind="workflow/start", data={"name": one_line(name, 120), "callId": ctx.call_id,
                                                "maxAgents": caps.max_agents, "concurrency": caps.concurrency}))
    result: CodeRunResult | None = None
    try:
        result = await narrow("read-only", network=False).run(text, hooks, hooks.abort)
        for line in result.logs:  # what the script printed: the session log's, not the result's
            ctx.emit(Note(kind="workflow/log", data={"message": line[:4000]}))
    finally:
        ctx.emit(Note(kind="workflow/end", data={
            "name": one_line(name, 120), "agents": members.started, "failed": members.failed,
            "outcome": "cancelled" if result is None else "stopped" if hooks.tripped else
            ("failed" if result.error is not None else "completed")}))
    return outcome(result, hooks, offset, name, max_result_chars)
