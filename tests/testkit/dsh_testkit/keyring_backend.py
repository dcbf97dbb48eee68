"""A keyring backend for tests (``PYTHON_KEYRING_BACKEND=dsh_testkit.keyring_backend.DirKeyring``):
one file per secret in ``$DSH_TEST_KEYRING`` — a stand-in for the OS keyring on a machine that
has none (CI), so the keyring path of ``dsh auth login`` runs against the real keyring library."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from keyring.backend import KeyringBackend


class DirKeyring(KeyringBackend):
    priority = 1

    def _path(self, service: str, username: str) -> Path:
        name = hashlib.sha256(f"{service}\0{username}".encode()).hexdigest()
        return Path(os.environ["DSH_TEST_KEYRING"]) / name

    def get_password(self, service: str, username: str) -> str | None:
        try:
            return self._path(service, username).read_text()
        except FileNotFoundError:
            return None

    def set_password(self, service: str, username: str, password: str) -> None:
        path = self._path(service, username)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(password)

    def delete_password(self, service: str, username: str) -> None:
        self._path(service, username).unlink()
