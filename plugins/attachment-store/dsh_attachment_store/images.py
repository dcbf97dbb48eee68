"""Raster image sniffing: magic bytes and pixel dimensions read from the header only.

Small, exact parsers for the four formats the store accepts. Nothing here decodes pixel
data; each parser reads a bounded prefix and raises ``ImageFormatError`` with a message
that says what is wrong with the bytes.
"""

from __future__ import annotations

import struct
import zlib

from dsh_core.media import Base64Error, decode_base64_strict, sniff_image  # noqa: F401  (re-exported)

PNG = "image/png"
JPEG = "image/jpeg"
GIF = "image/gif"
WEBP = "image/webp"
MIME_TYPES: tuple[str, ...] = (PNG, JPEG, GIF, WEBP)

_PNG_SIG = b"\x89PNG\r\n\x1a\n"


class ImageFormatError(ValueError):
    """The bytes are not a well-formed header of the format they claim."""


def sniff(data: bytes) -> str | None:
    """The mime type the magic bytes announce, or None for none of the four."""
    return sniff_image(data)


def dimensions(mime: str, data: bytes) -> tuple[int, int]:
    """``(width, height)`` from the header of ``data`` (which must already sniff as ``mime``)."""
    parser = _PARSERS[mime]
    width, height = parser(data)
    if width <= 0 or height <= 0:
        raise ImageFormatError(f"header declares an empty image ({width}x{height})")
    return width, height


def _png(data: bytes) -> tuple[int, int]:
    # signature, then the first chunk must be IHDR: length 13, "IHDR", 13 bytes, CRC.
    if len(data) < 33:
        raise ImageFormatError("PNG is truncated before the end of its IHDR chunk")
    length, ctype = struct.unpack(">I4s", data[8:16])
    if ctype != b"IHDR" or length != 13:
        raise ImageFormatError("PNG does not start with a 13-byte IHDR chunk")
    body = data[16:29]
    (crc,) = struct.unpack(">I", data[29:33])
    if zlib.crc32(data[12:29]) != crc:
        raise ImageFormatError("PNG IHDR chunk fails its CRC")
    width, height, depth, color = struct.unpack(">IIBB", body[:10])
    if width > 0x7FFFFFFF or height > 0x7FFFFFFF:
        raise ImageFormatError("PNG dimensions exceed 2^31-1")
    if color not in (0, 2, 3, 4, 6) or depth not in (1, 2, 4, 8, 16):
        raise ImageFormatError(f"PNG IHDR has an invalid bit depth/colour type ({depth}/{color})")
    return width, height


def _gif(data: bytes) -> tuple[int, int]:
    # "GIF8?a", then the logical screen descriptor: width, height (little-endian u16), flags…
    if len(data) < 13:
        raise ImageFormatError("GIF is truncated before the end of its logical screen descriptor")
    return struct.unpack("<HH", data[6:10])


# SOFn markers carry the frame size; C4 (DHT), C8 (JPG extension) and CC (DAC) share the range.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01}  # RSTn, TEM: no length field


def _jpeg(data: bytes) -> tuple[int, int]:
    n = len(data)
    i = 2  # after SOI
    while True:
        # A marker is 0xFF, optional 0xFF fill bytes, then the marker code.
        if i >= n or data[i] != 0xFF:
            raise ImageFormatError("JPEG is malformed or truncated before its frame header (SOF)")
        while i < n and data[i] == 0xFF:
            i += 1
        if i >= n:
            raise ImageFormatError("JPEG is truncated before its frame header (SOF)")
        marker = data[i]
        i += 1
        if marker in _STANDALONE:
            continue
        if marker == 0xD9 or marker == 0xDA or marker == 0xD8:
            raise ImageFormatError("JPEG has no frame header (SOF) before its scan data")
        if i + 2 > n:
            raise ImageFormatError("JPEG is truncated inside a marker segment")
        (length,) = struct.unpack(">H", data[i : i + 2])
        if length < 2:
            raise ImageFormatError("JPEG has a marker segment with an invalid length")
        if marker in _SOF:
            if length < 8 or i + 7 > n:
                raise ImageFormatError("JPEG frame header (SOF) is truncated")
            height, width = struct.unpack(">HH", data[i + 3 : i + 7])
            if height == 0:
                raise ImageFormatError("JPEG leaves its height to a DNL marker, which is not supported")
            return width, height
        i += length


def _webp(data: bytes) -> tuple[int, int]:
    if len(data) < 30:
        raise ImageFormatError("WebP is truncated before the end of its first chunk header")
    (riff_size,) = struct.unpack("<I", data[4:8])
    if riff_size + 8 > len(data):
        raise ImageFormatError(f"WebP is truncated: RIFF declares {riff_size + 8} bytes, got {len(data)}")
    fourcc = data[12:16]
    payload = data[20:]
    if fourcc == b"VP8 ":
        # Lossy: 3-byte frame tag (bit 0 = 0 for a key frame), start code 9d 01 2a, then 14-bit sizes.
        if payload[0] & 1:
            raise ImageFormatError("WebP (VP8) first frame is not a key frame")
        if payload[3:6] != b"\x9d\x01\x2a":
            raise ImageFormatError("WebP (VP8) key frame has no start code")
        w, h = struct.unpack("<HH", payload[6:10])
        return w & 0x3FFF, h & 0x3FFF
    if fourcc == b"VP8L":
        # Lossless: signature 0x2f, then 14 bits width-1, 14 bits height-1, alpha bit, 3-bit version 0.
        if payload[0] != 0x2F:
            raise ImageFormatError("WebP (VP8L) has no lossless signature byte")
        (bits,) = struct.unpack("<I", payload[1:5])
        if bits >> 29:
            raise ImageFormatError("WebP (VP8L) has an unknown version")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if fourcc == b"VP8X":
        # Extended: flags (1), reserved (3), canvas width-1 and height-1 as 24-bit little-endian.
        w = int.from_bytes(payload[4:7], "little") + 1
        h = int.from_bytes(payload[7:10], "little") + 1
        return w, h
    raise ImageFormatError(f"WebP has an unknown first chunk {fourcc!r} (expected VP8, VP8L or VP8X)")


_PARSERS = {PNG: _png, GIF: _gif, JPEG: _jpeg, WEBP: _webp}


def image_info(mime: str, data: bytes) -> tuple[int, int]:
    """Check that ``data`` is a ``mime`` image by its magic bytes and header; return its size.

    Raises ``ImageFormatError`` when the magic bytes disagree with ``mime`` or the header is bad.
    """
    actual = sniff(data)
    if actual is None:
        raise ImageFormatError(f"the bytes are not a {_name(mime)} image (magic bytes {data[:8].hex(' ') or 'none'})")
    if actual != mime:
        raise ImageFormatError(f"declared {mime} but the bytes are {_name(actual)} ({actual})")
    return dimensions(mime, data)


def _name(mime: str) -> str:
    return {PNG: "PNG", JPEG: "JPEG", GIF: "GIF", WEBP: "WebP"}.get(mime, mime)


