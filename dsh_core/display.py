"""Text a person is shown (a title, a question, a tool's output) made safe to show, whatever
front door shows it: no terminal control sequences or bidirectional overrides that could
disguise what is shown, and bounded. ``dsh_acp.display`` adds ACP's bounded ``rawInput``.
And text a repository wrote made safe to put in front of the model (``escape_system``).
"""

from __future__ import annotations

import re

# C0/C1 controls (not tab or newline), DEL, the zero-width characters and directional marks, and
# the bidirectional overrides/isolates that can reorder what is shown.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """One line, no control characters: newlines become ``↵``, tabs spaces, controls ``\\xNN``."""
    text = text.replace("\r\n", "\n").replace("\n", " ↵ ").replace("\t", " ")
    return UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}" if ord(m.group()) > 0xFF else f"\\x{ord(m.group()):02x}", text)


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def one_line(text: str, limit: int) -> str:
    """``visible`` and at most ``limit`` characters: a title."""
    return cut(visible(text), limit)


def strip_unsafe(text: str, replacement: str = "") -> str:
    """Multi-line text (a tool's output, a reason) without the characters that disguise it
    (each replaced by ``replacement``)."""
    return UNSAFE.sub(replacement, text)


_SYSTEM_TAG = re.compile(r"<(\s*/?\s*system[\w-]*)", re.IGNORECASE)


def escape_system(text: str) -> str:
    """Text a repository wrote (instructions, a skill) that may not open or close a system block:
    ``<system…>`` and ``</system-reminder>`` become ``&lt;system…``."""
    return _SYSTEM_TAG.sub(r"&lt;\1", text)
