"""The six terminal tools, with the original's names, arguments and result texts."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsh_core import FunctionTool, ToolError
from dsh_core.protocols import JobEnd
from dsh_core.types import ToolOutput

from .screen import bound_text, bound_with_prefix, bound_with_suffix
from .sessions import Limits, TerminalSet, check_mode, cwd_for, start_terminal
from .terminal import SIGNALS, SendResult

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import Agent, JobIO, Jobs

@dataclass(frozen=True)
class ToolSettings:
    limits: Limits
    max_result_bytes: int = 256 << 10
    run_in_background: bool = True


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def _session_prop(text: str = "Id of the terminal to act on.") -> dict[str, Any]:
    return {"sessionId": {"type": "string", "description": text}}


def render_send(result: SendResult, max_bytes: int) -> str:
    output = result.viewport or "(no new output)"
    return bound_with_suffix(output, f"\n[wait: {result.wait_reason}]\n[session: {result.status.render()}]",
                             result.truncated, max_bytes)


def send_detail(result: SendResult) -> str:
    if result.status.kind == "running":
        return f"wait: {result.wait_reason}"
    st = result.status
    return f"session exited: {st.exit_code if st.exit_code is not None else st.signal or 'unknown'}"


class TerminalTools:
    """The six tools over the calling session's terminals (``agent.state(TerminalSet)``)."""

    def __init__(self, settings: ToolSettings, jobs: Jobs | None) -> None:
        self.settings = settings
        self.jobs = jobs
        self.maxb = settings.max_result_bytes
        self.background = settings.run_in_background and jobs is not None

    def terms(self, agent: Agent) -> TerminalSet:
        return agent.state(TerminalSet).configure(self.settings.limits)

    def text(self, out: str, *, structured: Any = None) -> ToolOutput:
        result = ToolOutput.text(bound_text(out, self.maxb))
        result.structured = structured
        return result

    async def terminal_open(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        kind = args.get("type")
        if not isinstance(kind, str) or not kind:
            raise ToolError("type must be a non-empty string", code="INVALID_ARGUMENTS")
        if kind != "shell":
            raise ToolError(f'no PTY backend registered for "{kind}"', code="NO_BACKEND")
        name = args.get("name")
        if name is not None and (not isinstance(name, str) or not name):
            raise ToolError("PTY session name must be non-empty", code="INVALID_ARGUMENTS")
        cwd = cwd_for(ctx.agent, args.get("cwd"))
        owned = self.terms(ctx.agent)
        term = owned.new(name, kind)
        owned.opening += 1
        try:
            motd = await start_terminal(ctx.agent, term, cwd)
        finally:
            owned.opening -= 1
        owned.terminals[term.id] = term
        label = term.id if name is None else f"{term.id} ({name})"
        prefix = f"started terminal session {label} [type: {kind}]\n"
        structured = {"sessionId": term.id, "type": kind, "pid": term.pid, "status": term.status.as_dict(),
                      "motd": motd, **({"name": name} if name is not None else {})}
        out = ToolOutput.text(bound_with_prefix(prefix, motd or "(no startup output)", self.maxb))
        out.structured = structured
        return out

    async def terminal_send(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        term = self.terms(ctx.agent).get(args.get("sessionId"))
        await check_mode(ctx.agent, term)
        data = args.get("text")
        if not isinstance(data, str):
            raise ToolError("text must be a string", code="INVALID_ARGUMENTS")
        submit = args.get("submit", True)
        if not isinstance(submit, bool):
            raise ToolError("submit must be true or false", code="INVALID_ARGUMENTS")
        if args.get("run_in_background") is True:
            return self._background(term, data, submit, ctx)
        result = await term.send(data, submit=submit)
        out = ToolOutput.text(render_send(result, self.maxb))
        out.structured = {"kind": "foreground", "viewport": result.viewport, "waitReason": result.wait_reason,
                          "sessionStatus": result.status.as_dict(), "truncated": result.truncated}
        return out

    async def terminal_read(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        term = self.terms(ctx.agent).get(args.get("sessionId"))
        offset, count = args.get("offset", 0), args.get("count", 500)
        if isinstance(offset, float) and offset.is_integer():
            offset = int(offset)
        if isinstance(count, float) and count.is_integer():
            count = int(count)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ToolError("PTY read offset must be a non-negative safe integer", code="INVALID_ARGUMENTS")
        if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
            raise ToolError("PTY read count must be a positive safe integer", code="INVALID_ARGUMENTS")
        page = term.read(offset, count)
        out = ToolOutput.text(bound_with_suffix(
            page.text or "(no retained output)", f"\n[lines: {page.line_begin}-{page.line_end} of {page.total_lines}]",
            page.truncated, self.maxb))
        out.structured = {"text": page.text, "totalLines": page.total_lines, "lineBegin": page.line_begin,
                          "lineEnd": page.line_end, "truncated": page.truncated}
        return out

    async def terminal_signal(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        term = self.terms(ctx.agent).get(args.get("sessionId"))
        name = args.get("signal")
        if name not in SIGNALS:
            raise ToolError(f"signal must be one of {', '.join(SIGNALS)}", code="INVALID_ARGUMENTS")
        since = time.monotonic()
        pgid = term.signal(name)
        await term.settle(since)
        return self.text(f"delivered {name} to foreground process group {pgid}",
                    structured={"delivered": True, "targetPgid": pgid})

    async def terminal_close(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        owned = self.terms(ctx.agent)
        term = owned.get(args.get("sessionId"))
        closed = await owned.close(term.id)
        msg = f"closed terminal session {term.id}" if closed else f"terminal session {term.id} was already closing"
        return self.text(msg, structured={"sessionId": term.id, "outcome": "closed" if closed else "already-closing"})

    async def terminal_list(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        owned = self.terms(ctx.agent)
        rows, listed = [], []
        for term in owned.terminals.values():
            name = f" ({term.name})" if term.name is not None else ""
            pid = f" pid={term.pid}" if term.pid is not None else ""
            rows.append(f"{term.id}{name} [{term.type}] {term.status.render()}{pid}")
            listed.append({"sessionId": term.id, "type": term.type, "pid": term.pid, "status": term.status.as_dict(),
                           **({"name": term.name} if term.name is not None else {})})
        return self.text("\n".join(rows) if rows else "(no terminal sessions)", structured=listed)


    def _background(self, term: Any, data: str, submit: bool, ctx: ToolContext) -> ToolOutput:
        jobs = self.jobs
        if jobs is None or not self.settings.run_in_background:
            raise ToolError("background terminal sends need the jobs plugin (and run-in-background = true)",
                            code="INVALID_ARGUMENTS")
        if term.active:
            raise ToolError(f"PTY session {term.id} already has an active send", code="SEND_ACTIVE")

        async def work(io: JobIO) -> JobEnd:
            def progress(chunk: str) -> None:
                io.write(chunk.encode())

            result = await term.send(data, submit=submit, stop=io.stopping, on_progress=progress)
            if result.truncated:
                io.write(b"\n[output truncated]")
            return JobEnd(status="completed", exit_code=None, detail=send_detail(result))

        job = jobs.start(ctx.agent, kind="pty-send", title=f"{term.id}: {data or '(input)'}", work=work,
                         call_id=ctx.call_id)
        return self.text(f"started background job {job.id}", structured={"kind": "background", "jobId": job.id})

    def tools(self) -> list[FunctionTool]:
        return [
            FunctionTool(
                "terminal_open",
                "Start a terminal that stays alive between tool calls and that only you can reach. Pick it when a "
                "shell or a REPL has to keep its state from one call to the next.",
                _schema({
                    "type": {"type": "string", "description": 'Which kind of terminal to start; normally "shell".'},
                    "name": {"type": "string", "description": 'A label for the terminal, visible only to you, e.g. '
                             '"main" or "gdb". May be left out.'},
                    "cwd": {"type": "string", "description": "Directory the terminal starts in; when left out, the "
                            "root of the workspace."},
                }, ["type"]),
                self.terminal_open, kind="execute",
            ),
            self._send_tool(),
            FunctionTool(
                "terminal_read",
                "Show a size-limited page of the output a persistent terminal has kept, without typing anything "
                "into it.",
                _schema({
                    **_session_prop(),
                    "offset": {"type": "number", "description": "How many lines before the newest one the page "
                               "ends (0 by default)."},
                    "count": {"type": "number", "description": "How many lines to return (500 by default; the "
                              "terminal's own size limits still hold)."},
                }, ["sessionId"]),
                self.terminal_read, kind="read", parallel_safe=True,
            ),
            FunctionTool(
                "terminal_signal",
                "Deliver one of the permitted signals to whichever process group is in the foreground of a "
                "persistent terminal.",
                _schema({
                    **_session_prop(),
                    "signal": {"type": "string", "enum": list(SIGNALS), "description": "Which signal to send. "
                               "SIGKILL aimed at the shell itself is refused: call terminal_close for that."},
                }, ["sessionId", "signal"]),
                self.terminal_signal, kind="execute",
            ),
            FunctionTool(
                "terminal_close",
                "Shut down one persistent terminal; the call returns only after every process that terminal "
                "started has ended.",
                _schema(_session_prop(), ["sessionId"]), self.terminal_close, kind="delete",
            ),
            FunctionTool("terminal_list", "Show every persistent terminal that this agent has open.",
                         _schema({}, []), self.terminal_list, kind="read", parallel_safe=True),
        ]

    def _send_tool(self) -> FunctionTool:
        send_props: dict[str, Any] = {
            **_session_prop("Id of the terminal, as given by terminal_open or terminal_list."),
            "text": {"type": "string", "description": "The text to type into the terminal (UTF-8)."},
            "submit": {"type": "boolean", "description": "Whether to press Enter after the text (true by default). "
                       "Use false when sending control characters or a partial line of REPL input."},
        }
        send_description = ("Type text into a persistent terminal. Unless told otherwise it presses Enter, then "
                            "returns once the shell prompt is back, a program waits for input, the output goes "
                            "quiet, the time limit passes, or the session exits.")
        if self.background:
            send_props["run_in_background"] = {"type": "boolean", "description": "Answer at once with a job id; "
                                               "read the result with job_output, or stop it with job_kill."}
            send_description += (" With run_in_background it answers at once with a job id for job_output or "
                                 "job_kill.")
        return FunctionTool("terminal_send", send_description, _schema(send_props, ["sessionId", "text"]),
                            self.terminal_send, kind="execute")


def make_tools(settings: ToolSettings, jobs: Jobs | None) -> list[FunctionTool]:
    return TerminalTools(settings, jobs).tools()
