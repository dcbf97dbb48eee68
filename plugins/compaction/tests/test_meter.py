"""The token meter and the split, as units; the estimator measured against the fake DeepSeek
server's own token counts (the server is the peer whose numbers the meter adds to)."""

from __future__ import annotations

import json

import anyio
import pytest
from dsh_compaction import Compactor, Settings, parse_settings, render_transcript, split_point
from dsh_compaction._meter import Meter, history_tokens, message_tokens, prefix_tokens, reading, text_tokens
from fake_deepseek import render_prompt

from dsh_core import ConfigError
from dsh_core.types import (
    AssistantMessage,
    ModelInfo,
    ModelRequest,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)

TOOLS = [
    ToolSpec(name="read", description="Read a file of the workspace, with line numbers.",
             parameters={"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                         "required": ["path"]}),
    ToolSpec(name="bash", description="Run a shell command in the sandbox and return its output.",
             parameters={"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
]
SOURCE = "\n".join(f"def f{i}(x):\n    return x * {i}  # ünïcode {i}" for i in range(200))


def _session(turns: int) -> list:
    out: list = []
    for t in range(turns):
        out.append(UserMessage(id=f"u{t}", content=[TextBlock(text=f"Please look at module_{t}.py and fix the bug.")]))
        out.append(AssistantMessage(id=f"a{t}", content=[
            ReasoningBlock(text=f"I should read module_{t}.py first."),
            ToolCallBlock(id=f"call_{t}", name="read", arguments=json.dumps({"path": f"module_{t}.py"}))]))
        out.append(ToolResultMessage(call_id=f"call_{t}", name="read", content=[TextBlock(text=SOURCE)]))
        out.append(AssistantMessage(id=f"b{t}", content=[TextBlock(text=f"Fixed module_{t}.py: f3 multiplied by 4.")]))
    return out


def test_text_tokens_rounds_bytes_up():
    assert text_tokens("") == 0 and text_tokens("abcd") == 1 and text_tokens("abcde") == 2
    assert text_tokens("é" * 4) == 2  # UTF-8 bytes, not characters


def test_reading_adds_the_estimate_of_what_was_appended_to_the_reported_count():
    history = _session(3)
    tail = history[8:]
    assert reading(system="s", tools=TOOLS, history=history, metered_tokens=5000, metered_messages=8) == (
        5000 + history_tokens(tail))
    # no report (or a report about a longer history than there is): everything is estimated
    whole = prefix_tokens("s", TOOLS) + history_tokens(history)
    assert reading(system="s", tools=TOOLS, history=history, metered_tokens=None, metered_messages=0) == whole
    assert reading(system="s", tools=TOOLS, history=history, metered_tokens=5000, metered_messages=99) == whole


def test_meter_keeps_a_running_total_and_notices_a_rewrite():
    history = _session(4)
    meter = Meter()
    whole = prefix_tokens("s", TOOLS) + history_tokens(history)
    for n in (3, 7, 16):  # the history growing append-only
        assert meter.reading(system="s", tools=TOOLS, history=history[:n], metered_tokens=None, metered_messages=0) == (
            prefix_tokens("s", TOOLS) + history_tokens(history[:n]))
    rewritten = [UserMessage(id="sum", content=[TextBlock(text="summary")]), *history[-3:]]
    assert meter.reading(system="s", tools=TOOLS, history=rewritten, metered_tokens=None, metered_messages=0) == (
        prefix_tokens("s", TOOLS) + history_tokens(rewritten))
    assert meter.reading(system="s", tools=TOOLS, history=history, metered_tokens=None, metered_messages=0) == whole
    assert meter.reading(system="s", tools=TOOLS, history=history, metered_tokens=7, metered_messages=15) == (
        7 + message_tokens(history[-1]))
    from dsh_core.types import HistoryView

    viewed = Meter()  # the agent's views of one growing history (a call with nothing new among them)
    for n in (0, 1, 3, 3, 7, 16):
        assert viewed.reading(system="s", tools=TOOLS, history=HistoryView(history, n), metered_tokens=None,
                              metered_messages=0) == prefix_tokens("s", TOOLS) + history_tokens(history[:n])


@pytest.mark.parametrize("turns", [1, 4, 12])
def test_estimate_is_close_to_the_fake_deepseek_count(turns):
    from dsh_deepseek_model._wire import build_body

    history = _session(turns)
    route = ModelInfo(provider="deepseek", model="deepseek-flash", thinking=True)
    request = ModelRequest(route=route, system="You are dsh.", messages=history, tools=TOOLS)
    body = anyio.run(lambda: build_body(request, effort="high", max_tokens=8192))
    actual = len(render_prompt(body))
    estimate = reading(system=request.system, tools=TOOLS, history=history, metered_tokens=None, metered_messages=0)
    error = (estimate - actual) / actual
    print(f"\nturns={turns} fake-deepseek={actual} estimate={estimate} error={error:+.1%}")
    assert abs(error) < 0.10


def test_split_keeps_the_recent_share_and_never_starts_with_a_tool_result():
    history = _session(3)  # ends: assistant(call), result, assistant(text)
    last_three = sum(message_tokens(m) for m in history[-3:])
    assert split_point(history, last_three) == len(history) - 3  # the call and its result stay together
    assert split_point(history, last_three - 1) == len(history) - 1  # the result would lead: it goes too
    assert split_point(history, 10**9) == 0  # everything fits: nothing older to summarise
    assert split_point(history, 0) == len(history)  # nothing fits: summarise all


def test_split_moves_past_a_leading_tool_result():
    history = _session(1)  # user, assistant(call), result, assistant
    budget = message_tokens(history[2]) + message_tokens(history[3])
    assert split_point(history, budget) == 3  # the result's call is summarised, so is the result


def test_transcript_is_cut_in_the_middle_to_fit():
    history = _session(30)
    text = render_transcript(history, budget_tokens=2_000)
    assert len(text.encode()) < 8_000 + 200 and "bytes of the transcript omitted" in text
    assert text.startswith("[user (user)]\nPlease look at module_0.py") and text.rstrip().endswith("multiplied by 4.")
    assert "I should read" not in text  # reasoning is private
    assert render_transcript(history[:2], budget_tokens=2_000).count("-> read(") == 1


def test_settings_defaults_and_validation():
    assert parse_settings({}) == Settings(threshold_ratio=0.8, retain_ratio=0.08, max_tokens=8192)
    assert parse_settings({"compaction": {"threshold-ratio": 0.5, "max-tokens": 100}}).threshold_ratio == 0.5
    for bad in ({"threshold-ratio": 1.5}, {"retain-ratio": 0}, {"max-tokens": 0}, {"retain-ratio": 0.9},
                {"treshold": 0.8}):
        with pytest.raises(ConfigError, match=r"\[config.compaction\]"):
            parse_settings({"compaction": bad})
    assert isinstance(Compactor(Settings()), Compactor)
