"""A badly behaved plugin: it writes to stdout at import, at configure, and from a tool,
both through ``print`` and straight to file descriptor 1 (as a C extension would)."""

from __future__ import annotations

import os
import sys
from typing import Any

from dsh_core import FunctionTool, hookimpl

print("NOISY: print at import")
os.write(1, b"NOISY: fd 1 at import\n")


@hookimpl
def dsh_configure(config: Any, host: Any) -> None:
    print("NOISY: print at configure")
    sys.stdout.flush()


async def shout(args: dict[str, Any], ctx: Any) -> str:
    print("NOISY: print from a tool", flush=True)
    os.write(1, b"NOISY: fd 1 from a tool\n")
    os.system("echo NOISY: child process stdout")
    return "shouted"


@hookimpl
def dsh_register_tools(register: Any) -> None:
    register(FunctionTool("shout", "Write garbage to stdout.", {"type": "object"}, shout))
