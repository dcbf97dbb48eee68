"""A raw ACP-over-stdio driver for the reliability suite: exact control over what is written
when (no SDK in between), plus process-tree checks seen from outside any sandbox."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STRESS = os.environ.get("DSH_STRESS") == "1"


def agent_dirs(tmp_path: Path, script: dict[str, Any]) -> tuple[Path, Path, Path]:
    """A workspace (made), the scripted model's script (written) and a DSH_HOME, under ``tmp_path``."""
    ws = tmp_path / "ws"
    ws.mkdir()
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    return ws, path, tmp_path / "home"


def frame(method: str, params: dict[str, Any], rid: int | None = None) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if rid is not None:
        msg["id"] = rid
    return json.dumps(msg).encode() + b"\n"


class RawAgent:
    """``dsh run --example acp-agent`` with the scripted model, spoken to line by line."""

    def __init__(self, script: Path, cwd: Path, home: Path, env: dict[str, str] | None = None,
                 preexec: Any = None) -> None:
        full_env = {k: os.environ[k] for k in ("HOME", "PATH", "LANG") if k in os.environ}
        full_env.update({"DSH_HOME": str(home), **(env or {})})
        self.cwd = cwd
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dsh_core.cli", "run", "--example", "acp-agent",
             "--provider", "scripted", "--model", str(script)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=full_env,
            start_new_session=True, preexec_fn=preexec,
        )
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._buf = b""
        self._next = 0
        self.frames: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ writing

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any]) -> int:
        self._next += 1
        self.send(frame(method, params, self._next))
        return self._next

    def call(self, method: str, params: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
        return self.wait_response(self.request(method, params), timeout)

    def start(self) -> str:
        assert "result" in self.call("initialize", {"protocolVersion": 1})
        return self.new_session()

    def new_session(self) -> str:
        resp = self.call("session/new", {"cwd": str(self.cwd), "mcpServers": []})
        assert "result" in resp, resp
        return resp["result"]["sessionId"]

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    # ------------------------------------------------------------------ reading

    def _lines(self, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line:
                    msg = json.loads(line)
                    self.frames.append(msg)
                    yield msg
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no frame within {timeout}s; stderr: {self.stderr_tail()}")
            if not self._sel.select(left):
                continue
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise EOFError(f"agent closed stdout (exit {self.proc.poll()}); stderr: {self.stderr_tail()}")
            self._buf += chunk

    def wait_response(self, rid: int, timeout: float = 30) -> dict[str, Any]:
        for msg in self._lines(timeout):
            if msg.get("id") == rid and ("result" in msg or "error" in msg):
                return msg
        raise AssertionError("unreachable")

    def wait_exit(self, timeout: float = 20) -> int:
        try:
            for _ in self._lines(timeout):
                pass
        except EOFError:
            pass
        return self.proc.wait(timeout)

    def stderr_tail(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return "(running)"
        return self.proc.stderr.read()[-2000:].decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def __enter__(self) -> RawAgent:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            try:
                self.close_stdin()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


# ---------------------------------------------------------------------- process-tree checks


def _state(pid: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def live_with_marker(marker: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose command line mentions ``marker``, seen from outside any sandbox."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and _state(entry) not in (None, "Z", "X"):
            found.append((int(entry), cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]))
    return found


def live_in_dir(directory: Path) -> list[tuple[int, str]]:
    """Live processes whose working directory is ``directory`` or below it."""
    found = []
    target = str(directory.resolve())
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if (cwd == target or cwd.startswith(target + "/")) and _state(entry) not in (None, "Z", "X"):
            found.append((int(entry), cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]))
    return found
