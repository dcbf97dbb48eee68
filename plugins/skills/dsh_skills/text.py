"""Escaping a skill's text before it enters the system prompt or a reminder, as agent instructions
are: nothing a repository wrote may open or close a system block."""

from __future__ import annotations

import re

_SYSTEM_TAG = re.compile(r"<(\s*/?\s*system[\w-]*)", re.IGNORECASE)


def escape(text: str) -> str:
    """``<system…>`` and ``</system-reminder>`` become ``&lt;system…``."""
    return _SYSTEM_TAG.sub(r"&lt;\1", text)
