"""The ``run_code`` tool: run a program whose ``tools`` are the agent's own tools, return only its output."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from dsh_core import ToolError
from dsh_core.errors import CodeCallError
from dsh_core.schedule import ToolScheduler
from dsh_core.types import (
    CodeDispatch,
    CodeDispatchStart,
    CodeRunResult,
    ContentBlock,
    ImageBlock,
    TextBlock,
    ToolOutput,
    ToolSpec,
)

from .stubs import callable_name

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext

NAME = "run_code"
NO_OUTPUT = "(run_code completed with no output)"
MAX_ARGUMENTS_LOGGED = 64_000  # bytes of a nested call's arguments kept in the durable events


def _text(out: ToolOutput) -> str:
    return "\n".join(b.text for b in out.content if isinstance(b, TextBlock))


class Dispatcher:
    """``CodeBindings`` for one run: each call is a real tool call of the agent, id ``<callId>:code:<n>``.

    ``call`` is synchronous up to its first await: the call takes its place in the scheduler's
    line (parallel-safe calls overlap up to ``limit``, exclusive ones run alone) and gets its
    number in the program's order. Results go back to the program as the tool's structured
    value (or its text); only ``tool/code-dispatch-start``/``tool/code-dispatch`` events record
    them, never the model's history. Images are kept for the message spliced in after the step.
    """

    def __init__(self, ctx: ToolContext, names: list[str], limit: int) -> None:
        self.ctx = ctx
        self.names = names
        self.scheduler = ToolScheduler(limit)
        self.max_parallel = limit  # calls running at once, at most (the runtime needs no more workers)
        self.count = 0
        self.images: list[ContentBlock] = []

    def call(self, name: str, args: dict[str, Any], arguments: str | None = None) -> Awaitable[Any]:
        self.count += 1
        sub_id = f"{self.ctx.call_id}:code:{self.count}"
        if arguments is None:
            try:
                arguments = json.dumps(args, ensure_ascii=False)
            except (TypeError, ValueError):
                arguments = "{}"
        agent = self.ctx.agent
        ticket = self.scheduler.ticket(name not in self.names or agent.parallel_safe(name))
        return self._run(sub_id, name, args, arguments, ticket)

    async def _run(self, sub_id: str, name: str, args: dict[str, Any], arguments: str, ticket: Any) -> Any:
        if name not in self.names:
            async with ticket:
                pass
            raise CodeCallError(name, f"no tool {name!r}; the tools are: {', '.join(self.names)}", code="UNKNOWN_TOOL")
        logged = arguments if len(arguments) <= MAX_ARGUMENTS_LOGGED else arguments[:MAX_ARGUMENTS_LOGGED] + "…"
        ctx = self.ctx
        agent, turn, step, parent = ctx.agent, ctx.turn, ctx.step, ctx.call_id
        async with ticket:
            agent.emit(CodeDispatchStart(turn=turn, step=step, call_id=sub_id, parent_call_id=parent, name=name,
                                         arguments=logged))
            out: ToolOutput | None = None
            try:
                out = await agent.call_tool(name, args, call_id=sub_id, turn=turn, step=step, raw=arguments)
            finally:
                if out is None:  # cancelled: the program ended or the turn was aborted
                    agent.emit(CodeDispatch(turn=turn, step=step, call_id=sub_id, parent_call_id=parent, name=name,
                                            arguments=logged, is_error=True,
                                            result=[TextBlock(text="Error: tool call aborted")], code="ABORTED"))
            content = out.content
            agent.emit(CodeDispatch(turn=turn, step=step, call_id=sub_id, parent_call_id=parent, name=name,
                                    arguments=logged, is_error=out.is_error, result=content, code=out.code))
        for block in content:
            if isinstance(block, ImageBlock):
                self.images.extend(content)
                break
        if out.structured is not None:
            return out.structured
        text = _text(out)
        if out.is_error:
            raise CodeCallError(name, text.removeprefix("Error: "), code=out.code)
        return text


def outer_result(result: CodeRunResult) -> ToolOutput:
    """What the model sees: the output lines, then the value (a string as is, else indented JSON)."""
    logs = "\n".join(result.logs)
    if result.error is not None:
        text = f"code run failed ({result.error.kind}): {result.error.message}"
        if logs:
            text += "\n" + logs
        return ToolOutput.text(text, is_error=True, code="CODE_" + result.error.kind.upper().replace("-", "_"))
    parts = [logs] if logs else []
    if result.value is not None:
        value = result.value
        parts.append(value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False))
    return ToolOutput.text("\n".join(parts) or NO_OUTPUT)


class RunCodeTool:
    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.spec = ToolSpec(
            name=NAME,
            description=(
                "Run a Python program that calls the tools as `await tools.<name>(...)` (the API is in the system "
                "prompt). `code` is the body of an async function: top-level await and return work. Only what the "
                "program prints and returns comes back."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The program: the body of an async Python function."},
                    "description": {"type": "string", "description": "One line: what the program does."},
                },
                "required": ["code", "description"],
                "additionalProperties": False,
            },
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        code = args.get("code")
        description = args.get("description")
        if not isinstance(code, str):
            raise ToolError("run_code needs `code`: the program, as a string", code="INVALID_ARGUMENTS")
        if not isinstance(description, str) or not description.strip():
            raise ToolError("run_code needs a non-blank `description` of what the program does",
                            code="INVALID_ARGUMENTS")
        runtime = ctx.host.pm.hook.dsh_code_runtime(session=ctx.agent, host=ctx.host)
        if runtime is None:
            raise ToolError("no code runtime is mounted in this composition", code="NO_CODE_RUNTIME")
        names = [n for n in ctx.agent.tools if n != NAME and callable_name(n)]
        dispatcher = Dispatcher(ctx, names, self.settings.max_parallel_sub_calls)
        result = await runtime.run(code, dispatcher)  # stopped by cancelling this task (the turn's)
        if dispatcher.images and ctx.route.image_input:
            ctx.splice([TextBlock(text="Images returned by tool calls inside run_code:"), *dispatcher.images])
        return outer_result(result)
