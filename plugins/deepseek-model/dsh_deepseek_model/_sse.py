"""An incremental Server-Sent Events parser (the WHATWG rules DeepSeek's stream needs).

Bytes arrive in arbitrary pieces: lines, CRLF pairs and UTF-8 sequences may be split
across reads. Comment lines (``: keep-alive``) and blank keep-alive lines are reported
as keep-alives so the caller can tell liveness from progress; an event is dispatched on
a blank line; ``data`` fields of one event are joined with newlines.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True)
class SSEEvent:
    data: str
    event: str = "message"


class KeepAlive:
    """Marker: the peer showed liveness (a comment or an empty line) without data."""


KEEP_ALIVE = KeepAlive()


class SSEParser:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._data: list[str] = []
        self._event = ""
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[SSEEvent | KeepAlive]:
        text = self._decoder.decode(chunk)
        return self._lines(text)

    def close(self) -> list[SSEEvent | KeepAlive]:
        """End of stream: an unterminated final line is processed; an undispatched event is dropped."""
        text = self._decoder.decode(b"", final=True)
        out = self._lines(text)
        if self._buffer:
            out.extend(self._line(self._buffer))
            self._buffer = ""
        return out

    def _lines(self, text: str) -> list[SSEEvent | KeepAlive]:
        out: list[SSEEvent | KeepAlive] = []
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]
        self._pending_cr = False
        buf = self._buffer + text
        start = 0
        i = 0
        n = len(buf)
        while i < n:
            ch = buf[i]
            if ch == "\r" or ch == "\n":
                out.extend(self._line(buf[start:i]))
                if ch == "\r":
                    if i + 1 < n:
                        if buf[i + 1] == "\n":
                            i += 1
                    else:
                        self._pending_cr = True
                start = i + 1
            i += 1
        self._buffer = buf[start:]
        return out

    def _line(self, line: str) -> list[SSEEvent | KeepAlive]:
        if line == "":
            if not self._data:
                self._event = ""
                return [KEEP_ALIVE]
            event = SSEEvent(data="\n".join(self._data), event=self._event or "message")
            self._data = []
            self._event = ""
            return [event]
        if line.startswith(":"):
            return [KEEP_ALIVE]
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return []
