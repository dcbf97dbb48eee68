"""`dsh batch --report` and `dsh batch report`, as real subprocesses over real agents: the page's
rows, its numbers against the results file, its plots, that it fetches nothing, that a prompt's
markup stays text; and the page of an older results file, priced by the real DeepSeek price table."""

from __future__ import annotations

import calendar
import csv
import json
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from batchkit import REPO, batch_env, read_results, run_batch, scripted_batch, write_jsonl

from dsh_testing.browser import Page as BrowserPage

USAGE = {"inputTokens": 1200, "outputTokens": 300, "cacheHitTokens": 1000}
SCRIPT = {
    "rules": [
        {"when": "^answer", "steps": [{"text": "answer to {prompt}", "usage": USAGE}]},
        {"when": "^fail", "steps": [{"error": "auth"}]},
        {"when": "^guarded", "steps": [
            {"tool": "guarded_write", "args": {"path": "out.txt", "content": "x"}, "usage": USAGE},
            {"text": "tool said: {tool_result}", "usage": USAGE},
        ]},
    ]
}  # fmt: skip
PROMPT_WITH_MARKUP = 'answer <script>alert("x")</script> & <b>bold</b>'
TASKS = [
    {"id": "a1", "prompt": "answer one"},
    {"id": "f1", "prompt": "fail now"},
    {"id": "g1", "prompt": "guarded write"},
    {"id": "x1", "prompt": PROMPT_WITH_MARKUP},
]
# what each task's session did, by the script: (turns, tool calls, model calls, usage)
EXPECTED = {
    "a1": (1, 0, 1, USAGE),
    "f1": (1, 0, 0, None),
    "g1": (1, 1, 2, {k: 2 * v for k, v in USAGE.items()}),
    "x1": (1, 0, 1, USAGE),
}


class Page(HTMLParser):
    """What the report page holds: its rows (cell texts), tags, and every src/href."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self.tags: list[str] = []
        self.links: list[str] = []
        self.sections: dict[str, str] = {}
        self._row: str | None = None
        self._cells: list[str] = []
        self._in_cell = False
        self._section: str | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self.links += [v for k, v in attrs if k in ("src", "href", "xlink:href") and v is not None]
        if tag == "tr" and "data-id" in a:
            self._row, self._cells = a["data-id"], []
        elif tag == "td" and self._row is not None:
            self._cells.append("")
            self._in_cell = True
        elif tag == "section":
            self._section = a.get("id")
            self.sections[self._section or ""] = ""
        elif self._section is not None:
            self.sections[self._section] += f"<{tag}>"

    def handle_endtag(self, tag):
        if tag == "td":
            self._in_cell = False
        elif tag == "tr" and self._row is not None:
            self.rows[self._row] = [c.strip() for c in self._cells]
            self._row = None
        elif tag == "section":
            self._section = None

    def handle_data(self, data):
        if self._in_cell and self._cells:
            self._cells[-1] += data


def dsh_batch(cwd: Path, home: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsh_core.cli", "batch", *argv], cwd=cwd, env=batch_env(home),
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip


def no_external_fetch(page: Page, text: str) -> None:
    assert page.links and all(not re.match(r"(?i)(https?:)?//", link) for link in page.links), page.links
    assert "script" not in page.tags and "link" not in page.tags and "iframe" not in page.tags
    assert not re.search(r"(?i)url\(\s*['\"]?(https?:)?//", text)
    assert not re.search(r"(?i)@import", text)


@pytest.fixture
def setup(tmp_path: Path):
    return scripted_batch(tmp_path, SCRIPT)


def test_a_batch_report_has_a_row_per_task_its_numbers_plots_and_fetches_nothing(setup, chromium_browser):
    browser = chromium_browser
    tmp, home, args = setup
    tasks = write_jsonl(tmp / "tasks.jsonl", TASKS)
    out, html = tmp / "results.jsonl", tmp / "report.html"
    proc = run_batch(tasks, out, *args, "--report", str(html), home=home, cwd=tmp)
    assert proc.returncode == 1, proc.stderr.decode()[-3000:]  # f1 failed
    results = {r["id"]: r for r in read_results(out)}
    # the result lines carry the numbers of the session log
    for task_id, (turns, tool_calls, model_calls, usage) in EXPECTED.items():
        r = results[task_id]
        assert (r["turns"], r["toolCalls"], r["modelCalls"], r["usage"]) == (turns, tool_calls, model_calls, usage)
        assert r["cost"] is None  # the scripted provider prices nothing
    assert results["f1"]["status"] == "failed" and results["g1"]["status"] == "ok"

    data = json.loads((tmp / "report.json").read_text())
    rows = {row["id"]: row for row in data["tasks"]}
    assert [row["id"] for row in data["tasks"]] == [t["id"] for t in TASKS]
    for task_id, row in rows.items():
        r = results[task_id]
        usage = r["usage"] or {}
        assert row["status"] == r["status"]
        assert row["seconds"] == r["durationMs"] / 1000
        assert (row["turns"], row["toolCalls"], row["modelCalls"]) == (r["turns"], r["toolCalls"], r["modelCalls"])
        assert (row["inputTokens"], row["outputTokens"], row["cachedTokens"]) == (
            (usage["inputTokens"], usage["outputTokens"], usage["cacheHitTokens"]) if usage else (None, None, None))
        assert row["cost"] is None
        assert row["sessionPage"] == f"sessions/{r['sessionId']}.html"
    assert rows["x1"]["prompt"] == PROMPT_WITH_MARKUP
    assert rows["f1"]["error"] == "agent_error: Internal error: turn failed: simulated provider error (HTTP 401)"
    totals = data["totals"]
    assert (totals["tasks"], totals["ok"], totals["failed"], totals["interrupted"]) == (4, 3, 1, 0)
    assert (totals["turns"], totals["toolCalls"]) == (4, 1)
    assert (totals["inputTokens"], totals["outputTokens"], totals["cachedTokens"]) == (4800, 1200, 4000)
    assert totals["cost"] == {} and totals["unpriced"] == 4

    with open(tmp / "report.csv", newline="") as f:
        table = {row["id"]: row for row in csv.DictReader(f)}
    assert table.keys() == rows.keys()
    assert table["g1"]["toolCalls"] == "1" and table["g1"]["inputTokens"] == "2400" and table["f1"]["cost"] == ""

    text = html.read_text()
    page = Page(text)
    assert list(page.rows) == [t["id"] for t in TASKS]
    # task, status, prompt, turns, tool calls, time, in, out, cached, cost, session
    g1 = page.rows["g1"]
    assert g1[1] == "ok" and g1[2] == "guarded write" and g1[3:5] == ["1", "1"]
    assert g1[5] == f"{rows['g1']['seconds']:.2f}" and g1[6:10] == ["2,400", "600", "2,000", "—"]
    assert g1[10] == results["g1"]["sessionId"][:12]
    assert page.rows["f1"][1] == "failed" and "simulated provider error (HTTP 401)" in page.rows["f1"][2]
    assert page.rows["f1"][6:9] == ["—", "—", "—"]
    # the user's markup is text: shown as written, never an element
    assert page.rows["x1"][2] == PROMPT_WITH_MARKUP
    assert "&lt;script&gt;" in text and "<script>" not in text and "<b>bold" not in text
    # the time plot is an inline SVG of matplotlib's; no cost plot without a price
    assert "<svg>" in page.sections["plot-time"] and "<path>" in page.sections["plot-time"]
    assert "<svg>" not in page.sections["plot-cost"] and "No cost plot" in text
    assert f'href="sessions/{results["a1"]["sessionId"]}.html"' in text
    no_external_fetch(page, text)
    assert b"dsh batch: report: " in proc.stderr

    # what a person sees in a real browser: the rows, the prompt as text, the plot; nothing fetched
    view = BrowserPage(browser, html, ready="#tasks")
    try:
        seen = view.page.evaluate("""() => ({
            rows: [...document.querySelectorAll("#tasks tbody tr")].map(r => r.dataset.id + ":" + r.dataset.status),
            prompt: document.querySelector('tr[data-id="x1"] .prompt').textContent,
            scripts: document.scripts.length,
            plotWidth: document.querySelector("#plot-time svg").getBoundingClientRect().width,
            failed: document.querySelector('tr[data-id="f1"] .error').textContent,
        })""")  # fmt: skip
        assert seen == {"rows": ["a1:ok", "f1:failed", "g1:ok", "x1:ok"], "prompt": PROMPT_WITH_MARKUP, "scripts": 0,
                        "plotWidth": seen["plotWidth"], "failed": rows["f1"]["error"]}  # fmt: skip
        assert seen["plotWidth"] > 300
        view.clean()  # no console error; the page itself, and nothing else, was requested
    finally:
        view.close()


# A Saturday, 12:00 UTC: DeepSeek's off-peak price whatever day the test runs on.
OFF_PEAK = calendar.timegm((2026, 11, 28, 12, 0, 0))


def flash_price(usage: dict[str, int]) -> float:
    """deepseek-flash per million tokens off-peak: 0.003 cached input, 0.15 other input, 0.60 output
    (DeepSeek's price list, as the deepseek-model plugin's table has it)."""
    hit = usage.get("cacheHitTokens", 0)  # the log omits a zero
    return (hit * 0.003 + (usage["inputTokens"] - hit) * 0.15 + usage["outputTokens"] * 0.60) / 1e6


def test_report_of_an_older_results_file_reads_the_logs_and_prices_deepseek_calls(setup):
    """`dsh batch report RESULTS -o PAGE` without rerunning: result lines without the new keys (as
    an older dsh wrote them) get their numbers from the session logs, and calls on a priced route
    are priced by the provider of the example (`-e acp-agent` mounts deepseek-model)."""
    tmp, home, args = setup
    tasks = write_jsonl(tmp / "tasks.jsonl", TASKS)
    out = tmp / "results.jsonl"
    proc = run_batch(tasks, out, *args, home=home, cwd=tmp)
    assert proc.returncode == 1, proc.stderr.decode()[-3000:]
    results = read_results(out)
    # the calls as if DeepSeek's flash model had made them, off-peak
    for log in (home / "sessions").glob("*.jsonl"):
        lines = []
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("type") == "assistant/message":
                event["message"].update(provider="deepseek", model="deepseek-flash")
                event["time"] = OFF_PEAK
            lines.append(json.dumps(event))
        log.write_text("\n".join(lines) + "\n")
    old = [{k: v for k, v in r.items() if k not in ("turns", "toolCalls", "modelCalls", "cost")} for r in results]
    write_jsonl(out, old)

    html = tmp / "page.html"
    done = dsh_batch(tmp, home, "report", str(out), "-o", str(html), "-e", "acp-agent")
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert not done.stdout
    assert out.read_text() == "".join(json.dumps(r) + "\n" for r in old)  # read, never rewritten
    data = json.loads((tmp / "page.json").read_text())
    rows = {row["id"]: row for row in data["tasks"]}
    for task_id, (turns, tool_calls, model_calls, usage) in EXPECTED.items():
        row = rows[task_id]
        assert (row["turns"], row["toolCalls"], row["modelCalls"]) == (turns, tool_calls, model_calls)
        if usage is None:
            assert row["cost"] is None
        else:
            assert row["cost"]["currency"] == "USD"
            assert row["cost"]["amount"] == pytest.approx(flash_price(usage), rel=1e-6)
    # prompts come from the logs when no task list is given
    assert rows["x1"]["prompt"] == PROMPT_WITH_MARKUP
    expected_total = sum(flash_price(u) for *_, u in EXPECTED.values() if u)
    assert data["totals"]["cost"]["USD"] == pytest.approx(expected_total, rel=1e-6)
    assert data["totals"]["unpriced"] == 1
    text = html.read_text()
    page = Page(text)
    assert page.rows["a1"][9] == f"{flash_price(USAGE):.6f} USD" and page.rows["f1"][9] == "—"
    assert "<svg>" in page.sections["plot-cost"] and "<svg>" in page.sections["plot-time"]
    no_external_fetch(page, text)


def test_report_usage_errors(setup):
    tmp, home, _ = setup
    out = write_jsonl(tmp / "results.jsonl", [])

    def dsh(*argv: str) -> subprocess.CompletedProcess:
        return dsh_batch(tmp, home, *argv)

    no_page = dsh("report", str(out))
    assert no_page.returncode == 2 and b"give the page to write with -o REPORT.html" in no_page.stderr
    as_json = dsh("report", str(out), "-o", str(tmp / "r.json"))
    assert as_json.returncode == 2 and b"its .json and .csv are written beside it" in as_json.stderr
    over_results = dsh("report", str(out), "-o", str(out))
    assert over_results.returncode == 2 and b"would overwrite the results file" in over_results.stderr
    beside = dsh("report", str(out), "-o", str(tmp / "results.html"))  # results.html → results.json, .csv
    assert beside.returncode == 0 and out.read_text() == ""
    in_run = dsh(str(out), "-o", str(out), "--report", str(tmp / "results.jsonl"))
    assert in_run.returncode == 2 and b"would overwrite the results file" in in_run.stderr
    assert dsh("report", str(out), "-o", str(tmp / "empty.html")).returncode == 0
    assert json.loads((tmp / "empty.json").read_text())["tasks"] == []


def _flash_cost(usage: dict[str, int], at: float) -> float:
    """deepseek-flash as DeepSeek prices it: off-peak rates, doubled on weekdays 01-04 and 06-10 UTC."""
    t = time.gmtime(at)
    peak = t.tm_wday < 5 and (1 <= t.tm_hour < 4 or 6 <= t.tm_hour < 10)
    return flash_price(usage) * (2.0 if peak else 1.0)


def test_a_deepseek_batch_records_what_its_provider_prices(tmp_path):
    """A real batch of acp-agent on the deepseek provider, against a real DeepSeek-compatible
    server on loopback (deepseek-model's test server): each result line's cost is its logged calls
    at DeepSeek's prices at the time of each call, and the page plots it."""
    sys.path.insert(0, str(REPO / "plugins" / "deepseek-model" / "tests"))
    from fake_deepseek import FakeDeepSeek, Turn

    home = tmp_path / "home"
    home.mkdir()
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"id": "d1", "prompt": "say one"}, {"id": "d2", "prompt": "say two"}])
    out, html = tmp_path / "results.jsonl", tmp_path / "report.html"
    with FakeDeepSeek() as fake:
        fake.push(Turn(content="one"), Turn(content="two and more words"))
        env = batch_env(home, DEEPSEEK_BASE_URL=fake.base_url, DEEPSEEK_API_KEY=fake.api_key)
        proc = subprocess.run(
            [sys.executable, "-m", "dsh_core.cli", "batch", str(tasks), "-o", str(out), "-e", "acp-agent",
             "--provider", "deepseek", "--model", "deepseek-flash", "-j", "1", "--report", str(html)],
            cwd=tmp_path, env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        assert len(fake.chat_requests) == 2
    results = {r["id"]: r for r in read_results(out)}
    data = json.loads((tmp_path / "report.json").read_text())
    rows = {row["id"]: row for row in data["tasks"]}
    for task_id, r in results.items():
        calls = [json.loads(line) for line in (home / "sessions" / f"{r['sessionId']}.jsonl").read_text().splitlines()]
        calls = [c for c in calls if c.get("type") == "assistant/message"]
        assert len(calls) == 1 and calls[0]["message"]["provider"] == "deepseek"
        usage = calls[0]["usage"]
        assert usage["inputTokens"] > 0 and usage["outputTokens"] > 0
        assert r["usage"]["inputTokens"] == usage["inputTokens"] and r["modelCalls"] == 1 and r["turns"] == 1
        assert r["cost"]["currency"] == "USD"
        assert r["cost"]["amount"] == pytest.approx(_flash_cost(usage, calls[0]["time"]), rel=1e-6)
        assert rows[task_id]["cost"] == r["cost"]
    assert data["totals"]["cost"]["USD"] == pytest.approx(sum(r["cost"]["amount"] for r in results.values()))
    assert data["totals"]["unpriced"] == 0
    page = Page(html.read_text())
    assert "<svg>" in page.sections["plot-cost"]
    assert page.rows["d1"][9] == f"{results['d1']['cost']['amount']:.6f} USD"
