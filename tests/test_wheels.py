"""Built wheels work, not only editable installs.

Builds every distribution (the core and each plugins/* one) as a wheel from a copy of the
sources, installs the wheels into a fresh virtual environment (pip fetches their declared
dependencies, nothing else), and uses that installation as a user would: from a directory
outside the source tree, with no ``DSH_EXAMPLES_PATH``, so the examples must come from the
installed package. stdout must carry nothing but the command's output (JSON, the answer,
or ACP frames validated against the schema).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from acp import text_block

from dsh_testing import minimal_env, spawn_acp

REPO = Path(__file__).resolve().parent.parent
PLUGINS = sorted(p.parent.name for p in (REPO / "plugins").glob("*/pyproject.toml"))
EXAMPLES = sorted(p.parent.name for p in (REPO / "examples").glob("*/example.toml"))
# Building and installing takes ~25 s on a 2-core machine (pip's cache warm); the budget is generous.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

_IGNORE = shutil.ignore_patterns("tests", "build", "dist", "*.egg-info", "__pycache__", ".*")


def _pip(python: Path, *args: str) -> None:
    """The running interpreter's pip, acting on another environment (``pip --python``)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "-q", *args],
        capture_output=True, text=True, timeout=480,
    )
    assert proc.returncode == 0, f"pip {' '.join(args[:3])} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The ``bin`` directory of a fresh venv holding only the built wheels and their dependencies."""
    top = tmp_path_factory.mktemp("wheels")
    src = top / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("dsh_core", "examples"):
        shutil.copytree(REPO / name, src / name, ignore=_IGNORE)
    for name in PLUGINS:
        shutil.copytree(REPO / "plugins" / name, src / "plugins" / name, ignore=_IGNORE)

    # One build environment with setuptools, shared by every build (isolated builds cost ~50 s).
    builder = top / "build-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(builder)], check=True, timeout=120)
    _pip(builder / "bin" / "python", "install", "setuptools>=68")
    wheels = top / "wheels"
    dists = [src, *(src / "plugins" / n for n in PLUGINS)]
    _pip(builder / "bin" / "python", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), *map(str, dists))
    built = sorted(w.name for w in wheels.glob("*.whl"))
    assert len(built) == 1 + len(PLUGINS), built
    assert any(w.startswith("dsh_acp-") for w in built), built  # the ACP library (not a plugin) too

    venv = top / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    _pip(venv / "bin" / "python", "install", *map(str, sorted(wheels.glob("*.whl"))))
    return venv / "bin"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # No DSH_EXAMPLES_PATH: the examples must be the installed ones.
    return minimal_env(DSH_HOME=str(tmp_path / "home"), DEEPSEEK_API_KEY="", **extra)


def _run(bin_dir: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin_dir / "dsh"), *args], capture_output=True, timeout=120, cwd=tmp_path, env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
    )


def test_the_installed_core_is_the_wheel_with_its_examples(installed, tmp_path):
    where = subprocess.run(
        [str(installed / "python"), "-c", "import dsh_core, sys; print(dsh_core.__file__)"],
        capture_output=True, text=True, check=True, cwd=tmp_path, env=_env(tmp_path),
    ).stdout.strip()
    core = Path(where).parent
    assert "site-packages" in core.parts and not core.is_relative_to(REPO)
    for name in EXAMPLES:
        for f in (REPO / "examples" / name).iterdir():
            assert (core / "examples" / name / f.name).read_bytes() == f.read_bytes(), f
    out = _run(installed, tmp_path, "examples")
    assert out.returncode == 0, out.stderr
    assert [line.split()[0] for line in out.stdout.decode().splitlines()] == EXAMPLES


def test_the_installed_test_kit_carries_the_vendored_acp_schema(installed, tmp_path):
    """A plugin author's `pip install dsh-testing` gets the schema it validates frames with; the
    spine's wheel carries no test code."""
    where = subprocess.run(
        [str(installed / "python"), "-c",
         "from importlib.resources import files; print(files('dsh_testing').joinpath('_vendor', 'acp'))"],
        capture_output=True, text=True, check=True, cwd=tmp_path, env=_env(tmp_path),
    ).stdout.strip()
    vendored = Path(where)
    assert not vendored.is_relative_to(REPO)
    for name in ("schema.json", "LICENSE", "SOURCE.md"):
        assert (vendored / name).read_bytes() == (REPO / "plugins" / "testing" / "dsh_testing" / "_vendor" / "acp" / name).read_bytes(), name


def test_plugins_prints_only_json_naming_each_installed_distribution(installed, tmp_path):
    out = _run(installed, tmp_path, "plugins", "--example", "acp-agent")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)  # stdout is the JSON document and nothing else
    rows = {r["name"]: r["distribution"] for r in data["plugins"] if not r["builtin"]}
    assert rows == {
        "acp-transport": "dsh-acp-transport", "jsonl-persistence": "dsh-jsonl-persistence",
        "attachment-store": "dsh-attachment-store", "deepseek-model": "dsh-deepseek-model",
        "scripted-model": "dsh-scripted-model", "replay-model": "dsh-replay-model", "sandbox-tools": "dsh-sandbox-tools",
        "agent-instructions": "dsh-agent-instructions", "guards": "dsh-guards", "todo": "dsh-todo",
        "compaction": "dsh-compaction", "hooks-claude-code": "dsh-hooks-claude-code", "hooks-codex": "dsh-hooks-codex",
        "subagents": "dsh-subagents", "code-mode": "dsh-code-mode", "workflow": "dsh-workflow", "skills": "dsh-skills", "web": "dsh-web",
        "jobs": "dsh-jobs", "goals": "dsh-goals",
    }


def test_ask_with_the_installed_demo(installed, tmp_path):
    demo = next((installed.parent / "lib").glob("python*/site-packages/dsh_core/examples/acp-agent/demo.json"))
    for model in (str(demo), "demo.json"):  # the path, and the name beside the example
        out = _run(installed, tmp_path, "ask", "--provider", "scripted", "--model", model, "ping")
        assert (out.returncode, out.stdout) == (0, b"PONG\n"), out.stderr


async def test_an_acp_session_over_the_installed_acp_agent_keyless(installed, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    async with spawn_acp(
        Path("demo.json"), cwd=work, dsh=(str(installed / "dsh"),), env=_env(tmp_path, DSH_EXAMPLES_PATH="")
    ) as run:
        sid = await run.start()
        answer = await run.conn.prompt(session_id=sid, prompt=[text_block("ping")])
        assert answer.stop_reason == "end_turn"
        answer = await run.conn.prompt(session_id=sid, prompt=[text_block("where are you?")])
        assert answer.stop_reason == "end_turn"
        assert run.client.text(sid) == ["PONG", f"I am working in {work}."]
        assert await run.close_stdin() == 0
    # spawn_acp checked on exit that every stdout line is an ACP frame valid against the schema.
    methods = [f.get("method") for f in run.frames]
    assert methods.count("session/update") == 2 and set(methods) == {None, "session/update"}
    assert b"Traceback" not in run.stderr
    assert list((tmp_path / "home" / "sessions").glob("*.jsonl"))  # the wheel's jsonl-persistence wrote its log
    # the wheel's session-export, its templates included, makes a page and Markdown of that log
    page = _run(installed, tmp_path, "sessions", "export", sid, "--html")
    assert page.returncode == 0, page.stderr
    assert page.stdout.startswith(b"<!DOCTYPE html>") and b'"text":"PONG"' in page.stdout
    md = _run(installed, tmp_path, "sessions", "export", sid, "--md")
    assert md.returncode == 0 and b"**Answer:**\n\nPONG\n" in md.stdout, md.stderr


def test_doctor_from_the_wheels_runs_every_plugins_check(installed, tmp_path):
    out = _run(installed, tmp_path, "doctor", "--json")
    report = json.loads(out.stdout)  # stdout is the JSON report and nothing else
    assert out.returncode == (0 if report["can_serve"] else 1), out.stderr
    subjects = [c["subject"] for c in report["checks"]]
    assert subjects == ["dsh", "plugins", "route", "sandbox", "sandbox-isolation", "deepseek key", "data dir"]
    assert report["checks"][1]["status"] == "ok"
    assert [e["name"] for e in report["examples"]] == EXAMPLES
    assert all(e["missing"] == [] for e in report["examples"])
