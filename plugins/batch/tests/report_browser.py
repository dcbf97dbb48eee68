"""Open a page in a real headless Chromium (Debian's package) and report what a person would get:
the requests it made, its console errors and uncaught exceptions, and the value of a script run
in the loaded page. Stdlib only: the DevTools protocol over ``--remote-debugging-pipe`` (the
browser reads commands on its fd 3 and writes answers and events on its fd 4, each message JSON
ended by a NUL byte)."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Visit:
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, the page included
    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions, failed loads
    value: Any = None  # what the expression evaluated to


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is needed (apt-get install chromium; .ci/run installs it)"
    return path


class _Pipe:
    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int) -> None:
        self.proc, self.out, self.inp = proc, to_browser, from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30) -> dict[str, Any]:  # fmt: skip
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.out, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self.read(timeout)
            if reply.get("id") == self.next_id:
                assert "error" not in reply, reply
                return reply.get("result", {})
            self.events.append(reply)

    def read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0, "no answer from chromium"
            ready, _, _ = select.select([self.inp], [], [], left)
            if ready:
                chunk = os.read(self.inp, 1 << 16)
                assert chunk, f"chromium exited ({self.proc.poll()})"
                self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def wait_for(self, method: str, timeout: float = 30) -> dict[str, Any]:
        for event in self.events:
            if event.get("method") == method:
                return event
        deadline = time.monotonic() + timeout
        while True:
            event = self.read(max(0.01, deadline - time.monotonic()))
            self.events.append(event)
            if event.get("method") == method:
                return event


def visit(page: Path, expression: str, profile: Path) -> Visit:
    """Load ``page`` (a file) in a fresh headless Chromium; evaluate ``expression`` once loaded."""
    r1, w1 = os.pipe()  # us → browser (its fd 3)
    r2, w2 = os.pipe()  # browser → us (its fd 4)

    def fds() -> None:  # in the child, before exec
        os.dup2(r1, 3)
        os.dup2(w2, 4)

    proc = subprocess.Popen(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
         f"--user-data-dir={profile}", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-default-browser-check", "about:blank"],
        preexec_fn=fds, pass_fds=(3, 4), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(r1)
    os.close(w2)
    pipe = _Pipe(proc, w1, r2)
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Network", "Runtime", "Log", "Page"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.events.clear()
        pipe.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        pipe.wait_for("Page.loadEventFired")
        result = pipe.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session)
        out = Visit(value=result.get("result", {}).get("value"))
        for event in pipe.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Network.requestWillBeSent":
                out.requests.append(params["request"]["url"])
            elif method == "Network.loadingFailed":
                out.errors.append(f"load failed: {params.get('errorText')}")
            elif method == "Runtime.exceptionThrown":
                out.errors.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                out.errors.append(json.dumps(params.get("args", []))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.errors.append(params["entry"].get("text", ""))
        return out
    finally:
        os.close(w1)
        os.close(r2)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
