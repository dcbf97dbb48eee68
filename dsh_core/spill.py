"""The one spill mechanism: a tool result too big for the model goes to a file, the model gets head, tail and path.

``Sink`` streams (a command's output never sits whole in memory: past the limit everything goes
to the file, only head and tail stay); ``bound`` is the same for a result that is already text
(the agent loop applies it to every tool result the model is about to see). Both write
``<root>/<session>/<call>.log`` — ``root`` is ``$DSH_HOME/spill`` unless configured — and both
render the identical head/marker/tail text, so a spilled ``read`` and a spilled ``bash`` look alike.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import IO, Annotated

import msgspec

from .config import PluginConfig
from .paths import data_home

DEFAULT_LIMIT = 30_000  # bytes of UTF-8 text the model sees of one tool result


class SpillConfig(PluginConfig, kw_only=True):
    """``[config.spill]``: the spine's spill of every tool result (this module), declared by the host."""

    max_bytes: Annotated[int, msgspec.Meta(ge=1, description=(
        "a tool result longer than this is spilled to a file; the model gets its head, tail and the path"))] = (
        DEFAULT_LIMIT)
    dir: Annotated[str | None, msgspec.Meta(description=(
        "where spilled results go (default: the spill directory under dsh's data home)"))] = None


def default_root() -> Path:
    return data_home() / "spill"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _safe_name(s: str) -> str:
    return _UNSAFE.sub("_", s)[:100] or "call"


def spill_file_for(root: Path, session_id: str, call_id: str) -> str:
    """``<root>/<session>/<call>.log`` with both ids reduced to safe file-name characters, as a
    string: a ``Sink`` makes the Path only if it spills (a Path is ~45 Python calls; a command's
    output rarely spills, and this is on every bash call)."""
    return os.path.join(root, _safe_name(session_id), f"{_safe_name(call_id)}.log")


def spill_path_for(root: Path, session_id: str, call_id: str) -> Path:
    """``spill_file_for`` as a Path."""
    return Path(spill_file_for(root, session_id, call_id))


class Sink:
    """Keeps head and tail in memory; past ``limit`` bytes, streams everything to the spill file."""

    def __init__(self, limit: int, spill: Path | str) -> None:
        self.limit = limit
        self.half = max(1, limit // 2)
        self.spill_target = spill
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.file: IO[bytes] | None = None

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.file is None:
            self.head += chunk
            if len(self.head) > self.limit:
                Path(self.spill_target).parent.mkdir(parents=True, exist_ok=True)
                # Never through a link: a sandboxed command that can write in the spill root (a
                # DSH_HOME under /tmp) must not make dsh truncate another file.
                fd = os.open(self.spill_target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                             0o600)
                self.file = open(fd, "wb")  # noqa: SIM115 - stays open across feed(); close() closes it
                self.file.write(self.head)
                self.tail = bytearray(self.head[-self.half :])
                del self.head[self.half :]
            return
        self.file.write(chunk)
        self.tail += chunk
        if len(self.tail) > 4 * self.half:
            del self.tail[: -self.half]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    @property
    def spilled(self) -> bool:
        return self.file is not None

    def text(self) -> str:
        if self.file is None:
            return self.head.decode("utf-8", errors="replace")
        tail = bytes(self.tail[-self.half :])
        return cut_text(bytes(self.head), tail, self.total, self.spill_target)


def cut_text(head: bytes, tail: bytes, total: int, path: Path | str, *, where: str | None = None) -> str:
    """What the model sees of ``total`` bytes it is not shown whole: ``head``, a marker saying how
    much is left out and where it all is (``where``, default: the full output is in ``path``),
    ``tail`` — the one rendering of every spilled result (a tool's, a background job's)."""
    omitted = total - len(head) - len(tail)
    where = where or f"the full output ({total} bytes) is in {path}"
    return (
        head.decode("utf-8", errors="replace")
        + f"\n\n[… {omitted} bytes omitted; {where} — read it with the read tool (offset/limit) or grep it …]\n\n"
        + tail.decode("utf-8", errors="replace")
    )


def bound(text: str, limit: int, spill: Path) -> tuple[str, bool]:
    """(what the model sees, whether it spilled): ``text`` itself when it fits in ``limit`` bytes,
    else head + marker + tail with the whole text written to ``spill``."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text, False
    sink = Sink(limit, spill)
    try:
        sink.feed(data)
    finally:
        sink.close()
    return sink.text(), True
