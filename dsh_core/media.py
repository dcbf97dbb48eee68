"""Media helpers shared by plugins (the attachment store, tools, models)."""

from __future__ import annotations

RASTER_MIME_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


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
