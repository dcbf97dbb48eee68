"""run_code through a real host: the real runtime (a confined Python subprocess), real tools, real files."""

from __future__ import annotations

import json
import textwrap

import anyio
import pytest

from conftest import run
from dsh_core.types import (
    AssistantMessageEvent,
    CodeDispatch,
    CodeDispatchStart,
    RequestHeader,
    ToolResultEvent,
)

pytestmark = pytest.mark.anyio


def _result(turn) -> ToolResultEvent:
    (result,) = turn.of(ToolResultEvent)
    return result


def _text(result: ToolResultEvent) -> str:
    return result.result.content[0].text


async def test_a_program_writes_through_tools_and_reads_back_through_bash(code_host, workspace):
    code = textwrap.dedent('''
        w = await tools.write(file_path="notes/a.txt", content="alpha\\n")
        b = await tools.bash(description="Run the command", command="cat notes/a.txt && echo beta")
        print("wrote", w["bytes"], "bytes; created:", w["created"])
        return b["output"].strip() + f" (exit {b['exit_code']})"
    ''')
    async with code_host([run(code), {"text": "said: {tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    assert (workspace / "notes" / "a.txt").read_text() == "alpha\n"
    result = _result(turn)
    assert not result.result.is_error
    assert _text(result) == "wrote 6 bytes; created: True\nalpha\nbeta (exit 0)"
    starts, dispatches = turn.of(CodeDispatchStart), turn.of(CodeDispatch)
    assert [s.call_id for s in starts] == ["call_1:code:1", "call_1:code:2"]
    assert [(d.name, d.is_error, json.loads(d.arguments)) for d in dispatches] == [
        ("write", False, {"file_path": "notes/a.txt", "content": "alpha\n"}),
        ("bash", False, {"description": "Run the command", "command": "cat notes/a.txt && echo beta"}),
    ]
    assert dispatches[1].result[0].text == "alpha\nbeta\n"  # the native result, recorded durably
    assert all(d.parent_call_id == "call_1" for d in starts + dispatches)
    # Only the outer run_code result is in the model's history: one tool result, no nested ones.
    assert [r.result.name for r in turn.of(ToolResultEvent)] == ["run_code"]


async def test_code_mode_offers_only_run_code_and_points_direct_calls_at_it(code_host):
    steps = [{"tool": "bash", "args": {"description": "Run the command", "command": "echo hi"}}, {"text": "{tool_result}"}]
    async with code_host(steps) as turn:
        await turn.agent.wait_idle()
    (header,) = turn.of(RequestHeader)
    assert [t["name"] for t in header.tools] == ["run_code"]
    assert "run_code is your only tool" in header.system
    assert "class Tools(Protocol):" in header.system and "async def bash(self, *, command: str" in header.system
    result = _result(turn)
    assert result.code == "UNKNOWN_TOOL"
    assert _text(result) == (
        "Error: unknown tool 'bash'. Available tools: run_code. Tools are called from programs in this session: "
        "call run_code and use `await tools.<name>(...)` inside it."
    )


async def test_both_mode_offers_the_native_tools_and_run_code(code_host):
    steps = [{"tool": "bash", "args": {"description": "Run the command", "command": "echo native"}},
             run('return (await tools.bash(description="Run the command", command="echo coded"))["output"]'), {"text": "{tool_result}"}]
    async with code_host(steps, mode="both") as turn:
        await turn.agent.wait_idle()
    (header,) = turn.of(RequestHeader)
    assert [t["name"] for t in header.tools] == ["bash", "read", "write", "edit", "glob", "grep", "read_image",
                                                 "run_code"]
    assert "only tool" not in header.system and "class Tools(Protocol):" in header.system
    assert [_text(r) for r in turn.of(ToolResultEvent)] == ["native\n", "coded\n"]


async def test_a_blank_description_is_refused(code_host):
    async with code_host([run("return 1", description="  "), {"text": "{tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    result = _result(turn)
    assert result.code == "INVALID_ARGUMENTS" and "description" in _text(result)
    assert not turn.of(CodeDispatchStart)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("pass", "(run_code completed with no output)"),
        ("print('a')\nprint('b')", "a\nb"),
        ("return 'plain'", "plain"),
        ("print('x')\nreturn {'n': [1, 2]}", 'x\n{\n  "n": [\n    1,\n    2\n  ]\n}'),
        ("return None", "(run_code completed with no output)"),
    ],
)
async def test_the_outer_result_is_the_logs_then_the_value(code_host, code, expected):
    async with code_host([run(code), {"text": "{tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    assert _text(_result(turn)) == expected


@pytest.mark.parametrize(("code", "expected"), [
    # the event loop made while the run waited for its program is the program's, as asyncio.run's would be
    ("import asyncio\nreturn [asyncio.get_event_loop() is asyncio.get_running_loop(), "
     "asyncio.get_event_loop_policy().get_event_loop() is asyncio.get_running_loop()]", "[\n  true,\n  true\n]"),
    # a program without asyncio holds no descriptor of that loop: stdin, stdout, stderr, its channel
    ("import os\nreturn len(os.listdir('/proc/self/fd')) - 1", "4"),
])
async def test_a_ready_runs_rehearsal_leaves_nothing_a_program_could_tell(code_host, code, expected):
    async with code_host([run(code), {"text": "{tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    assert _text(_result(turn)) == expected


async def test_an_exception_is_an_error_result_with_the_captured_output(code_host):
    code = "print('before')\nx = 1\nraise ValueError('boom')"
    async with code_host([run(code), {"text": "{tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    result = _result(turn)
    assert result.result.is_error and result.code == "CODE_EXCEPTION"
    assert _text(result) == "code run failed (exception): ValueError: boom (program line 3)\nbefore"


async def test_a_failed_call_raises_tool_call_error_with_the_tool_name_and_code(code_host):
    code = textwrap.dedent('''
        try:
            await tools.read(file_path="missing.txt")
        except ToolCallError as e:
            return f"{e.tool_name} {e.code}: {e.message}"
    ''')
    async with code_host([run(code), {"text": "{tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    assert _text(_result(turn)).startswith("read NOT_FOUND: missing.txt does not exist")
    (dispatch,) = turn.of(CodeDispatch)
    assert dispatch.is_error and dispatch.code == "NOT_FOUND"


async def test_an_uncaught_tool_call_error_fails_the_run(code_host):
    async with code_host([run('await tools.read(file_path="nope")'), {"text": "{tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    text = _text(_result(turn))
    assert text.startswith("code run failed (exception): ToolCallError: read: nope does not exist")


async def test_bash_does_not_raise_for_a_non_zero_exit(code_host):
    code = 'r = await tools.bash(description="Run the command", command="echo oops; exit 3")\nreturn [r["exit_code"], r["output"], r["timed_out"]]'
    async with code_host([run(code), {"text": "{tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    assert json.loads(_text(_result(turn))) == [3, "oops\n", False]


async def test_structured_results_of_read_glob_grep(code_host, workspace):
    (workspace / "a.py").write_text("one\ntwo\nthree\n")
    code = textwrap.dedent('''
        r = await tools.read(file_path="a.py", offset=2, limit=1)
        g = await tools.glob(pattern="*.py")
        m = await tools.grep(pattern="t", path="a.py")
        return {"read": r, "glob": g, "grep": m}
    ''')
    async with code_host([run(code), {"text": "{tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    assert json.loads(_text(_result(turn))) == {
        "read": {"path": "a.py", "text": "two\n", "first_line": 2, "last_line": 2, "total_lines": 3},
        "glob": {"paths": ["a.py"], "truncated": False},
        "grep": {"matches": [{"path": "a.py", "line": 2, "text": "two"}, {"path": "a.py", "line": 3, "text": "three"}],
                 "truncated": False},
    }


async def test_gathered_reads_overlap_and_writes_run_alone_in_order(code_host, workspace):
    # A slow parallel-safe tool records how many of its calls run at once.
    from dsh_core import FunctionTool, hookimpl

    state = {"now": 0, "peak": 0, "order": []}

    class Slow:
        @hookimpl
        def dsh_register_tools(self, register):
            async def peek(args, ctx):
                state["now"] += 1
                state["peak"] = max(state["peak"], state["now"])
                await anyio.sleep(0.05)
                state["now"] -= 1
                return f"peeked {args['n']}"

            async def poke(args, ctx):
                state["order"].append(("start", args["n"], state["now"]))
                await anyio.sleep(0.01)
                state["order"].append(("end", args["n"]))
                return "poked"

            register(FunctionTool("peek", "Peek.", {"type": "object", "properties": {"n": {"type": "integer"}}}, peek,
                                  parallel_safe=True))
            register(FunctionTool("poke", "Poke.", {"type": "object", "properties": {"n": {"type": "integer"}}}, poke))

    code = textwrap.dedent('''
        import asyncio
        got = await asyncio.gather(*[tools.peek(n=i) for i in range(12)])
        await asyncio.gather(tools.poke(n=1), tools.poke(n=2), tools.peek(n=99))
        return len(got)
    ''')
    async with code_host([run(code), {"text": "{tool_result}"}], extra=(Slow(),), max_parallel_sub_calls=4) as turn:
        await turn.agent.wait_idle()
    assert _text(_result(turn)) == "12"
    assert state["peak"] == 4  # overlapping, up to max-parallel-sub-calls
    assert state["order"] == [("start", 1, 0), ("end", 1), ("start", 2, 0), ("end", 2)]
    ids = [s.call_id for s in turn.of(CodeDispatchStart)]
    assert ids[-3:] == ["call_1:code:13", "call_1:code:14", "call_1:code:15"]  # started in submission order


async def test_the_program_keeps_off_the_hosts_cpu_only_while_its_calls_overlap(code_host):
    """With two or more calls in flight the program process leaves the CPU the host ran on when
    the run started (``_child.AsyncChannel._keep_apart``); with one, or none left, it may use
    every CPU it was given. On a single-CPU machine there is nothing to leave: the mask stays."""
    import os

    from dsh_core import FunctionTool, hookimpl

    class Slow:
        @hookimpl
        def dsh_register_tools(self, register):
            async def peek(args, ctx):
                await anyio.sleep(0.05)
                return "peeked"

            register(FunctionTool("peek", "Peek.", {"type": "object", "properties": {"n": {"type": "integer"}}}, peek,
                                  parallel_safe=True))

    code = textwrap.dedent('''
        import asyncio, os
        one = tools.peek(n=0)
        alone = sorted(os.sched_getaffinity(0))
        await one
        calls = [tools.peek(n=i) for i in range(3)]
        during = sorted(os.sched_getaffinity(0))
        await asyncio.gather(*calls)
        return {"alone": alone, "during": during, "after": sorted(os.sched_getaffinity(0))}
    ''')
    async with code_host([run(code), {"text": "{tool_result}"}], extra=(Slow(),)) as turn:
        await turn.agent.wait_idle()
    got = json.loads(_text(_result(turn)))
    given = sorted(os.sched_getaffinity(0))  # the host's: the warm process and each run inherit it
    assert got["alone"] == given and got["after"] == given
    if len(given) > 1:
        assert len(got["during"]) == len(given) - 1 and set(got["during"]) < set(given)
    else:
        assert got["during"] == given


@pytest.mark.parametrize(("program", "uses"), [
    ("import asyncio\nawait asyncio.sleep(0)", True),
    ("from asyncio import gather\nreturn 1", True),
    ("import asyncio.subprocess\nreturn 1", True),
    ("def f():\n    return asyncio.sleep(0)\nreturn 1", True),  # a nested function's global
    ("return [asyncio for _ in range(1)]", True),  # a comprehension's
    ("\uff41\uff53\uff59\uff4e\uff43\uff49\uff4f.sleep\nreturn 1", True),  # fullwidth: the same name (NFKC)
    ('r = await tools.read(file_path="a")\nreturn r', False),
    ('x = "asyncio"\nreturn x', False),  # a string is not the module
])
def test_a_program_runs_on_asyncio_when_it_names_it(program, uses):
    from dsh_code_mode._child import parse_program

    code, uses_asyncio = parse_program(program)
    assert uses_asyncio is uses and code.co_consts[0].co_name == "__program__"


def _shape(code):
    """What a program's compiled form means, for comparing two ways of compiling it: each code
    object's name, instructions with their lines (after its prologue, which belongs to the
    ``def`` line) and constants (strings included), depth first."""
    import dis

    ops = [(i.opname, i.argval.co_name if hasattr(i.argval, "co_lines") else i.argrepr, i.positions.lineno)
           for i in dis.get_instructions(code)]
    body = ops[next((k + 1 for k, op in enumerate(ops) if op[0] == "RESUME"), 0):]
    consts = tuple(_shape(c) if hasattr(c, "co_lines") else c for c in code.co_consts)
    return code.co_name, code.co_names, code.co_varnames, body, consts


@pytest.mark.parametrize(("program", "as_text"), [
    ('x = 1\ny = [i for i in range(3)]\nraise ValueError(y)', True),
    ('def f(a):\n    return lambda: (a,\n  "one line")\n\nreturn f(1)()', True),  # a bracket spans lines
    ("s = 'a\u2028b'\r\nreturn s", True),  # \u2028 is no line end to Python; \r\n is
    ('"the docstring"\nreturn 1', True),
    ('s = """two\nlines"""\nreturn s', False),  # the string would change: compiled as a tree
    ("s = 'a\\\nb'\nreturn s", False),  # a backslash continues the string
    ("if True:\n\treturn 1", False),  # tabs
    ("  return 1", False),  # an indented first line: the tree's error says why
    ("", False), ("# only a comment", False),  # no statement: the tree's way gives __program__ a body
])
def test_a_program_compiled_from_its_text_means_what_its_syntax_tree_does(program, as_text):
    from dsh_code_mode import _child

    text = _child._compile_as_text(program)
    assert (text is not None) is as_text
    try:
        tree = _child._compile_as_tree(program)
    except SyntaxError:
        assert text is None
        return
    assert text is None or _shape(text.co_consts[0]) == _shape(tree.co_consts[0])


async def test_a_failing_programs_traceback_names_its_own_lines(code_host):
    code = "x = 1\ndef f():\n    raise ValueError('deep')\n\nf()"
    async with code_host([run(code), {"text": "{tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    assert "(program line 5, line 3)" in _text(_result(turn))


def test_the_first_call_of_a_burst_leaves_at_once_and_the_rest_together():
    """The first call made while none is in flight is written before the program goes on (the
    host starts on it meanwhile); the calls made after it in the same loop turn leave in one write."""
    import asyncio
    import socket

    from dsh_code_mode import _child

    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    try:
        channel = _child.AsyncChannel(ours.fileno(), loop, b"")
        channel.call("read", {"file_path": "a"})
        assert theirs.recv(4096) == b'{"t":"call","id":1,"name":"read","args":{"file_path":"a"}}\n'
        channel.call("read", {"file_path": "b"})
        channel.call("read", {"file_path": "c"})
        with pytest.raises(BlockingIOError):
            theirs.recv(4096)  # not yet: they wait for the end of the loop turn
        loop.run_until_complete(asyncio.sleep(0))
        assert theirs.recv(4096).count(b"\n") == 2
        channel.close()
    finally:
        loop.close()
        ours.close()
        theirs.close()


async def test_a_reply_is_not_held_back_for_the_calls_still_queued_behind_it(code_host):
    """Replies wait a few loop turns for others while calls are queued (one write for several),
    never for a slow call: with one call at a time, the first call's reply reaches the program
    while the slow calls queued behind it still run."""
    from dsh_core import FunctionTool, hookimpl

    class Tools:
        @hookimpl
        def dsh_register_tools(self, register):
            async def instant(args, ctx):
                return "now"

            async def slow(args, ctx):
                await anyio.sleep(0.5)
                return "later"

            schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
            register(FunctionTool("instant", "Instant.", schema, instant, parallel_safe=True))
            register(FunctionTool("slow", "Slow.", schema, slow, parallel_safe=True))

    code = textwrap.dedent('''
        import asyncio, time
        start = time.monotonic()
        first = tools.instant(n=0)
        rest = [tools.slow(n=i) for i in range(3)]
        await first
        waited = time.monotonic() - start
        await asyncio.gather(*rest)
        return waited
    ''')
    async with code_host([run(code), {"text": "{tool_result}"}], extra=(Tools(),), max_parallel_sub_calls=1) as turn:
        await turn.agent.wait_idle()
    assert float(_text(_result(turn))) < 0.25  # the slow calls take 1.5 s one after another


async def test_outstanding_calls_are_cancelled_and_drained_when_the_program_ends(code_host):
    code = textwrap.dedent('''
        import asyncio
        asyncio.ensure_future(tools.bash(description="Run the command", command="sleep 30"))
        await asyncio.sleep(0.3)
        return "left early"
    ''')
    with anyio.fail_after(20):
        async with code_host([run(code), {"text": "{tool_result}"}]) as turn:
            await turn.agent.wait_idle()
    assert _text(_result(turn)) == "left early"
    (dispatch,) = turn.of(CodeDispatch)
    assert dispatch.code == "ABORTED" and dispatch.is_error


async def test_unknown_attribute_on_tools_names_the_tools(code_host):
    async with code_host([run("await tools.run_code(code='1', description='x')"), {"text": "{tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    text = _text(_result(turn))
    assert "AttributeError: no tool 'run_code'; the tools are: bash, read, write, edit, glob, grep, read_image" in text


async def test_the_model_history_holds_only_the_outer_result(code_host):
    async with code_host([run('await tools.bash(description="Run the command", command="echo secret-$((40+2))")\nreturn "outer"'),
                          {"text": "{tool_result}"}]) as turn:
        await turn.agent.wait_idle()
    history = turn.agent._history
    assert "secret-42" not in json.dumps([str(m) for m in history])
    assert "secret-42" in turn.of(CodeDispatch)[0].result[0].text
    final = turn.of(AssistantMessageEvent)[-1]
    assert final.message.content[0].text == "outer"


@pytest.mark.parametrize("vision", [True, False])
async def test_an_image_from_a_nested_read_image_is_spliced_in_before_the_next_step(code_host, workspace, vision):
    from dsh_core.types import ImageBlock, UserMessageEvent
    from dsh_testing import make_png

    (workspace / "red.png").write_bytes(make_png(3, 2))
    code = 'r = await tools.read_image(file_path="red.png")\nreturn [r["mime"], r["width"], r["height"]]'
    async with code_host([run(code), {"text": "{tool_result}"}], capabilities={"image_input": vision}) as turn:
        await turn.agent.wait_idle()
    kinds = [type(e).__name__ for e in turn.events]
    users = turn.of(UserMessageEvent)
    if vision:
        assert json.loads(_text(_result(turn))) == ["image/png", 3, 2]
        spliced = users[-1].message
        assert spliced.source == "tool"
        assert [type(b).__name__ for b in spliced.content] == ["TextBlock", "TextBlock", "ImageBlock"]
        assert isinstance(spliced.content[-1], ImageBlock) and spliced.content[-1].mime == "image/png"
        # after the run_code result, before the next model call
        assert kinds.index("ToolResultEvent") < len(kinds) - 1 - kinds[::-1].index("UserMessageEvent")
        assert kinds[::-1].index("UserMessageEvent") > kinds[::-1].index("AssistantMessageEvent")
    else:
        assert "ToolCallError: read_image: cannot read \"red.png\" as an image" in _text(_result(turn))
        assert [u.message.source for u in users] == ["user"]


async def test_setting_cancel_aborts_the_run_and_kills_the_program(workspace):
    from dsh_code_mode.runtime import PythonRuntime

    from dsh_testing import memory_host

    class NoTools:
        names: tuple[str, ...] = ()

        def call(self, name, args, arguments=None):  # pragma: no cover - the program makes no calls
            raise AssertionError

    async with memory_host("unused.json", plugins=("sandbox-tools",)) as host:
        runtime = PythonRuntime(host, str(workspace))
        cancel = anyio.Event()

        async def later():  # cancel once the program says it spins
            while not (workspace / "spinning").exists():
                await anyio.sleep(0.01)
            cancel.set()

        program = 'print("spinning")\nopen("spinning", "w").close()\nwhile True:\n    pass'
        async with anyio.create_task_group() as tg:
            tg.start_soon(later)
            with anyio.fail_after(10):
                result = await runtime.run(program, NoTools(), cancel)
    assert result.error is not None and result.error.kind == "abort"
    assert result.logs == ["spinning"]


async def test_a_reminder_for_many_nested_calls_is_spliced_in_once(code_host, workspace):
    """The same after-tool context for each of a program's calls (a repeat reminder for every one
    of a gather's reads) reaches the model once, after the step; different texts each once, in order."""
    from dsh_core import hookimpl
    from dsh_core.types import AfterTool, UserMessageEvent

    class Remind:
        @hookimpl
        def dsh_after_tool(self, session, call, output):
            if call.name == "read":
                return AfterTool(context=["reads repeat", "a second note"])
            return None

    for i in range(3):
        (workspace / f"f{i}.txt").write_text("x\n")
    code = 'import asyncio\nawait asyncio.gather(*[tools.read(file_path=f"f{i}.txt") for i in range(3)])\nreturn "ok"'
    async with code_host([run(code), {"text": "done"}], extra=(Remind(),)) as turn:
        await turn.agent.wait_idle()
    spliced = [e.message for e in turn.of(UserMessageEvent) if e.message.source == "tool"]
    texts = [b.text for m in spliced for b in m.content]
    assert len(texts) == 2, texts  # 3 calls x 2 texts, each text once
    assert "reads repeat" in texts[0] and "a second note" in texts[1]
