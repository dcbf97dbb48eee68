"""Tool names: ``mcp__<server>__<tool>``, within DeepSeek's function-name rules.

A function name there is 1–64 characters of ``[A-Za-z0-9_-]``. A name that already fits is
used as is; any other is cleaned (each other character becomes ``_``), cut to fit, and given
a suffix from a hash of the whole original name, so two distinct tools never share a name
and a name depends on nothing but the server's and the tool's (never on connection order).
"""

from __future__ import annotations

import hashlib
import re

PREFIX = "mcp__"
MAX = 64
_FITS = re.compile(r"[A-Za-z0-9_-]{1,64}")
_OTHER = re.compile(r"[^A-Za-z0-9_-]")


def tool_name(server: str, tool: str) -> str:
    raw = f"{PREFIX}{server}__{tool}"
    if _FITS.fullmatch(raw):
        return raw
    suffix = "_" + hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return _OTHER.sub("_", raw)[: MAX - len(suffix)] + suffix
