"""Opt-in pytest plugin for dsh and its plugin authors: ``pytest_plugins = ["dsh_core.testing"]``.

Gives you:

- ``dsh_home`` (autouse) fixture: every test runs with its own ``DSH_HOME`` under its
  ``tmp_path``, and the ``dsh`` processes it spawns inherit it;
- ``scripted(tmp_path)`` fixture: ``scripted({...script...})`` writes a scripted-model script
  and returns its path;
- ``acp_agent`` fixture: an async context manager factory that spawns
  ``dsh run --example … --provider scripted --model …`` as a real subprocess, drives it with
  the official ACP SDK client, records every raw stdout byte, and on exit closes stdin,
  waits for the exit, and checks that every stdout line is a JSON-RPC frame that validates
  against ACP's ``schema.json``;
- ``memory_host(model, *extra_plugins, plugins=("scripted-model",))``: an in-process host
  (async context manager) on a fresh plugin manager, with throwaway plugin objects
  registered by name and the in-memory session store (``host.session_store.logs[id].events``);
- ``normalize_transcript(frames)``: ids renumbered and session ids replaced, for snapshots;
- scenario directories: every ``snapshots/<example>/<scenario>/input.json`` under the paths pytest
  collects becomes a test (marker ``snapshot_scenario``) that replays the recorded session and
  compares the wire transcript and the logs (``dsh_core.scenarios``); ``--dsh-snapshots=refresh``
  (or ``--snapshot-update``) rewrites the expectations keylessly, ``--dsh-snapshots=record``
  re-records the recordable ones against the live route.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def acp_schema_file() -> Any:
    """The vendored ACP v1 schema (v1.21.0), shipped as package data: ``dsh_core/_vendor/acp/``
    holds it with its upstream LICENSE and SOURCE.md (commit, release, sha256)."""
    from importlib.resources import files

    return files("dsh_core").joinpath("_vendor", "acp", "schema.json")


@cache
def acp_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(acp_schema_file().read_text(encoding="utf-8"))
    return schema


@cache
def acp_validator() -> Any:
    """A jsonschema validator for any frame an agent may send (request, response, notification)."""
    import jsonschema

    schema = acp_schema()
    wrapper = {
        "$schema": schema.get("$schema", "https://json-schema.org/draft/2020-12/schema"),
        "$defs": schema["$defs"],
        "anyOf": [
            {"$ref": "#/$defs/AgentRequest"},
            {"$ref": "#/$defs/AgentResponse"},
            {"$ref": "#/$defs/AgentNotification"},
        ],
    }
    cls = jsonschema.validators.validator_for(wrapper)
    return cls(wrapper)


def check_frames(raw: bytes) -> list[dict[str, Any]]:
    """Every line must be a JSON-RPC 2.0 object that validates against ACP's schema."""
    frames = []
    for n, line in enumerate(raw.split(b"\n")):
        if not line:
            continue
        try:
            frame = json.loads(line)
        except ValueError:
            raise AssertionError(f"stdout line {n} is not JSON: {line[:200]!r}") from None
        assert isinstance(frame, dict) and frame.get("jsonrpc") == "2.0", f"line {n} is not JSON-RPC: {line[:200]!r}"
        method = frame.get("method", "")
        assert not method.startswith(("fs/", "terminal/")), (
            f"the agent called the client's {method} (ACP-12: tools run in the harness, docs/acp-contract.md)"
        )
        errors = sorted(acp_validator().iter_errors(frame), key=str)
        assert not errors, f"stdout line {n} violates ACP schema: {errors[0].message}\n{line[:500]!r}"
        frames.append(frame)
    assert raw == b"" or raw.endswith(b"\n"), "stdout ends in a partial frame"
    return frames


_UUIDISH = re.compile(r"\b[0-9a-f]{32}\b")


def normalize_transcript(frames: Iterable[dict[str, Any]], cwd: str | None = None) -> str:
    """One JSON line per frame; ids renumbered by first appearance (client and agent id
    spaces kept apart), session ids → {{sessionId}}, the cwd → {{cwd}}, each message id →
    {{messageId-N}} numbered by first appearance (chunks of one message keep one number)."""
    ids: dict[Any, int] = {}
    message_ids: dict[str, int] = {}
    out = []
    for f in frames:
        f = json.loads(json.dumps(f))
        if "id" in f and f["id"] is not None:
            key = ("agent" if "method" in f else "client", f["id"])
            f["id"] = ids.setdefault(key, len(ids) + 1)
        update = (f.get("params") or {}).get("update") if isinstance(f.get("params"), dict) else None
        if isinstance(update, dict) and isinstance(update.get("messageId"), str):
            n = message_ids.setdefault(update["messageId"], len(message_ids) + 1)
            update["messageId"] = f"{{{{messageId-{n}}}}}"
        text = json.dumps(f, sort_keys=True)
        text = _UUIDISH.sub("{{sessionId}}", text)
        if cwd:
            text = text.replace(cwd, "{{cwd}}")
        out.append(text)
    return "\n".join(out) + "\n"


def memory_host(
    model: str | Path,
    *extra_plugins: object,
    plugins: tuple[str, ...] = ("scripted-model",),
    provider: str = "scripted",
    config: dict[str, dict[str, Any]] | None = None,
) -> Any:
    """An in-process host for tests: ``async with memory_host(script) as host: ...``."""
    from .compose import Composition
    from .host import make_plugin_manager, open_host

    pm = make_plugin_manager(trace=False)
    for i, plugin in enumerate(extra_plugins):
        pm.register(plugin, name=f"test-plugin-{i}")
    comp = Composition(name="test", path=Path("test/example.toml"), plugins=plugins, config=config or {})
    return open_host(comp, provider=provider, model=str(model), pm=pm)


def minimal_env(**extra: str) -> dict[str, str]:
    """The small environment the official ACP Python SDK gives an agent it spawns (HOME, LOGNAME,
    PATH, SHELL, TERM, USER), plus the test's ``DSH_HOME`` (so a spawned ``dsh`` writes under the
    test's temporary directory, never the user's data dir), plus ``extra``."""
    env = {k: os.environ[k] for k in ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "DSH_HOME") if k in os.environ}
    env.update(extra)
    return env


@dataclass
class Recorder:
    """An SDK ``Client`` that records updates and answers permission requests from a queue."""

    updates: list[tuple[str, Any]] = field(default_factory=list)
    permission_answers: list[Any] = field(default_factory=list)  # "allow-once" | "reject-once" | "cancelled" | Exception | "hang"
    permission_requests: list[Any] = field(default_factory=list)

    def text(self, session_id: str | None = None) -> list[str]:
        return [
            u.content.text
            for sid, u in self.updates
            if (session_id is None or sid == session_id) and getattr(u.content, "type", "") == "text"
        ]

    # --- acp.interfaces.Client
    async def session_update(self, session_id: str, update: Any, **kw: Any) -> None:
        self.updates.append((session_id, update))

    async def request_permission(self, options: Any, session_id: str, tool_call: Any, **kw: Any) -> Any:
        from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse

        self.permission_requests.append((session_id, tool_call, options))
        answer = self.permission_answers.pop(0) if self.permission_answers else "cancelled"
        if isinstance(answer, BaseException):
            raise answer
        if answer == "hang":
            await asyncio.sleep(3600)
        if answer == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=answer))

    def on_connect(self, conn: Any) -> None:
        pass


@dataclass
class AcpRun:
    conn: Any
    proc: asyncio.subprocess.Process
    client: Recorder
    cwd: Path
    stdout: bytearray
    stderr: bytearray
    frames: list[dict[str, Any]] = field(default_factory=list)

    async def start(self) -> str:
        """initialize + session/new; returns the session id."""
        await self.conn.initialize(protocol_version=1)
        session_id: str = (await self.conn.new_session(cwd=str(self.cwd), mcp_servers=[])).session_id
        return session_id

    async def close_stdin(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return await asyncio.wait_for(self.proc.wait(), 10)


@asynccontextmanager
async def spawn_acp(
    script: Path | None,
    *,
    cwd: Path,
    example: str = "acp-agent",
    env: dict[str, str] | None = None,
    client: Recorder | None = None,
    check: bool = True,
    dsh: tuple[str, ...] = (),
    provider: str = "scripted",
) -> AsyncIterator[AcpRun]:
    """Spawn ``dsh run`` and connect the official SDK client to it through a byte tap.

    ``script`` is the ``--model`` of ``provider`` (a scripted-model script by default; a recorded
    session log for ``provider="replay"``; a model id for ``deepseek``); None: the example's route.
    ``dsh`` is the command that runs dsh (default: this interpreter's ``-m dsh_core.cli``),
    e.g. ``("/venv/bin/dsh",)`` to drive another installation."""
    from acp import connect_to_agent

    client = client or Recorder()
    args = ["run", "--example", example]
    if script is not None:
        args += ["--provider", provider, "--model", str(script)]
    full_env = minimal_env(**(env or {}))
    full_env.setdefault("DSH_EXAMPLES_PATH", str(REPO / "tests" / "examples"))
    proc = await asyncio.create_subprocess_exec(
        *(dsh or (sys.executable, "-m", "dsh_core.cli")),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(cwd),
        env=full_env,
        limit=256 * 1024 * 1024,
        start_new_session=True,
    )
    raw = bytearray()
    err = bytearray()
    tapped = asyncio.StreamReader(limit=256 * 1024 * 1024)

    async def tap() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(1 << 20):
            raw.extend(chunk)
            tapped.feed_data(chunk)
        tapped.feed_eof()

    async def drain_stderr() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(1 << 16):
            err.extend(chunk)

    tasks = [asyncio.create_task(tap()), asyncio.create_task(drain_stderr())]
    sdk_client: Any = client  # a Recorder answers what a run needs; the SDK answers the rest method-not-found
    conn = connect_to_agent(sdk_client, proc.stdin, tapped)
    run = AcpRun(conn=conn, proc=proc, client=client, cwd=cwd, stdout=raw, stderr=err)
    try:
        yield run
    finally:
        if proc.returncode is None:
            assert proc.stdin is not None
            try:
                proc.stdin.close()
                await asyncio.wait_for(proc.wait(), 10)
            except (asyncio.TimeoutError, ProcessLookupError):
                proc.kill()
                await proc.wait()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await conn.close()
        except Exception:
            pass
        if check:
            run.frames = check_frames(bytes(raw))


# ---------------------------------------------------------------- test isolation: DSH_HOME per test

_run_temp: list[Path] = []  # this run's temp roots (pytest's base temp, the fixed-length root) once used


@pytest.fixture(autouse=True)
def dsh_home(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own ``DSH_HOME`` (session logs, attachments, spill files) under its
    ``tmp_path``. Autouse: no test writes to the user's data dir. In-process hosts read it from
    ``os.environ``; ``spawn_acp``/``minimal_env`` pass it to the ``dsh`` processes they start, and
    subagent-acp passes it on to its children (its ``inherit-env`` default)."""
    base = tmp_path_factory.getbasetemp().resolve()
    if base not in _run_temp:
        _run_temp.append(base)
    home = tmp_path / "dsh-home"
    monkeypatch.setenv("DSH_HOME", str(home))
    return home


def user_data_dirs() -> list[Path]:
    """Where a ``dsh`` started from this environment writes: ``$DSH_HOME`` if set, and the user's
    data dir (where it writes when ``DSH_HOME`` was scrubbed from its environment)."""
    import platformdirs

    dirs = [Path(platformdirs.user_data_dir("dsh"))]
    if os.environ.get("DSH_HOME"):
        dirs.append(Path(os.environ["DSH_HOME"]).expanduser())
    return dirs


def leaked_session_logs(data_dirs: Iterable[Path], run_temp: Path) -> list[Path]:
    """Session logs in ``data_dirs`` that a test of this run wrote: their header's ``cwd`` lies
    under this run's base temp dir (unique per run, so other runs and real use do not count)."""
    found = []
    for d in data_dirs:
        for log in sorted((d / "sessions").glob("*.jsonl")) if (d / "sessions").is_dir() else []:
            try:
                with log.open("rb") as f:
                    cwd = json.loads(f.readline()).get("cwd", "")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(cwd, str) and cwd and Path(cwd).resolve().is_relative_to(run_temp):
                found.append(log)
    return found


_DATA_DIRS = pytest.StashKey[list[Path]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_DATA_DIRS] = user_data_dirs()  # before any test's monkeypatch
    config.addinivalue_line("markers", "snapshot_scenario: keyless ACP snapshot scenarios (dsh_core.scenarios)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a test (or a process it spawned) left a session log in the user's data dir."""
    if not _run_temp or _DATA_DIRS not in session.config.stash:
        return
    dirs = session.config.stash[_DATA_DIRS]
    leaks = [log for root in _run_temp for log in leaked_session_logs(dirs, root)]
    if leaks:
        lines = [
            f"dsh_core.testing: tests wrote {len(leaks)} session log(s) outside their temporary directories "
            "(a dsh they started did not get the test's DSH_HOME):",
            *(f"  {p}" for p in leaks),
        ]
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            print("\n".join(lines), file=sys.stderr)
        else:
            reporter.ensure_newline()
            for line in lines:
                reporter.write_line(line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def scripted(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    counter = iter(range(10**6))

    def write(script: dict[str, Any]) -> Path:
        path = tmp_path / f"script-{next(counter)}.json"
        path.write_text(json.dumps(script))
        return path

    return write


@pytest.fixture(scope="session")
def _fixed_length_root() -> Iterator[Path]:
    """One directory per run at a path of fixed length (``/tmp/dsh-t-XXXXXXXX``). Snapshot
    scenarios meter prompts in bytes, and a cwd or spill path under pytest's ``pytest-<N>`` base
    temp grows a digit now and then: pinned token counts must not depend on it."""
    root = Path(tempfile.mkdtemp(prefix="dsh-t-", dir="/tmp" if os.path.isdir("/tmp") else None))
    _run_temp.append(root.resolve())
    yield root
    shutil.rmtree(root, ignore_errors=True)


_fixed_counter = iter(range(10**6))


@pytest.fixture
def acp_agent(_fixed_length_root: Path, dsh_home: Path) -> Callable[..., Any]:
    """``async with acp_agent(script_path, example=…, env=…) as run: …`` (see ``spawn_acp``).

    The spawned ``dsh`` works in ``<root>/<NNNNNN>/work`` with ``DSH_HOME`` ``<root>/<NNNNNN>/home``:
    paths of one length on every machine and run (see ``_fixed_length_root``)."""
    base = _fixed_length_root / f"{next(_fixed_counter):06d}"
    work = base / "work"
    work.mkdir(parents=True)
    home = base / "home"

    def factory(script: Path | None, **kw: Any) -> Any:
        env = {"DSH_HOME": str(home), **kw.pop("env", {})}
        return spawn_acp(script, cwd=kw.pop("cwd", work), env=env, **kw)

    factory.home = home  # type: ignore[attr-defined]
    factory.work = work  # type: ignore[attr-defined]
    return factory


def make_png(width: int = 2, height: int = 2, rgb: tuple[int, int, int] = (255, 0, 0)) -> bytes:
    """A real, valid PNG (8-bit RGB, no interlace) of one colour, built with zlib and struct."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


# ---------------------------------------------------------------- scenario directories (dsh_core.scenarios)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dsh")
    group.addoption(
        "--dsh-snapshots", choices=("replay", "refresh", "record"), default=None,
        help="scenario directories (snapshots/<example>/<scenario>/input.json): replay and compare (default), "
             "refresh the expectations keylessly, or record the recordable ones against the live route",
    )


def scenario_mode(config: pytest.Config) -> str:
    mode = config.getoption("--dsh-snapshots", default=None)
    if mode:
        return str(mode)
    try:
        return "refresh" if config.getoption("--snapshot-update") else "replay"
    except ValueError:  # pytest-snapshot not installed
        return "replay"


def _is_scenario_input(path: Path) -> bool:
    return path.name == "input.json" and len(path.parts) >= 4 and path.parent.parent.parent.name == "snapshots"


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if _is_scenario_input(file_path):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # a scenario's seeded workspace is data, even when it holds test_*.py files
    if collection_path.name == "workspace" and (collection_path.parent / "input.json").is_file():
        return True
    return None


_PINS = pytest.StashKey[dict[str, Any]]()


class ScenarioFile(pytest.File):
    def collect(self) -> Iterable[pytest.Item]:
        from .scenarios import load_scenario

        sc = load_scenario(self.path.parent)
        mechanisms: Iterable[str | None] = (None,)
        if sc.per_mechanism:  # sandbox-tools is optional here: without it there is one mechanism to test
            try:
                mechanisms = importlib.import_module("dsh_sandbox_tools.testing").MECHANISMS
            except ImportError:
                pass
        for mechanism in mechanisms:
            name = f"{sc.dir.parent.name}/{sc.name}" + (f"[{mechanism}]" if mechanism else "")
            item = ScenarioItem.from_parent(self, name=name, scenario=sc, mechanism=mechanism)
            item.add_marker(pytest.mark.snapshot_scenario)
            yield item


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario: Any, mechanism: str | None, **kw: Any) -> None:
        super().__init__(**kw)
        self.scenario = scenario
        self.mechanism = mechanism

    def runtest(self) -> None:
        from .scenarios import run_and_check

        mode = scenario_mode(self.config)
        if mode == "record" and not self.scenario.recordable:
            pytest.skip("not recordable (input.json: recordable is false): refresh keeps it current")
        if self.mechanism:
            importlib.import_module("dsh_sandbox_tools.testing").require_mechanism(self.mechanism)
        pins = self.config.stash.setdefault(_PINS, {})
        written = run_and_check(self.scenario, mode, mechanism=self.mechanism, pins=pins)
        for path in written:
            self.add_report_section("call", "written", path)

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        from .scenarios import ScenarioError

        if isinstance(excinfo.value, ScenarioError):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"scenario {self.name}"
