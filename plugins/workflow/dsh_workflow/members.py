"""One member of a workflow or a ralph loop: a one-shot child on the subagent seam, its answer
as text, or as a JSON value checked against a schema. A member that fails gives None; the run
records each member (``workflow/member``) in the parent's log."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import anyio

from dsh_core.display import one_line
from dsh_core.protocols import SubagentRequest, ToolContext
from dsh_core.types import Note, SubagentResult

log = logging.getLogger("dsh.workflow")

_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)\n```", re.DOTALL)


class Tripped(Exception):
    """A cap or a misused hook: the whole run ends with this message."""


@dataclass(kw_only=True)
class Caps:
    max_agents: int
    concurrency: int
    max_depth: int
    provider: str
    max_items: int = 4096  # items per parallel()/pipeline() call (workflow scripts)


@dataclass(eq=False)
class Members:
    """The members of one run: counted against the caps, gated by the concurrency limit."""

    ctx: ToolContext
    caps: Caps
    kind: str  # workflow | ralph
    started: int = 0
    failed: int = 0
    problem: str | None = None  # why the last member that failed did
    gate: anyio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.gate = anyio.Semaphore(self.caps.concurrency)

    async def ask(self, prompt: str, *, schema: dict[str, Any] | None = None, label: str | None = None,
                  phase: str | None = None, provider: str | None = None, model: str | None = None) -> Any:
        """The member's final text (or validated object, with ``schema``); None when it failed."""
        parent = self.ctx.agent
        if parent.spec.depth + 1 > self.caps.max_depth:
            raise Tripped(f"a {self.kind} member would be at depth {parent.spec.depth + 1}; the limit is "
                          f"{self.caps.max_depth}")
        if self.started >= self.caps.max_agents:
            raise Tripped(f"this run reached its total agent cap ({self.caps.max_agents}) — a runaway-loop backstop; "
                          "raise max-agents in [config.workflow] if the scale is intentional")
        name = provider or self.caps.provider
        seam = parent.host.subagent_providers.get(name)
        if seam is None:
            raise Tripped(f"no subagent provider {name!r} is mounted (providers: "
                          f"{', '.join(parent.host.subagent_providers) or 'none'})")
        self.started += 1
        index = self.started
        text = prompt if schema is None else prompt + "\n\n" + schema_instruction(schema)
        description = one_line(label or prompt.strip().splitlines()[0], 80)  # the caller checked the prompt
        route = (parent.provider.name, model) if model else None
        session: str | None = None
        listed = getattr(parent.provider, "models", None)
        if model and (listed is None or model not in {m.model for m in listed()}):
            # only a model the session's provider lists (a route is never a path a script names)
            result = SubagentResult(stop="error", diagnostic=f"model {model!r} is not one {parent.provider.name} lists")
        else:
            async with self.gate:
                result, session = await self._run(seam, SubagentRequest(
                    prompt=text, description=description, parent=parent, cwd=parent.cwd,
                    depth=parent.spec.depth + 1, call_id=self.ctx.call_id, route=route))
        value, problem = self._value(result, schema)
        if value is None:
            self.failed += 1
            self.problem = problem
        parent.emit(Note(kind=f"{self.kind}/member", data={
            "index": index, "label": description, **({"phase": phase} if phase else {}),
            **({"session": session} if session else {}), "stop": result.stop, "ok": value is not None,
            **({"problem": problem} if problem else {})}))
        return value

    async def _run(self, seam: Any, request: SubagentRequest) -> tuple[SubagentResult, str | None]:
        """Start one member, wait for its answer, dispose it (also when the run is cancelled)."""
        try:
            run = await seam.start(request)
        except Exception as exc:  # a provider's refusal: this member fails
            return SubagentResult(stop="error", diagnostic=f"it did not start: {exc}"), None
        try:
            return await run.result(), run.session_id
        except anyio.get_cancelled_exc_class():
            run.cancel()  # the run was cancelled: so is this member
            raise
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await run.dispose()
                except Exception as exc:
                    log.warning(f"disposing a {self.kind} member failed: {exc!r}")

    @staticmethod
    def _value(result: SubagentResult, schema: dict[str, Any] | None) -> tuple[Any, str | None]:
        if not result.completed:
            return None, result.diagnostic or result.stop
        if schema is None:
            return result.text, None
        try:
            value = parse_json(result.text)
        except ValueError as exc:
            return None, str(exc)
        problem = check(value, schema)
        return (None, problem) if problem else (value, None)


def schema_instruction(schema: dict[str, Any]) -> str:
    return ("Answer with one JSON value and nothing else (no prose, no code fence), matching this JSON Schema:\n"
            + json.dumps(schema, indent=1, ensure_ascii=False))


def parse_json(text: str) -> Any:
    """The JSON value a member answered: the whole text, else its one fenced block."""
    candidates = [text.strip()]
    fenced = _FENCE.findall(text)
    if len(fenced) == 1:
        candidates.append(fenced[0].strip())
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    raise ValueError("its answer is not one JSON value")


def check(value: Any, schema: dict[str, Any]) -> str | None:
    """What is wrong with ``value`` against ``schema`` (None: nothing). jsonschema is imported
    here, on a structured member's first answer, not at start-up (70-100 ms, measured)."""
    import jsonschema

    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return f"its answer does not match the schema: {exc.message}"
    except jsonschema.SchemaError as exc:
        raise Tripped(f"the schema is not a valid JSON Schema: {exc.message}") from None
    return None
