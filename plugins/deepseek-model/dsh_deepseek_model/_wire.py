"""ModelRequest → DeepSeek ``/chat/completions`` body, deterministically.

The output for a history is a pure function of that history and the settings, so the
request for model call *n+1* starts with exactly the bytes of call *n*'s messages: the
system prompt first, tools in the order given, earlier messages never rewritten. That is
what keeps DeepSeek's prefix cache (which matches the longest common request prefix) hitting.

Reasoning replay follows DeepSeek's rules for thinking mode across turns: with thinking on, every assistant
message carries ``reasoning_content`` verbatim (``""`` when the turn produced none); with
thinking off the field is omitted. Tool-call-only turns send ``content: ""``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any

from dsh_core import ModelError
from dsh_core.types import (
    AssistantMessage,
    ImageBlock,
    ModelRequest,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultMessage,
    UserMessage,
)

ImageReader = Callable[[ImageBlock], Awaitable[bytes]]

EMPTY_TOOL_OUTPUT = "(no output)"


def dumps(body: Any) -> bytes:
    """The one JSON encoding used on the wire: stable key order, no whitespace."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _text(blocks: list[Any]) -> str:
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


def _tool_specs(request: ModelRequest) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in request.tools
    ]


async def _image_part(block: ImageBlock, read_image: ImageReader | None, model: str) -> dict[str, Any]:
    if read_image is None:
        raise ModelError(
            f"deepseek: the request holds an image but no attachment store is mounted to read it "
            f"(mount a persistence plugin that provides dsh_attachment_store); model {model}",
            code="INVALID_REQUEST",
        )
    try:
        data = await read_image(block)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(
            f"deepseek: cannot read image {block.digest} from the attachment store: {exc}", code="INVALID_REQUEST"
        ) from exc
    url = f"data:{block.mime};base64,{base64.b64encode(data).decode('ascii')}"
    return {"type": "image_url", "image_url": {"url": url}}


def _no_image(model: str) -> ModelError:
    return ModelError(
        f"deepseek: model {model} does not accept image input; use an image-capable route such as deepseek-flash",
        code="INVALID_REQUEST",
    )


async def _user_content(
    blocks: list[Any], *, image_ok: bool, read_image: ImageReader | None, model: str
) -> str | list[dict[str, Any]]:
    if not any(isinstance(b, ImageBlock) for b in blocks):
        return "\n\n".join(b.text for b in blocks if isinstance(b, TextBlock))
    if not image_ok:
        raise _no_image(model)
    parts: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, TextBlock):
            parts.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageBlock):
            parts.append(await _image_part(b, read_image, model))
    return parts


def _assistant(message: AssistantMessage, *, thinking: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": _text(message.content)}
    if thinking:
        out["reasoning_content"] = "".join(b.text for b in message.content if isinstance(b, ReasoningBlock))
    calls = [b for b in message.content if isinstance(b, ToolCallBlock)]
    if calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments if c.arguments.strip() else "{}"},
            }
            for c in calls
        ]
    return out


async def build_messages(
    request: ModelRequest, *, thinking: bool, read_image: ImageReader | None = None
) -> list[dict[str, Any]]:
    model = request.route.model
    image_ok = request.route.image_input
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    pending_images: list[ImageBlock] = []

    async def flush_images() -> None:
        if pending_images:
            parts: list[dict[str, Any]] = [{"type": "text", "text": "Images returned by the tool calls above:"}]
            for img in pending_images:
                parts.append(await _image_part(img, read_image, model))
            out.append({"role": "user", "content": parts})
            pending_images.clear()

    for message in request.messages:
        if not isinstance(message, ToolResultMessage):
            await flush_images()
        if isinstance(message, UserMessage):
            content = await _user_content(message.content, image_ok=image_ok, read_image=read_image, model=model)
            out.append({"role": "user", "content": content})
        elif isinstance(message, AssistantMessage):
            out.append(_assistant(message, thinking=thinking))
        elif isinstance(message, ToolResultMessage):
            pieces: list[str] = []
            for b in message.content:
                if isinstance(b, TextBlock):
                    pieces.append(b.text)
                elif isinstance(b, ImageBlock):
                    if image_ok:
                        pending_images.append(b)
                        pieces.append(f"[image {len(pending_images)} follows in the next user message]")
                    else:
                        pieces.append(f"[image omitted: {model} does not accept image input]")
            text = "\n".join(p for p in pieces if p)
            out.append({"role": "tool", "tool_call_id": message.call_id, "content": text or EMPTY_TOOL_OUTPUT})
    await flush_images()
    return out


async def build_body(
    request: ModelRequest, *, effort: str, max_tokens: int, read_image: ImageReader | None = None
) -> dict[str, Any]:
    """The full request body. Key order is fixed; only ``messages`` grows between calls."""
    thinking = request.route.thinking and effort != "off"
    body: dict[str, Any] = {
        "model": request.route.model,
        "messages": await build_messages(request, thinking=thinking, read_image=read_image),
    }
    tools = _tool_specs(request) if request.route.tools else []
    if tools:
        body["tools"] = tools
    if thinking:
        body["thinking"] = {"type": "enabled"}
        body["reasoning_effort"] = effort
    else:
        body["thinking"] = {"type": "disabled"}
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    limit = request.max_output or max_tokens
    body["max_tokens"] = max(1, min(limit, request.route.max_output))
    return body
