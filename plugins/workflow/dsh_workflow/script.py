"""``workflow {meta, script, args}``: a model-written orchestration script.

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

A cap on total agents and on agents at once; a misused hook or a tripped cap ends the script
with a clear error. Cancelling the call cancels every member. ``workflow/start``, each
``workflow/member`` and ``workflow/end`` go to the session log."""

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

HOOKS = ("agent", "phase", "log")
_PRELUDE = '''import asyncio as __asyncio
import json as __json
args = __json.loads({args!r})
async def agent(prompt, *, schema=None, label=None, phase=None, provider=None, model=None):
    return await tools.agent(prompt=prompt, schema=schema, label=label, phase=phase, provider=provider, model=model)
async def parallel(thunks):
    thunks = list(thunks)
    if not all(callable(t) for t in thunks):
        raise TypeError("parallel() takes zero-argument callables, e.g. [lambda: agent('a'), lambda: agent('b')]")
    return list(await __asyncio.gather(*[t() for t in thunks]))
async def pipeline(items, *stages):
    async def __one(item):
        for stage in stages:
            item = await stage(item)
        return item
    return list(await __asyncio.gather(*[__one(i) for i in list(items)]))
def phase(title):
    tools.phase(title=str(title))
def log(message):
    tools.log(message=str(message))
'''
_LINE = re.compile(r"\bline (\d+)")
NO_VALUE = "(the workflow returned nothing)"


def program(script: str, args: Any) -> tuple[str, int]:
    """The program the runtime runs (the hooks, then the script) and how many lines precede the script."""
    prelude = _PRELUDE.format(args=json.dumps(args, ensure_ascii=False))
    return prelude + script, prelude.count("\n")


class Hooks:
    """``CodeBindings`` of a workflow run: ``agent``, ``phase`` and ``log``; a misuse or a cap
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
        return self._agent(args)

    async def _done(self, value: Any) -> Any:
        return value

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


def outcome(result: CodeRunResult, hooks: Hooks, offset: int) -> ToolOutput:
    logs = "\n".join(result.logs)
    members = hooks.members
    tally = f"[workflow: {members.started} agent{'s' if members.started != 1 else ''}, {members.failed} failed]"
    if hooks.tripped is not None:
        text = f"workflow stopped: {hooks.tripped}\n{tally}" + (f"\n{logs}" if logs else "")
        return ToolOutput.text(text, is_error=True, code="WORKFLOW_ABORTED")
    if result.error is not None:
        text = f"workflow failed ({result.error.kind}): {renumber(result.error.message, offset)}\n{tally}"
        return ToolOutput.text(text + (f"\n{logs}" if logs else ""), is_error=True,
                               code="WORKFLOW_" + result.error.kind.upper().replace("-", "_"))
    value = result.value
    shown = NO_VALUE if value is None else value if isinstance(value, str) else json.dumps(
        value, indent=2, ensure_ascii=False)
    return ToolOutput.text("\n".join([p for p in (logs, shown, tally) if p]))


async def run_workflow(args: dict[str, Any], ctx: ToolContext, caps: Caps) -> ToolOutput:
    meta, script = args.get("meta") or {}, args.get("script")
    if not isinstance(script, str) or not script.strip():
        raise ToolError("workflow needs `script`: the body of an async Python function", code="INVALID_ARGUMENTS")
    if not isinstance(meta, dict):
        raise ToolError("workflow `meta` must be an object ({\"name\": …, \"description\": …})",
                        code="INVALID_ARGUMENTS")
    runtime = ctx.host.pm.hook.dsh_code_runtime(session=ctx.agent, host=ctx.host)
    narrow = getattr(runtime, "confined_to", None)
    if runtime is None or narrow is None:
        raise ToolError("workflow needs a code runtime that can run scripts read-only (mount code-mode)",
                        code="NO_CODE_RUNTIME")
    text, offset = program(script, args.get("args"))
    members = Members(ctx=ctx, caps=caps, kind="workflow")
    hooks = Hooks(members, anyio.Event())
    name = one_line(str(meta.get("name") or meta.get("description") or "workflow"), 120)
    ctx.emit(Note(kind="workflow/start", data={"name": name, "callId": ctx.call_id, "maxAgents": caps.max_agents,
                                                "concurrency": caps.concurrency}))
    result: CodeRunResult | None = None
    try:
        result = await narrow("read-only", network=False).run(text, hooks, hooks.abort)
    finally:
        ctx.emit(Note(kind="workflow/end", data={
            "name": name, "agents": members.started, "failed": members.failed,
            "outcome": "cancelled" if result is None else "stopped" if hooks.tripped else
            ("failed" if result.error is not None else "completed")}))
    return outcome(result, hooks, offset)
