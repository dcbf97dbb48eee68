"""Media helpers shared by plugins (the attachment store, tools, models)."""

from __future__ import annotations

import base64
import binascii

from .errors import AttachmentError

RASTER_MIME_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


class Base64Error(AttachmentError, ValueError):
    """The text is not canonical, strict base64 (a policy failure the caller can fix)."""


def decode_base64_strict(data: str, *, max_bytes: int | None = None) -> bytes:
    """Decode standard-alphabet base64 that is exactly canonical, or raise ``Base64Error``.

    Rejected: whitespace or line breaks, the URL-safe alphabet (``-``/``_``), missing or
    extra padding, a length that is not a multiple of 4, and non-zero padding bits (``AB==``
    decodes to the same byte as ``AA==``; only the latter is canonical). With ``max_bytes``,
    input that would decode to more than that is refused before decoding.
    """
    if not isinstance(data, str):
        raise Base64Error(f"base64 data must be a string, not {type(data).__name__}")
    if max_bytes is not None and len(data) > 4 * ((max_bytes + 2) // 3):
        raise Base64Error(f"base64 data decodes to more than {max_bytes} bytes")
    if len(data) % 4:
        raise Base64Error("base64 length is not a multiple of 4 (missing padding or stray characters)")
    try:
        raw = data.encode("ascii")
    except UnicodeEncodeError:
        raise Base64Error("base64 data contains non-ASCII characters") from None
    try:
        out = base64.b64decode(raw, validate=True)
    except binascii.Error as exc:
        raise Base64Error(f"invalid base64 (standard alphabet, no whitespace): {exc}") from None
    if base64.b64encode(out) != raw:
        raise Base64Error("base64 is not canonical (non-zero padding bits or misplaced padding)")
    return out


def sniff_image(data: bytes) -> str | None:
    """The raster mime type the magic bytes announce, or None for none of the four."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None
