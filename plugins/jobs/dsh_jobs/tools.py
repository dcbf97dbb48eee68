"""The job tools: ``job_output {job_id, wait?, timeout_ms?}``, ``job_list``, ``job_kill {job_id, reason?}``.

A session sees only its own jobs. ``job_output`` returns what is new since the last read,
bounded like any command's output (head and tail, the rest named in the job's log file), and
ends with the original harness's status line (``[status: completed, exit code: 0]``).
``job_kill`` answers at once; the kill goes on in the job's own task.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio

from dsh_core import FunctionTool, ToolError
from dsh_core.display import one_line
from dsh_core.spill import cut_text
from dsh_core.types import ToolOutput

from .registry import BgJob, JobRegistry

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext

_STR = {"type": "string"}
_OPT_INT = {"type": ["integer", "null"]}


class JobTools:
    """The three tools over one host's registry and its read limits."""

    def __init__(self, registry: JobRegistry, *, limit: int, wait_ms: int, max_wait_ms: int) -> None:
        self.registry = registry
        self.limit = limit  # bytes of new output one job_output returns (head + tail past it)
        self.wait_ms = wait_ms
        self.max_wait_ms = max_wait_ms

    def tools(self) -> list[FunctionTool]:
        return [
            FunctionTool(
                "job_output",
                "Read a background job's output since your last read, ending with its status ([status: running | "
                "stopping | completed, exit code: N | killed, signal: X | failed, …]). With wait: true, first wait "
                f"until the job ends or timeout_ms passes (default {self.wait_ms}, max {self.max_wait_ms}).",
                {"type": "object", "properties": {
                    "job_id": {"type": "string", "description": "The job's id (bash-1…)."},
                    "wait": {"type": "boolean", "description": "Wait for the job to end before reading."},
                    "timeout_ms": {"type": "number", "description": "How long to wait at most, with wait."},
                }, "required": ["job_id"], "additionalProperties": False},
                self.job_output, kind="read",
                output_schema={"type": "object", "properties": {
                    "job_id": _STR, "status": _STR, "exit_code": _OPT_INT, "output": _STR,
                    "log_path": {"type": ["string", "null"]},
                }, "required": ["job_id", "status", "exit_code", "output", "log_path"]},
            ),
            FunctionTool(
                "job_list",
                "List this session's background jobs: id, kind, status and command.",
                {"type": "object", "properties": {}, "additionalProperties": False},
                self.job_list, parallel_safe=True, kind="read",
                output_schema={"type": "object", "properties": {"jobs": {"type": "array", "items": {
                    "type": "object", "properties": {"id": _STR, "kind": _STR, "status": _STR, "exit_code": _OPT_INT,
                                                     "title": _STR},
                    "required": ["id", "kind", "status", "exit_code", "title"]}}}, "required": ["jobs"]},
            ),
            FunctionTool(
                "job_kill",
                "Stop a background job: SIGTERM to its whole process group (and everything it started), SIGKILL "
                "if it has not ended a few seconds later. Answers at once.",
                {"type": "object", "properties": {
                    "job_id": {"type": "string", "description": "The job to stop."},
                    "reason": {"type": "string", "description": "Why (recorded in the session log)."},
                }, "required": ["job_id"], "additionalProperties": False},
                self.job_kill, kind="execute",
            ),
        ]

    def _find(self, args: dict[str, Any], ctx: ToolContext) -> BgJob:
        jid = args.get("job_id")
        if not isinstance(jid, str) or not jid:
            raise ToolError(f"invalid job_id: expected a non-empty string, got {json.dumps(jid)}",
                            code="INVALID_ARGUMENTS")
        job = self.registry.get(ctx.agent, jid)
        if job is None:
            if self.registry.owned_elsewhere(jid):
                raise ToolError(f"job {jid} belongs to another session", code="NOT_FOUND")
            raise ToolError(f"unknown job {jid}", code="NOT_FOUND")
        return job

    async def job_output(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        job = self._find(args, ctx)
        wait = args.get("wait", False)
        if not isinstance(wait, bool):
            raise ToolError("wait must be true or false", code="INVALID_ARGUMENTS")
        timeout_ms = args.get("timeout_ms")
        if timeout_ms is None:
            timeout_ms = self.wait_ms
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not timeout_ms >= 0 \
                or timeout_ms == float("inf"):
            raise ToolError("timeout_ms must be a number of milliseconds ≥ 0", code="INVALID_ARGUMENTS")
        timeout_ms = min(timeout_ms, self.max_wait_ms)
        if wait and not job.settled.is_set():
            job.watchers += 1
            try:
                with anyio.move_on_after(timeout_ms / 1000):
                    await job.settled.wait()
            finally:
                job.watchers -= 1
        text, spilled = read_new(job, self.limit)
        if job.settled.is_set():
            job.reported = True
        lines = [text.rstrip("\n") if text else "(no new output)"]
        if job.log.dropped and job.settled.is_set():
            lines.append(f"[the job wrote {job.log.dropped} bytes more than the {job.log.cap} kept]")
        lines.append(job.status_line())
        out = ToolOutput.text("\n".join(lines))
        if spilled:
            out.spill_path = str(job.log.path)  # already bounded here: nothing more is spilled
        out.structured = {"job_id": job.id, "status": job.status, "exit_code": job.exit_code, "output": text,
                          "log_path": str(job.log.path) if job.log.size else None}
        return out

    async def job_list(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        jobs = self.registry.of(ctx.agent)
        if not jobs:
            out = ToolOutput.text("(no background jobs)")
        else:
            out = ToolOutput.text("\n".join(f"{j.id} [{j.kind}] {j.status} — {one_line(j.title, 200)}" for j in jobs))
        out.structured = {"jobs": [{"id": j.id, "kind": j.kind, "status": j.status, "exit_code": j.exit_code,
                                    "title": j.title} for j in jobs]}
        return out

    async def job_kill(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        job = self._find(args, ctx)
        reason = args.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise ToolError("reason must be a string", code="INVALID_ARGUMENTS")
        if not job.request_kill(one_line(reason, 200) if reason and reason.strip() else None):
            job.reported = True
            return ToolOutput.text(f"job {job.id} had already finished {job.status_line()}")
        return ToolOutput.text(f"requested cancellation of job {job.id}")


def read_new(job: BgJob, limit: int) -> tuple[str, bool]:
    """The output since the last read, as text, and whether it was cut (head, marker, tail).

    Reads at most ``limit`` bytes from the file whatever the amount written (two seeks), and
    claims the range before any await, so two readers never get the same bytes. While the job
    runs, an incomplete UTF-8 character at the end is left for the next read."""
    start, end = job.read_offset, job.log.size
    if end <= start:
        return "", False
    half = max(1, limit // 2)
    if end - start <= limit:
        data = job.log.read(start, end)
        if not job.settled.is_set():
            data = _whole_chars(data)
            end = start + len(data)
        job.read_offset = end
        return data.decode("utf-8", errors="replace"), False
    head = job.log.read(start, start + half)
    tail = job.log.read(end - half, end)
    if not job.settled.is_set():
        tail = _whole_chars(tail)
        end = end - half + len(tail)
    job.read_offset = end
    return cut_text(head, tail, end - start, job.log.path,
                    where=f"all of the job's output is in {job.log.path} (this read: bytes {start}–{end})"), True


def _whole_chars(data: bytes) -> bytes:
    """``data`` without a UTF-8 sequence cut at its end (at most three bytes held back).

    Not ``codecs``' incremental decoder: that keeps one state per stream, while a read here
    starts wherever the last one stopped (either reader's) or at a tail cut; looking back at
    most four bytes needs no state at all."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data  # ASCII: complete
        if byte >= 0xC0:  # a lead byte: complete only if its sequence fits
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data
