"""``dsh sessions export`` over real session logs: every session the snapshot scenarios recorded,
and sessions written here for what no scenario records (a planted key, markup in tool output,
priced DeepSeek calls). The command runs as a real ``dsh`` process."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from dsh_deepseek_model import DeepSeekProvider, Settings
from recorded import answer, asks, prompt, run_dsh, tool_result, write_log

from dsh_core.types import ApprovalAsked, ApprovalDecided, SessionHeader, SubagentStarted, TurnEnd, TurnStart, Usage

KEY = "sk-planted0123456789abcdef0123456789"
# run, either would mark the page (<html data-pwned>); the image would also ask for file:///…/x
XSS = '<script>document.documentElement.dataset.pwned=1</script><img src=x onerror="document.documentElement.dataset.pwned=2">'


def _island(html: str) -> dict:
    m = re.search(r'<script id="session-data" type="application/json">(.*?)</script>', html, re.S)
    assert m, "no JSON island"
    return json.loads(m.group(1))


def test_every_recorded_session_exports_as_html_and_markdown(recorded_store, tmp_path):
    """One real `dsh sessions export --all --html DIR` over every session the scenarios recorded
    (their subagents nested in their parents' pages), then --md of each top-level one in-process."""
    home, _recorded = recorded_store
    out = tmp_path / "site"
    done = run_dsh(home, "--all", "--html", str(out))
    assert done.returncode == 0, done.stderr
    assert "sessions export:" not in done.stderr, done.stderr  # no session failed
    index = (out / "index.html").read_text()
    tops = [p for p in (home / "sessions").glob("*.jsonl")
            if json.loads(p.read_text().split("\n", 1)[0]).get("parentSession") is None]
    assert len(tops) > 80
    for p in tops:
        assert f'href="{p.stem}.html"' in index
        page = (out / f"{p.stem}.html").read_text()
        doc = _island(page)
        assert doc["id"] == p.stem and f'data-total="turns">{doc["totals"]["turns"]}<' in page

    from dsh_jsonl_persistence.store import JsonlStore
    from dsh_session_export.cli import export_one
    from dsh_session_export.model import Loader
    from dsh_session_export.pricing import Prices
    from dsh_session_export.secrets import Scrubber

    loader = Loader(JsonlStore(home / "sessions"), Prices({}))
    every = sorted((home / "sessions").glob("*.jsonl"))
    assert len(every) > len(tops)  # subagents' sessions too, each also on its own
    for p in every:
        md = export_one(loader, Scrubber([]), p.stem, md=True)
        assert md.startswith("# ") and f"session `{p.stem}`" in md
        assert _island(export_one(loader, Scrubber([]), p.stem, md=False))["id"] == p.stem


def test_all_for_one_project(tmp_path):
    home = tmp_path / "home"
    for sid, cwd in (("a1", "/proj/a"), ("a2", "/proj/a"), ("b1", "/proj/b")):
        write_log(home / "sessions", SessionHeader(id=sid, cwd=cwd, provider="scripted", model="m"),
                  [prompt(f"task of {sid}")])
    site = tmp_path / "site"
    done = run_dsh(home, "--all", "--html", str(site), "--cwd", "/proj/a")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in site.iterdir()) == ["a1.html", "a2.html", "index.html"]
    index = (site / "index.html").read_text()
    assert '<a href="a1.html">task of a1</a>' in index and "2 session(s)" in index


def test_a_subagent_is_nested_under_the_call_that_started_it(recorded_store):
    home, recorded = recorded_store
    [rec] = [r for r in recorded if r.scenario == "acp-agent/spawn-report"]
    parent, child = rec.ids
    done = run_dsh(home, parent, "--html")
    assert done.returncode == 0, done.stderr
    doc = _island(done.stdout)
    [call] = [r for r in doc["rows"] if r["k"] == "call" and r["name"] == "subagent"]
    assert call["children"] == [child]
    assert [c["id"] for c in doc["children"]] == [child]
    assert any(r["k"] == "call" and r["name"] == "report" for r in doc["children"][0]["rows"])
    md = run_dsh(home, parent, "--md").stdout
    assert f"### Subagent session `{child}`" in md and "REPORTER_DONE" in md


def test_an_edit_is_a_diff_in_both_forms_and_approvals_say_who_answered(recorded_store):
    home, recorded = recorded_store
    [edit] = [r for r in recorded if r.scenario == "acp-agent/fs-edit"]
    md = run_dsh(home, edit.ids[0], "--md").stdout
    assert "```diff\n--- a/notes.txt\n+++ b/notes.txt\n@@ -1,3 +1,3 @@\n alpha\n-beta\n+BETA\n gamma\n```" in md
    doc = _island(run_dsh(home, edit.ids[0], "--html").stdout)
    [call] = [r for r in doc["rows"] if r["k"] == "call" and r["name"] == "edit"]
    assert "-beta\n+BETA" in call["diff"] and call["status"] == "ok"
    [esc] = [r for r in recorded if r.scenario == "acp-agent/bash-escalation-approved"]
    md = run_dsh(home, esc.ids[0], "--md").stdout
    assert re.search(r"approval asked: escalate sandbox to danger-full-access: .* → \*\*allowed-once\*\* by acp", md)


def test_compactions_cancels_and_errors_are_marked_where_they_happened(recorded_store):
    home, recorded = recorded_store
    by = {r.scenario: r.ids[0] for r in recorded if r.ids}
    kinds = {}
    for name in ("acp-agent/compaction-pressure", "acp-agent/cancel", "acp-agent/error-finish"):
        doc = _island(run_dsh(home, by[name], "--html").stdout)
        kinds[name] = {r["kind"] for r in doc["rows"] if r["k"] == "mark"}
    assert "compaction" in kinds["acp-agent/compaction-pressure"]
    assert "cancel" in kinds["acp-agent/cancel"]
    assert "error" in kinds["acp-agent/error-finish"]


def _session(sessions: Path, *, result: str, path: str = "notes.txt", sid: str = "s-planted") -> str:
    route = {"provider": "deepseek", "model": "deepseek-flash"}
    t0 = 1_764_900_000.0
    h = SessionHeader(id=sid, created_at=t0, cwd="/w", **route)
    args = json.dumps({"file_path": path, "content": "new\n"})
    return write_log(sessions, h, [
        prompt(f"write {path}", id="m1", time=t0),
        TurnStart(time=t0 + 0.1, turn=1),
        asks(1, 1, "c1", "write", args, id="a1", **route, time=t0 + 2.1,
             usage=Usage(input_tokens=1000, output_tokens=200, cache_hit_tokens=600)),
        ApprovalAsked(time=t0 + 2.2, id="ap1", tool_name="write", call_id="c1", reason="write outside the workspace"),
        ApprovalDecided(time=t0 + 3.0, id="ap1", outcome="allowed-once", answered_by="acp"),
        tool_result(1, 1, "c1", "write", result, time=t0 + 3.1),
        answer(1, 2, "done", id="a2", **route, time=t0 + 4.1, usage=Usage(input_tokens=1300, output_tokens=10)),
        TurnEnd(time=t0 + 4.2, turn=1, reason="completed"),
    ])


def test_a_planted_key_never_appears(tmp_path):
    """The key in the environment, and the key `dsh auth login` stored in its file, are scrubbed
    from a tool result, a file name and the title, in both forms."""
    home = tmp_path / "home"
    stored = "sk-stored9876543210fedcba9876543210"
    sid = _session(home / "sessions", result=f"env says DEEPSEEK_API_KEY={KEY} and file has {stored}",
                   path=f"leak-{KEY}.txt")
    creds = tmp_path / "cfg" / "credentials"
    creds.mkdir(parents=True)
    (creds / "deepseek-api-key").write_text(stored)
    os.chmod(creds / "deepseek-api-key", 0o600)
    env = {"DEEPSEEK_API_KEY": KEY, "DSH_CONFIG_HOME": str(tmp_path / "cfg")}
    for form in ("--html", "--md"):
        done = run_dsh(home, sid, form, env=env)
        assert done.returncode == 0, done.stderr
        assert KEY not in done.stdout and stored not in done.stdout
        assert "DEEPSEEK_API_KEY=[redacted] and file has [redacted]" in done.stdout
        assert KEY not in done.stderr
    site = tmp_path / "site"
    assert run_dsh(home, "--all", "--html", str(site), env=env).returncode == 0
    for page in site.iterdir():
        assert KEY not in page.read_text() and stored not in page.read_text()
    # without the key in the environment it is shown as it was logged: the scrub is what hid it
    assert KEY in run_dsh(home, sid, "--md").stdout


def test_markup_in_tool_output_and_file_names_is_text(tmp_path):
    home = tmp_path / "home"
    sid = _session(home / "sessions", result=f"output {XSS}", path=f"{XSS}.txt")
    html = run_dsh(home, sid, "--html").stdout
    assert "<script>document" not in html and "<img" not in html  # only the page's own two scripts
    assert html.count("<script") == 2
    doc = _island(html)
    [call] = [r for r in doc["rows"] if r["k"] == "call"]
    assert XSS in call["result"] and json.dumps(f"{XSS}.txt") in call["args"]  # the data is intact, shown as text
    assert f"<title>write {XSS}" not in html and "write &lt;script&gt;document.documentElement.dataset.pwned=1&lt;/script&gt;" in html
    md = run_dsh(home, sid, "--md").stdout
    assert "write &lt;script>document.documentElement.dataset.pwned=1&lt;/script>" in md  # outside code fences, escaped
    assert f"output {XSS}\n```" in md  # inside a fence, verbatim


def test_costs_come_from_the_providers_price_table(tmp_path):
    home = tmp_path / "home"
    sid = _session(home / "sessions", result="ok")
    done = run_dsh(home, sid, "--html")
    assert done.returncode == 0, done.stderr
    doc = _island(done.stdout)
    provider = DeepSeekProvider(Settings())
    calls = [(Usage(input_tokens=1000, output_tokens=200, cache_hit_tokens=600), 1_764_900_002.1),
             (Usage(input_tokens=1300, output_tokens=10), 1_764_900_004.1)]
    costs = [provider.cost("deepseek-flash", u, at) for u, at in calls]
    total = sum(c.amount for c in costs)
    assert doc["totals"]["cost"] == f"{total:.6f} USD"
    assert doc["totals"] | {} == doc["totals"] and doc["totals"]["input"] == 2300 and doc["totals"]["cached"] == 600
    assert doc["totals"]["output"] == 210 and doc["totals"]["turns"] == 1 and doc["totals"]["seconds"] == 4.1
    models = [r for r in doc["rows"] if r["k"] == "model"]
    assert [m["cost"] for m in models] == [f"{c.amount:.6f} USD" for c in costs]
    assert models[0]["seconds"] == 2.0  # from the turn's start to the answer
    [turn] = [r for r in doc["rows"] if r["k"] == "turn"]
    assert turn["cost"] == f"{total:.6f} USD" and turn["tokens"] == {"input": 2300, "output": 210, "cached": 600}
    [call] = [r for r in doc["rows"] if r["k"] == "call"]
    assert call["approvals"] == [{"id": "ap1", "reason": "write outside the workspace", "tool": "write",
                                  "outcome": "allowed-once", "by": "acp"}]
    assert "the file's earlier text is not in the log" in call["note"] and "+new" in call["diff"]


def test_a_child_session_missing_from_the_store_is_named(tmp_path):
    home = tmp_path / "home"
    h = SessionHeader(id="p1", cwd="/w", provider="scripted", model="m")
    write_log(home / "sessions", h, [
        TurnStart(turn=1),
        asks(1, 1, "c1", "subagent", "{}"),
        SubagentStarted(id="sub1", provider="local", description="d", call_id="c1", session="gone"),
        TurnEnd(turn=1, reason="completed"),
    ])
    done = run_dsh(home, "p1", "--md")
    assert done.returncode == 0, done.stderr
    assert "Subagent session `gone`" in done.stdout and "not in this store" in done.stdout


def test_a_cycle_of_tampered_parent_links_ends(tmp_path):
    home = tmp_path / "home"
    for sid, other in (("p", "c"), ("c", "p")):
        write_log(home / "sessions", SessionHeader(id=sid, cwd="/w", parent_session=other if sid == "c" else None), [
            TurnStart(turn=1),
            asks(1, 1, "k", "subagent", "{}"),
            SubagentStarted(id="x", provider="local", description="d", call_id="k", session=other),
            TurnEnd(turn=1, reason="completed"),
        ])
    done = run_dsh(home, "--html", "p")  # the id after --html works too
    assert done.returncode == 0, done.stderr
    doc = _island(done.stdout)
    assert [c["id"] for c in doc["children"]] == ["c"] and doc["children"][0]["children"] == []


def test_usage_errors(tmp_path):
    home = tmp_path / "home"
    assert "needs a session ID" in run_dsh(home, "--md").stderr
    assert "needs --html DIR" in run_dsh(home, "--all", "--md").stderr
    assert "no session 'nope'" in run_dsh(home, "nope", "--md").stderr
