"""The README's ACP sample is what `dsh run --example acp-agent` answers today: its `->` lines are
sent to a real agent in order and every `<-` line must come back byte for byte (the session and
message ids, which are fresh per run, shown as the README abbreviates them)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from dsh_testing import REPO, minimal_env


def _sample() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("Drive it with any ACP client", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return [(line[:2], line[3:]) for line in block.splitlines() if line[:2] in ("->", "<-")]


def test_the_readme_sample_is_what_the_agent_says(tmp_path):
    lines = _sample()
    assert [d for d, _ in lines] == ["->", "<-", "->", "<-", "->", "<-", "<-"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_core.cli", "run", "--example", "acp-agent", "--provider", "scripted",
         "--model", "demo.json"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp_path,
        env=minimal_env(DSH_HOME=str(tmp_path / "home")),
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    ids: dict[str, str] = {}
    try:
        for direction, line in lines:
            if direction == "->":
                for real, shown in ids.items():
                    line = line.replace(shown, real)
                line = line.replace('"/work/repo"', json.dumps(str(tmp_path)))
                proc.stdin.write(line.encode() + b"\n")
                proc.stdin.flush()
                continue
            got = proc.stdout.readline().decode().rstrip("\n")
            for key, shown in re.findall(r'"(sessionId|messageId)":"([^"]*…)"', line):
                real = re.search(rf'"{key}":"([^"]*)"', got)
                assert real is not None, (line, got)
                ids[real.group(1)] = shown
            for real, shown in ids.items():
                got = got.replace(real, shown)
            assert got == line
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
