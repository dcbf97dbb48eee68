from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import dsh_attachment_store as plugin
import pytest
from attachment_imagegen import (
    gif,
    jpeg,
    png,
    png_header_only,
    webp_vp8,
    webp_vp8l,
    webp_vp8x,
)
from dsh_attachment_store import (
    Limits,
    LocalAttachmentStore,
    decode_base64_strict,
    image_info,
)
from dsh_attachment_store import store as store_mod

from dsh_core.errors import AttachmentCorrupt, AttachmentError, ConfigError, DshError
from dsh_core.types import ImageBlock


@pytest.fixture
def home(dsh_home: Path) -> Path:
    """This test's ``DSH_HOME`` (dsh_testing's autouse fixture sets it)."""
    return dsh_home


@pytest.fixture
def store(home: Path) -> LocalAttachmentStore:
    return LocalAttachmentStore()


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def objects(store: LocalAttachmentStore) -> list[Path]:
    return files_under(store.objects)


# ----------------------------------------------------------------------------- header parsing


@pytest.mark.parametrize(
    "mime,data,size",
    [
        ("image/png", png(3, 2), (3, 2)),
        ("image/png", png(1, 1), (1, 1)),
        ("image/gif", gif(10, 20), (10, 20)),
        ("image/jpeg", jpeg(4, 3), (4, 3)),
        ("image/jpeg", jpeg(1024, 768, sof=0xC2, fill=True), (1024, 768)),  # progressive, fill bytes
        ("image/webp", webp_vp8(6, 4), (6, 4)),
        ("image/webp", webp_vp8l(5, 7), (5, 7)),
        ("image/webp", webp_vp8x(640, 480), (640, 480)),
        ("image/webp", webp_vp8l(16384, 16384), (16384, 16384)),
    ],
)
def test_dimensions_from_headers(mime: str, data: bytes, size: tuple[int, int]) -> None:
    assert image_info(mime, data) == size


# ----------------------------------------------------------------------------- saving


@pytest.mark.anyio
async def test_real_png_round_trip(store: LocalAttachmentStore, home: Path) -> None:
    data = png(3, 2)
    [ref] = await store.save_images([("image/png", data)])
    hexd = hashlib.sha256(data).hexdigest()
    assert ref == ImageBlock(digest=f"sha256:{hexd}", mime="image/png", size=len(data), width=3, height=2)
    path = home / "attachments" / "objects" / "sha256" / hexd[:2] / hexd
    assert path.read_bytes() == data
    assert await store.read_image(ref) == data
    assert files_under(store.tmp) == []


@pytest.mark.anyio
async def test_mixed_batch_keeps_order(store: LocalAttachmentStore) -> None:
    batch = [("image/png", png()), ("image/jpeg", jpeg()), ("image/gif", gif()), ("image/webp", webp_vp8l())]
    refs = await store.save_images(batch)
    assert [(r.mime, r.size) for r in refs] == [(m, len(d)) for m, d in batch]
    for ref, (_, data) in zip(refs, batch, strict=False):
        assert await store.read_image(ref) == data
    assert await store.save_images([]) == []


@pytest.mark.anyio
async def test_dedup(store: LocalAttachmentStore, monkeypatch: pytest.MonkeyPatch) -> None:
    data = png(seed=7)
    replaces: list[str] = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (replaces.append(str(b)), real(a, b))[1])
    r1, r2 = await store.save_images([("image/png", data), ("image/png", data)])
    [r3] = await store.save_images([("image/png", data)])
    assert r1 == r2 == r3
    assert len(objects(store)) == 1
    assert len(replaces) == 1, "identical content is written once"


@pytest.mark.anyio
async def test_mime_is_normalised(store: LocalAttachmentStore) -> None:
    [ref] = await store.save_images([(" Image/PNG ", png())])
    assert ref.mime == "image/png"


# ----------------------------------------------------------------------------- validation: nothing written


def _bad_cases() -> list[tuple[str, list, str]]:
    good = ("image/png", png())
    small = Limits(max_image_bytes=2000, max_batch_bytes=3000, max_pixels=10_000, max_batch_images=3)
    truncated_png = png()[:20]
    bad_crc = bytearray(png())
    bad_crc[20] ^= 0xFF
    return [
        ("svg", [good, ("image/svg+xml", b"<svg/>")], "is not accepted"),
        ("bmp", [good, ("image/bmp", b"BM" + b"\0" * 40)], "is not accepted"),
        ("mime-params", [good, ("image/png; q=1", png())], "is not accepted"),
        ("not-bytes", [good, ("image/png", "iVBORw0KGgo=")], "must be bytes"),
        ("empty", [good, ("image/png", b"")], "is empty"),
        ("magic-mismatch", [good, ("image/png", jpeg())], "declared image/png but the bytes are JPEG"),
        ("magic-mismatch-gif", [good, ("image/jpeg", gif())], "declared image/jpeg but the bytes are GIF"),
        ("no-magic", [good, ("image/webp", b"hello world, not an image")], "not a WebP image"),
        ("truncated-png", [good, ("image/png", truncated_png)], "truncated"),
        ("bad-ihdr-crc", [good, ("image/png", bytes(bad_crc))], "CRC"),
        ("zero-size-gif", [good, ("image/gif", gif(0, 5))], "empty image"),
        ("jpeg-no-sof", [good, ("image/jpeg", b"\xff\xd8\xff\xe0\x00\x04ab\xff\xda\x00\x02")], "no frame header"),
        ("jpeg-dnl", [good, ("image/jpeg", jpeg(10, 0))], "DNL"),
        ("webp-truncated", [good, ("image/webp", webp_vp8l()[:-4])], "truncated"),
        ("webp-unknown-chunk", [good, ("image/webp", webp_vp8l().replace(b"VP8L", b"ABCD"))], "unknown first chunk"),
        ("pixel-bomb", [good, ("image/png", png_header_only(50_000, 50_000))], "pixels; the limit is"),
        ("pair", [good, ("image/png",)], "not a (mime, bytes) pair"),
        ("per-image", [("image/png", png(30, 30, noisy=True))], "per-image limit", small),
        ("per-batch", [("image/png", png(20, 20, seed=s, noisy=True)) for s in range(3)], "per-message limit", small),
        ("count", [good] * 4, "at most 3", small),
        ("pixels-small", [("image/png", png(101, 100))], "10,100 pixels; the limit is 10,000", small),
    ]  # type: ignore[list-item]


@pytest.mark.anyio
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
async def test_every_rule_rejects_before_any_write(home: Path, case) -> None:
    _, batch, message, *rest = case
    store = LocalAttachmentStore(limits=rest[0] if rest else None)
    root = home / "attachments"
    before = files_under(root)
    with pytest.raises(AttachmentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        await store.save_images(batch)
    assert files_under(root) == before == []
    assert not root.exists(), "a rejected batch must not even create the store directory"


def test_limit_sizes_in_the_test_table_are_what_they_claim() -> None:
    assert len(png(30, 30, noisy=True)) > 2000
    sizes = [len(png(20, 20, seed=s, noisy=True)) for s in range(3)]
    assert all(n <= 2000 for n in sizes) and sum(sizes) > 3000


# ----------------------------------------------------------------------------- atomicity


@pytest.mark.anyio
async def test_failed_rename_leaves_no_object_and_no_temp(store: LocalAttachmentStore, monkeypatch) -> None:
    def boom(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(DshError, match="cannot store object") as info:
        await store.save_images([("image/png", png())])
    assert not isinstance(info.value, AttachmentError), "a disk failure is not the caller's fault"
    assert objects(store) == [] and files_under(store.tmp) == []


CRASH = textwrap.dedent(
    """
    import os, stat, sys, anyio
    sys.path.insert(0, sys.argv[1])
    from attachment_imagegen import png
    from dsh_attachment_store import LocalAttachmentStore
    real_fsync = os.fsync
    def crash(fd):  # the process dies after the temp file is written, before the rename
        real_fsync(fd)
        if stat.S_ISREG(os.fstat(fd).st_mode):  # the object's temp file, not a directory
            os._exit(17)
    os.fsync = crash
    anyio.run(LocalAttachmentStore().save_images, [("image/png", png())])
    """
)


def test_crash_mid_write_leaves_no_visible_object(home: Path) -> None:
    env = dict(os.environ, DSH_HOME=str(home))
    here = str(Path(__file__).parent)
    proc = subprocess.run([sys.executable, "-c", CRASH, here], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 17, proc.stderr
    store = LocalAttachmentStore()
    assert objects(store) == []
    [leftover] = files_under(store.tmp)  # the torn write is invisible, parked in tmp/
    ref = ImageBlock(digest="sha256:" + hashlib.sha256(png()).hexdigest(), mime="image/png", size=len(png()))
    with pytest.raises(AttachmentCorrupt, match="missing"):
        store.read_image_sync(ref)
    # A later store sweeps stale temp files before its first write.
    old = leftover.stat().st_mtime - 2 * store_mod.STALE_TEMP_SECONDS
    os.utime(leftover, (old, old))
    assert store.save_images_sync([("image/png", png())])[0].digest == ref.digest
    assert files_under(store.tmp) == []
    assert store.read_image_sync(ref) == png()


@pytest.mark.anyio
async def test_concurrent_saves_of_the_same_content(store: LocalAttachmentStore) -> None:
    data = png(8, 8, seed=3)
    results: list = []

    async def one() -> None:
        results.append(await store.save_images([("image/png", data)]))

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(one)
    assert len({r[0].digest for r in results}) == 1
    assert len(objects(store)) == 1 and files_under(store.tmp) == []


# ----------------------------------------------------------------------------- corruption


@pytest.mark.anyio
async def test_corruption_is_detected(store: LocalAttachmentStore) -> None:
    data = png(seed=9)
    [ref] = await store.save_images([("image/png", data)])
    path = store.object_path(ref.digest)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(AttachmentCorrupt, match="corrupt"):
        await store.read_image(ref)
    # Saving the same content again repairs the object.
    await store.save_images([("image/png", data)])
    assert await store.read_image(ref) == data
    path.unlink()
    with pytest.raises(AttachmentCorrupt, match="missing"):
        await store.read_image(ref)


@pytest.mark.anyio
async def test_inconsistent_references_are_refused(store: LocalAttachmentStore) -> None:
    data = png()
    [ref] = await store.save_images([("image/png", data)])
    with pytest.raises(AttachmentCorrupt, match="says 1 bytes"):
        await store.read_image(ImageBlock(digest=ref.digest, mime="image/png", size=1))
    with pytest.raises(AttachmentCorrupt, match="says image/gif"):
        await store.read_image(ImageBlock(digest=ref.digest, mime="image/gif", size=ref.size))
    for bad in ("sha256:" + "A" * 64, "md5:abc", "sha256:../../etc/passwd", ref.digest[:-1]):
        with pytest.raises(AttachmentCorrupt, match="not a reference"):
            await store.read_image(ImageBlock(digest=bad, mime="image/png", size=ref.size))


# ----------------------------------------------------------------------------- base64


@pytest.mark.parametrize("raw", [b"", b"\x00", b"ab", b"abc", png()])
def test_strict_base64_accepts_canonical(raw: bytes) -> None:
    assert decode_base64_strict(base64.b64encode(raw).decode()) == raw


@pytest.mark.parametrize(
    "text",
    ["AB==", "AAB=", "AA", "AA=", "AA===", "A===", "AA==AA==", " AA==", "AA==\n", "AA\r\n==", "-_8=", "+/8", "ĀA==", "AA=A"],
)
def test_strict_base64_rejects(text: str) -> None:
    with pytest.raises(AttachmentError):
        decode_base64_strict(text)


def test_strict_base64_size_guard() -> None:
    with pytest.raises(AttachmentError, match="more than 3 bytes"):
        decode_base64_strict("AAAAAAAA", max_bytes=3)
    assert decode_base64_strict("AAAA", max_bytes=3) == b"\0\0\0"


# ----------------------------------------------------------------------------- config and hooks


def store_from_config(table):
    """A store from a raw ``[config.attachment-store]`` table, as the host builds it."""
    from dsh_core.config import decode

    return plugin.store_for(decode(plugin.PLUGIN, plugin.StoreConfig, table, where="example"))


def test_config_limits_and_errors(tmp_path: Path, home: Path) -> None:
    s = store_from_config({"max-image-bytes": 5, "max-batch-bytes": 50, "max-pixels": 7, "dir": str(tmp_path / "a")})
    assert s.limits == Limits(max_image_bytes=5, max_batch_bytes=50, max_pixels=7)
    assert s.root == tmp_path / "a"
    assert store_from_config({}).root == home / "attachments"
    for table, msg in [
        ({"max-size": 1}, "unknown key 'max-size'"),
        ({"max_batch_bytes": 1}, "unknown key 'max_batch_bytes'"),  # TOML keys are kebab-case
        ({"max-pixels": 0}, "max-pixels: expected `int` >= 1, found 0"),
        ({"max-pixels": True}, "max-pixels: expected `int`, found True"),
        ({"max-image-bytes": 10, "max-batch-bytes": 5}, r"max-batch-bytes \(5\) is smaller than"),
        ({"dir": 3}, "dir: expected `str | null`, found 3"),
    ]:
        with pytest.raises(ConfigError, match=r"\[config.attachment-store\] " + msg):
            store_from_config(table)


@pytest.mark.anyio
async def test_hook_mounts_the_store(home: Path, tmp_path: Path) -> None:
    from dsh_core.compose import Composition
    from dsh_core.host import make_plugin_manager, open_host

    pm = make_plugin_manager(trace=False)
    pm.register(plugin, name="attachment-store")
    comp = Composition(
        name="t",
        path=tmp_path / "example.toml",
        plugins=("attachment-store",),
        config={"attachment-store": {"max-pixels": 4}},
    )
    async with open_host(comp, pm=pm) as host:
        st = host.attachment_store
        assert isinstance(st, LocalAttachmentStore) and tuple(st.mime_types) == plugin.MIME_TYPES and st.limits.max_pixels == 4
        with pytest.raises(AttachmentError, match="limit is 4 pixels"):
            await st.save_images([("image/png", png(3, 2))])
