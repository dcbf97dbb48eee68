"""The `dsh` command line, as a user runs it (real subprocesses)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from acp import RequestError, text_block

from dsh_testing import minimal_env

pytestmark = pytest.mark.anyio


def dsh(*args: str, env: dict[str, str] | None = None, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dsh_core.cli", *args], capture_output=True, timeout=60,
        env=env or minimal_env(), input=input,
    )


def test_help_reads_well_and_lists_the_commands():
    out = dsh("--help")
    assert out.returncode == 0
    text = out.stdout.decode()
    for word in ("run", "plugins", "examples", "ask", "sessions", "Agent Client"):
        assert word in text


def test_help_starts_with_a_command_that_answers(tmp_path):
    """"Start here" is a command that prints something on a terminal, not `dsh run` (which waits,
    silently, for JSON-RPC on stdin); run exactly as the help prints it."""
    text = " ".join(dsh("--help").stdout.decode().split())
    start = text.split("Start here: ", 1)[1].split(" (prints PONG")[0]
    assert start == "dsh ask --provider scripted --model demo.json ping"
    proc = subprocess.run([sys.executable, "-m", "dsh_core.cli", *start.split()[1:]], capture_output=True, timeout=60,
                          cwd=tmp_path, env=minimal_env(DSH_HOME=str(tmp_path / "home")))
    assert (proc.returncode, proc.stdout) == (0, b"PONG\n"), proc.stderr


@pytest.mark.parametrize("argv", [["ask", "--bad-flag"], ["batch", "tasks.jsonl", "--out", "o.jsonl", "--bad-flag"], ["doctor", "--bad-flag"]])
def test_a_bad_flag_prints_the_commands_own_usage(argv):
    out = dsh(*argv)
    assert out.returncode == 2
    err = out.stderr.decode()
    assert f"\nusage: dsh {argv[0]} " in "\n" + err, err  # (plugins the tests install may write lines above)
    assert err.rstrip().endswith(f"dsh {argv[0]}: error: unrecognized arguments: --bad-flag"), err


def test_plugins_prints_the_exact_composition_as_json():
    out = dsh("plugins", "--example", "acp-agent")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)  # nothing but JSON on stdout (the testkit's import noise went to stderr)
    rows = {r["name"]: r for r in data["plugins"] if not r["builtin"]}
    assert set(rows) == {"acp-transport", "jsonl-persistence", "attachment-store", "deepseek-model",
                         "scripted-model", "replay-model", "sandbox-tools", "agent-instructions", "guards", "todo",
                         "compaction", "hooks-claude-code", "hooks-codex", "subagents", "code-mode", "workflow", "goals",
                         "skills", "web", "jobs"}
    assert "dsh_before_tool" in rows["hooks-codex"]["hooks"]
    assert rows["acp-transport"]["distribution"] == "dsh-acp-transport"
    assert rows["compaction"]["distribution"] == "dsh-compaction"
    assert "dsh_history_policy" in rows["compaction"]["hooks"]
    assert "dsh_register_front_doors" in rows["acp-transport"]["hooks"]
    assert rows["acp-transport"]["version"]


def test_examples_lists_acp_agent():
    out = dsh("examples")
    assert out.returncode == 0 and "acp-agent" in out.stdout.decode()


def test_examples_keeps_its_columns_aligned_for_long_names(tmp_path):
    for name in ("a-rather-long-example-name-indeed", "x"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "example.toml").write_text(f'[example]\ndescription = "about {name}"\nplugins = []\n')
    out = dsh("examples", env=minimal_env(DSH_EXAMPLES_PATH=str(tmp_path), DSH_HOME=str(tmp_path / "home")))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.decode().splitlines()
    names = [line.split()[0] for line in lines]
    assert names[:2] == ["a-rather-long-example-name-indeed", "x"] and "acp-agent" in names
    columns = {re.match(r"\S+\s+", line).end() for line in lines}
    assert len(columns) == 1, lines  # every description starts in the same column


def test_ask_finds_a_relative_script_beside_the_example(tmp_path):
    # From a directory with no examples/ below it, `--model demo.json` is the acp-agent example's demo.
    proc = subprocess.run(
        [sys.executable, "-m", "dsh_core.cli", "ask", "--provider", "scripted", "--model", "demo.json", "ping"],
        capture_output=True, timeout=60, cwd=tmp_path, env=minimal_env(DSH_HOME=str(tmp_path / "home")),
    )
    assert (proc.returncode, proc.stdout) == (0, b"PONG\n"), proc.stderr


@pytest.mark.parametrize("how", ["ask", "batch"])
def test_a_relative_example_path_is_read_from_where_the_user_runs_the_command(tmp_path, how):
    """`--example my/example` next to the user's shell, while the agent works in another --cwd."""
    mine = tmp_path / "mine" / "examples" / "own"
    mine.mkdir(parents=True)
    (mine / "example.toml").write_text('[example]\nfront-door = "acp-stdio"\n'
                                       'plugins = ["acp-transport", "scripted-model"]\n'
                                       '[route]\nprovider = "scripted"\nmodel = "own.json"\n')
    (mine / "own.json").write_text(json.dumps({"default": [{"text": "from my own example, in {cwd}"}]}))
    work = tmp_path / "work"
    work.mkdir()
    env = minimal_env(DSH_HOME=str(tmp_path / "home"))
    if how == "ask":
        argv = ["ask", "--cwd", str(work), "--example", "examples/own", "hi"]
    else:
        (tmp_path / "mine" / "tasks.jsonl").write_text(json.dumps({"id": "t", "prompt": "hi", "cwd": str(work)}) + "\n")
        argv = ["batch", "tasks.jsonl", "--out", "out.jsonl", "--example", "examples/own"]
    proc = subprocess.run([sys.executable, "-m", "dsh_core.cli", *argv], capture_output=True, timeout=60,
                          cwd=tmp_path / "mine", env=env)
    assert proc.returncode == 0, proc.stderr
    if how == "ask":
        assert proc.stdout == f"from my own example, in {work}\n".encode()
    else:
        (row,) = [json.loads(line) for line in (tmp_path / "mine" / "out.jsonl").read_text().splitlines()]
        assert row["status"] == "ok" and row["text"] == f"from my own example, in {work}", row


def test_an_unknown_example_is_one_clear_line():
    out = dsh("run", "--example", "nope")
    assert out.returncode == 2
    assert out.stdout == b""
    assert out.stderr.decode().strip().startswith("dsh: unknown example 'nope'")


def test_run_without_a_usable_provider_names_the_way_out():
    out = dsh("run", "--example", "acp-agent", "--provider", "nope", "--model", "x", input=b"")
    assert out.returncode == 2
    assert out.stdout == b""
    err = out.stderr.decode()
    assert "no model provider 'nope'" in err and "--provider scripted --model examples/acp-agent/demo.json" in err
    assert "Traceback" not in err


async def test_without_a_key_deepseek_starts_and_fails_the_request_clearly(acp_agent, tmp_path):
    async with acp_agent(None, env={"DEEPSEEK_API_KEY": ""}) as run:  # the manifest's DeepSeek route
        sid = await run.start()
        with pytest.raises(RequestError) as err:
            await run.conn.prompt(session_id=sid, prompt=[text_block("hello")])
        assert err.value.code == -32603
        assert "DEEPSEEK_API_KEY" in str(err.value)
