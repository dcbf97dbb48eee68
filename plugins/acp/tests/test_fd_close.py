"""FdReader/FdWriter.close are idempotent: the client closes an agent's stdin at shutdown
and again on exit; a second ``os.close`` of the same number would close whatever reused
it meanwhile — under `dsh batch`, another agent's freshly opened pipe (seen as agents
exiting on a stdin EOF nobody sent)."""

from __future__ import annotations

import os

import pytest
from dsh_acp.fdstream import FdReader, FdWriter


@pytest.mark.parametrize("end", ["reader", "writer"])
def test_second_close_leaves_a_reused_fd_number_alone(end):
    r, w = os.pipe()
    obj = FdReader(r) if end == "reader" else FdWriter(w)
    number = obj.fd
    obj.close()
    other = os.pipe()
    try:
        reused = next((fd for fd in other if fd == number), None)
        assert reused is not None, "the kernel hands out the lowest free number"
        obj.close()
        os.fstat(reused)  # still open
    finally:
        for fd in (*other, w if end == "reader" else r):
            os.close(fd)
