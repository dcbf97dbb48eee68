"""web_fetch of a 1 MB HTML page from a loopback HTTP server, through a real host's tool path
(resolution and its check, the pinned connection, streaming under the cap, charset, html-to-markdown
Markdown), beside the bare peer in the same run: httpx getting the same bytes, and the same page
through html2text. Goal: <= 300 ms for web_fetch.

    python bench/web_fetch.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from dsh_core.contracts import AgentSpec
from dsh_testing import memory_host

GOAL_MS = 300.0


def page(size: int = 1 << 20) -> bytes:
    nav = "<nav>" + " | ".join(f"<a href='/p{i}'>Section {i}</a>" for i in range(40)) + "</nav>"
    paras, body, i = [], 0, 0
    while body < size:
        p = (f"<h2>Part {i}</h2><p>Paragraph {i}: the installer takes the <code>--flag-{i}</code> option; check its "
             f"output before the next step, and read <a href='/ref/{i}'>the reference</a> for details.</p>")
        paras.append(p)
        body += len(p)
        i += 1
    html = (f"<html><head><title>Big docs</title><script>{'var x=1;' * 500}</script></head><body>{nav}<main><article>"
            + "".join(paras) + "</article></main><footer>Copyright</footer></body></html>")
    return html.encode()


def serve(body: bytes) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/big"


async def dsh_times(url: str, repeat: int, work: Path) -> tuple[list[float], int]:
    from dsh_web import web_fetch

    script = work / "s.json"
    script.write_text(json.dumps({"default": [{"text": "ok"}]}))
    async with memory_host(script, plugins=("scripted-model", "web"), config={"web": {"allow-private": True}}) as host:
        agent = host.create_agent(AgentSpec(cwd=str(work), provider="scripted", model=str(script)))
        await agent.call_tool("web_fetch", {"url": url}, call_id="warm", turn=1, step=1)  # imports, first parse
        times, size = [], 0
        for i in range(repeat):
            t0 = time.perf_counter()
            out = await agent.call_tool("web_fetch", {"url": url}, call_id=f"c{i}", turn=1, step=1)
            times.append((time.perf_counter() - t0) * 1000)
            assert not out.is_error, out.content
        size = len(await web_fetch({"url": url}, _Ctx(agent)))
    return times, size


class _Ctx:
    def __init__(self, agent: object) -> None:
        self.agent = agent
        self.host = agent.host  # type: ignore[attr-defined]


async def peer_times(url: str, repeat: int) -> tuple[list[float], list[float]]:
    import html2text

    raw, converted = [], []
    async with httpx.AsyncClient() as client:
        await client.get(url)
        for _ in range(repeat):
            t0 = time.perf_counter()
            text = (await client.get(url)).text
            raw.append((time.perf_counter() - t0) * 1000)
            h = html2text.HTML2Text()
            h.body_width = 0
            h.handle(text)
            converted.append((time.perf_counter() - t0) * 1000)
    return raw, converted


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    body = page()
    httpd, url = serve(body)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            dsh, chars = await dsh_times(url, args.repeat, Path(tmp))
        raw, converted = await peer_times(url, args.repeat)
    finally:
        httpd.shutdown()
    med = statistics.median(dsh)
    print(f"web_fetch of a {len(body) / (1 << 20):.2f} MiB HTML page from 127.0.0.1, median of {args.repeat}")
    print(f"  dsh web_fetch (check, pinned GET, html-to-markdown)     {med:8.1f} ms  -> {chars:,} characters"
          f"   goal <= {GOAL_MS:.0f} ms: {'met' if med <= GOAL_MS else 'MISSED'}")
    print(f"  peer: httpx GET only                                     {statistics.median(raw):8.1f} ms")
    print(f"  peer: httpx GET + html2text (keeps the page chrome)      {statistics.median(converted):8.1f} ms")


if __name__ == "__main__":
    asyncio.run(main())
