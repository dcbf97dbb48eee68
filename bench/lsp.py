"""The lsp tool through a real host's tool path (the real sandbox, the real Python default), beside
bash's figure for comparable work in the same session and sandbox:

1. the first ``lsp`` hover of a session (a cold server: confined start, initialize, the file
   analysed, the answer) against the session's first ``bash`` call (its confined command server
   starting) running ``grep -n 'class Square' *.py`` — what a model does without a language server;
2. a hover on the warm server against the same ``grep`` through the warm ``bash``.

With ``--candidates BIN`` (a directory holding ``jedi-language-server``, ``pylsp`` and
``basedpyright-langserver``), also the figures that chose the Python default: each server's cold
start to its first hover, its warm hover, and which of the five answers it gets right (hover,
definition, references with the declaration, implementation, the diagnostic of an edit) — on the
same client (``dsh_lsp.client.Connection``), unconfined, one fresh server per run.

    python bench/lsp.py [--repeat 20] [--cold 5] [--mechanism auto|bwrap|landlock] [--candidates DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import anyio
from _common import Caller, bench_host, ms
from lsprotocol import types as t

# the lsp plugin's recorded scenario's small project (its tests use the same files)
SAMPLE = Path(__file__).resolve().parents[1] / "plugins/lsp/snapshots/lsp-python/diagnostics-after-edit/workspace"
SHAPES = (SAMPLE / "shapes.py").read_text()
MAIN = (SAMPLE / "main.py").read_text()
HOVER = {"operation": "hover", "file_path": "main.py", "line": 3, "character": 15}
GREP = {"description": "Find the class", "command": "grep -n 'class Square' *.py"}


def seed(work: Path) -> None:
    (work / "shapes.py").write_text(SHAPES)
    (work / "main.py").write_text(MAIN)


async def tool_path(repeat: int, cold: int, mechanism: str) -> None:
    cold_lsp, cold_bash, warm_lsp, warm_bash = [], [], [], []
    for i in range(cold):
        with tempfile.TemporaryDirectory() as d:
            work = Path(d)
            seed(work)
            config = {"sandbox-tools": {"mechanism": mechanism}}
            async with bench_host(work, ("scripted-model", "sandbox-tools", "lsp"), config) as (_, agent):
                session = Caller(agent)

                async def call(name: str, args: dict, session: Caller = session) -> float:
                    return (await session.call(name, args))[0]

                cold_bash.append(await call("bash", GREP))
                cold_lsp.append(await call("lsp", HOVER))
                if i == 0:
                    for _ in range(repeat):
                        warm_lsp.append(await call("lsp", HOVER))
                        warm_bash.append(await call("bash", GREP))
                await agent.dispose()
    med = statistics.median
    print(f"lsp hover on a cold server (basedpyright, confined; {cold} sessions): median {med(cold_lsp):.0f} ms, "
          f"max {max(cold_lsp):.0f} ms")
    print(f"  bash `grep -n 'class Square' *.py`, the session's first call: median {med(cold_bash):.1f} ms")
    print(f"lsp hover on the warm server ({repeat} runs): median {med(warm_lsp):.1f} ms, max {max(warm_lsp):.1f} ms")
    print(f"  bash `grep -n 'class Square' *.py` on the warm command server: median {med(warm_bash):.1f} ms")


# ---------------------------------------------------------------------- choosing the Python default

CANDIDATES = {
    "jedi-language-server": ["jedi-language-server"],
    "python-lsp-server": ["pylsp"],
    "basedpyright": ["basedpyright-langserver", "--stdio"],
}


async def candidate(bin_dir: Path, argv: list[str], repeat: int) -> dict:
    from dsh_lsp.client import Connection, ServerFailed

    out: dict = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d).resolve()
        seed(work)
        async with anyio.create_task_group() as tg:
            conn = Connection(name=argv[0], root=str(work), languages={".py": "python"})
            t0 = time.perf_counter()
            try:
                await conn.start([str(bin_dir / argv[0]), *argv[1:]], dict(os.environ), tg, 60)
            except ServerFailed as exc:
                return {"failed": str(exc)[:160]}
            try:
                main, shapes = str(work / "main.py"), str(work / "shapes.py")
                uri, version = conn.sync(main, MAIN)
                await conn.diagnostics_after(uri, 0, version, 10)
                suri, _ = conn.sync(shapes, SHAPES)

                def doc(u: str) -> t.TextDocumentIdentifier:
                    return t.TextDocumentIdentifier(uri=u)

                async def hover() -> t.Hover | None:
                    return await conn.request(conn.client.text_document_hover_async(
                        t.HoverParams(text_document=doc(uri), position=t.Position(line=2, character=14))), 30)

                first = await hover()
                out["cold_ms"] = ms(t0)
                times = []
                for _ in range(repeat):
                    t1 = time.perf_counter()
                    await hover()
                    times.append(ms(t1))
                out["warm_ms"] = statistics.median(times)
                right = {"hover": first is not None and "Square" in str(first.contents)}
                d = await conn.request(conn.client.text_document_definition_async(t.DefinitionParams(
                    text_document=doc(uri), position=t.Position(line=2, character=14))), 30)
                right["definition"] = any(getattr(x, "uri", getattr(x, "target_uri", "")).endswith("shapes.py")
                                          for x in (d or []))
                r = await conn.request(conn.client.text_document_references_async(t.ReferenceParams(
                    text_document=doc(suri), position=t.Position(line=9, character=7),
                    context=t.ReferenceContext(include_declaration=True))), 30)
                right["references"] = len(r or []) == 4
                try:
                    i = await conn.request(conn.client.text_document_implementation_async(t.ImplementationParams(
                        text_document=doc(suri), position=t.Position(line=5, character=9))), 30)
                    right["implementation"] = any(x.range.start.line == 13 for x in (i or []))
                except ServerFailed:
                    right["implementation"] = False
                seq = conn.seq
                _, v = conn.sync(main, MAIN.replace("total([", "totl(["))
                diags = await conn.diagnostics_after(uri, seq, v, 10) or []
                right["diagnostic"] = any("totl" in x.message for x in diags)
                out["right"] = right
            finally:
                await conn.aclose()
    return out


async def candidates(bin_dir: Path, repeat: int, runs: int) -> None:
    print(f"\nchoosing the Python default (same client, unconfined; {runs} fresh servers each, median):")
    for name, argv in CANDIDATES.items():
        results = [await candidate(bin_dir, argv, repeat) for _ in range(runs)]
        failed = [r["failed"] for r in results if "failed" in r]
        if failed:
            print(f"  {name}: failed: {failed[0]}")
            continue
        right = results[0]["right"]
        print(f"  {name}: cold start to first hover {statistics.median(r['cold_ms'] for r in results):.0f} ms, "
              f"warm hover {statistics.median(r['warm_ms'] for r in results):.1f} ms, right "
              f"{sum(right.values())}/{len(right)} ({', '.join(k for k, v in right.items() if not v) or 'all'}"
              f"{' wrong' if not all(right.values()) else ''})")


async def main(a: argparse.Namespace) -> None:
    await tool_path(a.repeat, a.cold, a.mechanism)
    if a.candidates:
        await candidates(Path(a.candidates), a.repeat, a.cold)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--cold", type=int, default=5)
    ap.add_argument("--mechanism", default="auto", choices=["auto", "bwrap", "landlock"])
    ap.add_argument("--candidates", help="a directory with jedi-language-server, pylsp, basedpyright-langserver")
    asyncio.run(main(ap.parse_args()))
