"""The local content-addressed attachment store.

Layout under ``$DSH_HOME/attachments/`` (``root``)::

    objects/sha256/<hex[:2]>/<hex>     one immutable object per distinct content
    tmp/<hex[:12]>.<random>.tmp        in-flight writes (same filesystem, never read)

A write is: temp file in ``tmp/`` → write → fsync → ``os.replace`` into ``objects/`` →
fsync of the object's directory. Readers only look in ``objects/``, so a crash at any
point leaves either no object or a whole one; stale temp files are swept later.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import anyio
from msgspec import Meta

from dsh_core.config import PluginConfig
from dsh_core.errors import AttachmentCorrupt, AttachmentError, DshError
from dsh_core.paths import data_home
from dsh_core.types import ImageBlock

from .images import MIME_TYPES, ImageFormatError, image_info, sniff

PLUGIN = "attachment-store"
log = logging.getLogger(f"dsh.{PLUGIN}")
MiB = 1024 * 1024
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
STALE_TEMP_SECONDS = 3600.0




@dataclass(frozen=True)
class Limits:
    """Admission limits; configurable in ``[config.attachment-store]``."""

    max_image_bytes: int = 10 * MiB
    max_batch_bytes: int = 20 * MiB
    max_pixels: int = 40_000_000
    max_batch_images: int = 16



Positive = Annotated[int, Meta(gt=0)]


class StoreConfig(PluginConfig):
    """[config.attachment-store]"""

    max_image_bytes: Annotated[Positive, Meta(description="bytes of one image")] = Limits.max_image_bytes
    max_batch_bytes: Annotated[Positive, Meta(description="bytes of one prompt's images together")] = (
        Limits.max_batch_bytes)
    max_pixels: Annotated[Positive, Meta(description="pixels of one image (decompression bombs)")] = Limits.max_pixels
    max_batch_images: Annotated[Positive, Meta(description="images in one message")] = Limits.max_batch_images
    dir: Annotated[str | None, Meta(description="where the store lives (default $DSH_HOME/attachments)")] = None

    def __post_init__(self) -> None:
        if self.max_batch_bytes < self.max_image_bytes:
            raise ValueError(f"max-batch-bytes ({self.max_batch_bytes}) is smaller than max-image-bytes "
                             f"({self.max_image_bytes}); raise it or lower max-image-bytes")

    def limits(self) -> Limits:
        return Limits(max_image_bytes=self.max_image_bytes, max_batch_bytes=self.max_batch_bytes,
                      max_pixels=self.max_pixels, max_batch_images=self.max_batch_images)


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB // 10 else f"{n} bytes"


def _warn(message: str) -> None:
    log.warning(message)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class _Checked:
    mime: str
    data: bytes
    width: int
    height: int


class LocalAttachmentStore:
    """``AttachmentStore``: sha256-addressed, deduplicated, atomically written image bytes."""

    mime_types: Sequence[str] = MIME_TYPES

    def __init__(self, root: Path | None = None, limits: Limits | None = None) -> None:
        self.root = Path(root) if root is not None else data_home() / "attachments"
        self.limits = limits or Limits()
        self.objects = self.root / "objects" / "sha256"
        self.tmp = self.root / "tmp"
        self._swept = False

    # ------------------------------------------------------------------ paths

    def object_path(self, digest: str) -> Path:
        m = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
        if m is None:
            raise AttachmentCorrupt(f"{PLUGIN}: {digest!r} is not a reference of this store (want sha256:<64 hex>)")
        hexd = m.group(1)
        return self.objects / hexd[:2] / hexd

    # ------------------------------------------------------------------ validation

    def validate(self, batch: Sequence[tuple[str, bytes]]) -> list[_Checked]:
        """Check every member against every rule; raise ``AttachmentError`` on the first failure."""
        lim = self.limits
        n = len(batch)
        if n > lim.max_batch_images:
            raise AttachmentError(f"{PLUGIN}: {n} images in one message; at most {lim.max_batch_images} are accepted")
        staged: list[tuple[str, bytes]] = []
        total = 0
        for i, member in enumerate(batch, 1):
            where = f"image {i} of {n}"
            try:
                mime, data = member
            except (TypeError, ValueError):
                raise AttachmentError(f"{PLUGIN}: {where} is not a (mime, bytes) pair") from None
            if not isinstance(mime, str):
                raise AttachmentError(f"{PLUGIN}: {where}: mime type must be a string")
            norm = mime.strip().lower()
            if norm not in MIME_TYPES:
                raise AttachmentError(
                    f"{PLUGIN}: {where}: mime type {mime!r} is not accepted (accepted: {', '.join(MIME_TYPES)})"
                )
            if isinstance(data, (bytearray, memoryview)):
                data = bytes(data)
            if not isinstance(data, bytes):
                raise AttachmentError(f"{PLUGIN}: {where}: image data must be bytes, not {type(data).__name__}")
            if not data:
                raise AttachmentError(f"{PLUGIN}: {where} ({norm}) is empty")
            if len(data) > lim.max_image_bytes:
                raise AttachmentError(
                    f"{PLUGIN}: {where} ({norm}) is {_size(len(data))}; the per-image limit is "
                    f"{_size(lim.max_image_bytes)} — send a smaller or more compressed image"
                )
            total += len(data)
            staged.append((norm, data))
        if total > lim.max_batch_bytes:
            raise AttachmentError(
                f"{PLUGIN}: the {n} images total {_size(total)}; the per-message limit is "
                f"{_size(lim.max_batch_bytes)} — send fewer or smaller images"
            )
        checked: list[_Checked] = []
        for i, (mime, data) in enumerate(staged, 1):
            where = f"image {i} of {n}"
            try:
                width, height = image_info(mime, data)
            except ImageFormatError as exc:
                raise AttachmentError(f"{PLUGIN}: {where}: {exc}") from None
            if width * height > lim.max_pixels:
                raise AttachmentError(
                    f"{PLUGIN}: {where} ({mime}) is {width}x{height} = {width * height:,} pixels; the limit is "
                    f"{lim.max_pixels:,} pixels — downscale it"
                )
            checked.append(_Checked(mime, data, width, height))
        return checked

    # ------------------------------------------------------------------ AttachmentStore

    async def save_images(self, batch: Sequence[tuple[str, bytes]]) -> list[ImageBlock]:
        """Validate every member, then write each distinct content once. Returns refs in order.

        Runs in a worker thread; cancelling the caller does not abandon a started write
        (it completes, possibly leaving an unreferenced object — harmless by design).
        """
        members = list(batch)
        if not members:
            return []
        return await anyio.to_thread.run_sync(self.save_images_sync, members)

    async def read_image(self, ref: ImageBlock) -> bytes:
        return await anyio.to_thread.run_sync(self.read_image_sync, ref)

    # ------------------------------------------------------------------ sync bodies

    def save_images_sync(self, batch: Sequence[tuple[str, bytes]]) -> list[ImageBlock]:
        checked = self.validate(batch)  # nothing is written unless every member passes
        refs: list[ImageBlock] = []
        written: set[str] = set()
        for item in checked:
            hexd = hashlib.sha256(item.data).hexdigest()
            if hexd not in written:
                self._put(hexd, item.data)
                written.add(hexd)
            refs.append(
                ImageBlock(
                    digest=f"sha256:{hexd}", mime=item.mime, size=len(item.data), width=item.width, height=item.height
                )
            )
        return refs

    def read_image_sync(self, ref: ImageBlock) -> bytes:
        path = self.object_path(ref.digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise AttachmentCorrupt(f"{PLUGIN}: object {ref.digest} is missing ({path})") from None
        except OSError as exc:
            raise AttachmentCorrupt(f"{PLUGIN}: object {ref.digest} is unreadable ({path}): {exc}") from None
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if actual != ref.digest:
            raise AttachmentCorrupt(f"{PLUGIN}: object {ref.digest} is corrupt: its bytes hash to {actual} ({path})")
        if len(data) != ref.size:
            raise AttachmentCorrupt(
                f"{PLUGIN}: reference {ref.digest} says {ref.size} bytes but the object has {len(data)}"
            )
        if sniff(data) != ref.mime:
            raise AttachmentCorrupt(f"{PLUGIN}: reference {ref.digest} says {ref.mime} but the object is not one")
        return data

    def _put(self, hexd: str, data: bytes) -> None:
        final = self.objects / hexd[:2] / hexd
        if final.exists():
            try:
                if hashlib.sha256(final.read_bytes()).hexdigest() == hexd:
                    return  # deduplicated
            except OSError:
                pass
            _warn(f"{final} does not match its name; rewriting it")
        try:
            self._ensure_dirs(final.parent)
            fd, tmp_name = tempfile.mkstemp(dir=self.tmp, prefix=hexd[:12] + ".", suffix=".tmp")
            tmp = Path(tmp_name)
            try:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, final)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            _fsync_dir(final.parent)
        except OSError as exc:
            raise DshError(f"{PLUGIN}: cannot store object sha256:{hexd} under {self.root}: {exc}") from exc

    def _ensure_dirs(self, obj_dir: Path) -> None:
        if not self.tmp.is_dir():
            self.tmp.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self._swept:
            self._swept = True
            self.sweep_temp()
        if not obj_dir.is_dir():
            obj_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            _fsync_dir(obj_dir.parent)  # make the new fan-out directory itself durable

    def sweep_temp(self, older_than: float = STALE_TEMP_SECONDS) -> int:
        """Delete temp files left by a crashed writer (older than ``older_than`` seconds)."""
        removed = 0
        cutoff = time.time() - older_than
        try:
            entries = list(os.scandir(self.tmp))
        except FileNotFoundError:
            return 0
        for entry in entries:
            try:
                if entry.name.endswith(".tmp") and entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                pass
        return removed
