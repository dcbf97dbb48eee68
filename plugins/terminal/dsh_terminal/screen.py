"""A terminal's screen as a person would see it: a VT emulator (pyte) fed with everything the
program writes, plus the lines that scrolled off its top (the scrollback), bounded.

Lines are numbered absolutely from the terminal's start (``first`` is the oldest one still
kept): a send notes where the cursor stood and later renders the lines from there on, so a
command's output reads as the lines it produced, and a full-screen program (the alternate
screen: ``less``, ``top``, an editor) reads as its current screen.
"""

from __future__ import annotations

import codecs
import copy
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import pyte

# Private modes that switch to the alternate screen (47, 1047, 1049); pyte keeps private modes
# shifted left by 5 bits.
ALT_MODES = {47, 1047, 1049}
TRUNCATED = "\n[output truncated]"


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def utf8_tail(text: str, max_bytes: int) -> tuple[str, bool]:
    """The longest tail of ``text`` that fits ``max_bytes`` (whole characters), and whether it was cut."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text, False
    cut = data[len(data) - max_bytes:]
    return cut.decode("utf-8", errors="ignore"), True


def utf8_head(text: str, max_bytes: int) -> str:
    return text.encode("utf-8")[:max(0, max_bytes)].decode("utf-8", errors="ignore")


def bound_text(text: str, max_bytes: int) -> str:
    """A whole result bounded to ``max_bytes``: its head and the truncation marker."""
    if utf8_len(text) <= max_bytes:
        return text
    room = max_bytes - utf8_len(TRUNCATED)
    if room <= 0:
        return utf8_tail(TRUNCATED, max_bytes)[0]
    return utf8_head(text, room) + TRUNCATED


def bound_with_suffix(content: str, metadata: str, truncated: bool, max_bytes: int) -> str:
    """``content`` then ``metadata`` (kept whole); when it does not fit, the tail of the content."""
    complete = content + metadata + (TRUNCATED if truncated else "")
    if utf8_len(complete) <= max_bytes:
        return complete
    suffix = metadata + TRUNCATED
    room = max_bytes - utf8_len(suffix)
    if room <= 0:
        return utf8_tail(suffix, max_bytes)[0]
    return utf8_tail(content, room)[0] + suffix


def bound_with_prefix(prefix: str, content: str, max_bytes: int) -> str:
    """``prefix`` kept whole, then the tail of ``content`` that fits, then the marker."""
    complete = prefix + content
    if utf8_len(complete) <= max_bytes:
        return complete
    fixed = prefix + TRUNCATED
    room = max_bytes - utf8_len(fixed)
    if room <= 0:
        return utf8_head(fixed, max_bytes)
    return prefix + utf8_tail(content, room)[0] + TRUNCATED


def _render(line: dict, columns: int) -> str:
    """One row's text (only its written cells are visited: a wide, mostly empty screen is cheap)."""
    if not line:
        return ""
    width = min(columns, max(line) + 1)
    return "".join(line[x].data for x in range(width)).rstrip()


class _Screen(pyte.Screen):
    """pyte's screen, told when a line scrolls off the top (outside the alternate screen), and
    with the alternate screen kept apart so that leaving a full-screen program restores what
    was there (as xterm does)."""

    def __init__(self, columns: int, lines: int, on_scroll: Callable[[str], None],
                 reply: Callable[[str], None]) -> None:
        super().__init__(columns, lines)
        self._on_scroll = on_scroll
        self._reply = reply
        self._saved: tuple[dict, pyte.screens.Cursor] | None = None

    @property
    def alternate(self) -> bool:
        return any((m << 5) in self.mode for m in ALT_MODES)

    def index(self) -> None:
        top, bottom = self.margins or pyte.screens.Margins(0, self.lines - 1)
        if self.cursor.y == bottom and top == 0 and not self.alternate:
            self._on_scroll(_render(self.buffer[0], self.columns))
        super().index()

    def set_mode(self, *modes: int, **kwargs: object) -> None:
        if kwargs.get("private") and ALT_MODES & set(modes) and not self.alternate:
            self._saved = (copy.deepcopy(dict(self.buffer)), copy.copy(self.cursor))
            super().set_mode(*modes, **kwargs)
            self.erase_in_display(2)
            return
        super().set_mode(*modes, **kwargs)

    def reset_mode(self, *modes: int, **kwargs: object) -> None:
        leaving = bool(kwargs.get("private") and ALT_MODES & set(modes) and self.alternate)
        super().reset_mode(*modes, **kwargs)
        if leaving and self._saved is not None:
            saved, cursor = self._saved
            self._saved = None
            self.buffer.clear()
            self.buffer.update(saved)
            self.cursor = cursor
            self.dirty.update(range(self.lines))

    def write_process_input(self, data: str) -> None:
        # The program asked the terminal something (cursor position, device attributes): answer it,
        # as a terminal would (some REPLs wait for the answer before they draw their prompt).
        self._reply(data)


@dataclass
class Page:
    text: str
    total_lines: int
    line_begin: int
    line_end: int
    truncated: bool


class Scrollback:
    """The lines that scrolled off a terminal's screen: at most ``max_lines`` and ``max_bytes``;
    the oldest go first, and ``dropped`` says that some did."""

    def __init__(self, max_lines: int, max_bytes: int) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.lines: deque[str] = deque()
        self.bytes = 0
        self.first = 0  # absolute number of the oldest kept line
        self.dropped = False

    def append(self, line: str) -> None:
        self.lines.append(line)
        self.bytes += utf8_len(line) + 1
        while len(self.lines) > self.max_lines or (self.bytes > self.max_bytes and self.lines):
            self.drop_oldest()

    def drop_oldest(self) -> int:
        if not self.lines:
            return 0
        gone = utf8_len(self.lines.popleft()) + 1
        self.bytes -= gone
        self.first += 1
        self.dropped = True
        return gone

    @property
    def end(self) -> int:
        return self.first + len(self.lines)


class TermScreen:
    """One terminal's screen and scrollback, fed with the program's bytes."""

    def __init__(self, columns: int, rows: int, *, max_lines: int, max_bytes: int,
                 reply: Callable[[str], None] = lambda _data: None,
                 on_grow: Callable[[int], None] = lambda _n: None) -> None:
        self.scrollback = Scrollback(max_lines, max_bytes)
        self._on_grow = on_grow
        self.screen = _Screen(columns, rows, self._scrolled, reply)
        self.stream = pyte.Stream(self.screen)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _scrolled(self, line: str) -> None:
        self.scrollback.append(line)
        self._on_grow(utf8_len(line) + 1)

    def feed(self, data: bytes) -> None:
        self.stream.feed(self._decoder.decode(data))

    # ---------------------------------------------------------------- positions and text

    @property
    def alternate(self) -> bool:
        return self.screen.alternate

    def cursor(self) -> tuple[int, int]:
        """(absolute line, column) of the cursor."""
        return self.scrollback.end + self.screen.cursor.y, self.screen.cursor.x

    def screen_lines(self) -> list[str]:
        """The screen's rows up to the cursor's or the last written one; the cursor's row keeps
        what stands before the cursor (a prompt's trailing space)."""
        s = self.screen
        rows = [_render(s.buffer[y], s.columns) if y in s.buffer else "" for y in range(s.lines)]
        cy, cx = s.cursor.y, s.cursor.x
        if cx > len(rows[cy]):
            rows[cy] = "".join(s.buffer[cy][x].data for x in range(min(cx, s.columns)))
        last = cy
        for y in range(s.lines - 1, cy, -1):
            if rows[y]:
                last = y
                break
        return rows[: last + 1]

    def display(self) -> str:
        """The whole screen as a person sees it now (trailing blank rows dropped)."""
        return "\n".join(self.screen_lines())

    def lines_from(self, line: int, column: int) -> tuple[str, bool]:
        """The text from absolute (line, column) to the end: the output since a send began.
        True when part of it has already left the scrollback."""
        sb = self.scrollback
        lost = line < sb.first
        start = max(line, sb.first)
        # only the scrollback's newest lines from ``start`` on (a short delta stays cheap however much is kept)
        kept = list(itertools.islice(reversed(sb.lines), max(0, sb.end - start)))[::-1]
        chunk = kept + self.screen_lines()[max(0, start - sb.end):]
        if not chunk:
            return "", lost
        if not lost:
            chunk[0] = chunk[0][column:]
        return "\n".join(chunk), lost

    def transcript_lines(self) -> list[str]:
        return list(self.scrollback.lines) + self.screen_lines()

    def page(self, offset: int, count: int, max_bytes: int) -> Page:
        """``count`` lines ending ``offset`` lines before the newest (the original's paging)."""
        lines = self.transcript_lines()
        total = 0 if lines == [""] else len(lines)
        if offset >= total:
            return Page("", total, offset, offset, self.scrollback.dropped)
        end = total - offset
        start = max(0, end - count)
        text, cut = utf8_tail("\n".join(lines[start:end]), max_bytes)
        returned = 0 if not text else text.count("\n") + 1
        return Page(text, total, offset, offset + returned, self.scrollback.dropped or cut)
