"""Fetching one URL safely: http(s) only, no credentials in it, the host resolved once and every
address it has checked (loopback, private, link-local, metadata, multicast and reserved
addresses refused unless allowed), the connection made to the address that was checked (the
name still goes in ``Host`` and in TLS's SNI, so a DNS answer that changes cannot slip past),
same-origin redirects only, a byte cap, a timeout; then the body as text: HTML as Markdown with
scripts, styles and page chrome dropped (html-to-markdown), plain text and JSON as they are,
anything binary refused."""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import anyio

from dsh_core import ToolError

REDIRECTS = 5
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript", "application/x-yaml")
HTML_TYPES = ("text/html", "application/xhtml+xml")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9._-]+)""", re.IGNORECASE)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Private(Exception):
    """The host resolves to an address that is not public (the caller may ask a person)."""

    def __init__(self, host: str, address: Address) -> None:
        super().__init__(f"{host} resolves to {address}, a {kind(address)} address")
        self.host = host
        self.address = address


def _unmapped(address: Address) -> Address:
    """An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) as the IPv4 address it is."""
    return address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped else address


def kind(address: Address) -> str:
    a = _unmapped(address)
    if a.is_loopback:
        return "loopback"
    if a.is_link_local:
        return "link-local (cloud metadata lives here)"
    if a.is_private:
        return "private"
    if a.is_multicast:
        return "multicast"
    return "reserved"


def public(address: Address) -> bool:
    a = _unmapped(address)
    return a.is_global and not a.is_multicast


@dataclass(frozen=True)
class Target:
    url: str  # as asked (normalised)
    scheme: str
    host: str
    port: int

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host.lower(), self.port


def parse(url: str) -> Target:
    if not isinstance(url, str) or not url.strip():
        raise ToolError("web_fetch needs `url`: an http or https URL", code="INVALID_ARGUMENTS")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ToolError(f"only http and https URLs are fetched, not {parts.scheme or 'a bare path'!r}",
                        code="UNSUPPORTED_URL")
    if parts.username is not None or parts.password is not None:
        raise ToolError("a URL with credentials in it is not fetched (no user:password@)", code="UNSUPPORTED_URL")
    host = parts.hostname
    if not host:
        raise ToolError(f"{url!r} names no host", code="INVALID_ARGUMENTS")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ToolError(f"{url!r} has a bad port", code="INVALID_ARGUMENTS") from None
    return Target(url=urlunsplit(parts._replace(fragment="")), scheme=parts.scheme, host=host, port=port)


async def resolve(target: Target, *, allow_private: bool) -> Address:
    """The one address the fetch connects to: every address of the host checked, the first used."""
    try:
        literal: Address | None = ipaddress.ip_address(target.host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses: list[Address] = [literal]
    else:
        try:
            infos = await anyio.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ToolError(f"{target.host} does not resolve ({exc})", code="FETCH_FAILED") from None
        addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
        if not addresses:
            raise ToolError(f"{target.host} does not resolve", code="FETCH_FAILED")
    if not allow_private:
        for address in addresses:
            if not public(address):
                raise Private(target.host, address)
    return addresses[0]


def pinned_url(target: Target, address: Address, path_url: str) -> str:
    """``path_url`` with its host replaced by the checked address (the name goes in Host/SNI)."""
    parts = urlsplit(path_url)
    host = f"[{address}]" if address.version == 6 else str(address)
    return urlunsplit(parts._replace(netloc=f"{host}:{target.port}"))


def host_header(target: Target) -> str:
    default = 443 if target.scheme == "https" else 80
    return target.host if target.port == default else f"{target.host}:{target.port}"


@dataclass
class Page:
    url: str  # where the body came from (after same-origin redirects)
    content_type: str
    data: bytes
    truncated: bool
    charset: str | None


async def get(target: Target, *, allow_private: bool, max_bytes: int, timeout: float, user_agent: str,
              ask_private: Any) -> Page:
    """GET the URL through its same-origin redirects. ``ask_private(Private) -> bool`` decides an
    address that is not public (once per fetch: a person's answer covers this URL only)."""
    import httpx  # on the first fetch, not at start-up (~50 ms)

    url = target.url
    approved = allow_private
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), follow_redirects=False, trust_env=False) as client:
        for _ in range(REDIRECTS + 1):
            here = parse(url)
            if here.origin != target.origin:
                raise ToolError(f"{target.url} redirects to another origin: {url} (fetch that URL if it is the one "
                                "you want)", code="CROSS_ORIGIN_REDIRECT")
            try:
                address = await resolve(here, allow_private=approved)
            except Private as private:
                if not await ask_private(private):
                    raise ToolError(f"not fetched: {private} (only public addresses are fetched unless a person "
                                    "approves, or the session runs in full access)", code="PRIVATE_ADDRESS") from None
                approved = True
                address = await resolve(here, allow_private=True)
            headers = {"Host": host_header(here), "User-Agent": user_agent, "Accept": "text/html, text/*;q=0.9, "
                       "application/json;q=0.8, */*;q=0.1", "Accept-Encoding": "gzip, deflate"}
            extensions = {"sni_hostname": here.host} if here.scheme == "https" else {}
            request = client.build_request("GET", pinned_url(here, address, url), headers=headers,
                                           extensions=extensions)
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as exc:
                raise ToolError(f"fetching {url} failed: {type(exc).__name__}: {exc}", code="FETCH_FAILED") from None
            try:
                if response.is_redirect and response.headers.get("location"):
                    url = urljoin(url, response.headers["location"])
                    continue
                if response.status_code >= 400:
                    raise ToolError(f"{url} answered HTTP {response.status_code} {response.reason_phrase}",
                                    code="FETCH_FAILED")
                ctype = response.headers.get("content-type", "")
                mime = ctype.split(";")[0].strip().lower()
                if not (mime.startswith(TEXT_TYPES) or mime in HTML_TYPES or mime.endswith(("+json", "+xml"))
                        or not mime):
                    raise ToolError(f"{url} is {mime} (binary content is not fetched; web_fetch reads pages and "
                                    "text)", code="UNSUPPORTED_CONTENT")
                data = bytearray()
                truncated = False
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > max_bytes:
                        del data[max_bytes:]
                        truncated = True
                        break
                return Page(url=url, content_type=mime or "text/plain", data=bytes(data), truncated=truncated,
                            charset=response.charset_encoding)
            finally:
                await response.aclose()
    raise ToolError(f"{target.url} redirects more than {REDIRECTS} times", code="FETCH_FAILED")


def decode(page: Page) -> str:
    charset = page.charset
    if charset is None and page.content_type in HTML_TYPES:
        found = _META_CHARSET.search(page.data[:4096])
        charset = found.group(1).decode("ascii", "ignore") if found else None
    try:
        return page.data.decode(charset or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return page.data.decode("utf-8", errors="replace")


CHROME = ["nav", "header", "footer", "aside", "noscript", "[role=navigation]", "[role=banner]",
          "[role=contentinfo]", "[aria-hidden=true]"]  # dropped with scripts and styles


def to_markdown(html: str, url: str) -> str:
    """The page as Markdown, without its chrome (navigation, header, footer, asides), scripts,
    styles or images, through html-to-markdown (a Rust converter; chosen by measurement, see the
    README: 51 ms for a 1 MB page where trafilatura took 900 ms and html2text 350 ms). Imported on
    the first page, not at start-up."""
    import html_to_markdown

    options = html_to_markdown.ConversionOptions(exclude_selectors=CHROME, skip_images=True, heading_style="atx",
                                                 base_url=url)
    return str(html_to_markdown.convert(html, options).content)
