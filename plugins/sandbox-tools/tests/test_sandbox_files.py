"""read / write / edit / glob / grep / read_image behaviour, and a whole agent turn."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from sandbox_helpers import FakeProvider, Session, mechanisms, running_host, text

from dsh_core import hookimpl
from dsh_core.types import (
    Finish,
    ImageBlock,
    ModelInfo,
    TextBlock,
    TextDelta,
    ToolCallDelta,
    ToolCallEvent,
    ToolResultEvent,
    ToolResultMessage,
)

pytestmark = pytest.mark.anyio

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c63f8cfc0f01f0005000201"
    "a5b3d5f30000000049454e44ae426082"
)


async def test_read_window_and_edit_rules(root: Path) -> None:
    (root / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    async with running_host() as host:
        s = Session(host, root)
        out = await s.call("edit", file_path="f.txt", old_string="line 3", new_string="LINE 3")
        assert out.code == "NOT_READ"
        out = await s.call("read", file_path="f.txt", offset=3, limit=2.0)  # a JSON number: 2.0 is 2
        f = root / "f.txt"
        assert text(out) == (f"<path>{f}</path>\n<type>file</type>\n<content>\n3: line 3\n4: line 4\n\n"
                             "(Showing lines 3-4 of 10. Use offset=5 to continue.)\n</content>")
        assert (await s.call("read", file_path="f.txt", offset=1.5)).code == "INVALID_ARGUMENTS"
        fresh = Session(host, root)
        out = await fresh.call("read", file_path="f.txt", offset=11)
        assert out.code == "OUT_OF_RANGE" and text(out) == f'Error: offset 11 is out of range for "{f}" (10 lines)'
        assert (await fresh.call("edit", file_path="f.txt", old_string="line 1", new_string="x")).code == "NOT_READ"
        out = await s.call("read", file_path="f.txt", offset=9)
        assert text(out).endswith("\n9: line 9\n10: line 10\n\n(End of file - total 10 lines)\n</content>")
        out = await s.call("edit", file_path="f.txt", old_string="line 3\n", new_string="LINE 3\n")
        assert text(out) == f"The file {f} has been updated successfully.", text(out)
        out = await s.call("edit", file_path="f.txt", old_string="line", new_string="row")
        assert out.code == "AMBIGUOUS_MATCH" and "9 times" in text(out)
        out = await s.call("edit", file_path="f.txt", old_string="line", new_string="row", replace_all=True)
        assert text(out) == f"The file {f} has been updated. All occurrences were successfully replaced."
        out = await s.call("edit", file_path="f.txt", old_string="nope", new_string="x")
        assert out.code == "NO_MATCH"
        await anyio.sleep(0.01)
        (root / "f.txt").write_text("changed behind our back\n")
        out = await s.call("edit", file_path="f.txt", old_string="changed", new_string="x")
        assert out.code == "STALE_READ"
        # another session has not read it
        other = Session(host, root)
        assert (await other.call("edit", file_path="f.txt", old_string="changed", new_string="x")).code == "NOT_READ"
        assert (await s.call("read", file_path="missing.txt")).code == "NOT_FOUND"
        assert (await s.call("read", file_path=".")).code == "IS_DIRECTORY"
        (root / "bin").write_bytes(b"\0\1\2")
        assert (await s.call("read", file_path="bin")).code == "BINARY_FILE"
        w = await s.call("write", file_path="new/deep/n.txt", content="a\nb\n")
        n = root / "new/deep/n.txt"
        assert text(w) == f"<path>{n}</path>\n<type>file</type>\n<content>\nCreated file\n</content>"
        w = await s.call("write", file_path=str(n), content="a\nb\n")
        assert text(w) == f"<path>{n}</path>\n<type>file</type>\n<content>\nUpdated file\n</content>"
        (root / "empty.txt").write_text("")
        out = await s.call("read", file_path="empty.txt")
        assert text(out) == f"<path>{root / 'empty.txt'}</path>\n<type>file</type>\n<content>\n(End of file - total 0 lines)\n</content>"
        (root / "long.txt").write_text("x" * 2500 + "\n")
        out = await s.call("read", file_path="long.txt")
        assert f"\n1: {'x' * 2000}... (line truncated to 2000 chars)\n\n(End of file - total 1 lines)" in text(out)
        out = await s.call("edit", file_path="new/deep/n.txt", old_string="b", new_string="c")  # write counts as read
        assert not out.is_error
    assert (root / "new/deep/n.txt").read_text() == "a\nc\n"


async def test_glob_and_grep(root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "a.py").write_text("def alpha():\n    return 1\n")
    (root / "src" / "b.py").write_text("ALPHA = 2\n")
    (root / "notes.md").write_text("alpha notes\n")
    (root / ".git").mkdir()
    (root / ".git" / "x.py").write_text("def alpha(): pass\n")
    async with running_host() as host:
        s = Session(host, root)
        assert text(await s.call("glob", pattern="**/*.py")) == "src/b.py\nsrc/pkg/a.py"
        assert "no files match" in text(await s.call("glob", pattern="*.rs"))
        out = text(await s.call("grep", pattern=r"def \w+", include="*.py"))
        assert out == "Found 1 match\n\nsrc/pkg/a.py\nLine 1: def alpha():"
        out = text(await s.call("grep", pattern="(?i)alpha|return", path="src"))
        assert out == "Found 3 matches\n\nsrc/b.py\nLine 1: ALPHA = 2\n\nsrc/pkg/a.py\nLine 1: def alpha():\nLine 2:     return 1"
        out = text(await s.call("grep", pattern="(?i)alpha", include="*.{md,txt}"))
        assert out == "Found 1 match\n\nnotes.md\nLine 1: alpha notes"
        assert text(await s.call("grep", pattern="zzz")) == "No matches found"
        assert (await s.call("grep", pattern="a", include="!*.py")).code == "INVALID_ARGUMENTS"
        assert (await s.call("grep", pattern="(")).code == "INVALID_ARGUMENTS"


async def test_grep_shows_the_first_matches_and_counts_the_rest(root: Path) -> None:
    (root / "many.txt").write_text("hit\n" * 300)
    async with running_host() as host:
        out = await Session(host, root).call("grep", pattern="hit")
    lines = text(out).splitlines()
    assert lines[:3] == ["Found 250 of 300 matches", "", "many.txt"]
    assert lines[3:253] == [f"Line {n}: hit" for n in range(1, 251)]
    assert lines[253:] == ["", "(Only the first 250 are shown; narrow pattern, path or include to see the others.)"]
    assert out.structured is not None and out.structured["truncated"] is True


class _Store:
    mime_types = ("image/png", "image/jpeg", "image/gif", "image/webp")

    def __init__(self) -> None:
        self.saved: list[bytes] = []

    async def save_images(self, batch: Any) -> list[ImageBlock]:
        out = []
        for mime, data in batch:
            self.saved.append(data)
            out.append(ImageBlock(digest="sha256:" + hashlib.sha256(data).hexdigest(), mime=mime, size=len(data)))
        return out

    async def read_image(self, ref: ImageBlock) -> bytes:  # pragma: no cover
        raise NotImplementedError


class _StorePlugin:
    def __init__(self) -> None:
        self.store = _Store()

    @hookimpl
    def dsh_attachment_store(self, host: Any) -> _Store:
        return self.store


async def test_read_image(root: Path) -> None:
    (root / "red.png").write_bytes(PNG)
    (root / "fake.png").write_text("not an image")
    async with running_host() as host:  # no store mounted
        out = await Session(host, root, model="vision").call("read_image", file_path="red.png")
        assert out.code == "NO_ATTACHMENT_STORE"
        out = await Session(host, root, model="plain").call("read_image", file_path="red.png")
        assert text(out).startswith('Error: cannot read "red.png" as an image: model "plain" does not declare image input')
    plugin = _StorePlugin()
    async with running_host(plugins={"test-store": plugin}) as host:
        s = Session(host, root, model="vision")
        out = await s.call("read_image", file_path="red.png")
        assert not out.is_error, text(out)
        assert isinstance(out.content[0], TextBlock) and isinstance(out.content[1], ImageBlock)
        assert out.content[0].text.startswith(f"<path>{root / 'red.png'}</path>\n<type>image</type>\n<content>\nimage/png image, ")
        assert out.content[0].text.endswith(f"{len(PNG)} bytes\n</content>")
        assert out.content[1].mime == "image/png" and out.content[1].size == len(PNG)
        assert plugin.store.saved == [PNG]
        assert (await s.call("read_image", file_path="fake.png")).code == "NOT_AN_IMAGE"
        assert (await s.call("read_image", file_path="nope.png")).code == "NOT_FOUND"


class ScriptProvider(FakeProvider):
    """First call: ask for bash; second call: answer with text."""

    name = "script"

    def __init__(self, command: str) -> None:
        self.command = command
        self.calls = 0

    def resolve(self, model: str) -> ModelInfo:
        return ModelInfo(provider="script", model=model)

    async def stream(self, request: Any):
        self.calls += 1
        if self.calls == 1:
            args = json.dumps({"command": self.command, "description": "Make a file and show it"})
            yield ToolCallDelta(index=0, id="call_1", name="bash", arguments=args)
            yield Finish(reason="tool-calls")
        else:
            last = request.messages[-1]
            assert isinstance(last, ToolResultMessage)
            yield TextDelta(text="saw: " + last.content[0].text)
            yield Finish(reason="stop")


@pytest.mark.parametrize("mechanism", mechanisms())
async def test_agent_turn_records_tool_call_and_result(mechanism: str, root: Path) -> None:
    from dsh_core.contracts import AgentSpec
    from dsh_core.types import UserMessage

    provider = ScriptProvider("echo hi > made.txt && cat made.txt")

    class P:
        @hookimpl
        def dsh_register_models(self, register: Any) -> None:
            register(provider)

    async with running_host(mechanism=mechanism, plugins={"script-model": P()}) as host:
        agent = host.create_agent(AgentSpec(cwd=str(root), provider="script", model="s"))
        agent.submit(UserMessage(id="u1", content=[TextBlock(text="make a file")]))
        with anyio.fail_after(20):
            await agent.wait_idle()
        events = host.session_store.logs[agent.session_id].events
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    results = [e for e in events if isinstance(e, ToolResultEvent)]
    assert [c.name for c in calls] == ["bash"] and results[0].result.call_id == "call_1"
    assert results[0].result.content[0].text == "hi\n" and not results[0].result.is_error
    assert (root / "made.txt").read_text() == "hi\n"


def test_read_window_whole_streamed_and_buffered_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file read at once, the same file streamed line by line (past ``WHOLE_READ_MAX``) and an
    editor's buffer of its text give the same window: lines end at \\n only (\\r and \\r\\n kept
    as the file has them), invalid UTF-8 and a multi-byte character cut by a newline replaced the
    same way, long lines cut, a last line without its newline, windows past the end."""
    from dsh_sandbox_tools import files

    pieces = [b"plain", b"\r", b"\r\n", "é€".encode(), b"\xff", b"\xe2\x82", b"x" * 2500, b"", b"tab\tend"]
    body = b"\n".join(pieces[i % len(pieces)] + str(i).encode() for i in range(400))  # > 8 KiB: past the head
    assert len(body) > 8192
    path = tmp_path / "f.txt"
    plain = body.replace(b"\r", b"").replace(b"x" * 2500, b"x" * 1990)  # nothing to cut: numbered the fast way
    for data in (body, body + b"\n", body[:100], b"", b"\n", b"one", plain, plain + b"\n"):
        path.write_bytes(data)
        for offset, limit in ((1, 2000), (1, 1), (7, 3), (399, 5), (400, 1), (401, 1), (2, 10_000)):
            got = []
            for cap, editor in ((files.WHOLE_READ_MAX, None), (0, None),
                                (files.WHOLE_READ_MAX, data.decode("utf-8", errors="replace"))):
                monkeypatch.setattr(files, "WHOLE_READ_MAX", cap)
                exact: list[str] = []
                window = files._read_window(str(path), offset, limit, exact, editor)
                got.append((window[:4], "".join(exact)))
            assert got[0] == got[1] == got[2], (data[:40], offset, limit)
    monkeypatch.undo()
    path.write_bytes(b"a\r\nb\nc")
    exact = []
    assert files._read_window(str(path), 1, 2000, exact)[:4] == ("1: a\n2: b\n3: c", 1, 3, 3)
    assert exact == ["a\r\nb\nc"]


def _nowait_reads(directory: Path) -> bool:
    """Whether the kernel reads files in ``directory`` with RWF_NOWAIT (ext4, xfs, btrfs do; tmpfs
    did not before Linux 6.x): where it cannot, every read goes to the worker thread."""
    import errno
    import os

    probe = directory / ".nowait-probe"
    probe.write_bytes(b"x\n")
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(4)], 0, os.RWF_NOWAIT)
        return True
    except OSError as exc:
        assert exc.errno in (errno.EOPNOTSUPP, errno.EAGAIN), exc
        return exc.errno == errno.EAGAIN  # supported, just not cached (it was just written: rare)
    finally:
        os.close(fd)
        probe.unlink()


def test_a_cached_read_is_the_worker_threads_read_or_declined(tmp_path: Path) -> None:
    """``_read_window(cached=True)`` (the event loop's own read, from the kernel's caches) gives
    exactly what the worker thread's read gives, or None: for a file no longer in the page cache
    (evicted with POSIX_FADV_DONTNEED), one larger than CACHED_READ_MAX, or on a file system that
    cannot read without waiting."""
    import os

    from dsh_sandbox_tools import files

    nowait = _nowait_reads(tmp_path)
    path = tmp_path / "f.txt"
    cases = [b"", b"\n", b"one", b"a\r\nb\nc", "é€\n".encode() * 500, b"x" * 9000 + b"\n" + b"y\n" * 3000]
    for data in cases:
        path.write_bytes(data)
        path.read_bytes()  # in the page cache
        for offset, limit in ((1, 2000), (2, 1), (3000, 5)):
            exact_thread: list[str] = []
            exact_cached: list[str] = []
            thread = files._read_window(str(path), offset, limit, exact_thread)
            cached = files._read_window(str(path), offset, limit, exact_cached, cached=True)
            if nowait:
                assert cached == thread and exact_cached == exact_thread, (data[:20], offset, limit)
            else:
                assert cached is None and not exact_cached
    # evicted from the page cache: the loop would wait for the disk, so it declines
    path.write_bytes(b"cold\n" * 1000)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert files._read_window(str(path), 1, 10, cached=True) is None
    assert files._read_window(str(path), 1, 1)[:4] == ("1: cold", 1, 1, 1000)  # the thread's read
    with pytest.raises(ValueError):  # as os.open: never the file named by the part before the NUL
        files._read_window(str(path) + "\0.png", 1, 10, cached=True)
    # only on a local file system (NFS's open asks its server, FUSE's its daemon): procfs is not one
    assert files._read_window("/proc/self/status", 1, 1, cached=True) is None
    assert files._read_window("/proc/self/status", 1, 1)[0].startswith("1: Name:")
    big = tmp_path / "big.txt"
    big.write_bytes(b"z\n" * (files.CACHED_READ_MAX // 2 + 1))
    big.read_bytes()
    assert files._read_window(str(big), 1, 1, cached=True) is None
    assert files._read_window(str(big), 1, 1)[:4] == ("1: z", 1, 1, files.CACHED_READ_MAX // 2 + 1)


async def test_read_answers_from_the_cache_in_the_loop_else_in_a_thread(root: Path, monkeypatch) -> None:
    """Through the tool: a cached file is read with no worker thread (where the file system can
    say), one the kernel would wait for in a worker thread, with the same answer; a FIFO is
    refused at once on both ways, as the original refuses what is not a regular file (it was
    opened blocking: a read of one waited forever), as is /dev/null; a
    directory is still IS_DIRECTORY, and a file read through a symlink is recorded by its real
    path (the edit that follows finds the read)."""
    import errno
    import os

    from dsh_sandbox_tools import files

    hops: list[str] = []
    run_sync = files.anyio.to_thread.run_sync

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__name__", "?"))
        return await run_sync(fn, *args, **kwargs)

    class _Anyio:
        class to_thread:  # the module's shape
            run_sync = staticmethod(counted)

    monkeypatch.setattr(files, "anyio", _Anyio)
    (root / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 51)))
    (root / "f.txt").read_bytes()
    os.symlink(root / "f.txt", root / "link.txt")
    os.mkfifo(root / "pipe")
    async with running_host() as host:
        s = Session(host, root)
        warm = text(await s.call("read", file_path="f.txt", offset=3, limit=2))
        assert hops == ([] if _nowait_reads(root) else ["_read_window"])
        hops.clear()
        real_preadv = os.preadv

        def would_wait(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
            if flags & os.RWF_NOWAIT:
                raise BlockingIOError(errno.EAGAIN, "would wait")
            return real_preadv(fd, buffers, offset, flags)

        monkeypatch.setattr(os, "preadv", would_wait)
        assert text(await s.call("read", file_path="f.txt", offset=3, limit=2)) == warm
        assert hops == ["_read_window"]
        with anyio.fail_after(5):
            for _ in range(2):  # the loop's way, then (preadv restored) the thread's
                out = await s.call("read", file_path="pipe")
                assert out.code == "NOT_REGULAR_FILE", text(out)
                assert text(out) == 'Error: cannot read "pipe": not a regular file'
                monkeypatch.setattr(os, "preadv", real_preadv)
                monkeypatch.setattr(files, "open_cached", lambda path, flags: None)  # every read in the thread
        assert (await s.call("read", file_path=".")).code == "IS_DIRECTORY"
        assert (await s.call("read", file_path="/dev/null")).code == "NOT_REGULAR_FILE"
        fresh = Session(host, root)  # has read nothing yet
        assert "4: line 4" in text(await fresh.call("read", file_path="link.txt"))
        out = await fresh.call("edit", file_path="f.txt", old_string="line 4\n", new_string="LINE 4\n")
        assert not out.is_error, text(out)


def test_a_cached_open_is_only_for_a_local_file_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``open_cached`` opens nothing on a device it does not know as local (a network or FUSE
    file system, whose open waits for a server or daemon): the device is asked with statx
    without syncing, and looked up in the mount table."""
    import os

    from dsh_sandbox_tools import fspath

    path = tmp_path / "f.txt"
    path.write_text("x\n")
    dev = os.stat(path).st_dev
    devices = fspath.mounted_devices()
    assert os.stat("/").st_dev in devices and os.stat("/proc").st_dev in devices
    assert devices[os.stat("/proc").st_dev] is False
    fd = fspath.open_cached(str(path), os.O_RDONLY)
    if fd is not None:  # tmp_path is on a local file system the table knows
        try:
            assert os.readlink(f"/proc/self/fd/{fd}") == str(path.resolve())
            assert os.read(fd, 10) == b"x\n"
        finally:
            os.close(fd)
        monkeypatch.setitem(fspath._local_devices, dev, False)  # as if it were NFS
        assert fspath.open_cached(str(path), os.O_RDONLY) is None
    else:
        assert not devices.get(dev, False)
    missing = tmp_path / "missing"
    assert fspath.open_cached(str(missing / "deeper"), os.O_RDONLY) is None  # not looked up yet: it would wait
    assert not missing.exists()  # looked up now: the kernel remembers it is not there
    with pytest.raises(FileNotFoundError):
        fspath.open_cached(str(missing), os.O_RDONLY)
