"""The program side of code mode's Python runtime (standard library only).

Loaded once by the warm runtime (``_warm.py``); each run's program process, a fork of it,
calls ``main(FD)``. FD is its end of a private socketpair: JSON lines, one message each. The
host sends a ``program`` message (the program, the tool names, the limits); this side applies
the rlimits and compiles the program as the body of an ``async def`` (top-level ``await`` and
``return``); on ``go`` it runs it with ``tools`` bound, answers ``done`` and exits. A tool call is a
``call`` message; the host answers ``reply``. stdout and stderr (``print``) go to a pipe the
host captures as the program's output, never to the channel.

A program that does not mention ``asyncio`` is driven by a small synchronous loop (each
``await tools.x(...)`` one blocking round trip); one that does runs on asyncio (already
imported by the warm process), so ``asyncio.gather`` overlaps calls.

child → host   {"t": "ready", "cpus": [int]}   (once set up, before the program: the host learns
               this process's pid from the credentials the kernel attaches, and has it woken off
               the host's CPU; ``cpus``: its mask)
host → child   {"t": "program", "program": str, "names": [str], "limits": {...}}
               {"t": "go", "host_cpu": int}   (nothing of the program runs before it)
               {"t": "reply", "id": int, "ok": true, "value": any}
               {"t": "reply", "id": int, "ok": false, "tool": str, "error": str, "code": str|null}
child → host   {"t": "call", "id": int, "name": str, "args": {...}}
               {"t": "done", "ok": true, "value": any}            (null: no value)
               {"t": "done", "ok": false, "kind": "exception"|"timeout"|"output-limit", "error": str}
"""

from __future__ import annotations

import ast
import contextlib  # (loaded by asyncio, which the warm process has loaded)
import json
import os
import resource
import signal
import sys
import types  # already loaded by the interpreter: free
from typing import NoReturn

FILENAME = "<run_code>"
READ_CHUNK = 1 << 16


class ToolCallError(Exception):
    """A tool called from the program failed: ``tool_name``, the message, and the tool's error ``code``."""

    def __init__(self, tool_name: str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.tool_name = tool_name
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return f"{self.tool_name}: {self.message}"


# Tracebacks name it as a built-in: to the program it is one (a global it never imported), and
# the module this file is loaded as (by the warm process) means nothing to the model.
ToolCallError.__module__ = "builtins"


MAX_DEPTH = 100  # JSON nesting a value may have (the host refuses deeper ones too)


def too_deep(value, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests lists/dicts deeper than ``limit`` (iterative: no recursion to overflow)."""
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, list | tuple):
            continue
        if d >= limit:
            return True
        stack.extend((x, d + 1) for x in v)
    return False


# allow_nan=False: NaN/Infinity are not JSON; the host would refuse the line as invalid. One
# encoder for every message (json.dumps with options makes a new one per call).
_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _encode(msg: dict) -> bytes:
    return (_json(msg) + "\n").encode()


def _failed(msg: dict) -> ToolCallError:
    return ToolCallError(str(msg.get("tool")), str(msg.get("error")), msg.get("code"))


class SyncChannel:
    """Blocking JSON lines on the fd: one call at a time (programs that do not use asyncio)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.next_id = 0

    def send(self, msg: dict) -> None:
        data = memoryview(_encode(msg))
        while data:
            data = data[os.write(self.fd, data):]

    def readline(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = os.read(self.fd, READ_CHUNK)
            if not chunk:
                os._exit(0)  # the host went away: nothing left to do
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def call(self, name: str, args: dict) -> object:
        self.next_id += 1
        self.send({"t": "call", "id": self.next_id, "name": name, "args": args})
        while True:
            msg = json.loads(self.readline())
            if msg.get("id") == self.next_id:
                if msg.get("ok"):
                    return msg.get("value")
                raise _failed(msg)


class _Request:
    """What ``tools.x(...)`` returns under the synchronous driver; awaiting it makes the call."""

    def __init__(self, name: str, args: dict) -> None:
        self.name = name
        self.args = args

    def __await__(self):
        return (yield self)


class AsyncChannel:
    """JSON lines on the fd under asyncio: calls overlap (programs that use asyncio).

    ``call`` makes the call at once (in the program's order, whether or not the result is
    ever awaited) and returns a future. A call made while none is in flight leaves at once; the
    calls made after it in the same turn of the event loop leave together in one write; replies
    are read straight off the socket into the futures: no stream objects, no task per call.
    (With the host's batched replies, 200 gathered calls of a tool that answers at once went
    from 40 to 24 ms end to end.)
    """

    def __init__(self, fd: int, loop, leftover: bytes) -> None:
        self.fd = fd
        self.loop = loop
        self.pending: dict = {}
        self.masks = None  # (every CPU allowed, the same without the host's): see keep_off
        self.allowed = _allowed_cpus()  # read now, before the run's way to its first call
        self.apart = False
        # Before ``go``, what the host sends is the run's own messages (``program``, ``go``): they
        # wait here for ``message``; replies come only after calls.
        self.control: list = []
        self.control_ready = None
        self.next_id = 0
        self.out: list[bytes] = []
        self.unsent = b""
        self.buf = leftover
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._readable)

    def call(self, name: str, args: dict):
        self.next_id += 1
        fut = self.loop.create_future()
        waiting = not self.pending and not self.out and not self.unsent  # nothing in flight: the host waits
        self.pending[self.next_id] = fut
        # {"t":"call","id":…,"name":…,"args":…} as _encode writes it, the arguments encoded alone
        self.out.append(f'{{"t":"call","id":{self.next_id},"name":{_json(name)},"args":{_json(args)}}}\n'.encode())
        if waiting:
            # The first call leaves at once: the host starts on it while the program makes the
            # rest (100 gathered reads: the first call reached the host 0.3 ms sooner).
            self._flush()
        elif len(self.out) == 1:
            self.loop.call_soon(self._flush)
        if self.masks is not None and not self.apart and len(self.pending) > 1:
            self._keep_apart(True)
        return fut

    async def message(self) -> dict:
        """The next of the run's own messages (``program``, then ``go``)."""
        while not self.control:
            self.control_ready = ready = self.loop.create_future()
            await ready
        return self.control.pop(0)

    def keep_off(self, cpu: object) -> None:
        """``cpu`` is the host's (the event loop's, when it said ``go``): see ``_keep_apart``. The
        run's own messages are over; what comes now is replies. The whole CPU mask comes back
        first: the host kept this process off its CPU while it waited (``Prepared.keep_off``)."""
        self.control = None  # type: ignore[assignment]
        self.masks = _apart_masks(cpu, self.allowed)
        if self.allowed is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self.allowed)

    def detach(self) -> bytes:
        """Stop the loop's use of the fd (blocking again); what was read of the next message."""
        self.loop.remove_reader(self.fd)
        os.set_blocking(self.fd, True)
        data, self.buf = self.buf, b""
        return data

    def _keep_apart(self, apart: bool) -> None:
        """While two or more calls are in flight, keep off the host's CPU (it was there when the
        run started). The host answers them while this process takes in the replies that came:
        on one CPU, each batch of replies preempted the host. A scheduler that packs tasks onto
        few CPUs (a 2-vCPU VM's did in about half the runs) put this process there; kept apart,
        100 gathered reads took 10.2 instead of 12.6 ms. One call at a time, the two take turns,
        and the scheduler's choice stands: so the whole mask comes back once no call is left."""
        assert self.masks is not None
        try:
            os.sched_setaffinity(0, self.masks[1] if apart else self.masks[0])
        except OSError:
            self.masks = None
            return
        self.apart = apart

    def _flush(self) -> None:
        data = self.unsent + b"".join(self.out)
        self.out.clear()
        try:
            sent = os.write(self.fd, data)
        except BlockingIOError:
            sent = 0
        self.unsent = data[sent:]
        if self.unsent:  # the host applies back-pressure: finish when the socket has room
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        self.loop.remove_writer(self.fd)
        self._flush()

    def _readable(self) -> None:
        try:
            chunk = os.read(self.fd, READ_CHUNK)
        except BlockingIOError:
            return
        if not chunk:
            os._exit(0)  # the host went away: nothing left to do
        data = self.buf + chunk
        end = data.rfind(b"\n") + 1
        self.buf = data[end:]
        if not end:
            return
        # The complete lines decoded as one JSON array (the host's lines hold no raw newline): one
        # decoder call per read, not one per reply (5 replies of a read: 21 -> 14 us).
        for msg in json.loads(b"[" + data[:end - 1].replace(b"\n", b",") + b"]"):
            if self.control is not None:
                self.control.append(msg)
                if self.control_ready is not None and not self.control_ready.done():
                    self.control_ready.set_result(None)
                continue
            fut = self.pending.pop(msg.get("id"), None)
            if fut is None or fut.done():
                continue
            if msg.get("ok"):
                fut.set_result(msg.get("value"))
            else:
                fut.set_exception(_failed(msg))
        if self.apart and not self.pending:
            self._keep_apart(False)

    def close(self) -> bytes:
        """Stop the loop's use of the fd (blocking again); what is still unsent, to send before ``done``."""
        self.detach()
        self.loop.remove_writer(self.fd)
        data = self.unsent + b"".join(self.out)
        self.unsent, self.out = b"", []
        return data


def _allowed_cpus():
    """The CPUs this process may use (None when that cannot be read)."""
    try:
        return os.sched_getaffinity(0)
    except OSError:
        return None


def _apart_masks(cpu: object, allowed):
    """(``allowed``, the same without ``cpu``), or None when that is not a choice (no CPU given,
    one CPU only, ``cpu`` not among them)."""
    if not isinstance(cpu, int) or isinstance(cpu, bool) or cpu < 0 or allowed is None:
        return None
    if cpu not in allowed or len(allowed) < 2:
        return None
    return allowed, allowed - {cpu}


class Tools:
    """``await tools.<name>(**arguments)`` calls that tool through the host."""

    def __init__(self, names: list[str], make_call) -> None:
        self._names = tuple(names)
        self._make_call = make_call

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._names:
            raise AttributeError(f"no tool {name!r}; the tools are: {', '.join(self._names)}")
        make_call = self._make_call

        def call(**arguments: object):
            return make_call(name, arguments)

        call.__name__ = name
        self.__dict__[name] = call  # the next ``tools.<name>`` is found without this method
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
    if limits.get("network") is False:
        cut_network()


# seccomp (linux/seccomp.h, linux/filter.h, linux/audit.h): the classic-BPF filter below.
_AUDIT_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}  # arch, socket, io_uring_setup
_NET_FAMILIES = (2, 10, 17)  # AF_INET, AF_INET6, AF_PACKET
_X32 = 0x40000000  # x86-64's x32 syscalls: another way to the same calls, refused outright


def cut_network() -> None:
    """No internet sockets for this process and everything it starts: a seccomp filter answers
    ``socket(AF_INET | AF_INET6 | AF_PACKET, …)`` and ``io_uring_setup`` (which could open sockets
    itself) with EACCES, and kills a call made through a foreign syscall ABI. Unix sockets (the run's
    channel, already open) stay. Irrevocable (no_new_privs); on an architecture without a table
    here, the run does not start (a program never runs with a network it was told it lacks)."""
    import ctypes  # loaded by the warm process already
    import struct

    machine = os.uname().machine
    arch = _AUDIT_ARCH.get(machine)
    if arch is None:
        raise OSError(f"no seccomp filter for {machine}: a run without network cannot start")
    audit, nr_socket, nr_uring = arch
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, kill, errno = 0x7FFF0000, 0x80000000, 0x00050000 | 13  # SECCOMP_RET_ERRNO | EACCES
    prog = [(ld_w_abs, 0, 0, 4),  # seccomp_data.arch
            (jeq_k, 1, 0, audit), (ret_k, 0, 0, kill),
            (ld_w_abs, 0, 0, 0)]  # seccomp_data.nr
    if machine == "x86_64":
        prog += [(jge_k, 0, 1, _X32), (ret_k, 0, 0, kill)]
    prog += [(jeq_k, 0, 1, nr_uring), (ret_k, 0, 0, errno),
             (jeq_k, 1, 0, nr_socket), (ret_k, 0, 0, allow),
             (ld_w_abs, 0, 0, 16)]  # seccomp_data.args[0], low 32 bits: the address family
    for family in _NET_FAMILIES:
        prog += [(jeq_k, 0, 1, family), (ret_k, 0, 0, errno)]
    prog += [(ret_k, 0, 0, allow)]
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Prog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    for args in ((38, 1, 0, 0, 0), (22, 2, ctypes.addressof(fprog), 0, 0)):  # PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP
        if libc.prctl(*[ctypes.c_ulong(a) for a in args]) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl({args[0]}): {os.strerror(err)}")


# What keeps a program from being compiled as its own text indented one space under a ``def``
# line: a string that spans lines (triple quotes, a backslash before a line's end) would change;
# tabs and form feeds take part in the tokenizer's reckoning of indentation (and a first line of
# code that is indented already: ``_first_statement_indented``).
_NOT_AS_TEXT = ('"""', "'''", "\\\n", "\\\r", "\t", "\f")


def parse_program(program: str) -> tuple[types.CodeType, bool]:
    """(code object of ``async def __program__``, whether the program uses asyncio)."""
    code = _compile_as_text(program)
    if code is None:
        code = _compile_as_tree(program)
    # (a name is NFKC-normalised: "asyncio" may be spelt otherwise in a program that is not ASCII)
    return code, ("asyncio" in program or not program.isascii()) and _names_asyncio(code)


def _compile_as_text(program: str) -> types.CodeType | None:
    """The program compiled from its text, each line indented one space under the ``def`` line,
    and its lines numbered back as the program's own; None where that could change what it means
    or where it does not compile (the syntax tree's way says exactly why). Compiled straight from
    text, no syntax tree is built in Python and converted back: 76 -> 40 us for the benchmark's
    three-line program, about 0.15 ms of a run's way to its first call in a cold program process."""
    if any(s in program for s in _NOT_AS_TEXT) or _first_statement_indented(program):
        return None
    try:
        code = compile("async def __program__():\n " + program.replace("\n", "\n "), FILENAME, "exec")
    except (SyntaxError, ValueError):
        return None
    return _renumbered(code, -1)


def _first_statement_indented(program: str) -> bool:
    """Whether the program's first line of code starts with a space (an "unexpected indent" on
    its own; under the ``def`` line, a body)."""
    for line in program.split("\n"):
        code = line.lstrip(" \r")
        if code and not code.startswith("#"):
            return code is not line and line[:1] == " "
    return False


def _renumbered(code: types.CodeType, delta: int) -> types.CodeType:
    """``code`` and every code object in it with their line numbers moved by ``delta`` (each
    counts its lines from its ``co_firstlineno``)."""
    consts = tuple(_renumbered(c, delta) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_firstlineno=code.co_firstlineno + delta, co_consts=consts)


def _compile_as_tree(program: str) -> types.CodeType:
    tree = ast.parse(program, filename=FILENAME)
    # The parsed body keeps its own locations; only the nodes made here need one (set directly:
    # ast.fix_missing_locations would walk the whole tree for them, 40% of this function's time).
    fn = ast.AsyncFunctionDef(
        name="__program__",
        args=ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
        body=tree.body or [ast.Pass(lineno=1, col_offset=0, end_lineno=1, end_col_offset=0)],
        decorator_list=[],
        returns=None,
        lineno=1,
        col_offset=0,
        end_lineno=1,
        end_col_offset=0,
    )
    return compile(ast.Module(body=[fn], type_ignores=[]), FILENAME, "exec")


def _names_asyncio(code: types.CodeType) -> bool:
    """Whether any code object of the program names ``asyncio`` (a global, a local, an import of
    it or of one of its modules, an attribute: a name the compiler kept, NFKC-normalised as the
    program's identifiers are). Read off the compiled code instead of walking the syntax tree: a
    third of parse_program's time went to that walk."""
    stack = [code]
    while stack:
        c = stack.pop()
        for names in (c.co_names, c.co_varnames, c.co_cellvars, c.co_freevars):
            if any("asyncio" in n for n in names):
                return True
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return False


def describe(exc: BaseException) -> str:
    """The exception and the program lines it passed through (host frames left out)."""
    import traceback

    lines = [f"line {f.lineno}" for f in traceback.extract_tb(exc.__traceback__) if f.filename == FILENAME]
    head = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if isinstance(exc, SyntaxError):
        return head
    return head + (f" (program {', '.join(lines)})" if lines else "")


def outcome(run) -> dict:
    """Run ``run()`` (the program, to completion) and turn what happened into the ``done`` message."""
    try:
        value = run()
    except BaseException as exc:  # the program's failure is a result, whatever it raised (SystemExit too)
        return {"t": "done", "ok": False, "kind": "exception", "error": describe(exc)}
    return {"t": "done", "ok": True, "value": value}


def encode_done(msg: dict, max_value: int) -> bytes:
    if not msg["ok"]:
        return _encode(msg)
    if too_deep(msg["value"]):
        return _encode({"t": "done", "ok": False, "kind": "exception",
                        "error": f"the return value is nested deeper than {MAX_DEPTH} levels; return a flatter value"})
    try:
        text = _json(msg["value"])
    except ValueError as exc:
        return _encode({"t": "done", "ok": False, "kind": "exception",
                        "error": f"the return value is not JSON: {exc} (NaN and Infinity have no JSON form)"})
    except (TypeError, RecursionError) as exc:
        return _encode({"t": "done", "ok": False, "kind": "exception",
                        "error": f"the return value is not JSON-serializable: {exc}"})
    except MemoryError:
        return _encode({"t": "done", "ok": False, "kind": "output-limit", "error": "the return value is too large"})
    size = len(text.encode())
    if size > max_value:
        return _encode({"t": "done", "ok": False, "kind": "output-limit",
                        "error": f"the return value is {size} bytes as JSON; the limit is {max_value} bytes"})
    return b'{"t":"done","ok":true,"value":' + text.encode() + b"}\n"


def drive(coro, channel: SyncChannel):
    """Run a coroutine whose only awaits are tool calls, one blocking round trip each."""
    send, throw = None, None
    while True:
        try:
            request = coro.throw(throw) if throw is not None else coro.send(send)
        except StopIteration as stop:
            return stop.value
        send, throw = None, None
        if not isinstance(request, _Request):
            coro.close()
            raise RuntimeError("only `await tools.<name>(...)` can be awaited in a program that does not "
                               "import asyncio; import asyncio to use it")
        try:
            send = channel.call(request.name, request.args)
        except ToolCallError as exc:
            throw = exc


_REHEARSAL = ('import asyncio\n'
              'got = await asyncio.gather(*[tools.read(file_path=f"a{i}") for i in range(2)])\n'
              'print(got)\nreturn {"n": len(got)}\n')


REHEARSED_CALLS = 2
_REHEARSED_VALUE = {"path": "f.txt", "text": "a line of text\n" * 50, "first_line": 1, "last_line": 50,
                    "total_lines": 50}


def rehearse():
    """What every run does first, done while it waits for its program (a run is made ready ahead,
    off the critical path): this process is a fork, and the first write to each page it shares
    with the warm process costs a page fault and a copy (measured: the steps from the ``run``
    message to the first calls took 4 ms in a fresh fork, 1.5 ms once rehearsed). Gathered
    calls go through a channel of its own on the event loop, as a program's do (measured with
    the process's schedstat, 100 gathered reads: from the run message to the first calls 1.15 ->
    0.95 ms of this process's CPU, to ``done`` 2.6 -> 2.2 ms, against one call's encode and
    decode; its own cost from the fork on is about the same: the work moved off the run's path).
    Returns the event loop a program using asyncio runs on, made now for the same reason;
    nothing of the rehearsal is left on it."""
    import asyncio
    import socket

    parse_program(_REHEARSAL)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # as asyncio.run would
    ours, theirs = socket.socketpair()
    try:
        channel = AsyncChannel(ours.fileno(), loop, b"")
        channel.keep_off(None)
        tools = Tools(["read"], channel.call)

        async def burst() -> None:
            calls = [tools.read(file_path=f"f{i}.txt") for i in range(REHEARSED_CALLS)]
            await asyncio.sleep(0)  # the calls leave in one write
            sent = b""
            while sent.count(b"\n") < REHEARSED_CALLS:
                sent += theirs.recv(READ_CHUNK)
            replies = [_encode({"t": "reply", "id": json.loads(line)["id"], "ok": True, "value": _REHEARSED_VALUE})
                       for line in sent.splitlines()]
            theirs.sendall(b"".join(replies))
            await asyncio.gather(*calls)

        loop.run_until_complete(burst())
        channel.close()
    finally:
        ours.close()
        theirs.close()
    return loop


def batch() -> None:
    """Run as SCHED_BATCH: same share of the CPU, but waking does not preempt a task running on
    this CPU. The host's event loop sends this process its program, then ``go``, then replies,
    and goes on at once with its own work; on a machine that puts the two on one CPU, each wake-up
    took the CPU from the host mid-way (from sending the program to confirming the run's
    confinement: 0.07 ms of the host's CPU took 0.29 ms); nor does the rehearsal of a run made
    ready. Set by the warm runtime before the process is named ready; inherited by what the
    program starts."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or refused: the default policy stays
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def main(fd: int, on_run=None) -> None:
    """Wait for the ``program`` message on ``fd`` and make it ready to run (its limits applied, the
    program compiled), then for ``go``, then run it; ``on_run()`` is called once ``go`` has come
    (the warm runtime renames the process from ready to running). The host sends ``program`` as
    soon as it has one, before it has confirmed that this run's confinement is still the
    session's: the program process compiles it meanwhile, and runs nothing of it before ``go``
    (a run it no longer matches is killed instead).

    Everything that does not depend on the program is done before it comes (the rehearsal, the
    compute budget's handler, the channel on the event loop, the loop running): the way from
    ``program`` to the first call is all this process's, and cold (measured in the program
    process, 100 gathered reads: from ``go`` to the first call 0.30 ms when the loop was entered
    and the channel made after ``go``)."""
    # a killed program keeps the lines it printed (stdout is the runtime's pipe: a TextIOWrapper)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    loop = rehearse()
    limits: dict = {}  # the run's, once its program has come

    def on_xcpu(signum, frame):  # the compute budget is spent: say so on the channel, then end
        sys.stdout.flush()
        msg = {"t": "done", "ok": False, "kind": "timeout",
               "error": f"the program used its compute budget of {limits.get('cpu_seconds', 60)} s of CPU time"}
        try:
            os.write(fd, _encode(msg))
        finally:
            os._exit(3)

    signal.signal(signal.SIGXCPU, on_xcpu)
    # On the loop made ready. Not asyncio.run: what it adds comes after the program's end (its
    # tasks cancelled, the loop closed), and _serve ends the process before that; its start
    # (a task in a copied context, a SIGINT handler) was 0.1 ms of each run's way to its calls.
    synchronous = loop.run_until_complete(_serve(AsyncChannel(fd, loop, b""), limits, on_run))
    loop.close()  # a program without asyncio runs with no descriptor of it
    synchronous()


async def _serve(channel: AsyncChannel, limits: dict, on_run):
    """The run, on its event loop: the program, ``go``, the program run; ends the process. For a
    program that does not use asyncio, returns what runs it once the loop is closed."""
    ready = {"t": "ready", "cpus": sorted(channel.allowed)} if channel.allowed is not None else {"t": "ready"}
    os.write(channel.fd, _encode(ready))  # set up, waiting (the socket is empty: a short write never blocks)
    run = await channel.message()
    limits.update(run.get("limits", {}))
    max_value = int(limits.get("max_value_bytes", 1 << 20))
    names = run.get("names", [])
    failed = None
    try:
        apply_limits(limits)
    except OSError as exc:  # never run a program with less confinement than it was given
        failed = {"t": "done", "ok": False, "kind": "exception", "error": f"the run could not be confined: {exc}"}
    if failed is None:
        try:
            code, uses_asyncio = parse_program(run["program"])
        except BaseException as exc:
            failed = {"t": "done", "ok": False, "kind": "exception", "error": describe(exc)}
    namespace: dict = {"__name__": "__run_code__", "ToolCallError": ToolCallError}  # the program's globals
    if failed is None:
        exec(code, namespace)  # defines ``__program__``: nothing of the program runs before it is called
        if uses_asyncio:  # its tools made now, before ``go``
            import asyncio

            namespace["tools"] = Tools(names, channel.call)
            namespace["asyncio"] = asyncio
    go = await channel.message()
    channel.keep_off(go.get("host_cpu"))
    if on_run is not None:
        on_run()
    if failed is not None:
        finish(channel.fd, channel.close() + encode_done(failed, 0))
    if not uses_asyncio:  # one blocking round trip a call
        sync = SyncChannel(channel.fd)
        sync.buf = channel.detach()
        namespace["tools"] = Tools(names, _Request)
        return lambda: finish(sync.fd, encode_done(outcome(lambda: drive(namespace["__program__"](), sync)),
                                                   max_value))
    try:
        value = await namespace["__program__"]()
        msg = {"t": "done", "ok": True, "value": value}
    except BaseException as exc:
        msg = {"t": "done", "ok": False, "kind": "exception", "error": describe(exc)}
    # Answer from inside the loop, blocking: tasks the program left behind (or a thread of its
    # executor) must not hold the answer back while the loop winds them down.
    finish(channel.fd, channel.close() + encode_done(msg, max_value))  # and the process ends


def finish(fd: int, data: bytes) -> NoReturn:
    """Flush the program's output, send ``data`` (the ``done`` message) on ``fd`` (blocking), and
    end the process."""
    sys.stdout.flush()
    sys.stderr.flush()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    # Then end at once: the host reads ``done`` from its socket whatever happens to this end,
    # and the process's teardown overlaps the host's work on the answer.
    os._exit(0)
