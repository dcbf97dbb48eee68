"""Every shipped example has a keyless demo beside it (demo.json, the scripted model's script):
`dsh ask --example NAME --provider scripted --model demo.json ping` answers PONG, and the code-mode
examples' demos show their feature (a run_code program that calls tools) on a real sandbox."""

from __future__ import annotations

import subprocess
import sys

import pytest
from dsh_sandbox_tools.testing import require_mechanism

from dsh_testing import REPO, minimal_env

EXAMPLES = sorted(p.parent.name for p in (REPO / "examples").glob("*/example.toml"))


def ask(name: str, prompt: str, cwd, home) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dsh_core.cli", "ask", "--example", name, "--provider", "scripted",
         "--model", "demo.json", prompt],
        capture_output=True, timeout=120, cwd=cwd, env=minimal_env(DSH_HOME=str(home)),
    )  # fmt: skip


def test_the_examples_are_the_shipped_six():
    assert EXAMPLES == ["acp-agent", "acp-agent-subagent", "acp-editor", "acp-extended", "both-mode", "code-mode"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_answers_ping_keylessly(name, tmp_path):
    assert (REPO / "examples" / name / "demo.json").is_file()
    proc = ask(name, "ping", tmp_path, tmp_path / "home")
    assert (proc.returncode, proc.stdout) == (0, b"PONG\n"), proc.stderr


@pytest.mark.parametrize(("name", "said"), [
    ("code-mode", "One program, two tools: 2 entries, 3 lines\n"),
    ("both-mode", "A direct bash call, then a program that calls bash: 3 lines\n"),
])
def test_the_code_mode_demos_run_a_program_that_calls_tools(name, said, tmp_path):
    require_mechanism("landlock")  # the tools run confined (bubblewrap too when present; Landlock is the floor)
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("one\ntwo\n")
    (work / "b.txt").write_text("three\n")
    proc = ask(name, "count the lines", work, tmp_path / "home")
    assert (proc.returncode, proc.stdout.decode()) == (0, said), proc.stderr


@pytest.mark.parametrize(("prompt", "said"), [
    ("delegate", "A subagent answered: the workspace holds: a.txt\nb.txt\n"),
    ("fork", "The fork (which saw this conversation) answered: I start from your conversation, so I know what was "
             "asked before me.\n"),
    ("workflow", 'The workflow returned: {\n  "answers": [\n    "helper: one: done",\n    "helper: two: done"\n  ]\n}\n'
                 "[workflow: 2 agents, 0 failed]\n"),
])
def test_the_acp_agent_demo_delegates_forks_and_runs_a_workflow(prompt, said, tmp_path):
    require_mechanism("landlock")  # the workflow script runs in the confined runtime
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("one\n")
    (work / "b.txt").write_text("two\n")
    proc = ask("acp-agent", prompt, work, tmp_path / "home")
    assert (proc.returncode, proc.stdout.decode()) == (0, said), proc.stderr
