"""``dsh sessions search QUERY``: the model's session_search for people, over every recorded session.

jsonl-persistence owns ``dsh sessions``; this module is its ``search`` action (entry point
``search`` in group ``dsh.sessions``), so neither plugin imports the other."""

from __future__ import annotations

import argparse
import json
import sys
from os import path as osp

from dsh_core.errors import ToolError
from dsh_core.paths import data_home

from . import index_for, query
from .index import IndexUnavailable

HELP = "find sessions by what was said or done in them"
DESCRIPTION = "Full-text search over every recorded session, subagents' too (session-query's index)."


def setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("query", metavar="QUERY", nargs="+", help="literal text to find (the words as one phrase)")
    p.add_argument("--cwd", help="only sessions recorded in this directory (an absolute path, as session/list takes)")
    p.add_argument("--limit", type=int, default=20, help="sessions to show at most (default 20)")
    p.add_argument("--json", action="store_true", help="print one JSON array of the hits")


def run(args: argparse.Namespace) -> int:
    cwd = osp.normpath(osp.abspath(args.cwd)) if args.cwd else None
    if args.limit < 1:
        print("dsh: --limit must be at least 1", file=sys.stderr)
        return 2
    index = index_for(data_home() / "sessions")  # jsonl-persistence's directory
    try:
        with index.connect() as conn:
            hits = query.people_search(conn, " ".join(args.query), cwd=cwd, limit=args.limit)
    except ToolError as exc:
        print(f"dsh: {exc.message}", file=sys.stderr)
        return 2
    except IndexUnavailable as exc:
        print(f"dsh: the session index is unavailable: {exc}", file=sys.stderr)
        return 1
    finally:
        index.close()
    if args.json:
        sys.stdout.write(json.dumps(hits, ensure_ascii=False) + "\n")
        return 0
    if not hits:
        print("no session matches", file=sys.stderr)
        return 1
    for h in hits:
        lead = f"└ parent {h['parent']}  " if h["parent"] else ""
        sys.stdout.write(f"{h['sessionId']}\t{h['createdAt']}\t{h['cwd']}\t{lead}{h['title'] or ''}\n"
                         f"    seq {h['seq']} {h['type']} {h['time']}: {h['snippet']}\n")
    return 0
