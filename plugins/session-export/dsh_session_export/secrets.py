"""Secrets an export must never show: the DeepSeek API key (``DEEPSEEK_API_KEY``, a ``.env``, or
the key ``dsh auth login`` stored) and the value of every variable of this process's environment
whose name says it holds a credential (the spine's one pattern, ``dsh_core.hardening``).

Session logs hold no key by design; a tool's output may (a command that printed its environment,
a file that held one), so every text of an export passes ``scrub``."""

from __future__ import annotations

import os
from typing import Any

from dsh_core.hardening import is_credential_name

REDACTED = "[redacted]"
MIN_LEN = 8  # shorter values ("1", "true") are not secrets worth erasing from every text


def known_secrets() -> list[str]:
    found = {v.strip() for k, v in os.environ.items() if is_credential_name(k) and len(v.strip()) >= MIN_LEN}
    try:
        from dsh_deepseek_model._config import find_api_key
        from dsh_deepseek_model._login import stored_key
    except ImportError:
        pass
    else:
        for key in (find_api_key(), _quiet(stored_key)):
            if key and len(key) >= MIN_LEN:
                found.add(key)
    return sorted(found, key=len, reverse=True)  # a longer secret first, should one contain another


def _quiet(read: Any) -> str | None:
    try:
        return read()[0]
    except Exception:
        return None


class Scrubber:
    def __init__(self, secrets: list[str]) -> None:
        self.secrets = secrets

    def text(self, s: str) -> str:
        for secret in self.secrets:
            if secret in s:
                s = s.replace(secret, REDACTED)
        return s

    def tree(self, value: Any) -> Any:
        """Every string of a JSON-like value, scrubbed (keys too)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.tree(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.tree(v) for v in value]
        return value
