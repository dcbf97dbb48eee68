"""Opt-in pytest plugin for dsh and its plugin authors: ``pytest_plugins = ["dsh_testing"]``.

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
  compares the wire transcript and the logs (``dsh_testing.scenarios``); ``--dsh-snapshots=refresh``
  (or ``--snapshot-update``) rewrites the expectations keylessly, ``--dsh-snapshots=record``
  re-records the recordable ones against the live route.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .harness import (  # re-exported: plugin authors import these from dsh_testing
    REPO as REPO,
)
from .harness import (
    SHIPPED_EXAMPLES as SHIPPED_EXAMPLES,
)
from .harness import (
    AcpRun as AcpRun,
)
from .harness import (
    Recorder as Recorder,
)
from .harness import (
    acp_schema as acp_schema,
)
from .harness import (
    acp_schema_file as acp_schema_file,
)
from .harness import (
    acp_validator as acp_validator,
)
from .harness import (
    added_and_sibling_dirs as added_and_sibling_dirs,
)
from .harness import (
    check_frames as check_frames,
)
from .harness import (
    live_processes as live_processes,
)
from .harness import (
    memory_host as memory_host,
)
from .harness import (
    minimal_env as minimal_env,
)
from .harness import (
    new_sleep_marker as new_sleep_marker,
)
from .harness import (
    normalize_transcript as normalize_transcript,
)
from .harness import (
    prompt_once as prompt_once,
)
from .harness import (
    session_log as session_log,
)
from .harness import (
    sleepers as sleepers,
)
from .harness import (
    sleepers_gone as sleepers_gone,
)
from .harness import (
    spawn_acp as spawn_acp,
)
from .harness import (
    streaming as streaming,
)
from .harness import (
    until as until,
)

# ---------------------------------------------------------------- test isolation: DSH_HOME per test

# This run's temp roots (pytest's base temp, the fixed-length root) once used, kept on the run's config.
_RUN_TEMP = pytest.StashKey[list[Path]]()


def _run_temp(config: pytest.Config) -> list[Path]:
    return config.stash.setdefault(_RUN_TEMP, [])


@pytest.fixture(autouse=True)
def dsh_home(request: pytest.FixtureRequest, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
             monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own ``DSH_HOME`` (session logs, attachments, spill files) under its
    ``tmp_path``. Autouse: no test writes to the user's data dir. In-process hosts read it from
    ``os.environ``; ``spawn_acp``/``minimal_env`` pass it to the ``dsh`` processes they start, and
    subagent-acp passes it on to its children (its ``inherit-env`` default)."""
    base = tmp_path_factory.getbasetemp().resolve()
    roots = _run_temp(request.config)
    if base not in roots:
        roots.append(base)
    home = tmp_path / "dsh-home"
    monkeypatch.setenv("DSH_HOME", str(home))
    # and its own config dir: a key the developer stored with `dsh auth login` never reaches a test
    monkeypatch.setenv("DSH_CONFIG_HOME", str(tmp_path / "dsh-config"))
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")  # nor the OS keyring's
    monkeypatch.setenv("DSH_SKILLS_USER_ROOTS", "")  # nor the developer's own skills (~/.agents/skills)
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
    config.addinivalue_line("markers", "snapshot_scenario: keyless ACP snapshot scenarios (dsh_testing.scenarios)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a test (or a process it spawned) left a session log in the user's data dir."""
    roots = _run_temp(session.config)
    if not roots or _DATA_DIRS not in session.config.stash:
        return
    dirs = session.config.stash[_DATA_DIRS]
    leaks = [log for root in roots for log in leaked_session_logs(dirs, root)]
    if leaks:
        lines = [
            f"dsh_testing: tests wrote {len(leaks)} session log(s) outside their temporary directories "
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
def _fixed_length_root(request: pytest.FixtureRequest) -> Iterator[Path]:
    """One directory per run at a path of fixed length (``/tmp/dsh-t-XXXXXXXX``). Snapshot
    scenarios meter prompts in bytes, and a cwd or spill path under pytest's ``pytest-<N>`` base
    temp grows a digit now and then: pinned token counts must not depend on it."""
    root = Path(tempfile.mkdtemp(prefix="dsh-t-", dir="/tmp" if os.path.isdir("/tmp") else None))
    _run_temp(request.config).append(root.resolve())
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


@pytest.fixture(scope="module")
def chromium_browser() -> Iterator[Any]:
    """A real headless Chromium for the module's tests (``dsh_testing.browser``: skips without
    chromium or Playwright, fails under CI=true)."""
    from dsh_testing.browser import launch

    yield from launch()


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


# ---------------------------------------------------------------- scenario directories (dsh_testing.scenarios)


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
            with contextlib.suppress(ImportError):
                mechanisms = importlib.import_module("dsh_sandbox_tools.testing").MECHANISMS
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
        # per mechanism, or one the scenario's env names: skip where this machine lacks it
        mechanism = self.mechanism or self.scenario.env.get("DSH_SANDBOX_MECHANISM")
        if mechanism:
            importlib.import_module("dsh_sandbox_tools.testing").require_mechanism(mechanism)
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
