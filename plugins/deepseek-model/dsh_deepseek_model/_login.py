"""The DeepSeek key a person stored with ``dsh auth login``: the OS keyring (the keyring
library: macOS Keychain, Windows Credential Locker, Secret Service), or else a 0600 file in
the user's config directory. Never an environment variable, a log line or a frame.

The file is readable by the user's own processes, as ``~/.aws/credentials`` is: bubblewrap hides
its directory from confined commands (sandbox-tools), Landlock alone cannot (it only adds read
rights, and reads are granted everywhere), so ``login`` says which store it used.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any, TextIO

from dsh_core.paths import credentials_home

from ._config import BASE_URL_ENV, DEFAULT_BASE_URL, KEY_ENV

log = logging.getLogger("dsh.deepseek-model")  # read in an agent process too: stderr through logging, never stdout

SERVICE = "dsh"
ACCOUNT = "deepseek-api-key"
KEY_PAGE = "https://platform.deepseek.com/api_keys"


def key_file() -> Path:
    return credentials_home() / ACCOUNT


def _keyring() -> Any | None:
    """The keyring module when it has a backend that keeps secrets (not ``fail``/``null``, and not
    keyrings.alt's plaintext files, which are no better than our own 0600 file). Imported on
    first use: it is not needed while ``DEEPSEEK_API_KEY`` is set."""
    try:
        import keyring
        backend = keyring.get_keyring()
    except Exception:
        return None
    name = f"{type(backend).__module__}.{type(backend).__qualname__}"
    if name.startswith(("keyring.backends.fail", "keyring.backends.null", "keyrings.alt")):
        return None
    if getattr(backend, "priority", 1) <= 0:
        return None
    return keyring


def stored_key() -> tuple[str | None, str]:
    """(key, where it came from): the keyring's, else the file's (owner-only files only)."""
    kr = _keyring()
    if kr is not None:
        try:
            key = kr.get_password(SERVICE, ACCOUNT)
        except Exception:
            key = None
        if key:
            return key.strip(), "the OS keyring"
    path = key_file()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None, ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077 or st.st_uid != os.getuid():
            log.warning(f"ignoring {path}: it must be a regular file only you can read (chmod 600)")
            return None, ""
        key = os.read(fd, 4096).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    return (key or None), str(path)


def store_key(key: str) -> str:
    """Store ``key``; returns where (a sentence)."""
    kr = _keyring()
    if kr is not None:
        try:
            kr.set_password(SERVICE, ACCOUNT, key)
            if kr.get_password(SERVICE, ACCOUNT) == key:
                with contextlib.suppress(FileNotFoundError):
                    key_file().unlink()  # one place only
                return f"the OS keyring ({type(kr.get_keyring()).__name__})"
        except Exception:
            pass
    path = key_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, key.encode("utf-8") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return f"{path} (mode 0600; no OS keyring is available here)"


def forget_key() -> list[str]:
    """Remove the stored key everywhere it is; returns where it was."""
    removed: list[str] = []
    kr = _keyring()
    if kr is not None:
        try:
            if kr.get_password(SERVICE, ACCOUNT):
                kr.delete_password(SERVICE, ACCOUNT)
                removed.append("the OS keyring")
        except Exception:
            pass
    try:
        key_file().unlink()
        removed.append(str(key_file()))
    except FileNotFoundError:
        pass
    return removed


def check_key(key: str, *, base_url: str | None = None, timeout: float = 15.0) -> str | None:
    """None when DeepSeek accepts ``key`` (``GET /models``), else why not. A network failure is
    not a verdict on the key: it is stored, with a warning."""
    import httpx

    url = (os.environ.get(BASE_URL_ENV) or base_url or DEFAULT_BASE_URL).rstrip("/") + "/models"
    try:
        response = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout, follow_redirects=False)
    except httpx.HTTPError as exc:
        print(f"dsh: could not reach DeepSeek to check the key ({type(exc).__name__}); storing it unchecked",
              file=sys.stderr)
        return None
    if response.status_code in (401, 403):
        return "DeepSeek refused this key (HTTP 401): check it and try again"
    return None


def read_key(stdin: bool, out: TextIO) -> str:
    if stdin:
        return sys.stdin.readline().strip()
    print(f"Paste your DeepSeek API key (from {KEY_PAGE}); it is not shown as you type.", file=out, flush=True)
    return getpass.getpass("DeepSeek API key: ", stream=out).strip()


def login(*, stdin: bool = False, check: bool = True, base_url: str | None = None, out: TextIO | None = None) -> int:
    """Read a key without echo, check it, store it. 0 on success."""
    out = out or sys.stderr
    try:
        key = read_key(stdin, out)
    except (EOFError, KeyboardInterrupt):
        print("\ndsh: login cancelled; nothing was stored", file=out)
        return 130
    if not key or any(c.isspace() or not c.isprintable() for c in key) or not key.isascii():
        print("dsh: that is not an API key (empty, or with spaces or control characters); nothing was stored",
              file=out)
        return 1
    if check:
        problem = check_key(key, base_url=base_url)
        if problem is not None:
            print(f"dsh: {problem}; nothing was stored", file=out)
            return 1
    where = store_key(key)
    print(f"Logged in: the key is stored in {where}.", file=out)
    if os.environ.get(KEY_ENV):
        print(f"Note: {KEY_ENV} is set in this environment and is used first.", file=out)
    return 0


def logout(out: TextIO | None = None) -> int:
    out = out or sys.stderr
    removed = forget_key()
    print(f"Logged out: removed the key from {' and '.join(removed)}." if removed else "No stored key to remove.",
          file=out)
    return 0


def status(out: TextIO | None = None) -> int:
    out = out or sys.stdout
    key, where = stored_key()
    if os.environ.get(KEY_ENV, "").strip():
        print(f"A key is set in {KEY_ENV} (used first).", file=out)
    print(f"A key is stored in {where}." if key else "No key is stored (run: dsh auth login).", file=out)
    return 0
