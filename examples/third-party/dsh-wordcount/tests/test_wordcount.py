"""Unit tests on an in-process host (``memory_host``): the scripted model calls the tool, the
session log says what happened. No subprocess, no network; the snapshot scenario in
snapshots/wordcount/ drives the same tool through a real ``dsh run`` over ACP."""

from __future__ import annotations

import os

import pytest

from dsh_core.contracts import AgentSpec
from dsh_core.types import TextBlock, ToolResultEvent, UserMessage
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio  # async tests run on anyio's pytest plugin (installed with dsh-core)


async def call(scripted, cwd, args, config=None):
    """One prompt whose script calls word_count with ``args``; the tool's result event."""
    script = scripted({"default": [{"tool": "word_count", "args": args}, {"text": "{tool_result}"}]})
    async with memory_host(script, plugins=("scripted-model", "wordcount"), config=config) as host:
        agent = host.create_agent(AgentSpec(cwd=str(cwd), provider="scripted", model=str(script)))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="count")]))
        await agent.wait_idle()
        (result,) = [e for e in host.session_store.logs[agent.session_id].events if isinstance(e, ToolResultEvent)]
    return result


async def test_counts_lines_words_and_bytes(scripted, tmp_path):
    (tmp_path / "notes.txt").write_text("one two\nthree\n")
    result = await call(scripted, tmp_path, {"path": "notes.txt"})
    assert not result.result.is_error
    assert result.result.content[0].text == "2 lines, 3 words, 14 bytes"


@pytest.mark.parametrize(("args", "code", "message"), [
    ({"path": "missing.txt"}, "NOT_FOUND", "Error: no file 'missing.txt' in the workspace"),
    ({"path": "../outside.txt"}, "OUTSIDE_WORKSPACE", "Error: '../outside.txt' is outside the workspace"),
    ({"path": "big.txt"}, "TOO_LARGE", "Error: 'big.txt' has 40 bytes, over max-bytes (10)"),
    ({"path": "link.txt"}, "OUTSIDE_WORKSPACE", "Error: 'link.txt' is outside the workspace"),  # a symlink out
    ({"path": "pipe"}, "NOT_FOUND", "Error: no file 'pipe' in the workspace"),  # a FIFO: not read, not hung on
    # the schema's `required`: dsh answers before the tool runs
    ({}, "INVALID_ARGUMENTS", "Error: word_count: missing required argument 'path'. "
                              "Call it again with arguments that match its schema."),
])
async def test_errors_the_model_can_act_on(scripted, tmp_path, args, code, message):
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "outside.txt").write_text("secret\n")
    (work / "big.txt").write_text("x" * 40)
    (work / "link.txt").symlink_to(tmp_path / "outside.txt")
    os.mkfifo(work / "pipe")
    result = await call(scripted, work, args, config={"wordcount": {"max-bytes": 10}})
    assert result.result.is_error and result.code == code
    assert result.result.content[0].text == message


async def test_a_bad_config_table_is_one_clear_error(scripted, tmp_path):
    from dsh_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\[config.wordcount\] max-bytes: expected `int` >= 1, found 0"):
        await call(scripted, tmp_path, {"path": "x"}, config={"wordcount": {"max-bytes": 0}})
