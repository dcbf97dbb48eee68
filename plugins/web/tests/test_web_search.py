"""web_search through the provider seam, against a real HTTP server on 127.0.0.1 that answers
as Brave Search's web endpoint does: the tool exists only with a key, the key goes in one header
and nowhere else, several queries run at once, failures say why without the key."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

from dsh_core.types import ToolResultEvent
from dsh_testing import memory_host, prompt_once

pytestmark = pytest.mark.anyio

KEY = "brv-test-key-0123456789"


class Brave(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict]] = []
    status = 200

    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        Brave.seen.append({"path": url.path, "q": q.get("q", [""])[0], "count": q.get("count", [""])[0],
                           "token": self.headers.get("X-Subscription-Token"), "at": time.monotonic()})
        time.sleep(0.2)  # each answer takes a while: queries at once finish in about one of these
        if Brave.status != 200:
            body = json.dumps({"error": {"detail": "bad token"}}).encode()
            self.send_response(Brave.status)
        else:
            term = q["q"][0]
            results = [{"title": f"<strong>{term}</strong> result {i}", "url": f"https://example.com/{term}/{i}",
                        "description": f"About <strong>{term}</strong> &amp; more ({i})"} for i in range(1, 9)]
            body = json.dumps({"type": "search", "web": {"type": "search", "results": results}}).encode()
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def brave():
    Brave.seen, Brave.status = [], 200
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Brave)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/res/v1/web/search"
    httpd.shutdown()
    httpd.server_close()


async def search(scripted, tmp_path, endpoint, queries):
    script = scripted({"default": [{"tool": "web_search", "args": {"queries": queries}}, {"text": "{tool_result}"}]})
    config = {"web": {"brave-endpoint": endpoint, "search-results": 3}}
    async with memory_host(script, plugins=("scripted-model", "web", "jsonl-persistence"), config=config) as host:
        assert "web_search" in host.tools and KEY not in repr(host.search_providers["brave"])
        _, seen = await prompt_once(host, tmp_path, script)
        (result,) = [e for e in seen if isinstance(e, ToolResultEvent)]
        return result, b"".join(msgspec.json.encode(e) for e in seen)


async def test_without_a_key_there_is_no_web_search(scripted, monkeypatch):
    for var in ("BRAVE_SEARCH_API_KEY", "BRAVE_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    async with memory_host(scripted({"default": [{"text": "x"}]}), plugins=("scripted-model", "web")) as host:
        assert "web_fetch" in host.tools and "web_search" not in host.tools and not host.search_providers


async def test_queries_run_at_once_and_come_back_in_order_with_the_key_in_one_header_only(
        brave, scripted, tmp_path, monkeypatch):
    monkeypatch.setenv("BRAVE_SEARCH_API_KEY", KEY)
    t0 = time.monotonic()
    result, log = await search(scripted, tmp_path, brave, ["anyio task groups", "msgspec structs"])
    took = time.monotonic() - t0
    text = result.result.content[0].text
    assert not result.result.is_error, text
    assert text.startswith("## anyio task groups\n1. anyio task groups result 1\n   https://example.com/anyio task groups/1"
                           "\n   About anyio task groups & more (1)\n")
    assert "## msgspec structs\n1. msgspec structs result 1" in text and "result 4" not in text  # 3 per query
    assert sorted(s["q"] for s in Brave.seen) == ["anyio task groups", "msgspec structs"]
    assert {(s["token"], s["count"], s["path"]) for s in Brave.seen} == {(KEY, "3", "/res/v1/web/search")}
    assert abs(Brave.seen[0]["at"] - Brave.seen[1]["at"]) < 0.15 and took < 10  # both asked before either answered
    assert KEY.encode() not in log and KEY not in text


@pytest.mark.parametrize("status", [401, 500])
async def test_a_failing_service_says_why_without_the_key(brave, scripted, tmp_path, monkeypatch, status):
    monkeypatch.setenv("BRAVE_API_KEY", KEY)
    Brave.status = status
    result, log = await search(scripted, tmp_path, brave, ["anything"])
    text = result.result.content[0].text
    assert result.result.is_error and result.code == "SEARCH_FAILED"
    said = "refused the API key (HTTP 401)" if status == 401 else "answered HTTP 500"
    assert said in text and KEY not in text and KEY.encode() not in log
