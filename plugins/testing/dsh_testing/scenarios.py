"""Scenario directories: record a session once, replay it forever (the snapshot runner).

A scenario is a directory ``snapshots/<example>/<scenario>/``::

    input.json              what the client does (steps) and how to run it (example, env, …)
    session.jsonl           the recording: the model's input on replay AND the expected log
    session.<n>.jsonl       further sessions (a second session, subagents), in creation order
    stdout.expected.jsonl   the normalised wire transcript (every frame the agent wrote)
    replay.override.json    optional: what a recording cannot hold (plugins/replay-model)
    workspace/              optional: copied into the session cwd before the agent starts

and, per header class, ``snapshots/<example>/_headers/<class>/system-prompt.md`` and
``tool-schemas.json``: the request header (system prompt, tool schemas) every scenario of the
class sends, pinned once as readable files. A log line whose header equals its class's pin says
``{{system}}`` / ``{{tools}}`` instead of repeating it.

Three modes (``pytest --dsh-snapshots=MODE``, or ``--snapshot-update`` for refresh):

- ``replay`` (default): run ``dsh run --example … --provider replay --model session.jsonl`` —
  the real agent, the real tools, the model played back — and compare stdout, every session
  log and the class pins with the committed files. Keyless.
- ``refresh``: the same run, then rewrite the expectations from it (review the diff). Keyless.
- ``record``: run the scenarios whose ``input.json`` says ``"recordable": true`` against the
  live route (``record`` in ``input.json``, default DeepSeek's ``deepseek-flash``; needs
  ``DEEPSEEK_API_KEY``, and honours ``DEEPSEEK_BASE_URL`` for any DeepSeek-compatible server),
  then write the recording and the expectations. Other scenarios are skipped in this mode.

``input.json``::

    {"example": "acp-agent",            # the example to run (required)
     "header": "acp-agent",             # header class (default: the example)
     "recordable": false, "record": {"provider": "deepseek", "model": "deepseek-flash"},
                                        # or {"provider": "scripted", "model": "{{scenario}}/script.json"}:
                                        # a keyless recording from a scripted-model script
     "env": {"DSH_PERMISSION_MODE": "workspace-write"},
     "perMechanism": false,             # run once per sandbox mechanism (bubblewrap, Landlock)
     "cleanup": ["/var/tmp/x"],         # paths (files or directories) removed before and after the run
     "mkdir": [".git"],                 # empty directories to create in the workspace (git stores none)
     "pinStderr": false,                # also pin the exit code and stderr in stderr.expected.txt
                                        # (e.g. a start-up error that never opens the front door)
     "http": "site",                    # serve this directory of the scenario on 127.0.0.1 for the run:
                                        # "{{http}}" in step texts, the recording and the expectations
                                        # stands for its URL (its port changes every run)
     "steps": [...]}

Steps (``session`` is the index of a session this client opened, default 0):

    {"op": "initialize"}
    {"op": "newSession", "additionalDirectories": [...], "expectError": true,
     "cwd": "sub/dir",                  # the session's cwd, relative to the workspace (default: itself)
     "mcpServers": [{"name": "fx", "command": "{{python}}", "args": ["{{scenario}}/server.py"],
                     "env": {}}]}       # or {"type": "http", "name", "url", "headers": {}}
    {"op": "prompt", "text": "ping", "expect": "end_turn" | "cancelled" | "max_turn_requests" | "error"}
    {"op": "promptContent", "content": [ACP content blocks; an image may say "file": "x.png"]}
    {"op": "promptAndCancel", "text": "…", "after": {"event": "turn/start"} | {"file": "started.txt"},
     "delayMs": 50}
    {"op": "cancel"}
    {"op": "setConfigOption", "configId": "mode", "value": "plan", "expectError": false}
    {"op": "setMode", "modeId": "read-only", "expectError": false}
    {"op": "permission", "answers": ["allow-once", "reject-once"]}   # queued for the next requests
    {"op": "wait", "ms": 50} | {"op": "wait", "event": "tool/call", "count": 1} | {"op": "wait", "file": "x"}
                                        # an event in the session's log (at least `count` of them)
    {"op": "checkFiles", "files": {"out.txt": "exact text\n", "made": true, "gone.txt": null}}
                                        # the workspace now: a file's text, exists, does not exist

The runner is the library behind ``dsh_testing``'s collection of ``input.json`` files; its
functions (``load_scenario``, ``run_scenario``, ``check_or_write``) are usable directly.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import difflib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .harness import REPO, TEST_EXAMPLES

MODES = ("replay", "refresh", "record")
HEADERS_DIR = "_headers"
SYSTEM_FILE = "system-prompt.md"
TOOLS_FILE = "tool-schemas.json"
STDOUT_FILE = "stdout.expected.jsonl"
STDERR_FILE = "stderr.expected.txt"
OVERRIDE_FILE = "replay.override.json"
DEFAULT_RECORD_ROUTE = ("deepseek", "deepseek-flash")
REPLAY_CODES = ("REPLAY_EXHAUSTED", "REPLAY_DIVERGED")
_HEX = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")
# ISO 8601 UTC times in texts (session-query shows when logged events happened), replaced as the log's
# own times are zeroed.
_ISO_TIME = re.compile(r"(?<![0-9])\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z")


class ScenarioError(AssertionError):
    """A scenario failed: its message says what differs or diverged."""


@dataclass
class Scenario:
    dir: Path
    example: str
    header: str
    steps: list[dict[str, Any]]
    env: dict[str, str] = field(default_factory=dict)
    recordable: bool = False
    record: tuple[str, str] = DEFAULT_RECORD_ROUTE
    per_mechanism: bool = False
    cleanup: list[str] = field(default_factory=list)
    mkdir: list[str] = field(default_factory=list)  # empty directories of the workspace (git keeps none)
    pin_stderr: bool = False  # pin "exit code N" and the normalised stderr in stderr.expected.txt
    http: str | None = None  # a directory of the scenario served on 127.0.0.1 for the run ({{http}} is its URL)

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def headers_dir(self) -> Path:
        return self.dir.parent / HEADERS_DIR / self.header

    def logs(self) -> list[Path]:
        """The committed session logs, in order: ``session.jsonl``, ``session.1.jsonl``, …"""
        first = self.dir / "session.jsonl"
        if not first.is_file():
            return []
        out, n = [first], 1
        while (self.dir / f"session.{n}.jsonl").is_file():
            out.append(self.dir / f"session.{n}.jsonl")
            n += 1
        return out


def load_scenario(directory: Path) -> Scenario:
    path = directory / "input.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"{path}: not readable JSON: {exc}") from None
    known = {"example", "header", "steps", "env", "recordable", "record", "perMechanism", "cleanup", "mkdir", "about",
             "pinStderr", "http"}
    unknown = set(doc) - known
    if unknown:
        raise ScenarioError(f"{path}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
    if not isinstance(doc.get("example"), str) or not isinstance(doc.get("steps"), list):
        raise ScenarioError(f"{path}: needs \"example\" (a name) and \"steps\" (a list)")
    record = doc.get("record") or {}
    return Scenario(
        dir=directory,
        example=doc["example"],
        header=doc.get("header") or doc["example"],
        steps=doc["steps"],
        env={k: str(v) for k, v in (doc.get("env") or {}).items()},
        recordable=bool(doc.get("recordable", False)),
        record=(record.get("provider", DEFAULT_RECORD_ROUTE[0]),
                record.get("model", DEFAULT_RECORD_ROUTE[1]).replace("{{scenario}}", str(directory))),
        per_mechanism=bool(doc.get("perMechanism", False)),
        cleanup=list(doc.get("cleanup") or []),
        mkdir=list(doc.get("mkdir") or []),
        pin_stderr=bool(doc.get("pinStderr", False)),
        http=doc.get("http") if isinstance(doc.get("http"), str) else None,
    )


def dump_input(doc: dict[str, Any]) -> str:
    """``input.json`` as people read it: one key per line, one step per line."""
    lines = []
    for key, value in doc.items():
        if key == "steps" and value:
            steps = ",\n".join("  " + json.dumps(s, ensure_ascii=False) for s in value)
            lines.append(f'"steps": [\n{steps}\n ]')
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n " + ",\n ".join(lines) + "\n}\n"


# ----------------------------------------------------------------------------- running


@dataclass
class Run:
    """What one run produced, normalised."""

    stdout: str
    logs: list[str]  # normalised JSONL texts, in order (header class not yet scrubbed)
    headers: list[dict[str, Any]]  # the live session headers (provider/model before restoring)
    stderr: str
    replay_errors: list[str]
    exit_code: int | None = None
    stderr_normalized: str = ""


def _mcp_server(entry: dict[str, Any], scenario_dir: Path) -> Any:
    """An ``mcpServers`` entry of a ``newSession`` step as the SDK's model: ``{{python}}`` (this
    interpreter) and ``{{scenario}}`` (the scenario's directory) are replaced in its strings."""
    import sys

    from acp.schema import EnvVariable, HttpHeader, HttpMcpServer, McpServerStdio

    def sub(text: str) -> str:
        return text.replace("{{python}}", sys.executable).replace("{{scenario}}", str(scenario_dir))

    if entry.get("type") == "http":
        return HttpMcpServer(type="http", name=entry["name"], url=sub(entry["url"]),
                             headers=[HttpHeader(name=k, value=sub(v)) for k, v in entry.get("headers", {}).items()])
    return McpServerStdio(name=entry["name"], command=sub(entry["command"]), args=[sub(a) for a in entry.get("args", [])],
                          env=[EnvVariable(name=k, value=sub(v)) for k, v in entry.get("env", {}).items()])


def _content_block(block: dict[str, Any], scenario_dir: Path) -> Any:
    from acp import schema

    block = dict(block)
    if block.get("type") == "image" and "file" in block:
        data = (scenario_dir / block.pop("file")).read_bytes()
        block.setdefault("data", base64.b64encode(data).decode())
    kinds: dict[str, Any] = {"text": schema.TextContentBlock, "image": schema.ImageContentBlock, "audio": schema.AudioContentBlock,
             "resource_link": schema.ResourceContentBlock, "resource": schema.EmbeddedResourceContentBlock}
    cls: Any = kinds.get(block.get("type", ""))
    if cls is None:
        raise ScenarioError(f"unknown content block type {block.get('type')!r} (known: {', '.join(kinds)})")
    return cls.model_validate(block)


async def _wait_for(cond: dict[str, Any], cwd: Path, home: Path, sid: str | None, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if "file" in cond and (cwd / cond["file"]).exists():
            return
        if "event" in cond and sid is not None:
            log = home / "sessions" / f"{sid}.jsonl"
            seen = log.read_text(errors="replace").replace(" ", "").count(f'"type":"{cond["event"]}"') if (
                log.exists()) else 0
            if seen >= int(cond.get("count", 1)):
                return
        await asyncio.sleep(0.01)
    raise ScenarioError(f"waited {timeout:.0f} s for {cond} in vain")


@dataclass
class _Driver:
    """The client's side of one run: plays the steps against the agent, one method per op."""

    run: Any  # the spawned agent (dsh_testing.harness): conn, client, cwd
    sids: list[str]  # the sessions this client opened, in order
    home: Path
    scenario_dir: Path
    http: str | None = None  # the URL of the scenario's fixture server ({{http}} in step texts)

    def session(self, step: dict[str, Any]) -> str:
        try:
            return self.sids[int(step.get("session", 0))]
        except IndexError:
            raise ScenarioError(f"step {step} names a session this client has not opened") from None

    async def _prompt(self, step: dict[str, Any], blocks: list[Any]) -> None:
        from acp import RequestError

        expect = step.get("expect")
        try:
            result = await self.run.conn.prompt(session_id=self.session(step), prompt=blocks)
        except RequestError as exc:
            if expect != "error":
                raise ScenarioError(f"step {step}: the prompt failed: {exc}") from None
            return
        if expect == "error":
            raise ScenarioError(f"step {step}: expected an error, got stop reason {result.stop_reason!r}")
        if expect is not None and result.stop_reason != expect:
            raise ScenarioError(f"step {step}: stop reason {result.stop_reason!r}, expected {expect!r}")

    async def initialize(self, step: dict[str, Any], n: int) -> None:
        await self.run.conn.initialize(protocol_version=int(step.get("protocolVersion", 1)))

    async def new_session(self, step: dict[str, Any], n: int) -> None:
        kw: dict[str, Any] = {}
        if "additionalDirectories" in step:
            kw["additional_directories"] = step["additionalDirectories"]
        cwd = self.run.cwd / step["cwd"] if "cwd" in step else self.run.cwd
        servers = [_mcp_server(s, self.scenario_dir) for s in step.get("mcpServers", [])]
        created = await self._answer(step, n, self.run.conn.new_session(cwd=str(cwd), mcp_servers=servers, **kw))
        if created is not None:
            self.sids.append(created.session_id)

    async def prompt(self, step: dict[str, Any], n: int) -> None:
        from acp import text_block

        text = step["text"] if self.http is None else step["text"].replace("{{http}}", self.http)
        await self._prompt(step, [text_block(text)])

    async def prompt_content(self, step: dict[str, Any], n: int) -> None:
        await self._prompt(step, [_content_block(b, self.scenario_dir) for b in step["content"]])

    async def prompt_and_cancel(self, step: dict[str, Any], n: int) -> None:
        from acp import text_block

        sid = self.session(step)
        task = asyncio.create_task(self.run.conn.prompt(session_id=sid, prompt=[text_block(step["text"])]))
        await _wait_for(step.get("after") or {"event": "turn/start"}, self.run.cwd, self.home, sid)
        await asyncio.sleep(int(step.get("delayMs", 50)) / 1000)
        await self.run.conn.cancel(session_id=sid)
        stop = (await task).stop_reason
        if stop != "cancelled":
            raise ScenarioError(f"step {n} ({step.get('op')}): stop reason {stop!r}, expected 'cancelled'")

    async def cancel(self, step: dict[str, Any], n: int) -> None:
        await self.run.conn.cancel(session_id=self.session(step))

    async def _answer(self, step: dict[str, Any], n: int, call: Awaitable[Any]) -> Any:
        """The answer to ``call``; None when it is an error the step expects (``expectError``)."""
        from acp import RequestError

        try:
            answer = await call
        except RequestError:
            if not step.get("expectError"):
                raise
            return None
        if step.get("expectError"):
            raise ScenarioError(f"step {n} ({step.get('op')}): expected an error")
        return answer

    async def _settle(self, step: dict[str, Any], n: int, call: Awaitable[Any]) -> None:
        await self._answer(step, n, call)
        await asyncio.sleep(0.05)  # the updates that follow the answer (config_option_update…) arrive

    async def set_config_option(self, step: dict[str, Any], n: int) -> None:
        await self._settle(step, n, self.run.conn.set_config_option(
            config_id=step["configId"], session_id=self.session(step), value=step["value"]))

    async def set_mode(self, step: dict[str, Any], n: int) -> None:
        await self._settle(step, n, self.run.conn.set_session_mode(session_id=self.session(step), mode_id=step["modeId"]))

    async def permission(self, step: dict[str, Any], n: int) -> None:
        self.run.client.permission_answers.extend(step["answers"])

    async def wait(self, step: dict[str, Any], n: int) -> None:
        if "ms" in step:
            await asyncio.sleep(int(step["ms"]) / 1000)
        else:
            sid = self.sids[int(step.get("session", 0))] if self.sids else None
            await _wait_for(step, self.run.cwd, self.home, sid)

    async def check_files(self, step: dict[str, Any], n: int) -> None:
        _check_files(step["files"], self.run.cwd, n)


# a step's "op" → what plays it (the order is the one the unknown-op message lists)
_STEP_OPS: dict[str, Callable[[_Driver, dict[str, Any], int], Awaitable[None]]] = {
    "initialize": _Driver.initialize,
    "newSession": _Driver.new_session,
    "prompt": _Driver.prompt,
    "promptContent": _Driver.prompt_content,
    "promptAndCancel": _Driver.prompt_and_cancel,
    "cancel": _Driver.cancel,
    "permission": _Driver.permission,
    "setConfigOption": _Driver.set_config_option,
    "setMode": _Driver.set_mode,
    "wait": _Driver.wait,
    "checkFiles": _Driver.check_files,
}


async def _drive(steps: list[dict[str, Any]], run: Any, sids: list[str], home: Path, scenario_dir: Path,
                 http: str | None = None) -> None:
    driver = _Driver(run, sids, home, scenario_dir, http)
    for n, step in enumerate(steps):
        op = step.get("op")
        play = _STEP_OPS.get(op) if isinstance(op, str) else None
        if play is None:
            raise ScenarioError(f"step {n}: unknown op {op!r} ({', '.join(_STEP_OPS)})")
        await play(driver, step, n)


def _check_files(files: dict[str, Any], cwd: Path, n: int) -> None:
    """What the tools left in the workspace (the log says what they reported; this is what they did)."""
    problems = []
    for rel, want in files.items():
        path = cwd / rel
        there = path.exists() or path.is_symlink()
        if want is None:
            if there:
                problems.append(f"{rel} exists, expected no such file")
        elif not there:
            problems.append(f"{rel} does not exist")
        elif isinstance(want, str):
            text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None
            if text != want:
                problems.append(f"{rel} holds {text!r}, expected {want!r}")
    if problems:
        raise ScenarioError(f"step {n} (checkFiles): " + "; ".join(problems))


def _normalize_text(text: str, replacements: list[tuple[str, str]], ids: dict[str, int] | None = None) -> str:
    """Paths replaced, ISO times replaced (``{{time}}``), then every 32-hex id: ``{{id:N}}`` numbered
    by first appearance in ``ids`` (one numbering per log, so two messages or two approvals never collapse into one placeholder
    and a swapped pair shows up as a diff), or ``{{id}}`` where no numbering is kept."""
    for old, new in replacements:
        if old:
            text = text.replace(old, new)
    text = _ISO_TIME.sub("{{time}}", text)
    if ids is None:
        return _HEX.sub("{{id}}", text)
    return _HEX.sub(lambda m: f"{{{{id:{ids.setdefault(m.group(0), len(ids) + 1)}}}}}", text)


def normalize_log_lines(raw: str, replacements: list[tuple[str, str]]) -> tuple[str, dict[str, Any]]:
    """One log: times zeroed, retry delays zeroed (they are jittered), hook durations zeroed, paths and
    ids replaced."""
    lines, header = [], {}
    ids: dict[str, int] = {}
    for n, line in enumerate(raw.splitlines()):
        if not line.strip():
            continue
        rec = json.loads(line)
        if n == 0:
            header = dict(rec)
        for key in ("time", "createdAt"):
            if key in rec:
                rec[key] = 0
        if rec.get("type") == "llm/retry":
            rec["delayMs"] = 0
        if rec.get("type") == "hook/result" and "durationMs" in rec:  # wall-clock time of the hook process
            rec["durationMs"] = 0
        lines.append(_normalize_text(json.dumps(rec, sort_keys=True, ensure_ascii=False), replacements, ids))
    return "\n".join(lines) + "\n", header


def _log_order_key(path: Path) -> tuple[str, float]:
    """Sessions the client did not open (subagents): by their first prompt, then creation time, so
    children started in parallel land in the same files every run."""
    first, created = "", 0.0
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        created = float(json.loads(lines[0]).get("createdAt", 0))
        for line in lines[1:]:
            rec = json.loads(line)
            if rec.get("type") == "user/message":
                first = "".join(b.get("text", "") for b in rec["message"]["content"])
                break
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        pass
    return first, created


def _prepare_dirs(sc: Scenario, root: Path) -> tuple[Path, Path, Path]:
    """The run's workspace (the scenario's ``workspace/`` copy plus its ``mkdir`` list), its home and
    the fixture directory the replay provider reads."""
    work, home, fixture = root / "work", root / "home", root / "fixture"
    if (sc.dir / "workspace").is_dir():
        shutil.copytree(sc.dir / "workspace", work, symlinks=True)
    else:
        work.mkdir()
    for d in sc.mkdir:
        (work / d).mkdir(parents=True, exist_ok=True)
    fixture.mkdir()
    return work, home, fixture


def _agent_env(sc: Scenario, home: Path, mechanism: str | None, extra_env: dict[str, str] | None) -> dict[str, str]:
    own = {k: v.replace("{{scenario}}", str(sc.dir)).replace("{{snapshots}}", str(sc.dir.parent.parent))
           for k, v in sc.env.items()}
    env = {"DSH_HOME": str(home), "DSH_PERMISSION_MODE": "workspace-write", **own, **(extra_env or {})}
    # where the example is found: the scenario's own setting, then the examples/ beside the
    # snapshots/ it sits in (a plugin's repository: no variable to set), then the caller's (by
    # default dsh's test-only examples, as for every spawned dsh)
    beside = sc.dir.parent.parent.parent / "examples"
    search = [env.get("DSH_EXAMPLES_PATH"), str(beside) if beside.is_dir() else None,
              os.environ.get("DSH_EXAMPLES_PATH", str(TEST_EXAMPLES))]
    env["DSH_EXAMPLES_PATH"] = os.pathsep.join(p for p in search if p)
    if mechanism:
        env["DSH_SANDBOX_MECHANISM"] = mechanism
    return env


def _write_fixture(sc: Scenario, fixture: Path, http: str | None = None) -> None:
    """What the replay provider plays back: the committed logs, and the override if there is one."""
    logs = sc.logs()
    for log in logs:  # with the class pin put back where the fixture says {{system}} / {{tools}}
        text = expand_headers(log.read_text(encoding="utf-8"), *_class_pin(sc))
        if http is not None:  # the tool calls the model made name this run's fixture server
            text = text.replace("{{http}}", http)
        (fixture / log.name).write_text(text, encoding="utf-8")
    if not logs:  # no session was ever opened: any model call is more than recorded
        (fixture / "session.jsonl").write_text(json.dumps(
            {"type": "session", "id": "none", "provider": "replay", "model": "none"}) + "\n")
    if (sc.dir / OVERRIDE_FILE).is_file():
        shutil.copy(sc.dir / OVERRIDE_FILE, fixture / OVERRIDE_FILE)


def _route(sc: Scenario, mode: str, fixture: Path, env: dict[str, str], http: str | None = None) -> tuple[str, str]:
    """The (provider, model) the agent runs with: the live route when recording (its keys passed on
    in ``env``), else the replay provider on a fixture written now."""
    if mode == "record":
        for key in ("DEEPSEEK_API_KEY", "DEEPSEEK_BASE_URL"):
            if key in os.environ:
                env.setdefault(key, os.environ[key])
        return sc.record
    _write_fixture(sc, fixture, http)
    return "replay", str(fixture / "session.jsonl")


def _ordered_logs(home: Path, sids: list[str]) -> tuple[dict[str, Path], list[str]]:
    """Every log this run wrote: the client's sessions in the order it opened them, then the rest."""
    found = {p.stem: p for p in (home / "sessions").glob("*.jsonl")} if (home / "sessions").is_dir() else {}
    order = [s for s in sids if s in found] + sorted((s for s in found if s not in sids),
                                                     key=lambda s: _log_order_key(found[s]))
    return found, order


def _replacements(paths: tuple[Path, Path, Path], mode: str, model: str, sids: list[str],
                  order: list[str]) -> list[tuple[str, str]]:
    """What a run's text says that differs between runs (``paths``: home, work, root), and its placeholder."""
    home, work, root = paths
    replacements: list[tuple[str, str]] = [(str(home), "{{home}}"), (str(work), "{{cwd}}"), (str(root), "{{tmp}}"),
                                           (str(REPO), "{{repo}}")]  # e.g. an example's path in a config error
    if mode != "record" or os.path.isabs(model):  # a file as the model: a script, a recording
        replacements.insert(0, (model, "{{script}}"))
    for n, sid in enumerate([*sids, *[s for s in order if s not in sids]]):
        replacements.append((sid, f"{{{{session{n}}}}}"))
    return replacements


def _read_logs(found: dict[str, Path], order: list[str],
               replacements: list[tuple[str, str]]) -> tuple[list[str], list[dict[str, Any]], list[str]]:
    """The normalised logs, their headers, and the replay errors they report."""
    logs_out, headers, errors = [], [], []
    for sid in order:
        raw = found[sid].read_text(encoding="utf-8")
        for line in raw.splitlines():
            if any(code in line for code in REPLAY_CODES) and '"agent/error"' in line.replace(" ", ""):
                errors.append(json.loads(line)["message"])
        text, header = normalize_log_lines(raw, replacements)
        logs_out.append(text)
        headers.append(header)
    return logs_out, headers, errors


def _normalize_frames(frames: Any, sids: list[str], replacements: list[tuple[str, str]]) -> str:
    from .harness import normalize_transcript

    raw_frames = json.dumps(frames)
    for i, s in enumerate(sids):  # session ids first: messageIds are numbered before ids are blanked
        raw_frames = raw_frames.replace(s, f"{{{{session{i}}}}}")
    return _normalize_text(normalize_transcript(json.loads(raw_frames)), replacements)


async def run_scenario(
    sc: Scenario,
    *,
    mode: str = "replay",
    mechanism: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> Run:
    """Run the scenario once in a fresh temporary directory (fixed-length path, so the cwd's length
    — which the token meter sees — is the same in every run) and return what it produced."""
    from .harness import Recorder, spawn_acp

    if mode not in MODES:
        raise ScenarioError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
    root = Path(tempfile.mkdtemp(prefix="dsh-scenario-", dir=tempfile.gettempdir())).resolve()
    for p in sc.cleanup:
        _remove(Path(p))
    stack = contextlib.ExitStack()
    try:
        # set up
        work, home, fixture = _prepare_dirs(sc, root)
        env = _agent_env(sc, home, mechanism, extra_env)
        server, http = _serve(sc)
        stack.callback(_stop, server)
        provider, model = _route(sc, mode, fixture, env, http)
        # run
        sids: list[str] = []
        async with spawn_acp(Path(model), provider=provider, cwd=work, example=sc.example, env=env,
                             client=Recorder()) as run:
            try:
                await _drive(sc.steps, run, sids, home, sc.dir, http)
            except (ConnectionError, ScenarioError) as exc:
                await asyncio.sleep(0.2)  # let the agent's last words reach stderr
                tail = bytes(run.stderr).decode(errors="replace")[-3000:]
                raise ScenarioError(f"scenario {sc.name} ({provider} {model}): {exc}\nagent stderr:\n{tail}") from None
        # collect, normalised for comparing
        stderr = bytes(run.stderr).decode(errors="replace")
        found, order = _ordered_logs(home, sids)
        replacements = _replacements((home, work, root), mode, model, sids, order)
        if http is not None:
            replacements.insert(0, (http, "{{http}}"))
        logs_out, headers, errors = _read_logs(found, order, replacements)
        stdout = _normalize_frames(run.frames, sids, replacements)
        return Run(stdout=stdout, logs=logs_out, headers=headers, stderr=stderr, replay_errors=errors,
                   exit_code=run.proc.returncode, stderr_normalized=_normalize_text(stderr, replacements))
    finally:
        stack.close()
        for p in sc.cleanup:
            _remove(Path(p))
        shutil.rmtree(root, ignore_errors=True)


def _remove(path: Path) -> None:
    """A ``cleanup`` path: a file, or a directory with what is in it (a fixed spill directory)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _serve(sc: Scenario) -> tuple[Any, str | None]:
    """The scenario's ``http`` directory on 127.0.0.1 (a thread of this process), and its URL."""
    if sc.http is None:
        return None, None
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(sc.dir / sc.http))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _stop(server: Any) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()


# ----------------------------------------------------------------------------- comparing and writing


def _class_pin(sc: Scenario) -> tuple[str | None, Any]:
    system = sc.headers_dir / SYSTEM_FILE
    tools = sc.headers_dir / TOOLS_FILE
    return (system.read_text(encoding="utf-8") if system.is_file() else None,
            json.loads(tools.read_text(encoding="utf-8")) if tools.is_file() else None)


def _first_header(log: str) -> dict[str, Any] | None:
    for line in log.splitlines():
        rec: dict[str, Any] = json.loads(line)
        if rec.get("type") == "request/header":
            return rec
    return None


def scrub_headers(log: str, system: str | None, tools: Any) -> str:
    """Request headers equal to the class pin say ``{{system}}`` / ``{{tools}}``."""
    out = []
    for line in log.splitlines():
        rec = json.loads(line)
        if rec.get("type") == "request/header":
            if system is not None and rec.get("system", "") + "\n" == system:
                rec["system"] = "{{system}}"
            if tools is not None and rec.get("tools") == tools:
                rec["tools"] = "{{tools}}"
            line = json.dumps(rec, sort_keys=True, ensure_ascii=False)
        out.append(line)
    return "\n".join(out) + "\n"


def _restore_route(log: str, recorded: Path | None) -> str:
    """On replay the session header names the replay route; compare it as the recorded one."""
    if recorded is None or not recorded.is_file():
        return log
    want = json.loads(recorded.read_text(encoding="utf-8").splitlines()[0])
    lines = log.splitlines()
    head = json.loads(lines[0])
    if head.get("type") == "session" and head.get("provider") == "replay":
        for key in ("provider", "model"):
            if key in want:
                head[key] = want[key]
            else:
                head.pop(key, None)
        lines[0] = json.dumps(head, sort_keys=True, ensure_ascii=False)
    return "\n".join(lines) + "\n"


def expand_headers(log: str, system: str | None, tools: Any) -> str:
    """The inverse of ``scrub_headers``: a fixture as the agent wrote it (for the replay provider)."""
    out = []
    for line in log.splitlines():
        if '"request/header"' in line:
            rec = json.loads(line)
            if rec.get("system") == "{{system}}":
                if system is None:
                    raise ScenarioError("a fixture says {{system}} but its header class has no system-prompt.md")
                rec["system"] = system[:-1] if system.endswith("\n") else system
            if rec.get("tools") == "{{tools}}":
                if tools is None:
                    raise ScenarioError("a fixture says {{tools}} but its header class has no tool-schemas.json")
                rec["tools"] = tools
            line = json.dumps(rec, sort_keys=True, ensure_ascii=False)
        out.append(line)
    return "\n".join(out) + "\n"


def _diff(expected: str, actual: str, name: str) -> str:
    lines = list(difflib.unified_diff(expected.splitlines(), actual.splitlines(), f"{name} (committed)",
                                      f"{name} (this run)", lineterm="", n=1))
    cut = [ln if len(ln) < 400 else ln[:400] + "…" for ln in lines[:60]]
    return "\n".join(cut) + ("\n…" if len(lines) > 60 else "")


def expected_files(sc: Scenario, run: Run, *, class_written: dict[str, str] | None = None) -> dict[Path, str]:
    """The files this run says the scenario directory should hold."""
    header = _first_header(run.logs[0]) if run.logs else None
    system, tools = _class_pin(sc)
    files: dict[Path, str] = {}
    if header is not None:
        live_system, live_tools = header["system"] + "\n", header["tools"]
        files[sc.headers_dir / SYSTEM_FILE] = live_system
        files[sc.headers_dir / TOOLS_FILE] = json.dumps(live_tools, indent=2, ensure_ascii=False) + "\n"
        system, tools = live_system, live_tools
    files[sc.dir / STDOUT_FILE] = run.stdout
    if sc.pin_stderr:
        files[sc.dir / STDERR_FILE] = f"exit code {run.exit_code}\n{run.stderr_normalized}"
    committed = sc.logs()
    for i, log in enumerate(run.logs):
        name = "session.jsonl" if i == 0 else f"session.{i}.jsonl"
        files[sc.dir / name] = _restore_route(scrub_headers(log, system, tools),
                                             committed[i] if i < len(committed) else None)
    return files


def check_or_write(sc: Scenario, run: Run, mode: str, *, pins: dict[str, tuple[str, str]] | None = None) -> list[str]:
    """Compare (replay) or write (refresh, record); returns the paths written. ``pins`` (class →
    (scenario, system + tools)) catches two scenarios of one class that disagree in one run."""
    if run.replay_errors:
        raise ScenarioError(f"{sc.name}: the replay failed:\n  " + "\n  ".join(run.replay_errors)
                            + "\n(re-record it, or fix what changed; stderr:\n" + run.stderr[-2000:] + ")")
    files = expected_files(sc, run)
    system_path, tools_path = sc.headers_dir / SYSTEM_FILE, sc.headers_dir / TOOLS_FILE
    if pins is not None and system_path in files:
        mine = files[system_path] + files[tools_path]
        other = pins.setdefault(sc.header, (sc.name, mine))
        if other[1] != mine:
            raise ScenarioError(f"{sc.name} and {other[0]} send different request headers but share header class "
                                f"{sc.header!r}: give one of them its own \"header\" in input.json")
    if mode == "replay":
        problems = []
        for path, text in files.items():
            if not path.is_file():
                problems.append(f"{path.relative_to(sc.dir.parent)}: missing (run with --dsh-snapshots=refresh)")
            elif path.read_text(encoding="utf-8") != text:
                problems.append(_diff(path.read_text(encoding="utf-8"), text, str(path.relative_to(sc.dir.parent))))
        extra = sc.logs()[len(run.logs):]
        problems += [f"{p.name}: committed, but this run wrote no such session" for p in extra]
        if problems:
            raise ScenarioError(f"scenario {sc.name} differs from its snapshots:\n" + "\n".join(problems))
        return []
    written = []
    for path, text in files.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(str(path))
    for stale in sc.logs()[len(run.logs):]:
        stale.unlink()
        written.append(str(stale))
    return written


def run_and_check(sc: Scenario, mode: str = "replay", *, mechanism: str | None = None,
                  pins: dict[str, tuple[str, str]] | None = None, extra_env: dict[str, str] | None = None) -> list[str]:
    """One scenario, start to end, in its own event loop (what each collected test item does)."""
    if mode == "record" and not sc.recordable:
        raise ScenarioError(f"{sc.name} is not recordable")
    run = asyncio.run(run_scenario(sc, mode=mode, mechanism=mechanism, extra_env=extra_env))
    return check_or_write(sc, run, mode, pins=pins)
