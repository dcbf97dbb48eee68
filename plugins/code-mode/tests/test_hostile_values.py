"""Hostile return values and channel messages (issue 22 item 7): nesting deeper than any JSON
encoder recurses, NaN, and raw deep messages each end the run with one clear, bounded line,
never a worker crash or a host traceback."""

from __future__ import annotations

import textwrap

import anyio
import pytest

from conftest import run
from dsh_core.types import ToolResultEvent

pytestmark = pytest.mark.anyio

FD = "int(__import__('sys').argv[1])"


async def _first(code_host, code: str) -> ToolResultEvent:
    steps = [run(textwrap.dedent(code)), run('return "still serving"'), {"text": "done"}]
    with anyio.fail_after(60):
        async with code_host(steps) as turn:
            await turn.agent.wait_idle()
    first, second = turn.of(ToolResultEvent)
    assert second.result.content[0].text == "still serving"
    return first


def _text(result: ToolResultEvent) -> str:
    return result.result.content[0].text


@pytest.mark.parametrize("depth", [3_000, 100_000])
async def test_a_deeply_nested_return_value_is_one_clear_error(code_host, depth, capfd):
    result = await _first(code_host, f'''
        v = []
        for _ in range({depth}):
            v = [v]
        return v
    ''')
    assert result.result.is_error and result.code != "CODE_WORKER_EXIT", _text(result)
    assert "nested" in _text(result) and len(_text(result)) < 500
    assert "Traceback" not in capfd.readouterr().err


async def test_nan_return_value_is_one_clear_error(code_host, capfd):
    result = await _first(code_host, 'return {"x": float("nan")}')
    assert result.result.is_error and result.code != "CODE_WORKER_EXIT", _text(result)
    assert "NaN" in _text(result) or "nan" in _text(result)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("payload", [b"[" * 200_000 + b"]" * 200_000, b"[" * 3_000 + b"]" * 3_000])
async def test_a_raw_deep_done_message_is_invalid_output(code_host, payload, capfd):
    result = await _first(code_host, f'''
        import os
        os.write({FD}, b'{{"t":"done","ok":true,"value":' + {payload!r} + b'}}\\n')
        await asyncio.sleep(5)
    ''')
    assert result.code == "CODE_INVALID_OUTPUT", _text(result)
    assert "nested" in _text(result) and len(_text(result)) < 500
    assert "Traceback" not in capfd.readouterr().err
