"""``dsh sessions export``: one recorded session as a self-contained HTML page (``--html``) or
Markdown (``--md``), or every session of the store (``--all --html DIR``: an index page and one
page per session)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from dsh_jsonl_persistence.store import JsonlStore

from dsh_core.errors import DshError

from .model import Loader
from .pricing import Prices
from .render import index_html, session_html, session_md
from .secrets import Scrubber, known_secrets

HELP = "write a session as a page (HTML, self-contained) or Markdown"
DESCRIPTION = ("Write a recorded session as one self-contained HTML page (no network: its CSS and script are "
               "inline) or as Markdown: each turn's prompt, answer, folded thoughts, tool calls with arguments, "
               "results, status, diffs and approvals, subagents nested under the call that started them, "
               "compactions, cancels and errors where they happened, time, tokens and cost per turn and per "
               "model call, totals at the top. Secrets (the DeepSeek key, credential variables) are replaced "
               "by [redacted]. --all --html DIR writes an index page and one page per session.")


def setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="ID", nargs="?", help="session id (a unique prefix is enough); not with --all")
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--html", nargs="?", const="", metavar="DIR", default=None,
                      help="an HTML page; with --all, the directory to write the index and pages into")
    kind.add_argument("--md", action="store_true", help="Markdown")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: standard output)")
    p.add_argument("--all", action="store_true", help="every top-level session of the store (with --html DIR)")
    p.add_argument("--cwd", help="with --all: only the sessions recorded in this directory (a project)")


def run(args: argparse.Namespace) -> int:
    store = JsonlStore()
    scrub = Scrubber(known_secrets())
    loader = Loader(store, Prices.installed())
    if args.all:
        if args.id or not args.html:
            raise DshError("sessions export --all takes no ID and needs --html DIR")
        return _all(store, loader, scrub, Path(args.html), args.cwd)
    if not args.id and args.html:  # `export --html ID`: argparse gave the id to --html's optional DIR
        args.id, args.html = args.html, ""
    if not args.id:
        raise DshError("sessions export needs a session ID (or --all --html DIR)")
    if args.html:
        raise DshError("--html takes a directory only with --all; write one page with -o FILE")
    text = export_one(loader, scrub, args.id, md=args.md)
    if args.output:
        _write(Path(args.output), text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0


def export_one(loader: Loader, scrub: Scrubber, session_id: str, *, md: bool) -> str:
    doc = scrub.tree(loader.session(session_id))
    out = session_md(doc) if md else session_html(doc)
    return scrub.text(out)  # the page's own words too (a key in a cwd, a title)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _all(store: JsonlStore, loader: Loader, scrub: Scrubber, out: Path, cwd: str | None) -> int:
    cwd = os.path.normpath(os.path.abspath(cwd)) if cwd else None
    rows: list[dict[str, Any]] = []
    failed = 0
    for summary in store.summaries_sync(cwd=cwd):
        try:
            doc = scrub.tree(loader.session(summary.id))
        except Exception as exc:
            print(f"dsh: sessions export: {summary.id}: {exc}", file=sys.stderr)
            failed += 1
            continue
        name = f"{summary.id}.html"
        _write(out / name, scrub.text(session_html(doc)))
        rows.append({"id": doc["id"], "title": doc["title"], "cwd": doc["cwd"], "created": doc["created"],
                     "totals": doc["totals"], "children": len(doc["children"]), "href": name})
    _write(out / "index.html", scrub.text(index_html(rows, scrub.text(str(store.root)))))
    print(f"{len(rows)} session(s) written to {out / 'index.html'}", file=sys.stderr)
    return 1 if failed else 0
