"""The session logs the snapshot scenarios recorded (``snapshots/`` and ``plugins/*/snapshots/``),
put back into a real ``JsonlStore`` directory as the agent wrote them: request headers expanded
from their class pins (``dsh_testing.scenarios.expand_headers``), placeholders replaced by real
values (session ids, paths, message ids)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsh_core.types import (
    AssistantMessage,
    AssistantMessageEvent,
    SessionHeader,
    TextBlock,
    ToolCallBlock,
    ToolResultEvent,
    ToolResultMessage,
    UserMessage,
    UserMessageEvent,
    log_encoder,
)
from dsh_testing.scenarios import _class_pin, expand_headers, load_scenario

REPO = Path(__file__).resolve().parents[3]
_SESSION = re.compile(r"\{\{session(\d+)\}\}")
_ID = re.compile(r"\{\{id(?::(\d+))?\}\}")


@dataclass
class Recorded:
    scenario: str  # example/name
    ids: list[str]  # the store ids of its sessions, in the order the scenario's files hold them


def scenario_dirs() -> list[Path]:
    roots = [REPO / "snapshots", *sorted((REPO / "plugins").glob("*/snapshots"))]
    return sorted(p.parent for root in roots for p in root.glob("*/*/input.json"))


def materialize(directory: Path, sessions: Path, cwd: Path) -> Recorded:
    sc = load_scenario(directory)
    system, tools = _class_pin(sc)
    tag = f"{directory.parent.name}.{directory.name}"
    ids = []
    for log_path in sc.logs():
        text = expand_headers(log_path.read_text(encoding="utf-8"), system, tools)
        text = _SESSION.sub(lambda m: f"{tag}.s{m.group(1)}", text)
        text = _ID.sub(lambda m: f"{int(m.group(1) or 0):032x}", text)
        for old, new in (("{{cwd}}", str(cwd)), ("{{home}}", str(sessions.parent)), ("{{tmp}}", str(cwd.parent)),
                         ("{{repo}}", str(REPO)), ("{{script}}", "script.json"), ("{{http}}", "http://127.0.0.1:9"),
                         ("{{time}}", "2026-01-01T00:00:00Z")):
            text = text.replace(old, new)
        header = json.loads(text.split("\n", 1)[0])
        sessions.mkdir(parents=True, exist_ok=True)
        assert not (sessions / f"{header['id']}.jsonl").exists(), f"two scenarios named {tag}"
        (sessions / f"{header['id']}.jsonl").write_text(text, encoding="utf-8")
        ids.append(header["id"])
    return Recorded(f"{directory.parent.name}/{directory.name}", ids)


DSH = Path(sys.executable).with_name("dsh")


def write_log(sessions: Path, header: SessionHeader, events: Iterable[Any]) -> str:
    """A session log as the store writes it: the header, then each event (seq numbered from 1)."""
    sessions.mkdir(parents=True, exist_ok=True)
    lines = [log_encoder.encode(header)]
    for n, ev in enumerate(events, 1):
        ev.seq = n
        lines.append(log_encoder.encode(ev))
    (sessions / f"{header.id}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return header.id


def run_dsh(home: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real ``dsh`` over the store at ``home`` (a fresh environment: no key of the machine's)."""
    home.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")}
    base |= {"DSH_HOME": str(home), "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
             "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}
    return subprocess.run([str(DSH), "sessions", "export", *args], capture_output=True, text=True, timeout=120,
                          env=base | (env or {}), cwd=cwd or home)


def prompt(text: str, *, id: str = "m", **event: Any) -> UserMessageEvent:
    """The person's prompt as the log holds it (``event``: time, …)."""
    return UserMessageEvent(message=UserMessage(id=id, content=[TextBlock(text=text)]), **event)


def asks(turn: int, step: int, call_id: str, name: str, arguments: str, *, id: str = "a", provider: str = "",
         model: str = "", **event: Any) -> AssistantMessageEvent:
    """A model call that answered with one tool call (``event``: time, usage, …)."""
    message = AssistantMessage(id=id, provider=provider, model=model,
                               content=[ToolCallBlock(id=call_id, name=name, arguments=arguments)])
    return AssistantMessageEvent(turn=turn, step=step, finish="tool-calls", message=message, **event)


def answer(turn: int, step: int, text: str, *, id: str = "a", provider: str = "", model: str = "",
           **event: Any) -> AssistantMessageEvent:
    """A model call that answered with text."""
    message = AssistantMessage(id=id, provider=provider, model=model, content=[TextBlock(text=text)])
    return AssistantMessageEvent(turn=turn, step=step, message=message, **event)


def tool_result(turn: int, step: int, call_id: str, name: str, text: str, **event: Any) -> ToolResultEvent:
    """A tool call's result, one text block."""
    return ToolResultEvent(turn=turn, step=step, result=ToolResultMessage(call_id=call_id, name=name,
                                                                          content=[TextBlock(text=text)]), **event)


def big_session(sessions: Path, events: int) -> str:
    """A session of ``events`` events (with the header: one more line): turns of a prompt, then
    model calls each with one bash call and its result, priced usage on each call. The last tool
    result says ``the last output, number N``."""
    from dsh_core.types import TurnEnd, TurnStart, Usage

    per_turn = events // 500  # 20 events a turn: prompt, start, 4 x (call message, result), ... , answer, end
    calls = (per_turn - 4) // 2
    out: list[Any] = []
    t, n = 1_764_900_000.0, 0
    route = {"provider": "deepseek", "model": "deepseek-flash"}
    for turn in range(1, 501):
        out.append(prompt(f"task {turn}", id=f"u{turn}", time=t))
        out.append(TurnStart(time=t, turn=turn))
        for step in range(1, calls + 1):
            t += 0.5
            cid = f"c{turn}-{step}"
            out.append(asks(turn, step, cid, "bash", json.dumps({"command": f"echo {n}"}), id=f"a{cid}", **route, time=t,
                            usage=Usage(input_tokens=4000 + n, output_tokens=60, cache_hit_tokens=3500)))
            text = f"the last output, number {n}" if n == 2499 else f"output {n}\n" + "line of output\n" * 5
            out.append(tool_result(turn, step, cid, "bash", text, time=t + 0.1))
            n += 1
        t += 0.5
        out.append(answer(turn, calls + 1, f"done with task {turn}", id=f"a{turn}", **route, time=t,
                          usage=Usage(input_tokens=5000, output_tokens=30)))
        out.append(TurnEnd(time=t, turn=turn, reason="completed"))
    assert len(out) == events, len(out)
    return write_log(sessions, SessionHeader(id="big", created_at=1_764_900_000.0, cwd="/w", **route), out)
