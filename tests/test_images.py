"""Images end to end over real stdio with the official SDK client: capability, admission and
committed output (ACP-2, ACP-4, ACP-6 in docs/acp-contract.md)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from acp import RequestError, text_block
from acp.helpers import image_block

from dsh_testing import make_png

pytestmark = pytest.mark.anyio

VISION = {"capabilities": {"image_input": True}}


def log_text(home: Path, sid: str) -> str:
    return (home / "sessions" / f"{sid}.jsonl").read_text()


async def test_capability_is_advertised_only_with_a_store_and_an_image_route(acp_agent, scripted):
    # acp-agent mounts the attachment store; the route decides
    async with acp_agent(scripted(VISION)) as run:
        assert (await run.conn.initialize(protocol_version=1)).agent_capabilities.prompt_capabilities.image is True
    async with acp_agent(scripted({"capabilities": {"image_input": False}})) as run:
        assert (await run.conn.initialize(protocol_version=1)).agent_capabilities.prompt_capabilities.image is False
    # an image route without a store (acp-testkit mounts none) is not enough
    async with acp_agent(scripted(VISION), example="acp-testkit") as run:
        assert (await run.conn.initialize(protocol_version=1)).agent_capabilities.prompt_capabilities.image is False


async def test_inline_png_keeps_wire_order_and_the_log_holds_only_a_reference(acp_agent, scripted):
    png = make_png(3, 2)
    data = base64.b64encode(png).decode()
    async with acp_agent(scripted({**VISION, "default": [{"text": "seen"}]})) as run:
        sid = await run.start()
        resp = await run.conn.prompt(
            session_id=sid, prompt=[text_block("before "), image_block(data, "image/png"), text_block(" after")]
        )
        assert resp.stop_reason == "end_turn"
    log = log_text(acp_agent.home, sid)
    assert data not in log and data[:40] not in log  # no base64 in the durable log
    user = next(json.loads(line) for line in log.splitlines() if '"user/message"' in line)
    content = user["message"]["content"]
    assert [b["type"] for b in content] == ["text", "image", "text"]
    image = content[1]
    assert image["mime"] == "image/png" and image["size"] == len(png)
    assert (image["width"], image["height"]) == (3, 2)
    assert image["digest"].startswith("sha256:")


@pytest.mark.parametrize(
    "block, message",
    [
        (image_block("AB==", "image/png"), "image data must be canonical base64"),
        (image_block(base64.b64encode(b"GIF89a....").decode(), "image/tiff"), "image mimeType must be"),
        (image_block(base64.b64encode(make_png()).decode(), "image/jpeg"), "Invalid params"),
    ],
)
async def test_bad_images_are_invalid_params_and_nothing_is_written(acp_agent, scripted, block, message):
    async with acp_agent(scripted(VISION)) as run:
        sid = await run.start()
        with pytest.raises(RequestError) as err:
            await run.conn.prompt(session_id=sid, prompt=[text_block("look"), block])
        assert err.value.code == -32602 and message in str(err.value)
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("still here")])).stop_reason == "end_turn"
    objects = acp_agent.home / "attachments" / "objects"
    assert not objects.exists() or not any(p.is_file() for p in objects.rglob("*"))


async def test_an_image_without_capability_is_rejected(acp_agent, scripted):
    async with acp_agent(scripted({})) as run:
        sid = await run.start()
        with pytest.raises(RequestError) as err:
            await run.conn.prompt(
                session_id=sid, prompt=[image_block(base64.b64encode(make_png()).decode(), "image/png")]
            )
        assert err.value.code == -32602
        assert "inline image prompts were not advertised by this connection" in str(err.value)


async def test_assistant_image_is_delivered_byte_identical_in_block_order(acp_agent, scripted, tmp_path):
    png = make_png(4, 4, (0, 128, 255))
    script = scripted({**VISION, "default": [{"text": "here it is", "image": "pic.png"}]})
    (script.parent / "pic.png").write_bytes(png)
    async with acp_agent(script) as run:
        sid = await run.start()
        assert (await run.conn.prompt(session_id=sid, prompt=[text_block("draw")])).stop_reason == "end_turn"
        updates = [u for s, u in run.client.updates if s == sid]
        assert [u.content.type for u in updates] == ["text", "image"]
        assert base64.b64decode(updates[1].content.data) == png
        assert updates[1].content.mime_type == "image/png"


async def test_a_corrupted_stored_image_fails_the_prompt_without_a_placeholder(acp_agent, scripted):
    script = scripted({**VISION, "default": [{"text": "look", "image": "pic.png"}]})
    (script.parent / "pic.png").write_bytes(make_png())
    async with acp_agent(script, example="acp-corrupt") as run:
        sid = await run.start()
        with pytest.raises(RequestError) as err:
            await run.conn.prompt(session_id=sid, prompt=[text_block("draw")])
        assert err.value.code == -32603
        assert "assistant output delivery failed: cannot deliver assistant image" in str(err.value)
        kinds = [u.content.type for s, u in run.client.updates if s == sid]
        assert kinds == ["text"]  # the text before it, and no image placeholder
