"""Tiny, exact image builders for the tests (no imaging library needed)."""

from __future__ import annotations

import random
import struct
import zlib


def png(width: int = 3, height: int = 2, *, seed: int = 0, noisy: bool = False) -> bytes:
    """A real, decodable 8-bit RGB PNG (``noisy``: pseudo-random pixels, so it barely compresses)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    if noisy:
        rng = random.Random(seed)
        rows = b"".join(b"\x00" + rng.randbytes(width * 3) for _ in range(height))
    else:
        rows = b"".join(
            b"\x00" + bytes((x * 40 + y * 90 + seed) % 256 for x in range(width) for _ in range(3))
            for y in range(height)
        )
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def png_header_only(width: int, height: int) -> bytes:
    """Signature + a valid IHDR claiming any size (a decompression-bomb shaped header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + body + struct.pack(">I", zlib.crc32(body))


def gif(width: int = 1, height: int = 1) -> bytes:
    """A real 1-frame GIF89a (the logical screen is ``width`` x ``height``; the frame is 1x1)."""
    return (
        b"GIF89a"
        + struct.pack("<HH", width, height)
        + b"\x80\x00\x00"  # global colour table of 2 entries
        + b"\xff\xff\xff\x00\x00\x00"
        + b",\x00\x00\x00\x00\x01\x00\x01\x00\x00"  # image descriptor 1x1
        + b"\x02\x02D\x01\x00"  # LZW min code size 2, one sub-block
        + b";"
    )


def jpeg(width: int = 4, height: int = 3, *, sof: int = 0xC0, fill: bool = False) -> bytes:
    """SOI, APP0/JFIF, DQT, SOFn, EOI: the header structure a JPEG parser must walk."""
    app0 = b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    dqt = b"\x00" + bytes(range(64))
    sof_body = struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00"
    seg = lambda m, body: b"\xff" + bytes([m]) + struct.pack(">H", len(body) + 2) + body  # noqa: E731
    out = b"\xff\xd8" + seg(0xE0, app0) + seg(0xDB, dqt)
    if fill:
        out += b"\xff\xff"  # fill bytes before a marker are legal
    out += seg(0xC4, b"\x00" * 17) if sof != 0xC4 else b""
    return out + seg(sof, sof_body) + b"\xff\xd9"


def _riff(chunk_kind: bytes, payload: bytes) -> bytes:
    if len(payload) % 2:
        payload += b"\x00"
    body = b"WEBP" + chunk_kind + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


def webp_vp8l(width: int = 5, height: int = 7) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    return _riff(b"VP8L", b"\x2f" + struct.pack("<I", bits) + b"\x00" * 8)


def webp_vp8(width: int = 6, height: int = 4) -> bytes:
    frame_tag = b"\x10\x02\x00"  # key frame (bit 0 clear), version 0, shown
    return _riff(b"VP8 ", frame_tag + b"\x9d\x01\x2a" + struct.pack("<HH", width, height) + b"\x00" * 10)


def webp_vp8x(width: int = 640, height: int = 480) -> bytes:
    payload = b"\x10\x00\x00\x00" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return _riff(b"VP8X", payload)
