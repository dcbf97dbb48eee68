"""The scenario-directory runner end to end (dsh_testing.scenarios): record a scenario through the fake
DeepSeek server (a real HTTP server on loopback speaking DeepSeek's wire format), replay it keyless
with the server gone to the identical transcript, and see replay fail — with what diverged — when
the workspace, the prompt or an expectation changes; refresh rewrites expectations keylessly; a
plugin repository gets all of it from ``pytest_plugins = ["dsh_testing"]`` alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsh_testing.scenarios import ScenarioError, load_scenario, run_and_check

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins" / "deepseek-model" / "tests"))
from fake_deepseek import FakeDeepSeek, Turn

pytestmark = pytest.mark.snapshot_scenario

INPUT = {
    "example": "acp-agent",
    "recordable": True,
    "record": {"provider": "deepseek", "model": "deepseek-flash"},
    "steps": [
        {"op": "initialize"},
        {"op": "newSession"},
        {"op": "prompt", "text": "what do the notes say?", "expect": "end_turn"},
    ],
}


def _scenario(tmp_path: Path, inp: dict = INPUT) -> Path:
    d = tmp_path / "snapshots" / "acp-agent" / "read-notes"
    (d / "workspace").mkdir(parents=True)
    (d / "workspace" / "notes.txt").write_text("alpha\nbeta\n")
    (d / "input.json").write_text(json.dumps(inp, indent=2))
    return d


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """A scenario recorded through the fake DeepSeek server, which is stopped afterwards."""
    d = _scenario(tmp_path)
    with FakeDeepSeek(keepalive_every_s=0.05) as fake:
        fake.push(Turn(reasoning="Read the file first.", tool_calls=[("read", '{"file_path": "notes.txt"}')]),
                  Turn(content="The notes say alpha and beta."))
        monkeypatch.setenv("DEEPSEEK_API_KEY", fake.api_key)
        monkeypatch.setenv("DEEPSEEK_BASE_URL", fake.base_url)
        written = run_and_check(load_scenario(d), "record")
        assert len(fake.chat_requests) == 2
    monkeypatch.delenv("DEEPSEEK_API_KEY")
    monkeypatch.delenv("DEEPSEEK_BASE_URL")
    return d, written


def test_record_through_fake_deepseek_then_replay_keyless_to_the_identical_transcript(recorded):
    d, written = recorded
    names = sorted(Path(p).relative_to(d.parent).as_posix() for p in written)
    assert names == ["_headers/acp-agent/system-prompt.md", "_headers/acp-agent/tool-schemas.json",
                     "read-notes/session.jsonl", "read-notes/stdout.expected.jsonl"]
    log = [json.loads(line) for line in (d / "session.jsonl").read_text().splitlines()]
    assert log[0]["provider"] == "deepseek" and log[0]["model"] == "deepseek-flash"
    header = next(e for e in log if e["type"] == "request/header")
    assert header["system"] == "{{system}}" and header["tools"] == "{{tools}}"  # pinned once per class
    assert header["route"]["provider"] == "deepseek"
    first, _ = [e for e in log if e["type"] == "assistant/message"]
    assert first["message"]["content"][0] == {"type": "reasoning", "text": "Read the file first."}
    assert first["finish"] == "tool-calls" and first["usage"]["inputTokens"] > 0
    result = next(e for e in log if e["type"] == "tool/result")
    assert "alpha" in json.dumps(result)
    assert "The notes say alpha and beta." in (d / "stdout.expected.jsonl").read_text()
    system = (d.parent / "_headers" / "acp-agent" / "system-prompt.md").read_text()
    assert "{{cwd}}" in system and "/tmp/" not in system

    before = {p: p.read_bytes() for p in d.parent.rglob("*") if p.is_file()}
    assert "DEEPSEEK_API_KEY" not in os.environ
    assert run_and_check(load_scenario(d), "replay") == []  # the server is gone: all from the recording
    assert {p: p.read_bytes() for p in d.parent.rglob("*") if p.is_file()} == before


def test_replay_fails_when_a_tool_result_changes(recorded):
    d, _ = recorded
    (d / "workspace" / "notes.txt").write_text("gamma\n")
    with pytest.raises(ScenarioError) as err:
        run_and_check(load_scenario(d), "replay")
    assert "session.jsonl" in str(err.value) and "gamma" in str(err.value)


def test_replay_fails_loudly_when_the_prompt_diverges(recorded):
    d, _ = recorded
    inp = json.loads((d / "input.json").read_text())
    inp["steps"][2] = {"op": "prompt", "text": "something else", "expect": "error"}
    (d / "input.json").write_text(json.dumps(inp))
    with pytest.raises(ScenarioError, match=r"the replay failed:\n  replay: call 1 of session \w+ diverged: no "
                       r"unclaimed recording starts with the prompt \['something else'\] \(session.jsonl starts with"):
        run_and_check(load_scenario(d), "replay")


def test_refresh_rewrites_expectations_keylessly(recorded):
    d, _ = recorded
    stdout = (d / "stdout.expected.jsonl").read_text()
    (d / "stdout.expected.jsonl").write_text(stdout.replace("alpha and beta", "nothing"))
    with pytest.raises(ScenarioError, match=r"stdout\.expected\.jsonl"):
        run_and_check(load_scenario(d), "replay")
    assert run_and_check(load_scenario(d), "refresh") == [str(d / "stdout.expected.jsonl")]
    assert (d / "stdout.expected.jsonl").read_text() == stdout
    run_and_check(load_scenario(d), "replay")


def test_a_plugin_repository_gets_the_runs_from_one_pytest_option(recorded, tmp_path):
    """What a plugin author does: a conftest with dsh_testing, snapshots/ beside it, pytest."""
    d, _ = recorded
    repo = tmp_path  # snapshots/acp-agent/read-notes was recorded above
    (repo / "conftest.py").write_text('pytest_plugins = ["dsh_testing"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPSEEK_", "PYTEST_"))}

    def pytest_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "snapshots",
                               *args], cwd=repo, env=env, capture_output=True, text=True, timeout=300)

    out = pytest_run("-m", "snapshot_scenario")
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr
    (d / "stdout.expected.jsonl").write_text("{}\n")
    out = pytest_run()
    assert out.returncode == 1 and "scenario read-notes differs from its snapshots" in out.stdout
    out = pytest_run("--dsh-snapshots=refresh")
    assert out.returncode == 0, out.stdout + out.stderr
    assert pytest_run().returncode == 0
    out = pytest_run("--dsh-snapshots=record")  # recordable, but no key: the record run fails loudly
    assert out.returncode == 1


def test_parallel_subagents_record_and_replay_each_child_from_its_own_log(tmp_path):
    """Two children started by one model message (subagent-acp, separate processes): each replays
    from its own session.<n>.jsonl — bound by the prompt it sends, not by timing."""
    d = tmp_path / "snapshots" / "acp-agent-subagent" / "two-children"
    d.mkdir(parents=True)
    (d / "script.json").write_text(json.dumps({"rules": [
        {"when": "^fan out", "steps": [
            {"tools": [{"name": "subagent_acp", "args": {"task": "child one: count"}},
                       {"name": "subagent_acp", "args": {"task": "child two: spell"}}]},
            {"text": "children said: {tool_result}"}]},
        {"when": "^child one", "steps": [{"text": "ONE TWO THREE", "delay_ms": 200}]},
        {"when": "^child two", "steps": [{"text": "T-W-O"}]},
    ]}))
    (d / "input.json").write_text(json.dumps({
        "example": "acp-agent-subagent", "recordable": True,
        "record": {"provider": "scripted", "model": "{{scenario}}/script.json"},
        "steps": [{"op": "initialize"}, {"op": "newSession"}, {"op": "prompt", "text": "fan out", "expect": "end_turn"}],
    }))
    run_and_check(load_scenario(d), "record")
    logs = [d / "session.jsonl", d / "session.1.jsonl", d / "session.2.jsonl"]
    assert all(p.is_file() for p in logs) and not (d / "session.3.jsonl").exists()
    firsts = [json.loads(p.read_text().splitlines()[1])["message"]["content"][0]["text"] for p in logs]
    assert firsts == ["fan out", "child one: count", "child two: spell"]
    parent = logs[0].read_text()
    assert "ONE TWO THREE" in parent and "T-W-O" in parent  # both children's answers reached the parent
    (d / "script.json").unlink()  # replay needs no script: every answer is in the logs
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    run_and_check(load_scenario(d), "replay")
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before


def test_session_cwd_and_workspace_checks_run_on_every_replay(tmp_path):
    """newSession names a cwd inside the workspace; checkFiles says what the real tools left there."""
    d = tmp_path / "snapshots" / "acp-agent" / "write-in-sub"
    d.mkdir(parents=True)
    (d / "script.json").write_text(json.dumps({"rules": [{"when": "^write", "steps": [
        {"tool": "write", "args": {"file_path": "out.txt", "content": "hi\n"}}, {"text": "written"}]}]}))
    inp = {"example": "acp-agent", "recordable": True,
           "record": {"provider": "scripted", "model": "{{scenario}}/script.json"}, "mkdir": ["sub"],
           "steps": [{"op": "initialize"}, {"op": "newSession", "cwd": "sub"},
                     {"op": "prompt", "text": "write it", "expect": "end_turn"},
                     {"op": "checkFiles", "files": {"sub/out.txt": "hi\n", "out.txt": None, "sub": True}}]}
    (d / "input.json").write_text(json.dumps(inp))
    run_and_check(load_scenario(d), "record")
    log = [json.loads(line) for line in (d / "session.jsonl").read_text().splitlines()]
    assert log[0]["cwd"] == "{{cwd}}/sub"
    (d / "script.json").unlink()
    run_and_check(load_scenario(d), "replay")
    inp["steps"][-1]["files"] = {"sub/out.txt": "bye\n", "sub/missing": True, "sub": None}
    (d / "input.json").write_text(json.dumps(inp))
    with pytest.raises(ScenarioError) as err:
        run_and_check(load_scenario(d), "replay")
    assert ("step 3 (checkFiles): sub/out.txt holds 'hi\\n', expected 'bye\\n'; sub/missing does not exist; "
            "sub exists, expected no such file") in str(err.value)


def test_a_startup_error_is_a_scenario_with_a_pinned_stderr_and_no_session(tmp_path):
    """pinStderr: a plugin that fails activation (deepseek-model refusing its config) stops dsh run
    before the front door opens; exit code and stderr are the expectation, in replay as in record."""
    d = tmp_path / "snapshots" / "acp-agent" / "bad-config"
    d.mkdir(parents=True)
    (d / "input.json").write_text(json.dumps({"example": "acp-deepseek-bad-config", "recordable": True,
                                              "pinStderr": True, "steps": []}))
    assert "DEEPSEEK_API_KEY" not in os.environ
    assert run_and_check(load_scenario(d), "record") == [str(d / "stdout.expected.jsonl"),
                                                           str(d / "stderr.expected.txt")]
    stderr = (d / "stderr.expected.txt").read_text()
    assert stderr == ("exit code 2\ndsh: {{repo}}/tests/examples/acp-deepseek-bad-config/example.toml: "
                      "[config.deepseek-model] retry: expected `object`, found 'as often as it takes'\n")
    assert (d / "stdout.expected.jsonl").read_text().strip() == "" and not (d / "session.jsonl").exists()
    run_and_check(load_scenario(d), "replay")
    (d / "stderr.expected.txt").write_text("exit code 0\n")
    with pytest.raises(ScenarioError, match=r"stderr\.expected\.txt"):
        run_and_check(load_scenario(d), "replay")


def test_a_scenario_naming_a_sandbox_mechanism_the_machine_lacks_is_skipped(recorded, tmp_path):
    """A scenario whose env pins DSH_SANDBOX_MECHANISM (say, partial Landlock) skips — with the reason —
    where that mechanism is missing, like the per-mechanism ones; here bubblewrap, hidden from PATH."""
    d, _ = recorded
    inp = json.loads((d / "input.json").read_text())
    inp["env"] = {"DSH_SANDBOX_MECHANISM": "bwrap"}
    (d / "input.json").write_text(json.dumps(inp))
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["dsh_testing"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPSEEK_", "PYTEST_"))}
    without_bwrap = Path(__file__).resolve().parent.parent / ".ci" / "without-bwrap"
    out = subprocess.run([str(without_bwrap), sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
                          "snapshots"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "1 skipped" in out.stdout, out.stdout + out.stderr
    assert "bubblewrap is not installed" in out.stdout


def test_hook_durations_are_zeroed_in_the_normalized_log():
    from dsh_testing.scenarios import normalize_log_lines

    raw = "\n".join(json.dumps(r) for r in (
        {"type": "session", "id": "s"}, {"type": "hook/result", "durationMs": 22, "time": 5, "exitCode": 2}))
    text, _ = normalize_log_lines(raw, [])
    assert json.loads(text.splitlines()[1]) == {"type": "hook/result", "durationMs": 0, "time": 0, "exitCode": 2}


def test_the_workspace_copy_keeps_the_executable_bit(tmp_path):
    from dsh_testing.scenarios import _prepare_dirs

    scenario = tmp_path / "sc"
    (scenario / "workspace" / "hooks").mkdir(parents=True)
    (scenario / "workspace" / "hooks" / "deny.sh").write_text("#!/bin/sh\nexit 2\n")
    (scenario / "workspace" / "hooks" / "deny.sh").chmod(0o755)
    (scenario / "workspace" / "plain.txt").write_text("x\n")
    work, _, _ = _prepare_dirs(type("Sc", (), {"dir": scenario, "mkdir": []})(), tmp_path / "run")
    assert os.access(work / "hooks" / "deny.sh", os.X_OK) and not os.access(work / "plain.txt", os.X_OK)


def test_log_ids_are_numbered_by_first_appearance_so_a_swap_is_a_diff():
    """Two messages' ids never collapse into one placeholder: a log that swaps which result answers
    which call normalises to a different text (issue 28 item 7)."""
    from dsh_testing.scenarios import normalize_log_lines

    a, b = "a" * 32, "b" * 32
    header = '{"type": "session", "id": "s", "createdAt": 1}'
    one = "\n".join([header, f'{{"type": "x", "id": "msg_{a}", "ref": "msg_{b}"}}', f'{{"type": "y", "id": "msg_{b}"}}'])
    swapped = "\n".join([header, f'{{"type": "x", "id": "msg_{b}", "ref": "msg_{a}"}}', f'{{"type": "y", "id": "msg_{b}"}}'])
    text, _ = normalize_log_lines(one, [])
    assert '"id": "msg_{{id:1}}", "ref": "msg_{{id:2}}"' in text and '"id": "msg_{{id:2}}", "type": "y"' in text
    assert normalize_log_lines(swapped, [])[0] != text
