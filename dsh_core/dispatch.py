"""Tool dispatch: the calls of one step in order (parallel-safe ones overlap), approvals and the
before-tool decisions, errors mapped to results, results bounded and spilled, the after-tool
decisions, and ``call_tool`` for nested calls (code mode)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from .agent_base import AgentBase
from .diag import warn
from .errors import ToolError
from .interception import (
    BLOCKED_TOOL,
    HALTED_TOOL,
    BeforeTool,
    fold_before_tool,
    reminder,
    settle,
)
from .protocols import ToolContext
from .schedule import ToolScheduler
from .spill import bound, spill_path_for
from .state import checkpoint
from .tools import argument_problems
from .types import (
    AfterTool,
    ApprovalRequest,
    ContentBlock,
    TextBlock,
    ToolCallBlock,
    ToolCallEvent,
    ToolOutput,
    ToolResultEvent,
    ToolResultMessage,
    UserMessageEvent,
)

if TYPE_CHECKING:  # pragma: no cover
    from .protocols import Tool



class ToolDispatch(AgentBase):
    """The tool-dispatch part of the agent (see ``agent_base``)."""

    __slots__ = ()

    def parallel_safe(self, name: str) -> bool:
        """Whether calls of ``name`` may overlap (unknown tools run nothing, so they may)."""
        tool = self.tools.get(name)
        return tool is None or bool(getattr(tool.spec, "parallel_safe", False))

    async def _run_tools(self, turn: int, step: int, calls: list[ToolCallBlock]) -> None:
        results: list[ToolOutput | None] = [None] * len(calls)
        for call in calls:
            self.emit(ToolCallEvent(turn=turn, step=step, call_id=call.id, name=call.name, arguments=call.arguments))
        try:
            if len(calls) == 1:
                # One call (most messages): run it in this task, with no scheduler and no task group.
                # A cancel reaches it here as it would in its task; an error leaves wrapped as the
                # task group would wrap it (the turn's error text is the same either way). The
                # yields keep the event loop's order as it was with a task: the call starts one
                # loop turn later (as a task started then), and the loop goes round twice before
                # this task goes on (the task's end, then the group's wake-up), so whatever the
                # call started (a subagent, a background job) takes the same steps meanwhile.
                await checkpoint()
                try:
                    results[0] = await self._run_tool(turn, step, calls[0])
                except Exception as exc:
                    raise ExceptionGroup("unhandled errors in a TaskGroup", [exc]) from exc
                await checkpoint()
                await checkpoint()
            else:
                # Calls start in the model's order; parallel-safe ones overlap, exclusive ones
                # (writes, commands) run alone, so two writes of one message never race.
                scheduler = ToolScheduler()
                tickets = [scheduler.ticket(self.parallel_safe(c.name) or c.name not in self.offered) for c in calls]

                async def run_one(i: int, call: ToolCallBlock) -> None:
                    async with tickets[i]:
                        results[i] = await self._run_tool(turn, step, call)

                async with anyio.create_task_group() as tg:
                    for i, call in enumerate(calls):
                        tg.start_soon(run_one, i, call)
        finally:
            # Every call gets a result, so the history stays a valid conversation.
            for i, call in enumerate(calls):
                out = results[i] or ToolOutput.text("Error: tool call aborted", is_error=True, code="ABORTED")
                result = ToolResultMessage(call_id=call.id, name=call.name, content=out.content, is_error=out.is_error)
                self._history.append(result)
                self.emit(ToolResultEvent(turn=turn, step=step, result=result, code=out.code))
            spliced, self._spliced = self._spliced, []
            for message in spliced:
                self._history.append(message)
                self.emit(UserMessageEvent(message=message))

    async def _run_tool(self, turn: int, step: int, call: ToolCallBlock) -> ToolOutput:
        return await self._after_tool(call, self._bounded(call, await self._dispatch(turn, step, call)))

    def _bounded(self, call: ToolCallBlock, out: ToolOutput) -> ToolOutput:
        """Bound a result the model will see (one spill mechanism for every tool)."""
        if out.spill_path is not None:
            return out
        blocks = out.content
        if len(blocks) == 1 and isinstance(blocks[0], TextBlock):  # most results: no generator to join
            text = blocks[0].text
        else:
            text = "\n".join(b.text for b in blocks if isinstance(b, TextBlock))
        if len(text.encode("utf-8", errors="replace")) <= self.host.spill_limit:
            return out
        path = spill_path_for(self.host.spill_root, self.session_id, call.id)
        spilled = False
        try:
            bounded, spilled = bound(text, self.host.spill_limit, path)
        except OSError as exc:  # no spill file: still never flood the model
            warn(f"spill of {call.name} result failed: {exc}")
            bounded = text[: self.host.spill_limit] + f"\n[… output truncated; the spill file failed: {exc}]"
        content: list[ContentBlock] = [TextBlock(text=bounded)] + [b for b in out.content if not isinstance(b, TextBlock)]
        return ToolOutput(content=content, is_error=out.is_error, code=out.code, structured=out.structured,
                          spill_path=str(path) if spilled else None)

    async def _after_tool(self, call: ToolCallBlock, out: ToolOutput, *, nested: bool = False) -> ToolOutput:
        """Fold the ``dsh_after_tool`` decisions: feedback that blocks replaces the content (and
        drops the structured result, so a program sees the error too); context is appended after
        the result, or for a program's nested call (which the model never reads) spliced after this
        step's results. Nothing runs once an interception point stopped the turn."""
        if self._halted:
            return out
        raw = self.host.direct.dsh_after_tool(session=self, call=call, output=out)
        if not raw:  # most calls: no plugin answers (nothing to settle)
            return out
        answers: list[AfterTool] = [a for a in await settle(raw) if isinstance(a, AfterTool)]
        if not answers:
            return out
        self._halt(self._turn, "after_tool", answers)
        blocks = [a.block for a in answers if a.block]
        context: list[ContentBlock] = [TextBlock(text=reminder(c)) for a in answers for c in a.context if c]
        if not blocks and not context:
            return out
        content: list[ContentBlock] = [TextBlock(text="\n\n".join(blocks))] if blocks else list(out.content)
        if nested:
            # A program's calls all end in this one step: a text already queued for after it (the
            # same repeat reminder for each of 100 gathered reads) is not queued again, where each
            # call used to add a message of its own.
            queued = {b.text for m in self._spliced for b in m.content if isinstance(b, TextBlock)}
            self.splice([c for c in context if not (isinstance(c, TextBlock) and c.text in queued)])
        else:
            content += context
        return ToolOutput(
            content=content, is_error=out.is_error or bool(blocks), code="BLOCKED" if blocks else out.code,
            structured=None if blocks else out.structured, spill_path=out.spill_path,
        )

    async def _dispatch(self, turn: int, step: int, call: ToolCallBlock) -> ToolOutput:
        if call.name not in self.offered:
            known = ", ".join(self.offered) or "none"
            hint = f" {self._unknown_hint}" if self._unknown_hint and call.name in self.tools else ""
            return ToolOutput.text(
                f"Error: unknown tool {call.name!r}. Available tools: {known}.{hint}", is_error=True, code="UNKNOWN_TOOL"
            )
        return await self._call(call.name, call.arguments, call_id=call.id, turn=turn, step=step)

    async def call_tool(
        self, name: str, arguments: str | dict[str, Any], *, call_id: str, turn: int, step: int,
        raw: str | None = None,
    ) -> ToolOutput:
        """Run one tool call through the normal tool path: lookup among all of this agent's tools
        (offered or not), argument decoding, the ``dsh_before_tool`` interception, a ``ToolContext``
        (so approvals reach the approval seam with ``call_id``), errors mapped to error results,
        then the ``dsh_after_tool`` interception (the result is not bounded: a program reads it
        whole). Never raises for a tool's failure; cancellation propagates. Tools that call tools
        (code mode) use this; ``raw`` is the arguments' JSON text when they have it already (a
        program's call comes as JSON: not encoded again, ~5 us a call)."""
        out = await self._call(name, arguments, call_id=call_id, turn=turn, step=step)
        if raw is None:
            raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return await self._after_tool(ToolCallBlock(id=call_id, name=name, arguments=raw), out, nested=True)

    async def _call(
        self, name: str, arguments: str | dict[str, Any], *, call_id: str, turn: int, step: int
    ) -> ToolOutput:
        if self._halted:  # an interception point stopped the turn: nothing more runs in it
            return ToolOutput.text(f"Error: {HALTED_TOOL}", is_error=True, code="STOPPED")
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return ToolOutput.text(
                f"Error: unknown tool {name!r}. Available tools: {known}.", is_error=True, code="UNKNOWN_TOOL"
            )
        if isinstance(arguments, dict):
            args = arguments
        else:
            try:
                if not arguments.strip():
                    args = {}
                else:
                    try:  # one C call (json.loads is three Python calls around its scanner)
                        args = _decode_json(arguments)
                    except msgspec.DecodeError:  # the stdlib's reading: it takes NaN, 1e400, a lone
                        args = json.loads(arguments)  # surrogate; and its message for malformed JSON
                if not isinstance(args, dict):
                    raise ValueError("arguments must be a JSON object")
            except ValueError as exc:
                return ToolOutput.text(
                    f"Error: the arguments of {name} are not a JSON object ({exc}). Call it again with valid JSON.",
                    is_error=True,
                    code="INVALID_ARGUMENTS",
                )
        problems = argument_problems(tool.spec.parameters, args)
        if problems:  # the schema's promises hold before the tool (or a hook) sees the call
            return ToolOutput.text(
                f"Error: {name}: {'; '.join(problems)}. Call it again with arguments that match its schema.",
                is_error=True,
                code="INVALID_ARGUMENTS",
            )
        refused = await self._before_tool(tool, name, args, call_id, turn, step)
        if refused is not None:
            return refused
        ctx = ToolContext(agent=self.as_agent(), call_id=call_id, tool_name=name, turn=turn, step=step)
        try:
            return await tool.run(args, ctx)
        except ToolError as exc:
            return ToolOutput.text(f"Error: {exc.message}", is_error=True, code=exc.code)
        except Exception as exc:
            return ToolOutput.text(f"Error: tool {name} crashed: {exc!r}", is_error=True, code="TOOL_CRASHED")

    async def _before_tool(
        self, tool: Tool, name: str, args: dict[str, Any], call_id: str, turn: int, step: int
    ) -> ToolOutput | None:
        """Fold the ``dsh_before_tool`` answers (deny > ask > allow); an error result when the call
        must not run, None when it may."""
        raw = self.host.direct.dsh_before_tool(session=self, name=name, args=args, call_id=call_id, turn=turn, step=step)
        if not raw:  # most calls: no plugin answers; the turn was not stopped (``_call`` looked)
            return None
        answers = [a for a in await settle(raw) if isinstance(a, BeforeTool)]
        if self._halt(turn, "before_tool", answers):  # a stop wins over any verdict: the call does not run
            return ToolOutput.text(f"Error: {HALTED_TOOL}", is_error=True, code="STOPPED")
        verdict = fold_before_tool(answers)
        if verdict.decision == "deny":
            return ToolOutput.text(f"Error: {verdict.reason or BLOCKED_TOOL}", is_error=True, code="BLOCKED")
        if verdict.decision == "ask":
            reason = verdict.reason or f"a hook asks before {name} runs"
            req = ApprovalRequest(agent=self, tool_name=name, call_id=call_id, reason=reason,
                                  kind=tool.spec.kind, subject=_subject(args, reason), args=args)
            outcome = await self.host.approvals.request(req)
            if outcome != "allowed-once":
                who = "an approval policy refused" if req.decided_by == "policy" else "the user rejected"
                return ToolOutput.text(f"Error: {who} tool {name!r} ({reason})", is_error=True, code="REJECTED")
        return None



_decode_json = msgspec.json.decode


def _subject(args: dict[str, Any], reason: str) -> str:
    """What a person judging the call reads: what it acts on, then why it is asked."""
    for key in ("command", "file_path", "path", "pattern", "description"):
        if isinstance(args.get(key), str):
            return f"{args[key]} — {reason}"
    return reason
