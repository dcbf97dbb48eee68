"""A running tool call's progress (``ToolContext.progress``, ``dsh_core.progress``): the tail it
shows is bounded, it is sent at a bounded rate and only when it changed, it reaches the agent's
progress watchers and nothing else (never the log, never the model), and with no watcher a tool
gathers nothing at all."""

from __future__ import annotations

from itertools import pairwise

import anyio
import pytest

from dsh_core import FunctionTool, hookimpl
from dsh_core.contracts import AgentSpec
from dsh_core.progress import EVERY_S, TAIL_BYTES, TAIL_LINES, OutputTail, output_progress
from dsh_core.types import TextBlock, ToolProgress, ToolResultEvent, UserMessage
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio


def test_the_tail_is_the_last_whole_lines_of_a_bounded_window():
    tail = OutputTail()
    for i in range(10_000):  # about 1 MB
        tail.feed(f"line {i:05d} ".encode() + b"x" * 90 + b"\n")
    text = tail.text()
    assert len(text.encode()) <= TAIL_BYTES and len(text.split("\n")) <= TAIL_LINES
    assert text.split("\n")[-2].startswith("line 09999 ") and text.split("\n")[0].startswith("line ")
    assert len(tail._kept) <= 2 * TAIL_BYTES  # what it holds stays bounded too
    assert tail.total == 10_000 * 102


def test_the_tail_shows_a_progress_bar_as_a_terminal_leaves_it_and_never_half_a_character():
    tail = OutputTail()
    tail.feed(b"building\n 10%\r 50%\r100%\r\ndone\n")
    assert tail.text() == "building\n100%\ndone\n"
    cut = OutputTail(size=8)
    cut.feed("héé\nab\ncd\n".encode())  # the window of 8 bytes starts inside an é
    assert cut.text() == "ab\ncd\n"
    assert "\ufffd" not in OutputTail(size=5).text()


class _Ctx:
    """What ``output_progress`` uses of a ``ToolContext``."""

    def __init__(self, watched: bool) -> None:
        self.shows_progress = watched
        self.sent: list[tuple[float, str]] = []

    def progress(self, text: str) -> None:
        self.sent.append((anyio.current_time(), text))


async def test_progress_is_sent_at_most_every_interval_only_when_changed_and_never_after_the_end():
    ctx = _Ctx(True)
    async with output_progress(ctx) as feed:  # type: ignore[arg-type]
        assert feed is not None
        began = anyio.current_time()
        while anyio.current_time() - began < 1.0:  # a chunk every 10 ms for a second
            feed(b"more\n")
            await anyio.sleep(0.01)
        await anyio.sleep(2 * EVERY_S)  # quiet: the last tail goes out once, then nothing
        quiet = len(ctx.sent)
        await anyio.sleep(2 * EVERY_S)
        assert len(ctx.sent) == quiet
        feed(b"last\n")
    times = [t for t, _ in ctx.sent]
    assert 2 <= len(times) <= 1.0 / EVERY_S + 2
    assert all(b - a >= EVERY_S * 0.95 for a, b in pairwise(times))
    assert len({text for _, text in ctx.sent}) == len(ctx.sent)  # never the same tail twice
    assert not ctx.sent[-1][1].endswith("last\n")  # the block ended first: the result replaces it


async def test_nobody_watching_costs_nothing():
    ctx = _Ctx(False)
    async with output_progress(ctx) as feed:  # type: ignore[arg-type]
        assert feed is None  # nothing to feed, no task started
    assert ctx.sent == []


async def test_a_tools_progress_reaches_the_watchers_only_and_never_the_log(scripted, tmp_path):
    seen_unwatched: list[bool] = []

    class Chatty:
        @hookimpl
        def dsh_register_tools(self, register):
            async def chatty(args, ctx):
                seen_unwatched.append(ctx.shows_progress)
                async with output_progress(ctx) as feed:
                    if feed is not None:
                        feed(b"step one\n")
                        await anyio.sleep(EVERY_S * 1.5)
                        feed(b"step two\n")
                        await anyio.sleep(EVERY_S * 1.5)
                return "all steps done"

            register(FunctionTool("chatty", "Say what it does.", {"type": "object"}, chatty))

    script = scripted({"default": [{"tool": "chatty", "args": {}}, {"text": "{tool_result}"}]})
    async with memory_host(script, Chatty()) as host:
        quiet = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        quiet.submit(UserMessage(id="u1", content=[TextBlock(text="go")]))
        await quiet.wait_idle()
        assert seen_unwatched == [False]  # nobody watches: the tool gathers nothing

        agent = host.create_agent(AgentSpec(cwd=str(tmp_path), provider="scripted", model=str(script)))
        pieces: list[ToolProgress] = []
        unwatch = agent.watch_progress(lambda a, piece: pieces.append(piece))
        assert agent.progress_watched
        agent.submit(UserMessage(id="u2", content=[TextBlock(text="go")]))
        await agent.wait_idle()
        unwatch()
        assert not agent.progress_watched
        events = host.session_store.logs[agent.session_id].events
    (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert [(p.call_id, p.tool_name, p.text) for p in pieces] == [
        (result.result.call_id, "chatty", "step one\n"), (result.result.call_id, "chatty", "step one\nstep two\n")]
    assert not any("step one" in repr(e) for e in events)  # not durable, not in the model's history
    assert "step one" not in repr(agent.history)
