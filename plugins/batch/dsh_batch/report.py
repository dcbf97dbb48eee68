"""``--report report.html``: one self-contained page for a batch, and its numbers beside it.

Beside ``report.html`` go ``report.json`` (the rows and totals) and ``report.csv`` (the
rows): the same numbers the page shows, for a program. The page needs no network: CSS is
inline, the plots are SVG drawn by matplotlib and inlined, and the only links are relative
ones to each task's session page, ``sessions/<ID>.html`` beside the report (what
``dsh sessions export --all --html DIR`` writes into ``DIR`` = the report's folder's
``sessions``). The template is Jinja2 with autoescape on: prompts, answers and error
messages are user text.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .records import Result
from .stats import Pricer, read_log

STATUS_COLOURS = {"ok": "#2e7d32", "failed": "#c62828", "interrupted": "#9e9e9e"}
CSV_FIELDS = ("id", "status", "error", "turns", "toolCalls", "modelCalls", "seconds", "inputTokens", "outputTokens",
              "cachedTokens", "cost", "currency", "attempts", "sessionId", "sessionPage")  # fmt: skip
MAX_TICK_LABELS = 30
MAX_BARS = 200  # more tasks than this: each task is a vertical line


@dataclass
class Report:
    rows: list[dict[str, Any]]
    totals: dict[str, Any]


def session_page(session_id: str | None) -> str | None:
    return f"sessions/{session_id}.html" if session_id else None


def build(results: list[Result], *, prompts: dict[str, str] | None = None, example: str = "acp-agent",
          pricer: Pricer | None = None) -> Report:  # fmt: skip
    """One row per result, in the order given. A result line written before the log's numbers
    were recorded gets them from the session log here (when this node has it), its cost priced
    by ``example``'s providers."""
    prompts = prompts or {}
    pricer = pricer or Pricer()
    rows = []
    for r in results:
        turns, tool_calls, model_calls, usage, cost = r.turns, r.tool_calls, r.model_calls, r.usage, r.cost
        prompt = prompts.get(r.id)
        if turns is None or prompt is None:
            log = read_log(r.session_id)
            if log is not None:
                prompt = prompt if prompt is not None else log.first_prompt
                if turns is None:
                    turns, tool_calls, model_calls, usage = log.turns, log.tool_calls, log.model_calls, log.usage
                    cost = pricer.price(example, log.calls) if log.calls else None
        usage = usage or {}
        rows.append({
            "id": r.id,
            "status": r.status,
            "stopReason": r.stop_reason,
            "error": f"{r.error.cls}: {r.error.message}" if r.error is not None else None,
            "prompt": prompt,
            "text": r.text,
            "turns": turns,
            "toolCalls": tool_calls,
            "modelCalls": model_calls,
            "seconds": round(r.duration_ms / 1000, 3),
            "inputTokens": usage.get("inputTokens", 0) if usage else None,
            "outputTokens": usage.get("outputTokens", 0) if usage else None,
            "cachedTokens": usage.get("cacheHitTokens", 0) if usage else None,
            "cost": {"amount": cost.amount, "currency": cost.currency} if cost is not None else None,
            "attempts": r.attempts,
            "sessionId": r.session_id,
            "sessionPage": session_page(r.session_id),
        })  # fmt: skip
    return Report(rows, _totals(rows))


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    status = Counter(row["status"] for row in rows)
    cost: dict[str, float] = {}
    for row in rows:
        if row["cost"] is not None:
            cost[row["cost"]["currency"]] = round(cost.get(row["cost"]["currency"], 0.0) + row["cost"]["amount"], 9)

    def total(key: str) -> int:
        return sum(row[key] or 0 for row in rows)

    return {
        "tasks": len(rows),
        "ok": status["ok"],
        "failed": status["failed"],
        "interrupted": status["interrupted"],
        "seconds": round(sum(row["seconds"] for row in rows), 3),
        "turns": total("turns"),
        "toolCalls": total("toolCalls"),
        "modelCalls": total("modelCalls"),
        "inputTokens": total("inputTokens"),
        "outputTokens": total("outputTokens"),
        "cachedTokens": total("cachedTokens"),
        "cost": cost,  # currency → amount, over the priced tasks
        "unpriced": sum(1 for row in rows if row["cost"] is None),
    }


# --------------------------------------------------------------------------- plots


def _svg(fig: Any) -> str:
    """The figure as an SVG element to inline (without the XML prolog and DOCTYPE)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _plot(title: str, unit: str, rows: list[dict[str, Any]], values: list[float]) -> str:
    """Per task (bars coloured by status) and their distribution (a histogram), side by side."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    with matplotlib.rc_context({"svg.hashsalt": "dsh-batch-report", "svg.fonttype": "path", "font.size": 9}):
        fig = Figure(figsize=(10, 3.2), layout="constrained")
        per_task, spread = fig.subplots(1, 2, width_ratios=(2, 1))
        ids = [row["id"] for row in rows]
        colours = [STATUS_COLOURS.get(row["status"], "#555") for row in rows]
        if len(values) <= MAX_BARS:
            per_task.bar(range(len(values)), values, color=colours)
        else:  # one line collection, not a patch per task: 5,000 bars take matplotlib half a minute
            per_task.vlines(range(len(values)), 0, values, colors=colours, linewidth=max(0.2, 400 / len(values)))
            per_task.set_ylim(bottom=0)
        per_task.set_title(f"{title} per task")
        per_task.set_ylabel(unit)
        if len(ids) <= MAX_TICK_LABELS:
            per_task.set_xticks(range(len(ids)), ids, rotation=60, ha="right")
        else:
            per_task.set_xlabel(f"{len(ids)} tasks, in results order")
            per_task.set_xticks([])
        shown = [s for s in STATUS_COLOURS if any(row["status"] == s for row in rows)]
        per_task.legend(handles=[Patch(color=STATUS_COLOURS[s], label=s) for s in shown], loc="upper right", fontsize=8)
        spread.hist(values, bins=min(20, max(1, len(set(values)))), color="#1565c0")
        spread.yaxis.set_major_locator(MaxNLocator(integer=True))
        spread.set_title(f"{title}: distribution")
        spread.set_xlabel(unit)
        spread.set_ylabel("tasks")
        return _svg(fig)


def plots(report: Report) -> dict[str, str | None]:
    rows = report.rows
    out: dict[str, str | None] = {"time": None, "cost": None, "costCurrency": None}
    if rows:
        out["time"] = _plot("Time", "seconds", rows, [row["seconds"] for row in rows])
    currencies = Counter(row["cost"]["currency"] for row in rows if row["cost"] is not None)
    if currencies:
        currency = currencies.most_common(1)[0][0]
        priced = [row for row in rows if row["cost"] is not None and row["cost"]["currency"] == currency]
        out["cost"] = _plot("Cost", currency, priced, [row["cost"]["amount"] for row in priced])
        out["costCurrency"] = currency
    return out


# --------------------------------------------------------------------------- files


def _money(cost: dict[str, Any] | None) -> str:
    return "—" if cost is None else f"{cost['amount']:.6f} {cost['currency']}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def render(report: Report, *, title: str, source: str) -> str:
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(loader=PackageLoader("dsh_batch", "templates"), autoescape=select_autoescape(default=True))
    env.filters["money"] = _money
    env.filters["num"] = lambda v: "—" if v is None else f"{v:,}"
    env.filters["duration"] = _duration
    return env.get_template("report.html").render(
        title=title, source=source, rows=report.rows, totals=report.totals, plots=plots(report),
        statuses=STATUS_COLOURS,
    )  # fmt: skip


def _csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        flat = dict(row)
        flat["cost"] = row["cost"]["amount"] if row["cost"] is not None else None
        flat["currency"] = row["cost"]["currency"] if row["cost"] is not None else None
        writer.writerow(flat)
    return buf.getvalue()


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write(report: Report, html_path: str | os.PathLike[str], *, source: str) -> list[Path]:
    """Write the page and, beside it, ``<stem>.json`` and ``<stem>.csv``; return the three paths."""
    html = Path(html_path)
    json_path, csv_path = html.with_suffix(".json"), html.with_suffix(".csv")
    title = f"dsh batch: {Path(source).name}"
    _write(html, render(report, title=title, source=source))
    _write(json_path, json.dumps({"source": source, "totals": report.totals, "tasks": report.rows}, indent=1) + "\n")
    _write(csv_path, _csv(report.rows))
    return [html, json_path, csv_path]
