"""Convert scenarios written with the inline harness (tests/test_snapshots.py style) into scenario
directories (dsh_testing.scenarios), mechanically:

    python tests/snapshot_convert.py [--module tests/test_snapshots.py] NAME...

For each NAME of the module's ``SCENARIOS`` table (``name -> (example, body[, script])``):

1. the old body runs once against the scripted model, through a connection that writes down what
   the client does (initialize, newSession, prompt/promptContent with the stop reason it got,
   prompt+cancel, permission answers) as ``input.json`` steps; the files the body seeds in the cwd
   before its first ACP call become ``workspace/``;
2. the runner then *records* the scenario with the scripted model as the route, which writes the
   recording (``session.jsonl`` …), ``stdout.expected.jsonl`` and the header class pins;
3. the scripted route is dropped from ``input.json`` and the scenario is replayed once to check.

What the body waits for between steps is not visible to the recorder: a cancel becomes
``promptAndCancel`` after ``turn/start``; say otherwise with ``AFTER`` below (e.g. a file the
tool creates). Assertions in the body still run (in step 1). The module's ``SCENARIO_ENV``
(name -> env), ``CONFINED`` (run per sandbox mechanism), ``CLEANUP`` (name -> paths removed before
and after, e.g. files written outside the workspace) and ``scenario_dir(name)`` (where the
directory goes; default snapshots/acp-agent/NAME, snapshots/code-mode/NAME for code/both mode)
are honoured; header classes other than the example's come from ``HEADER_CLASS`` below.

A module written another way says how to convert each of its scenarios with ``conversion(name)``,
which returns a dict: ``example``, ``body`` (``async body(run, sids)`` as above), and either
``script`` (a scripted-model script) or ``route`` — a context-manager factory yielding
``{"provider", "model", "env", …}`` for one run, e.g. deepseek-model against a fresh loopback fake
DeepSeek server (the body finds the dict as ``run.route``), so the recording is in DeepSeek's wire
format and replays keyless; plus optional ``env``, ``perMechanism``, ``cleanup``, ``header``,
``recordable``, ``about`` and ``pinStderr`` (written to ``input.json`` as they are), and ``checkFiles``
(what the workspace must hold at the end: a last ``checkFiles`` step, checked on every replay).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from dsh_testing import Recorder, spawn_acp  # noqa: E402
from dsh_testing.scenarios import dump_input, load_scenario, run_and_check  # noqa: E402

# How long to wait before a cancel, where turn/start is not the moment (scenario -> "after").
AFTER = {"cancel-tool-calls": {"file": "started.txt"}}
HEADER_CLASS = {"agent-instructions": "agent-instructions", "agent-instructions-linked": "agent-instructions-linked"}
CLEANUP = {"bash-escalation-approved": ["/var/tmp/dsh-snapshot-escalation.txt"],
           "bash-escalation-rejected": ["/var/tmp/dsh-snapshot-escalation.txt"]}


class _Answers(list):
    def __init__(self, steps: list[dict[str, Any]]) -> None:
        super().__init__()
        self._steps = steps

    def append(self, answer: Any) -> None:
        self._steps.append({"op": "permission", "answers": [answer]})
        super().append(answer)


class StepConn:
    """The SDK connection, writing down each client call as a scenario step."""

    def __init__(self, conn: Any, cwd: Path, workspace: Path, steps: list[dict[str, Any]]) -> None:
        self._conn, self._cwd, self._workspace, self.steps = conn, cwd, workspace, steps
        self.sids: list[str] = []
        self._inflight: dict[str, dict[str, Any]] = {}
        self._seeded = False
        self.empty_dirs: list[str] = []

    def _seed(self) -> None:
        if not self._seeded:
            self._seeded = True
            if any(self._cwd.iterdir()):
                shutil.copytree(self._cwd, self._workspace, symlinks=True)
                for link in [p for p in self._workspace.rglob("*") if p.is_symlink()]:
                    target = Path(os.readlink(link))
                    if target.is_absolute() and target.is_relative_to(self._cwd):  # keep it inside the seed
                        link.unlink()
                        link.symlink_to(os.path.relpath(target, self._cwd.joinpath(link.parent.relative_to(
                            self._workspace))))
                for d in sorted(self._workspace.rglob("*"), reverse=True):  # git keeps no empty directory
                    if d.is_dir() and not d.is_symlink() and not any(d.iterdir()):
                        self.empty_dirs.append(d.relative_to(self._workspace).as_posix())
                        d.rmdir()

    async def initialize(self, **kw: Any) -> Any:
        self._seed()
        self.steps.append({"op": "initialize"})
        return await self._conn.initialize(**kw)

    async def new_session(self, cwd: str, mcp_servers: list[Any], **kw: Any) -> Any:
        from acp import RequestError

        self._seed()
        step: dict[str, Any] = {"op": "newSession"}
        if Path(cwd) != self._cwd:
            step["cwd"] = Path(cwd).relative_to(self._cwd).as_posix()
        if kw.get("additional_directories"):
            step["additionalDirectories"] = kw["additional_directories"]
        self.steps.append(step)
        try:
            result = await self._conn.new_session(cwd=cwd, mcp_servers=mcp_servers, **kw)
        except RequestError:
            step["expectError"] = True
            raise
        self.sids.append(result.session_id)
        return result

    async def prompt(self, session_id: str, prompt: list[Any], **kw: Any) -> Any:
        from acp import RequestError

        self._seed()
        index = self.sids.index(session_id)
        blocks = [b.model_dump(by_alias=True, exclude_none=True) for b in prompt]
        if len(blocks) == 1 and blocks[0].get("type") == "text":
            step: dict[str, Any] = {"op": "prompt", "text": blocks[0]["text"]}
        else:
            step = {"op": "promptContent", "content": blocks}
        if index:
            step["session"] = index
        self.steps.append(step)
        self._inflight[session_id] = step
        try:
            result = await self._conn.prompt(session_id=session_id, prompt=prompt, **kw)
        except RequestError:
            step["expect"] = "error"
            raise
        finally:
            self._inflight.pop(session_id, None)
        if step["op"] != "promptAndCancel":
            step["expect"] = result.stop_reason
        return result

    async def cancel(self, session_id: str, **kw: Any) -> Any:
        step = self._inflight.get(session_id)
        if step is not None and step["op"] == "prompt":
            step["op"] = "promptAndCancel"
            step["after"] = {"event": "turn/start"}
        else:
            self.steps.append({"op": "cancel"})
        return await self._conn.cancel(session_id=session_id, **kw)


async def _capture(body: Any, example: str, route: dict[str, Any], env: dict[str, str],
                   dest: Path) -> tuple[list[dict], list[str]]:
    root = Path(tempfile.mkdtemp(prefix="dsh-convert-"))
    try:
        work, home = root / "work", root / "home"
        work.mkdir()
        steps: list[dict[str, Any]] = []
        client = Recorder()
        client.permission_answers = _Answers(steps)
        env = {"DSH_HOME": str(home), "DSH_PERMISSION_MODE": "workspace-write", **env, **route.get("env", {})}
        async with spawn_acp(Path(route["model"]), provider=route["provider"], cwd=work, example=example, env=env,
                             client=client) as run:
            run.home = home  # type: ignore[attr-defined]
            run.route = route  # type: ignore[attr-defined]
            conn = StepConn(run.conn, work, dest / "workspace", steps)
            run.conn = conn
            await body(run, [])
        return steps, sorted(conn.empty_dirs)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _spec(module: Any, name: str) -> dict[str, Any]:
    """How to convert ``name``: the module's ``conversion(name)``, or read from the inline harness's tables."""
    if hasattr(module, "conversion"):
        return dict(module.conversion(name))
    example, body, *override = module.SCENARIOS[name]
    spec: dict[str, Any] = {"example": example, "body": body, "script": override[0] if override else module.SCRIPT}
    env = dict(getattr(module, "SCENARIO_ENV", {}).get(name, {}))
    if env:
        spec["env"] = env
    if name in getattr(module, "CONFINED", set()):
        spec["perMechanism"] = True
    cleanup = {**CLEANUP, **getattr(module, "CLEANUP", {})}.get(name, [])
    if cleanup:
        spec["cleanup"] = cleanup
    if name in HEADER_CLASS:
        spec["header"] = HEADER_CLASS[name]
    return spec


def _scripted(script_doc: Any) -> Callable[[], AbstractContextManager[dict[str, Any]]]:
    @contextmanager
    def route() -> Iterator[dict[str, Any]]:
        with tempfile.TemporaryDirectory(prefix="dsh-convert-script-") as tmp:
            script = Path(tmp) / "script.json"
            script.write_text(json.dumps(script_doc))
            yield {"provider": "scripted", "model": str(script), "env": {}}

    return route


def _clear(dest: Path) -> None:
    """What an earlier conversion or the inline harness left there (the workspace is captured anew)."""
    for old in ("stdout.jsonl", "session.jsonl", "system-prompt.md", "tool-schemas.json", "input.json",
                "stderr.txt"):
        (dest / old).unlink(missing_ok=True)
    for extra in dest.glob("session.*.jsonl"):
        extra.unlink()
    shutil.rmtree(dest / "workspace", ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)


def _input_doc(spec: dict[str, Any], steps: list[dict[str, Any]], empty_dirs: list[str],
               recorded_on: dict[str, str] | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"example": spec["example"]}
    for key in ("header", "about"):
        if key in spec:
            doc[key] = spec[key]
    if recorded_on is not None:  # the route it was recorded on (a scripted recording is recorded once, by this tool)
        doc["recordable"] = bool(spec.get("recordable", False))
        doc["record"] = recorded_on
    for key in ("env", "cleanup"):
        if spec.get(key):
            doc[key] = spec[key]
    for key in ("perMechanism", "pinStderr"):
        if spec.get(key):
            doc[key] = True
    if empty_dirs:
        doc["mkdir"] = empty_dirs
    doc["steps"] = steps
    return doc


def _record(name: str, dest: Path, route: Callable[[], AbstractContextManager[dict[str, Any]]]) -> None:
    sc = load_scenario(dest)
    pins = {p: p.read_bytes() for p in sc.headers_dir.glob("*")} if sc.headers_dir.is_dir() else {}
    with route() as live:
        sc.recordable, sc.record = True, (live["provider"], live["model"])
        run_and_check(sc, "record", extra_env=live.get("env") or None)
    changed = [p for p, text in pins.items() if p.read_bytes() != text]
    if changed:  # the class's other scenarios send the pinned header: this one sends another
        for p in changed:
            p.write_bytes(pins[p])
        raise SystemExit(f"{name}: its request header differs from header class {sc.header!r}'s pin "
                         f"({', '.join(p.name for p in changed)}, left as it was): give it its own \"header\"")


def convert(module: Any, name: str, snapshots: Path) -> Path:
    spec = _spec(module, name)
    example = spec["example"]
    if hasattr(module, "scenario_dir"):  # the module knows where its scenarios live
        dest = Path(module.scenario_dir(name))
    else:
        dest = snapshots / ("code-mode" if example in ("code-mode", "both-mode") else "acp-agent") / name
    _clear(dest)
    cleanup = list(spec.get("cleanup", []))
    scripted = "route" not in spec
    route = _scripted(spec["script"]) if scripted else spec["route"]
    for p in cleanup:
        Path(p).unlink(missing_ok=True)
    with route() as live:
        steps, empty_dirs = asyncio.run(_capture(spec["body"], example, live, dict(spec.get("env", {})), dest))
        recorded_on = {"provider": live["provider"], "model": live["model"]}
    for p in cleanup:
        Path(p).unlink(missing_ok=True)
    for step in steps:
        if step["op"] == "promptAndCancel" and name in AFTER:
            step["after"] = AFTER[name]
    if spec.get("checkFiles"):
        steps.append({"op": "checkFiles", "files": spec["checkFiles"]})
    doc = _input_doc(spec, steps, empty_dirs, None if scripted else recorded_on)
    (dest / "input.json").write_text(dump_input(doc))
    _record(name, dest, route)
    run_and_check(load_scenario(dest), "replay")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default=str(REPO / "tests" / "test_snapshots.py"))
    parser.add_argument("--snapshots", default=str(REPO / "snapshots"))
    parser.add_argument("names", nargs="*", help="scenarios to convert (default: all of the module's table)")
    args = parser.parse_args(argv)
    spec = importlib.util.spec_from_file_location("legacy_scenarios", args.module)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses of the module look themselves up there
    spec.loader.exec_module(module)
    for name in args.names or list(module.SCENARIOS):
        print(f"converted {convert(module, name, Path(args.snapshots))}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
