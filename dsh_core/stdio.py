"""Protect the protocol stream at the file-descriptor level (ACP-1: stdout is protocol, docs/acp-contract.md).

``claim_stdout()`` duplicates fd 1 to a private descriptor for protocol frames and
then points fd 1 at stderr. After it, ``print``, a C extension writing to fd 1 or a
child process inheriting stdout all land on stderr; only the returned stream reaches
the peer. ``sys.stdout`` is not patched: it still writes to fd 1, which is now stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import BinaryIO

_claimed: tuple[BinaryIO, BinaryIO] | None = None


def _flush_python_stdout() -> None:
    """Push out anything ``print`` buffered before fd 1 changes target."""
    with suppress(Exception):
        sys.stdout.flush()


def claim_stdio() -> tuple[BinaryIO, BinaryIO]:
    """Return (protocol_in, protocol_out), claiming fds 0 and 1 once per process."""
    global _claimed
    if _claimed is None:
        _flush_python_stdout()
        out_fd = os.dup(1)
        os.dup2(2, 1)
        in_fd = os.dup(0)
        # fd 0 now reads /dev/null: a child process can never consume protocol input.
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        _claimed = (os.fdopen(in_fd, "rb", buffering=0), os.fdopen(out_fd, "wb", buffering=0))
    return _claimed


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point fd 1 at stderr for the duration (e.g. while importing plugins for their
    commands, so an import-time ``print`` cannot pollute a command's output)."""
    _flush_python_stdout()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        _flush_python_stdout()
        os.dup2(saved, 1)
        os.close(saved)
