"""web_fetch against a real HTTP server on 127.0.0.1 (a thread of this process): pages, text,
JSON, charsets, caps, redirects, the refusals, and the address the connection goes to."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from dsh_core import hookimpl
from dsh_core.types import ToolResultEvent
from dsh_testing import memory_host, prompt_once

pytestmark = pytest.mark.anyio

ARTICLE = ("<html><head><title>Docs</title><style>body{color:red}</style><script>var secret = 1;</script></head>"
           "<body><nav><a href='/'>Home</a> | <a href='/about'>About</a> | Keyboard shortcuts</nav>"
           "<main><article><h1>Installing the tool</h1>"
           + "".join(f"<p>Step {i}: run the installer with the <code>--flag-{i}</code> option and check the output "
                     "carefully before going on to the next step of the guide.</p>" for i in range(8))
           + "</article></main><footer>Copyright 2026 Example Corp</footer></body></html>")


class Handler(BaseHTTPRequestHandler):
    seen_hosts: ClassVar[list[str]] = []
    other_port = 0

    def log_message(self, *args):
        pass

    def _send(self, status, ctype, body, extra=None):
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        Handler.seen_hosts.append(self.headers.get("Host", ""))
        routes = {
            "/article": (200, "text/html; charset=utf-8", ARTICLE.encode()),
            "/plain": (200, "text/plain", b"just text\n"),
            "/data": (200, "application/json", json.dumps({"ok": True}).encode()),
            "/latin": (200, "text/plain; charset=iso-8859-1", "café".encode("latin-1")),
            "/meta": (200, "text/html", '<html><head><meta charset="iso-8859-1"></head><body><p>naïve</p></body></html>'
                      .encode("latin-1")),
            "/image": (200, "image/png", b"\x89PNG\r\n\x1a\n" + b"\0" * 32),
            "/big": (200, "text/plain", b"x" * 300_000),
            "/missing": (404, "text/plain", b"nope"),
        }
        if self.path == "/same":
            return self._send(302, None, b"", {"Location": "/plain"})
        if self.path == "/away":
            return self._send(302, None, b"", {"Location": f"http://127.0.0.1:{Handler.other_port}/plain"})
        if self.path == "/loop":
            return self._send(302, None, b"", {"Location": "/loop"})
        status, ctype, body = routes.get(self.path, (404, "text/plain", b"unknown"))
        self._send(status, ctype, body)


@pytest.fixture
def server():
    Handler.seen_hosts = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    other = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Handler.other_port = other.server_address[1]
    threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True) for s in (httpd, other)]
    for t in threads:
        t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    for s in (httpd, other):
        s.shutdown()
        s.server_close()


async def fetch(scripted, tmp_path, url, *extra, config=None, plugins=("scripted-model", "web")):
    script = scripted({"default": [{"tool": "web_fetch", "args": {"url": url}}, {"text": "{tool_result}"}]})
    cfg = {"web": {"allow-private": True, "max-bytes": 100_000}, **(config or {})}
    async with memory_host(script, *extra, plugins=plugins, config=cfg) as host:
        _, seen = await prompt_once(host, tmp_path, script)
        (result,) = [e for e in seen if isinstance(e, ToolResultEvent)]
        return result, seen


async def test_a_page_comes_back_as_markdown_without_its_chrome(server, scripted, tmp_path):
    result, _ = await fetch(scripted, tmp_path, f"{server}/article")
    text = result.result.content[0].text
    assert not result.result.is_error, text
    assert text.startswith(f"{server}/article (text/html)")
    assert "Installing the tool" in text and "Step 7: run the installer" in text and "`--flag-3`" in text
    for chrome in ("var secret", "color:red", "Keyboard shortcuts", "Copyright 2026"):
        assert chrome not in text, chrome


@pytest.mark.parametrize(("path", "expected"), [
    ("/plain", "just text"),
    ("/data", '{"ok": true}'),
    ("/latin", "café"),  # the charset of the Content-Type
    ("/meta", "naïve"),  # the charset of the page's <meta>
    ("/same", "just text"),  # a redirect on the same origin is followed
])
async def test_text_json_charsets_and_same_origin_redirects(server, scripted, tmp_path, path, expected):
    result, _ = await fetch(scripted, tmp_path, f"{server}{path}")
    assert not result.result.is_error and expected in result.result.content[0].text, result.result.content


@pytest.mark.parametrize(("url", "code", "said"), [
    ("{server}/image", "UNSUPPORTED_CONTENT", "is image/png (binary content is not fetched"),
    ("{server}/away", "CROSS_ORIGIN_REDIRECT", "redirects to another origin: http://127.0.0.1:"),
    ("{server}/loop", "FETCH_FAILED", "redirects more than 5 times"),
    ("{server}/missing", "FETCH_FAILED", "answered HTTP 404"),
    ("file:///etc/passwd", "UNSUPPORTED_URL", "only http and https URLs are fetched, not 'file'"),
    ("http://user:secret@example.com/", "UNSUPPORTED_URL", "credentials in it"),
])
async def test_what_is_refused_says_why(server, scripted, tmp_path, url, code, said):
    result, _ = await fetch(scripted, tmp_path, url.format(server=server))
    assert result.result.is_error and result.code == code and said in result.result.content[0].text, result


async def test_a_body_past_the_cap_is_cut_and_says_so(server, scripted, tmp_path):
    result, _ = await fetch(scripted, tmp_path, f"{server}/big")
    text = result.result.content[0].text
    assert text.rstrip().endswith("[cut: the body is longer than 100000 bytes]"), text[-300:]  # the spill keeps the tail


class Approve:
    def __init__(self, verdict):
        self.verdict = verdict
        self.asked = []

    @hookimpl
    def dsh_check_approval(self, request):
        self.asked.append(request)
        return self.verdict


@pytest.mark.parametrize("verdict", ["deny", "allow"])
async def test_a_private_address_is_fetched_only_when_a_person_approves(server, scripted, tmp_path, verdict):
    policy = Approve(verdict)
    result, _ = await fetch(scripted, tmp_path, f"{server}/plain", policy, config={"web": {"allow-private": False}})
    (asked,) = policy.asked
    assert asked.tool_name == "web_fetch" and asked.subject == "127.0.0.1" and "loopback" in asked.reason
    if verdict == "deny":
        assert result.result.is_error and result.code == "PRIVATE_ADDRESS"
        assert "127.0.0.1 resolves to 127.0.0.1, a loopback address" in result.result.content[0].text
    else:
        assert "just text" in result.result.content[0].text


@pytest.mark.parametrize("address", ["169.254.169.254", "10.0.0.5", "::1", "::ffff:127.0.0.1", "fd00:ec2::254",
                                     "224.0.0.1", "0.0.0.0"])
async def test_metadata_private_and_mapped_addresses_are_not_public(address):
    import ipaddress

    from dsh_web.fetch import public

    assert not public(ipaddress.ip_address(address))
    assert public(ipaddress.ip_address("93.184.216.34"))


async def test_the_host_is_resolved_once_and_the_connection_goes_to_that_address(server, scripted, tmp_path,
                                                                                monkeypatch):
    """DNS rebinding: the first answer (checked) is where the connection goes; a later, different
    answer is never asked for. The name still travels in the Host header."""
    import dsh_web.fetch as fetch_module

    port = int(server.rsplit(":", 1)[1])
    answers = iter(["127.0.0.1", "10.9.9.9"])
    calls = []

    async def fake_getaddrinfo(host, port_, **kw):
        calls.append(host)
        import socket

        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port_))]

    monkeypatch.setattr(fetch_module.anyio, "getaddrinfo", fake_getaddrinfo)
    result, _ = await fetch(scripted, tmp_path, f"http://docs.example.test:{port}/plain")
    assert "just text" in result.result.content[0].text
    assert calls == ["docs.example.test"] and Handler.seen_hosts == [f"docs.example.test:{port}"]


async def test_in_full_access_a_private_address_is_fetched_without_asking(server, scripted, tmp_path):
    """As the sandbox decides the tier: a session in full access reaches what its bash could."""
    policy = Approve("deny")
    result, _ = await fetch(scripted, tmp_path, f"{server}/plain", policy, config={
        "web": {"allow-private": False}, "sandbox-tools": {"permission-mode": "danger-full-access"}},
        plugins=("scripted-model", "web", "sandbox-tools"))
    assert "just text" in result.result.content[0].text and policy.asked == []
