"""Prompt admission (ACP-4): a prompt's content blocks, validated and converted without awaiting,
then its images saved to the attachment store as one batch."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import msgspec
from dsh_acp import wire
from dsh_acp.rpc import internal_error, invalid_params

from dsh_core import AttachmentError
from dsh_core.media import RASTER_MIME_TYPES, Base64Error, decode_base64_strict
from dsh_core.types import ImageBlock, TextBlock

from .state import BridgeState, Session

log = logging.getLogger("dsh.acp")

_PROMPT_BLOCKS = msgspec.json.Decoder(wire.ContentIn)


def _embedded_text(block: wire.ResourceIn) -> tuple[str, str]:
    """(uri, text) of an embedded text resource; a blob or a malformed resource is invalid params."""
    res = block.resource
    if not isinstance(res, dict) or not isinstance(res.get("uri"), str):
        raise invalid_params("embedded resource needs a resource with a uri and text")
    if "blob" in res and "text" not in res:
        raise invalid_params(
            f"embedded binary resources are not supported ({res['uri']}); send text, or a resource_link"
        )
    if not isinstance(res.get("text"), str):
        raise invalid_params(f"embedded resource {res['uri']} has no text")
    return res["uri"], res["text"]




class PromptContent(BridgeState):
    """Turns ``session/prompt`` content into the user message's blocks."""

    def _admit(self, raw_blocks: list[msgspec.Raw]) -> tuple[list[Any], list[tuple[int, str, bytes]]]:
        """Validate and convert a prompt without awaiting (ACP-4, prompt admission). Images are
        decoded here and returned as (index, mime, bytes) for ``_store_images``; their slots in content are None."""
        blocks: list[Any] = []
        for i, raw in enumerate(raw_blocks):
            try:
                blocks.append(_PROMPT_BLOCKS.decode(raw))
            except msgspec.ValidationError as exc:
                raise invalid_params(f"malformed prompt content block {i}: {exc}") from None
        content: list[Any] = []
        images: list[tuple[int, str, bytes]] = []

        def add_text(text: str) -> None:
            if content and isinstance(content[-1], TextBlock):
                content[-1] = TextBlock(text=content[-1].text + text)
            else:
                content.append(TextBlock(text=text))

        for block in blocks:
            if isinstance(block, wire.TextIn):
                add_text(block.text)
            elif isinstance(block, wire.ResourceLinkIn):  # a textual reference, never fetched
                prev = content[-1].text if content and isinstance(content[-1], TextBlock) else ""
                sep = "\n" if prev and not prev[-1].isspace() else ""
                add_text(f"{sep}[Resource link: {block.name} <{block.uri}>]")
            elif isinstance(block, wire.AudioIn):
                raise invalid_params("audio prompt content is not supported")
            elif isinstance(block, wire.ResourceIn):  # embedded text, e.g. an @file mention
                uri, text = _embedded_text(block)
                prev = content[-1].text if content and isinstance(content[-1], TextBlock) else ""
                sep = "\n" if prev and not prev.endswith("\n") else ""
                end = "" if text.endswith("\n") or not text else "\n"
                add_text(f"{sep}[Resource: {uri}]\n{text}{end}[End of resource: {uri}]")
            elif isinstance(block, wire.ImageIn):
                images.append((len(content), block.mime_type, self._decode_image(block)))
                content.append(None)  # placeholder, filled after the batch is saved
        if not any(isinstance(b, TextBlock) and b.text.strip() for b in content) and not images:
            raise invalid_params("empty prompt")
        return content, images

    async def _store_images(self, session: Session, content: list[Any], images: list[tuple[int, str, bytes]]) -> None:
        refs = await self._save_images(session, [(mime, data) for _, mime, data in images])
        for (index, _, _), ref in zip(images, refs, strict=False):
            content[index] = ref

    def _decode_image(self, block: wire.ImageIn) -> bytes:
        if not self.image_capable():
            raise invalid_params("inline image prompts were not advertised by this connection")
        if block.mime_type not in RASTER_MIME_TYPES:
            raise invalid_params("image mimeType must be image/png, image/jpeg, image/webp, or image/gif")
        try:
            return decode_base64_strict(block.data)
        except Base64Error:
            raise invalid_params("image data must be canonical base64") from None

    async def _save_images(self, session: Session, batch: list[tuple[str, bytes]]) -> list[ImageBlock]:
        store = self.host.attachment_store
        if store is None:
            raise invalid_params("no attachment store is mounted")
        agent = session.agent
        try:
            route = agent.provider.resolve(agent.route.model)  # the session's *current* route
        except Exception:
            raise internal_error("the current model route could not be verified for image input") from None
        if not route.image_input:
            raise invalid_params(f'model "{route.model}" does not declare image input')
        try:
            with anyio.CancelScope(shield=True):  # writes already started finish (ACP-8)
                saved: list[ImageBlock] = await store.save_images(batch)
            return saved
        except AttachmentError as exc:
            raise invalid_params(str(exc)) from None
        except Exception as exc:
            log.warning(f"saving prompt images failed: {exc!r}")
            raise internal_error("unable to persist the prompt image batch") from None

