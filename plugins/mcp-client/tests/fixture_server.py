"""An MCP server written with the official SDK, for the mcp-client tests.

``python fixture_server.py stdio`` serves on stdin/stdout; ``python fixture_server.py http PORT``
serves streamable HTTP on 127.0.0.1:PORT/mcp. Environment knobs: ``FIXTURE_MARKS`` (a directory
where tools leave marks: ``started`` with the pid at start, ``cancelled`` when a call was
cancelled), ``FIXTURE_HANG=1`` (never answer ``initialize``: the process just sleeps),
``FIXTURE_PREFIX`` (a prefix of every tool name, so two servers can share names or not).
"""

from __future__ import annotations

import base64
import contextlib
import os
import sys
import time
from pathlib import Path

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp_types import ToolAnnotations

MARKS = Path(os.environ["FIXTURE_MARKS"]) if os.environ.get("FIXTURE_MARKS") else None
PREFIX = os.environ.get("FIXTURE_PREFIX", "")
PNG = base64.b64decode(  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")

app = MCPServer("fixture")


def mark(name: str, text: str = "") -> None:
    if MARKS is not None:
        (MARKS / name).write_text(text)


@app.tool(name=f"{PREFIX}echo", annotations=ToolAnnotations(read_only_hint=True))
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


@app.tool(name=f"{PREFIX}add")
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers (a structured result)."""
    return {"sum": a + b}


@app.tool(name=f"{PREFIX}fail")
def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"failed on purpose: {reason}")


@app.tool(name=f"{PREFIX}env")
def env(name: str) -> str:
    """The value of an environment variable, or <unset>."""
    return os.environ.get(name, "<unset>")


@app.tool(name=f"{PREFIX}whereami")
def whereami() -> str:
    """The server's working directory."""
    return os.getcwd()


@app.tool(name=f"{PREFIX}picture")
def picture() -> list:
    """A 1x1 image and a caption."""
    from mcp_types import ImageContent, TextContent

    return [TextContent(text="a tiny picture"), ImageContent(data=base64.b64encode(PNG).decode(), mime_type="image/png")]


@app.tool(name=f"{PREFIX}slow")
async def slow(seconds: float) -> str:
    """Sleep, then answer (marks 'cancelled' when cancelled first)."""
    mark("slow-started", str(os.getpid()))
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        mark("cancelled", "yes")
        raise
    return f"slept {seconds}"


@app.tool(name=f"{PREFIX}spawn")
def spawn() -> str:
    """Start a long-lived child process of the server (in its process group) and name its pid."""
    import subprocess

    child = subprocess.Popen(["sleep", "300"])
    mark("child", str(child.pid))
    return str(child.pid)


@app.tool(name=f"{PREFIX}crash")
def crash() -> str:
    """The server process dies at once."""
    os._exit(3)


@app.tool(name=f"{PREFIX}grow")
async def grow(name: str, ctx: Context) -> str:
    """Add a tool called ``name`` and announce the changed list."""

    def extra() -> str:
        return "extra"

    app.add_tool(extra, name=name, description="A tool added while the server runs.")
    with contextlib.suppress(Exception):  # handshake-era connections
        await ctx.request_context.session.send_tool_list_changed()
    with contextlib.suppress(Exception):  # 2026-07-28 connections (subscriptions/listen)
        await ctx.notify_tools_changed()
    return f"added {name}"


def main() -> None:
    if os.environ.get("FIXTURE_ONCE") == "1" and MARKS is not None and (MARKS / "started").exists():
        sys.stderr.write("fixture: already started once; refusing to start again\n")
        sys.exit(1)
    mark("started", str(os.getpid()))
    if os.environ.get("FIXTURE_HANG") == "1":
        time.sleep(3600)
        return
    if sys.argv[1] == "stdio":
        app.run()
    else:
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))


if __name__ == "__main__":
    main()
