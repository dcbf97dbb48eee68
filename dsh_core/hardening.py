"""What the ``dsh`` process does to itself before anything else: keep its secrets out of reach
of the code it runs.

Confined code (``bash``, ``run_code``, a hook shipped in a cloned repository) runs as the same
user as dsh. Without a pid namespace (Landlock alone) it can open ``/proc/<dsh pid>/environ``,
which holds the environment dsh was *started* with — ``DEEPSEEK_API_KEY`` included — no
matter what dsh later removes from ``os.environ``. Two measures close that, and the sandbox
adds a third:

- ``PR_SET_DUMPABLE 0``: dsh's ``/proc/<pid>`` files (``environ``, ``mem``, ``maps``) then
  need ``CAP_SYS_PTRACE`` to open, which confined children never have (sandbox-tools drops
  every capability in them, even as root);
- the kernel-visible environment block (what ``/proc/<pid>/environ`` shows: the memory the
  process was started with) is overwritten where it holds a credential-shaped variable, so
  nothing can read the value from there even where the first measure is unavailable. The
  variable itself stays set — libc's ``environ`` gets a fresh copy elsewhere in memory, and
  ``os.environ`` keeps its own — because libraries read credentials through ``getenv`` (Ray's
  C++ core reads ``RAY_AUTH_TOKEN`` so; unsetting it broke ``dsh batch --ray``). Confined
  children never get them: sandbox-tools hands them an explicitly scrubbed environment;
- (sandbox-tools) confined processes drop all capabilities, so as root they cannot read the
  ``/proc`` files of any process that holds capabilities either.

``harden()`` is called first thing by the ``dsh`` entry point; the library never calls it on
import (a test process or an embedding application decides for itself).
"""

from __future__ import annotations

import ctypes
import os
import re

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3

# Variables a command never needs and a leaked key must never reach (the one pattern the
# sandbox's scrubbed environment and this module use).
CREDENTIAL = re.compile(
    r"(API_?KEY|ACCESS_?KEY|SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE_?KEY|AUTH|COOKIE|SESSION_?KEY|"
    r"^AWS_|^AZURE_|^GCP_|^GOOGLE_APPLICATION|^OPENAI_|^ANTHROPIC_|^DEEPSEEK_|^GH_|^GITHUB_|^NPM_CONFIG_|^PYPI_|"
    r"^SSH_AUTH_SOCK$|^GPG_AGENT|^KRB5|^VAULT_)",
    re.IGNORECASE,
)
# Names that match the pattern but carry no secret and that children rely on.
_NOT_SECRET = frozenset({"DEEPSEEK_BASE_URL", "DSH_SANDBOX"})


def is_credential_name(name: str) -> bool:
    return bool(CREDENTIAL.search(name))


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - no libc (not Linux)
        return None


def set_non_dumpable() -> bool:
    """Make this process non-dumpable (its /proc files need CAP_SYS_PTRACE); True when it is."""
    libc = _libc()
    if libc is None:  # pragma: no cover
        return False
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return bool(libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)


def _env_block() -> tuple[int, int] | None:
    """(start, end) addresses of this process's initial environment block (/proc/self/stat)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        # Fields after the ")" start at field 3 (state); env_start/env_end are fields 50 and 51.
        return int(fields[50 - 3]), int(fields[51 - 3])
    except (OSError, ValueError, IndexError):
        return None


def scrub_process_environment() -> list[str]:
    """Overwrite every credential-shaped variable's value in the initial environment block (what
    ``/proc/<pid>/environ`` shows); the variable stays set, moved to a fresh copy (libc ``setenv``),
    so ``getenv`` and ``os.environ`` still see it. Returns the names scrubbed."""
    libc = _libc()
    block = _env_block()
    if libc is None or block is None:  # pragma: no cover
        return []
    start, end = block
    libc.getenv.restype = ctypes.c_void_p
    libc.getenv.argtypes = [ctypes.c_char_p]
    libc.setenv.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    done: list[str] = []
    for name in list(os.environb):
        text = os.fsdecode(name)
        if not is_credential_name(text) or text in _NOT_SECRET:
            continue
        value = os.environb[name]
        ptr = libc.getenv(name)
        if not (ptr and value and start <= ptr and ptr + len(value) <= end):
            continue  # already a copy (set after start-up): nothing in the block to wipe
        libc.setenv(name, value, 1)  # a fresh copy first, so getenv never sees a torn value
        ctypes.memset(ptr, ord("x"), len(value))
        done.append(text)
    return done


def harden() -> None:
    """Everything above, for the ``dsh`` process (idempotent)."""
    set_non_dumpable()
    scrub_process_environment()
