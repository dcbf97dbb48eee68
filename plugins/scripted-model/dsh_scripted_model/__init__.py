"""scripted-model: a keyless, deterministic model for tests and demos.

``--provider scripted --model PATH`` plays back the JSON script at PATH. The format
is documented in this plugin's README.md.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import anyio
import msgspec
from msgspec import Meta

from dsh_core import ModelError, RouteError, config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.media import sniff_image
from dsh_core.paths import exists_inside, open_inside
from dsh_core.types import (
    Finish,
    ImageDelta,
    ModelDelta,
    ModelInfo,
    ModelRequest,
    ReasoningDelta,
    RetryPolicy,
    TextBlock,
    TextDelta,
    ToolCallDelta,
    ToolResultMessage,
    Usage,
    UsageDelta,
    UserMessage,
)

PROVIDER = "scripted"

# What each simulated failure looks like: the message a real provider's adapter would give.
ERRORS: dict[str, tuple[str, str, bool, int]] = {
    "rate_limit": ("simulated provider error (HTTP 429): rate limit reached", "RATE_LIMIT", True, 429),
    "server": ("simulated provider error (HTTP 500): server error", "SERVER", True, 500),
    "auth": ("simulated provider error (HTTP 401)", "AUTH", False, 401),
    "context_length": (
        "simulated provider error (HTTP 400): maximum context length exceeded",
        "CONTEXT_WINDOW_EXCEEDED",
        False,
        400,
    ),
    # a provider's filter stopped the answer (DeepSeek: finish_reason content_filter, on an HTTP 200)
    "content_filter": ("simulated provider stop: content_filter", "CONTENT_FILTER", False, 200),
}

_SUBST = re.compile(r"\{(prompt|tool_result|cwd|started_id)\}")
# What a tool result says when something keeps running after it (a background subagent, a job).
_STARTED = re.compile(r"\b(?:started subagent|started background job|job id) ([A-Za-z0-9_:-]*[A-Za-z0-9])")


class Step(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    text: str | None = None
    tool: str | None = None
    args: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    error: str | None = None
    finish: str | None = None
    image: str | None = None
    partial: str | None = None
    delay_ms: int = 0
    mark: str | None = None  # created (relative to the cwd) once `partial` is out, before the wait
    wait_for: str | None = None  # a file (relative to the cwd) the step waits for, after its mark and delay
    reasoning: str | None = None
    usage: dict[str, int] | None = None


async def _pause(step: Step, cwd: str, sub: Callable[[Any], Any]) -> None:
    """Between a step's partial and its answer: create its mark (the consumer has taken the
    partial; say so for whoever waits), then wait its delay (cancellable)."""
    if step.mark is not None:
        _touch_inside(cwd or ".", sub(step.mark))  # one small local file operation
    if step.delay_ms:
        await anyio.sleep(step.delay_ms / 1000)
    if step.wait_for is not None:
        target = sub(step.wait_for)
        with anyio.move_on_after(WAIT_FOR_S):
            while not exists_inside(cwd or ".", target):
                await anyio.sleep(0.005)


WAIT_FOR_S = 30.0  # the longest a step waits for its file; then it answers anyway




def _touch_inside(cwd: str, mark: str) -> None:
    """Create the empty file ``mark`` inside ``cwd`` and nowhere else. This model runs in the dsh
    process, unconfined, and a script may come from a repository someone else wrote (``--model
    demo.json`` is read from the cwd first): a mark that leads out of the cwd (absolute, ``..``,
    a symlink pointing out) fails the call (``dsh_core.paths.open_inside``)."""
    try:
        os.close(open_inside(cwd, mark, os.O_WRONLY | os.O_CREAT, 0o644))
    except OSError as exc:
        raise ModelError(f"scripted model: mark {mark!r} is not a path inside the session's cwd ({exc.strerror})",
                         code="INVALID_REQUEST", retryable=False) from None


class Rule(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    when: str
    steps: list[Step]
    repeat: bool = False


class Capabilities(msgspec.Struct, kw_only=True):
    image_input: bool = False
    tools: bool = True
    context_window: int = 128_000
    max_output: int = 8_192


class Script(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    capabilities: Capabilities = msgspec.field(default_factory=Capabilities)
    rules: list[Rule] = msgspec.field(default_factory=list)
    default: list[Step] | None = None
    repeat_default: bool = False


@dataclass
class _Loaded:
    path: Path
    script: Script
    patterns: list[re.Pattern[str]]
    mtime_ns: int
    # id(a call's args) -> their JSON, for the args of the script's calls that hold no placeholder:
    # encoded once, not substituted and encoded on every call (~7 calls a tool step)
    static_args: dict[int, str] = field(default_factory=dict)


@dataclass
class _Cursor:
    """Where one session is in its script: the prompt it serves and the next step."""

    prompt_id: str = ""
    prompt: str = ""
    steps: list[Step] = field(default_factory=list)
    repeat: bool = False
    index: int = 0
    calls: int = 0


def _validate(script: Script, path: Path) -> list[re.Pattern[str]]:
    patterns = []
    for i, rule in enumerate(script.rules):
        try:
            patterns.append(re.compile(rule.when))
        except re.error as exc:
            raise RouteError(f"scripted model {path}: rule {i} has a bad regex {rule.when!r}: {exc}") from exc
    for step in [s for r in script.rules for s in r.steps] + list(script.default or []):
        if step.error is not None and step.error not in ERRORS:
            raise RouteError(f"scripted model {path}: unknown error {step.error!r} (one of {', '.join(ERRORS)})")
        if step.finish not in (None, "length", "stop"):
            raise RouteError(f"scripted model {path}: unknown finish {step.finish!r} (use \"length\")")
    return patterns


def _is_prompt(message: Any) -> bool:
    """A message that asks something: the user's (or a parent agent's) prompt, or a stop hook's
    reason to go on (source "hook", plain text; a script may answer it). Not one the harness
    added beside a prompt: a tool's splice, a compaction summary, a notice (a subagent settled),
    or a hook's context (source "hook", every block a ``<system-reminder>``), which a rule's
    ``when`` never sees."""
    if not isinstance(message, UserMessage) or message.source in ("tool", "compaction", "notice"):
        return False
    return message.source != "hook" or not all(
        isinstance(b, TextBlock) and b.text.startswith("<system-reminder>") for b in message.content
    )


def _latest_prompt(messages: Sequence[Any]) -> tuple[UserMessage | None, Sequence[Any]]:
    """The latest prompt (``_is_prompt``) of ``messages`` and the messages after it (all of them:
    none). Looked for in a window from the end that grows: a slice of the agent's HistoryView is
    one copy in C, where reading it message by message was a Python call each (~12 calls a model
    call, bench/profile_prompt.py --bash)."""
    n, size = len(messages), 8
    while True:
        start = max(0, n - size)
        window = messages[start:]
        for i in range(len(window) - 1, -1, -1):
            if _is_prompt(window[i]):
                return window[i], window[i + 1 :]
        if start == 0:
            return None, window
        size *= 8


def _static_args(script: Script) -> dict[int, str]:
    """The JSON of each call's args in ``script`` that hold no ``{...}`` placeholder, by the args'
    identity (the script's own objects, alive as long as the loaded script)."""
    out: dict[int, str] = {}
    for step in [s for r in script.rules for s in r.steps] + list(script.default or []):
        for args in [step.args, *(call.get("args") for call in step.tools or [])]:
            if isinstance(args, dict) and not _SUBST.search(json.dumps(args)):
                out[id(args)] = json.dumps(args)
    return out


def _substitute(value: Any, values: Mapping[str, str]) -> Any:
    """``value`` with ``{prompt}``, ``{tool_result}`` and ``{cwd}`` filled in, through lists and dicts."""
    if isinstance(value, str):
        return _SUBST.sub(lambda m: values[m.group(1)], value)
    if isinstance(value, list):
        return [_substitute(v, values) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, values) for k, v in value.items()}
    return value


class _Values(dict[str, str]):
    """The substitutions of one step; ``started_id`` is looked for only when a step names it (it
    scans the history backwards: on every call it would cost a long session ~0.3 ms a prompt)."""

    messages: Any = ()

    def __missing__(self, key: str) -> str:
        if key != "started_id":
            raise KeyError(key)
        found = self[key] = _started_id(self.messages)
        return found


def _started_id(messages: Any) -> str:
    """The id the latest ``started subagent <id>`` (or ``started background job <id>``, ``job id <id>``)
    tool result named; "" for none."""
    for m in reversed(messages):
        if isinstance(m, ToolResultMessage):
            found = _STARTED.search(_flatten(m.content))
            if found:
                return found.group(1)
    return ""


def _flatten(blocks: list[Any]) -> str:
    if len(blocks) == 1 and isinstance(blocks[0], TextBlock):  # most prompts and results: no generator
        return blocks[0].text
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


class ScriptedProvider:
    name = PROVIDER

    def __init__(self) -> None:
        self.host: Any = None
        self.retry_policy = RetryPolicy(max_retries=2, base_delay=0.001, max_delay=0.01, jitter=0.0)
        self._scripts: dict[str, _Loaded] = {}
        self._cursors: dict[str, _Cursor] = {}

    # ------------------------------------------------------------------ catalogue

    def _load(self, model: str) -> _Loaded:
        # One stat per model call (to pick up edited scripts); no path resolution on the hot path.
        where = model
        try:
            mtime = os.stat(where).st_mtime_ns
        except OSError:
            # A relative path that is not beside the caller may name a script shipped in the
            # example's own directory (`--model demo.json` works from an installed wheel too).
            where = self._beside_example(model)
            try:
                mtime = os.stat(where).st_mtime_ns
            except OSError:
                raise RouteError(
                    f"scripted model: no script at {model!r}; pass --model PATH to a JSON script "
                    "(see plugins/scripted-model/README.md; demo: examples/acp-agent/demo.json)"
                ) from None
        cached = self._scripts.get(model)
        if cached is not None and cached.mtime_ns == mtime:
            return cached
        path = Path(where).expanduser().resolve()
        try:
            script = msgspec.json.decode(path.read_bytes(), type=Script)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise RouteError(f"scripted model {path}: invalid script: {exc}") from exc
        loaded = _Loaded(path, script, _validate(script, path), mtime, _static_args(script))
        self._scripts[model] = loaded
        return loaded

    def _beside_example(self, model: str) -> str:
        directory = getattr(getattr(self.host, "composition", None), "directory", None)
        if directory is None or os.path.isabs(model):
            return model
        return os.path.join(directory, model)

    def resolve(self, model: str) -> ModelInfo:
        caps = self._load(model).script.capabilities
        return ModelInfo(
            provider=PROVIDER,
            model=model,
            context_window=caps.context_window,
            max_output=caps.max_output,
            tools=caps.tools,
            thinking=True,
            image_input=caps.image_input,
        )

    # ------------------------------------------------------------------ playback

    def _cursor(self, request: ModelRequest, loaded: _Loaded) -> tuple[_Cursor, str, str]:
        # The prompt is the latest user message (a failed earlier turn leaves its message in the
        # history right before it; that one is not part of this prompt). Messages a tool spliced in
        # mid-turn (source "tool", e.g. images from code mode) belong to the prompt before them, and
        # a compaction summary (source "compaction") belongs to no prompt: when the prompt itself was
        # compacted away, the session goes on with the steps it was playing.
        head, since = _latest_prompt(request.messages)
        prompt = _flatten(head.content) if head is not None else ""
        prompt_id = head.id if head is not None else ""
        tool_result = ""
        for m in since:
            if isinstance(m, ToolResultMessage):
                tool_result = _flatten(m.content)
        cursor = self._cursors.get(request.session_id)
        if cursor is None:
            cursor = self._cursors[request.session_id] = _Cursor()
        if head is None and cursor.prompt_id:
            prompt = cursor.prompt
        elif cursor.prompt_id != prompt_id:
            script = loaded.script
            for rule, pattern in zip(script.rules, loaded.patterns, strict=False):
                if pattern.search(prompt):
                    steps, repeat = rule.steps, rule.repeat
                    break
            else:
                if script.default is not None:
                    steps, repeat = script.default, script.repeat_default
                else:
                    steps, repeat = [Step(text="echo: {prompt}")], False
            cursor.prompt_id, cursor.steps, cursor.repeat, cursor.index = prompt_id, steps, repeat, 0
            cursor.prompt = prompt
        return cursor, prompt, tool_result

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelDelta, None]:
        loaded = self._load(request.route.model)
        cursor, prompt, tool_result = self._cursor(request, loaded)
        if cursor.index >= len(cursor.steps):
            if not (cursor.repeat and cursor.steps):
                yield Finish(reason="stop")
                return
            cursor.index = 0
        step = cursor.steps[cursor.index]
        cursor.index += 1
        values = _Values(prompt=prompt, tool_result=tool_result, cwd=request.cwd)
        values.messages = request.messages

        def sub(value: Any) -> Any:
            return _substitute(value, values)

        if step.partial is not None:
            yield TextDelta(text=sub(step.partial))
        if step.mark is not None or step.delay_ms or step.wait_for is not None:
            await _pause(step, request.cwd, sub)
        if step.error is not None:
            message, code, retryable, status = ERRORS[step.error]
            raise ModelError(message, code=code, retryable=retryable, status=status)
        if step.reasoning:
            yield ReasoningDelta(text=sub(step.reasoning))
        if step.text:
            yield TextDelta(text=sub(step.text))
        if step.image is not None:
            yield ImageDelta(image=await self._save_image(loaded.path.parent / step.image))
        calls = list(step.tools or [])
        if step.tool is not None:
            calls.insert(0, {"name": step.tool, "args": step.args or {}})
        cut = step.finish == "length"
        for i, call in enumerate(calls):
            cursor.calls += 1
            args = call.get("args", {})
            arguments = loaded.static_args.get(id(args)) or json.dumps(sub(args))
            if cut and i == len(calls) - 1:
                arguments = arguments[: len(arguments) // 2]  # max tokens hit while this call streamed
            yield ToolCallDelta(index=i, id=f"call_{cursor.calls}", name=call["name"], arguments=arguments)
        if step.usage:
            yield UsageDelta(usage=msgspec.convert(step.usage, Usage))
        if step.finish == "length":
            yield Finish(reason="max-tokens")
        else:
            yield Finish(reason="tool-calls" if calls else "stop")

    async def _save_image(self, path: Path) -> Any:
        if self.host is None or self.host.attachment_store is None:
            raise ModelError(
                f"scripted model: step image {path.name!r} needs an attachment store, and none is mounted",
                code="MALFORMED_RESPONSE",
            )
        data = await anyio.Path(path).read_bytes()
        mime = sniff_image(data) or "application/octet-stream"
        (block,) = await self.host.attachment_store.save_images([(mime, data)])
        return block

    def forget(self, session_id: str) -> None:
        self._cursors.pop(session_id, None)


class ScriptedConfig(PluginConfig):
    """[config.scripted-model]"""

    max_retries: Annotated[int, Meta(ge=0, description="retries of a retryable scripted error (delays are ~1 ms)")] = 2


dsh_config_type = config_type_hook("scripted-model", ScriptedConfig)


@hookimpl
def dsh_register_models(register: Any, host: Any) -> None:
    provider = ScriptedProvider()
    provider.host = host
    provider.retry_policy = RetryPolicy(max_retries=host.config_for(ScriptedConfig).max_retries, base_delay=0.001,
                                        max_delay=0.01, jitter=0.0)
    register(provider)
