"""The program side of code mode's Python runtime (standard library only; run as a script).

    python3 -I -S _child.py FD

FD is this process's end of a private socketpair: JSON lines, one message each. The host
sends one ``run`` message (the program, the tool names, the limits); this side applies the
rlimits, compiles the program as the body of an ``async def`` (top-level ``await`` and
``return``), runs it with ``tools`` bound, and answers ``done``. A tool call is a ``call``
message; the host answers ``reply``. stdout and stderr (``print``) go to a pipe the host
captures as the program's output, never to the channel.

host → child   {"t": "run", "program": str, "names": [str], "limits": {...}}
               {"t": "reply", "id": int, "ok": true, "value": any}
               {"t": "reply", "id": int, "ok": false, "tool": str, "error": str, "code": str|null}
child → host   {"t": "call", "id": int, "name": str, "args": {...}}
               {"t": "done", "ok": true, "value": any}            (null: no value)
               {"t": "done", "ok": false, "kind": "exception"|"timeout"|"output-limit", "error": str}
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import resource
import signal
import socket
import sys
import traceback

FILENAME = "<run_code>"


class ToolCallError(Exception):
    """A tool called from the program failed: ``tool_name``, the message, and the tool's error ``code``."""

    def __init__(self, tool_name: str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.tool_name = tool_name
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return f"{self.tool_name}: {self.message}"


class Channel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pending: dict[int, asyncio.Future] = {}
        self.next_id = 0

    def send(self, msg: dict) -> None:
        self.writer.write(json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")

    async def pump(self) -> None:
        while True:
            line = await self.reader.readline()
            if not line:
                os._exit(0)  # the host went away: nothing left to do
            msg = json.loads(line)
            fut = self.pending.pop(msg.get("id"), None)
            if fut is None or fut.done():
                continue
            if msg.get("ok"):
                fut.set_result(msg.get("value"))
            else:
                fut.set_exception(ToolCallError(str(msg.get("tool")), str(msg.get("error")), msg.get("code")))

    async def call(self, name: str, args: dict) -> object:
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        self.send({"t": "call", "id": self.next_id, "name": name, "args": args})
        await self.writer.drain()
        return await fut


class Tools:
    """``await tools.<name>(**arguments)`` calls that tool through the host."""

    def __init__(self, channel: Channel, names: list[str]) -> None:
        self._channel = channel
        self._names = tuple(names)

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._names:
            raise AttributeError(f"no tool {name!r}; the tools are: {', '.join(self._names)}")
        channel = self._channel

        async def call(**arguments: object) -> object:
            return await channel.call(name, arguments)

        call.__name__ = name
        return call

    def __dir__(self) -> list[str]:
        return list(self._names)


def apply_limits(limits: dict) -> None:
    cpu = int(limits.get("cpu_seconds", 60))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the budget, SIGKILL a second later
    address = int(limits.get("address_space_bytes", 0))
    if address > 0:
        resource.setrlimit(resource.RLIMIT_AS, (address, address))
    nproc = int(limits.get("nproc", 0))
    if nproc > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def compile_program(program: str):
    tree = ast.parse(program, filename=FILENAME)
    fn = ast.AsyncFunctionDef(
        name="__program__",
        args=ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
        body=tree.body or [ast.Pass()],
        decorator_list=[],
        returns=None,
        lineno=1,
        col_offset=0,
    )
    module = ast.Module(body=[fn], type_ignores=[])
    ast.fix_missing_locations(module)
    return compile(module, FILENAME, "exec")


def describe(exc: BaseException) -> str:
    """The exception and the program lines it passed through (host frames left out)."""
    lines = []
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == FILENAME:
            lines.append(f"  line {frame.lineno}")
    head = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if isinstance(exc, SyntaxError):
        return head
    return head + (f" (program {', '.join(x.strip() for x in lines)})" if lines else "")


async def main(fd: int) -> None:
    sys.stdout.reconfigure(line_buffering=True)  # a killed program keeps the lines it printed
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=64 * 1024 * 1024)
    channel = Channel(reader, writer)
    first = await reader.readline()
    if not first:
        return
    run = json.loads(first)
    limits = run.get("limits", {})
    max_value = int(limits.get("max_value_bytes", 1 << 20))

    def finish(msg: dict) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        channel.send(msg)
        writer.transport.set_write_buffer_limits(high=0)  # the next drain waits until all of it is sent

    def on_xcpu(signum, frame):  # the compute budget is spent: say so on the channel, then end
        sys.stdout.flush()
        msg = {"t": "done", "ok": False, "kind": "timeout",
               "error": f"the program used its compute budget of {limits.get('cpu_seconds', 60)} s of CPU time"}
        try:
            os.write(fd, json.dumps(msg).encode() + b"\n")
        finally:
            os._exit(3)

    signal.signal(signal.SIGXCPU, on_xcpu)
    apply_limits(limits)
    asyncio.get_running_loop().create_task(channel.pump())
    try:
        code = compile_program(run["program"])
        namespace = {"__name__": "__run_code__", "tools": Tools(channel, run.get("names", [])),
                     "ToolCallError": ToolCallError, "asyncio": asyncio}
        exec(code, namespace)
        value = await namespace["__program__"]()
    except BaseException as exc:  # the program's failure is a result, whatever it raised (SystemExit too)
        finish({"t": "done", "ok": False, "kind": "exception", "error": describe(exc)})
        await writer.drain()
        return
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        finish({"t": "done", "ok": False, "kind": "exception",
                "error": f"the return value is not JSON-serializable: {exc}"})
        await writer.drain()
        return
    except MemoryError:
        finish({"t": "done", "ok": False, "kind": "output-limit", "error": "the return value is too large"})
        await writer.drain()
        return
    if len(text.encode()) > max_value:
        finish({"t": "done", "ok": False, "kind": "output-limit",
                "error": f"the return value is {len(text.encode())} bytes as JSON; the limit is {max_value} bytes"})
    else:
        sys.stdout.flush()
        sys.stderr.flush()
        writer.write(b'{"t":"done","ok":true,"value":' + text.encode() + b"}\n")
    writer.transport.set_write_buffer_limits(high=0)
    await writer.drain()


async def serve(fd: int) -> None:
    await main(fd)
    # Stay until the host has read ``done`` and closes the channel (the pump exits then) or kills us:
    # exiting first could make the host's socket fail on a late reply and drop the unread ``done``.
    await asyncio.sleep(60)


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
    sys.stdout.flush()
    os._exit(0)
