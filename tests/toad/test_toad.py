"""acp-editor in the real Toad (batrachian-toad, the terminal ACP client), driven through tmux:
what a person sees on the screen, not the frames. The frames are checked everywhere else (the
official SDK client against the schema); this is the check that a real client renders them.

Toad is installed, once per machine, into its own virtual environment (its pins clash with
dsh's test set: it never shares dsh's environment) under ``~/.cache/dsh-tests``. It declares
Python >= 3.14; on 3.13 it runs with ``compat/sitecustomize.py`` (see there). Where no Python >=
3.13 or no tmux is found, the test is skipped with the reason, except under ``CI`` (CI's machine
has both, so a skip there would hide a broken set-up).

Toad is told to expand every tool card (``tools.expand = "always"``; by default it folds a
successful one) and to collect no usage data; an HTTPS proxy on a closed local port keeps its
version check on this machine.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dsh_testing.harness import minimal_env

TOAD = "batrachian-toad==0.6.20"
COMPAT = Path(__file__).parent / "compat"
MARK = "\u276f"  # Toad marks a prompt the person sent with this sign


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI must be able to run Toad: {reason}")
    pytest.skip(reason)


def _python_for_toad() -> tuple[str, tuple[int, int]] | None:
    """The newest Python >= 3.13 on this machine: on PATH, else a pyenv build."""
    candidates = [shutil.which(f"python3.{minor}") for minor in (16, 15, 14, 13)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv.is_dir():
        candidates += [str(p / "bin" / "python3") for p in sorted(pyenv.iterdir(), reverse=True)]
    best: tuple[str, tuple[int, int]] | None = None
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "-c", "import sys, venv; print(*sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout.split()
        except (OSError, subprocess.SubprocessError):
            continue
        version = (int(out[0]), int(out[1]))
        if version >= (3, 13) and (best is None or version > best[1]):
            best = (exe, version)
    return best


@pytest.fixture(scope="module")
def toad_program() -> tuple[Path, bool]:
    """Toad's executable, and whether it needs the 3.13 compatibility shim."""
    if shutil.which("tmux") is None:
        _unavailable("tmux is not installed (Debian package tmux)")
    found = _python_for_toad()
    if found is None:
        _unavailable("no Python >= 3.13 here (Toad needs one)")
    exe, version = found  # type: ignore[misc]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dsh-tests"
    venv = cache / f"{TOAD.replace('==', '-')}-py{version[0]}{version[1]}"
    program = venv / "bin" / "toad"
    complete = venv / ".installed"
    if not complete.exists():
        # built where it will live (a venv's scripts name their interpreter by absolute path);
        # an unfinished one (no marker) is built again
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([exe, "-m", "venv", str(venv)], check=True, timeout=300)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        if version < (3, 14):
            pip.append("--ignore-requires-python")
        done = subprocess.run([*pip, TOAD], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            _unavailable(f"could not install {TOAD}: {done.stderr.strip()[-800:]}")
        complete.write_text(TOAD)
    return program, version < (3, 14)


class Screen:
    """One tmux session (its own server socket) running one program; the screen as text."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              timeout=30).stdout

    def text(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-200")

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 60.0, what: str = "") -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if predicate(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"not on the screen after {timeout} s: {what}\n--- screen ---\n{text}")
            time.sleep(0.2)

    def wait_text(self, needle: str, timeout: float = 60.0) -> str:
        return self.wait_for(lambda t: needle in t, timeout, repr(needle))

    def send_prompt(self, text: str) -> None:
        """Type ``text`` into the prompt and send it. Toad drops keys while its input is not
        there yet (at start, or just after a permission question closed) and takes Enter only
        once its agent is ready, so the text is typed again while the input box is empty, and
        Enter repeated until the prompt leaves the box and shows in the conversation."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if f"▊ {MARK} {text}" not in self.text():
                if "How can I help you today?" in self.text():
                    self.tmux("send-keys", "-l", text)
                time.sleep(0.5)
                continue
            self.tmux("send-keys", "Enter")
            try:
                self.wait_for(lambda t: f"▌ {MARK} {text}" in t, timeout=2.0)
                return
            except AssertionError:
                continue
        raise AssertionError(f"Toad never sent the prompt {text!r}\n--- screen ---\n{self.text()}")


@pytest.fixture
def toad(toad_program: tuple[Path, bool], tmp_path: Path) -> Iterator[Callable[..., Screen]]:
    program, compat = toad_program
    sockets: list[str] = []

    def start(script: dict | None, *, workspace: Path, example: str = "acp-editor", launcher: bool = False) -> Screen:
        """Toad on ``dsh run --example EXAMPLE`` with the scripted model playing ``script``; with
        ``launcher``, Toad's own start screen instead (from which a recorded session is resumed)."""
        if script is not None:
            (tmp_path / "script.json").write_text(json.dumps(script))
        home = tmp_path / "toad-home"
        config = home / ".config" / "toad"
        config.mkdir(parents=True, exist_ok=True)
        (config / "toad.json").write_text(json.dumps({
            "tools": {"expand": "always"}, "statistics": {"allow_collect": False}}))
        dsh = Path(sys.executable).parent / "dsh"
        agent = tmp_path / "agent.sh"
        # dsh gets what the official SDK gives an agent it spawns (dsh_testing.minimal_env), with
        # this test's data and config dirs
        dsh_env = minimal_env(DSH_HOME=str(tmp_path / "dsh-home"), DSH_CONFIG_HOME=str(tmp_path / "dsh-config"))
        agent.write_text(
            "#!/bin/sh\n"
            f"exec env -i {' '.join(shlex.quote(f'{k}={v}') for k, v in dsh_env.items())} "
            f"{shlex.quote(str(dsh))} run --example {example} --provider scripted "
            f"--model {shlex.quote(str(tmp_path / 'script.json'))} 2>>{shlex.quote(str(tmp_path / 'dsh.err'))}\n")
        agent.chmod(0o755)
        env = {
            "HOME": str(home), "PATH": os.environ["PATH"], "TERM": "xterm-256color", "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            # its version check and any other request leave no machine: a closed local port
            "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "",
        }
        if compat:
            env["PYTHONPATH"] = str(COMPAT)
        args = [str(workspace)] if launcher else ["acp", str(agent), str(workspace)]
        command = " ".join(["env", "-i", *(shlex.quote(f"{k}={v}") for k, v in env.items()),
                            shlex.quote(str(program)), *map(shlex.quote, args)])
        socket = f"dsh-toad-{uuid.uuid4().hex[:12]}"
        sockets.append(socket)
        screen = Screen(socket)
        subprocess.run(["tmux", "-L", socket, "-f", "/dev/null", "new-session", "-d", "-x", "160", "-y", "60",
                        "-c", str(workspace), command], check=True, timeout=30)
        screen.tmux("set-option", "-g", "remain-on-exit", "on")
        screen.wait_text("^r Resume" if launcher else "How can I help you today?")
        return screen

    def stop(screen: Screen) -> None:
        subprocess.run(["tmux", "-L", screen.socket, "kill-server"], capture_output=True, timeout=30)

    start.stop = stop  # type: ignore[attr-defined]
    yield start
    for socket in sockets:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=30)


def _notes_workspace(tmp_path: Path) -> Path:
    """A workspace holding notes.txt (``alpha``, ``beta``): the file the edit tests change."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    return workspace


def test_a_session_in_toad_streams_and_shows_the_edit_as_a_diff(toad, tmp_path: Path) -> None:
    workspace = _notes_workspace(tmp_path)
    script = {"rules": [{"when": "(?i)edit", "steps": [
        {"tool": "read", "args": {"file_path": "notes.txt"}},
        {"partial": "Editing the notes ", "mark": "streamed", "delay_ms": 3000, "text": "in place.",
         "tool": "edit", "args": {"file_path": "notes.txt", "old_string": "beta", "new_string": "BETA-EDITED"}},
        {"text": "All done: EDIT-FINISHED"},
    ]}], "default": [{"text": "echo: {prompt}"}]}
    screen = toad(script, workspace=workspace)
    screen.send_prompt("please edit the notes")

    # streaming: the first words are on the screen while the model is still writing
    shown = screen.wait_text("Editing the notes")
    assert "in place." not in shown and "EDIT-FINISHED" not in shown

    screen.wait_text("EDIT-FINISHED")
    # the edit's tool card, expanded, with its diff: the old and the new line side by side
    done = screen.wait_text("(+1, -1)", timeout=10)
    assert "Editing the notes in place." in done
    assert "edit notes.txt" in done
    # line 2 before and after: side by side when the pane is wide, else one above the other
    assert re.search(r"▎[\d ]*\bbeta\b.*?▎[\d ]*BETA-EDITED", done, re.S), done
    assert (workspace / "notes.txt").read_text() == "alpha\nBETA-EDITED\n"


def test_a_session_reopened_in_toad_shows_its_tool_cards(toad, tmp_path: Path) -> None:
    workspace = _notes_workspace(tmp_path)
    script = {"rules": [{"when": "(?i)edit", "steps": [
        {"tool": "read", "args": {"file_path": "notes.txt"}},
        {"tool": "edit", "args": {"file_path": "notes.txt", "old_string": "beta", "new_string": "BETA-EDITED"}},
        {"tool": "bash", "args": {"command": "echo SHELL-SAID-$((40+2))", "description": "Say it"}},
        {"text": "All done: EDIT-FINISHED"},
    ]}], "default": [{"text": "echo: {prompt}"}]}
    screen = toad(script, workspace=workspace)
    screen.send_prompt("please edit the notes")
    screen.wait_text("EDIT-FINISHED")
    toad.stop(screen)

    # Toad's own start screen: ^r lists the sessions it ran (newest first); Enter resumes one,
    # which starts dsh again and asks it for session/load
    launcher = toad(None, workspace=workspace, launcher=True)
    launcher.tmux("send-keys", "C-r")
    launcher.wait_text("Not all ACP agents currently support resume")  # the resume dialog
    deadline = time.monotonic() + 60
    while "Not all ACP agents currently support resume" in launcher.text():  # an Enter Toad drops is sent again
        assert time.monotonic() < deadline, launcher.text()
        launcher.tmux("send-keys", "Enter")
        time.sleep(2)
    shown = launcher.wait_text("EDIT-FINISHED")
    assert f"{MARK} please edit the notes" in shown
    shown = launcher.wait_text("SHELL-SAID-42", timeout=10)  # the bash card's output, replayed
    for card in ("read notes.txt", "edit notes.txt", "bash: echo SHELL-SAID"):
        assert card in shown, card
    assert shown.index("read notes.txt") < shown.index("edit notes.txt") < shown.index("EDIT-FINISHED")


def test_toad_remembers_an_approval_and_queues_a_prompt_sent_during_a_turn(toad, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()

    def escalate(n: int) -> list[dict]:
        return [{"tool": "bash", "args": {
            "command": f"echo wrote-{n} > {outside}/report-{n}.txt && cat {outside}/report-{n}.txt",
            "description": "Write the report", "sandbox_permissions": "danger-full-access",
            "justification": "write the report outside the workspace"}},
            {"text": f"REPORT-{n}-DONE: {{tool_result}}"}]

    script = {"rules": [
        {"when": "first report", "steps": escalate(1)},
        {"when": "second report", "steps": escalate(2)},
        {"when": "slow", "steps": [{"partial": "Working slowly ", "mark": "slow-started", "delay_ms": 15000,
                                    "text": "SLOW-DONE"}]},
    ], "default": [{"text": "echo: {prompt}"}]}
    screen = toad(script, workspace=workspace)

    # the first escalation asks, with the remembered kinds offered; "A" is Toad's key for allow_always
    screen.send_prompt("write the first report")
    asked = screen.wait_text("Always allow bash in danger-full-access for this session")
    assert "Allow once" in asked and "Always reject bash in danger-full-access" in asked
    screen.tmux("send-keys", "A")
    screen.wait_text("REPORT-1-DONE: wrote-1")
    # the same escalation again: answered by the rule. Nobody presses a key now, so had Toad been
    # asked, the turn would wait on its question and never finish
    screen.send_prompt("write the second report")
    screen.wait_text("REPORT-2-DONE: wrote-2")
    assert (outside / "report-2.txt").read_text() == "wrote-2\n"
    screen.send_prompt("/approvals")
    listed = screen.wait_text("Remembered approvals in this session")
    assert re.search(r"always allow\W+bash\W+in danger-full-access", listed), listed

    # a prompt sent while a turn runs waits for it and gets its own answer (Toad showed
    # "Failed to send prompt" when dsh refused it). The slow turn lasts long enough for Toad to
    # take the second prompt while it runs (an Enter it drops is sent again).
    screen.send_prompt("go slow")
    deadline = time.monotonic() + 30
    while not (workspace / "slow-started").exists():
        assert time.monotonic() < deadline, screen.text()
        time.sleep(0.1)
    screen.send_prompt("and then this")
    sent = screen.text()
    assert "SLOW-DONE" not in sent, sent  # sent while the first turn still ran
    shown = screen.wait_text("echo: and then this", timeout=60)
    assert "Failed to send prompt" not in shown
    assert shown.index("SLOW-DONE") < shown.index("echo: and then this")
