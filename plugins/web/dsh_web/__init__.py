"""dsh plugin ``web``: ``web_fetch {url}`` — a page as Markdown, or a text or JSON body as it is.

http(s) only, no credentials in the URL, same-origin redirects only (another origin is an error
naming it), a byte cap and a timeout, an explicit User-Agent. A host that resolves to a
loopback, private, link-local (cloud metadata), multicast or reserved address is fetched only
when the session runs in full access, when ``allow-private`` says so (tests), or when a person
approves that one call (a one-shot permission request naming the host); the connection goes
to the address that was checked. A long result is spilled by the spine (head, tail, a file).
``web_search {queries}`` is offered only when a search provider is registered
(``dsh_register_search_providers``): this plugin's Brave Search provider registers when
``BRAVE_SEARCH_API_KEY`` is set; a tool that cannot work is never registered. See README.md."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Any

from msgspec import Meta

from dsh_core import FunctionTool, ToolError, config_type_hook, hookimpl
from dsh_core.config import PluginConfig

from .fetch import HTML_TYPES, Private, decode, get, parse, to_markdown
from .search import BRAVE_ENDPOINT, BraveSearch, search_tool

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import Host

NAME = "web"
USER_AGENT = "dsh/0.1 (web_fetch; +https://github.com/deepseek-ai/deepseek-harness)"
FULL_ACCESS = frozenset({"full-access", "danger-full-access"})


class WebConfig(PluginConfig):
    """[config.web]"""

    max_bytes: Annotated[int, Meta(ge=1024, description="bytes of a body read at most (the rest is cut)")] = 5 << 20
    timeout: Annotated[float, Meta(gt=0, description="seconds for one request")] = 30.0
    allow_private: Annotated[bool, Meta(
        description="fetch loopback and private addresses without asking (tests; a local docs server)")] = False
    user_agent: Annotated[str, Meta(min_length=1, description="the User-Agent header")] = USER_AGENT
    search_results: Annotated[int, Meta(ge=1, le=20, description="web_search: results per query")] = 5
    brave_endpoint: Annotated[str, Meta(min_length=1, description="the Brave Search web endpoint (with "
                                                                     "BRAVE_SEARCH_API_KEY set)")] = BRAVE_ENDPOINT


dsh_config_type = config_type_hook(NAME, WebConfig)


async def _full_access(ctx: ToolContext) -> bool:
    """Whether the session's commands run unconfined, as the sandbox decides it (the session's own
    mode, else the deployment's): then a private address is no more than bash could reach."""
    confinement = ctx.host.confinement
    if confinement is None:
        return False
    try:
        confined = await confinement.confine(["true"], cwd=ctx.cwd, session=ctx.agent)
    except Exception:  # no mechanism for a confined tier: certainly not full access
        return False
    return confined.mode in FULL_ACCESS


async def web_fetch(args: dict[str, Any], ctx: ToolContext) -> str:
    config = ctx.host.config_for(WebConfig)
    target = parse(args.get("url", ""))

    async def ask_private(private: Private) -> bool:
        if await _full_access(ctx):
            return True
        outcome = await ctx.approve(f"fetch {target.url}: {private}", kind="fetch", subject=private.host,
                                    args={"url": target.url, "address": str(private.address)},
                                    choices=(f"Fetch from {private.host}", "Don't fetch"))
        return outcome == "allowed-once"

    page = await get(target, allow_private=config.allow_private, max_bytes=config.max_bytes, timeout=config.timeout,
                     user_agent=config.user_agent, ask_private=ask_private)
    text = decode(page)
    if page.content_type in HTML_TYPES:
        text = to_markdown(text, page.url)
    if not text.strip():
        raise ToolError(f"{page.url} has no text", code="FETCH_FAILED")
    cut = f"\n\n[cut: the body is longer than {config.max_bytes} bytes]" if page.truncated else ""
    return f"{page.url} ({page.content_type})\n\n{text.strip()}{cut}"


WEB_FETCH = FunctionTool(
    "web_fetch",
    "Fetch a web page (http or https) and read it: HTML comes back as Markdown without the page's chrome, text "
    "and JSON as they are. Follows redirects within the same site only.",
    {"type": "object", "properties": {"url": {"type": "string", "description": "The http(s) URL to read."}},
     "required": ["url"], "additionalProperties": False},
    web_fetch, parallel_safe=True, kind="fetch",
)


@hookimpl
def dsh_register_search_providers(register: Any, host: Host) -> None:
    """Brave Search, when its key is in the environment (``BRAVE_SEARCH_API_KEY``)."""
    config = host.config_for(WebConfig)
    brave = BraveSearch.from_env(os.environ, endpoint=config.brave_endpoint, timeout=config.timeout,
                                 user_agent=config.user_agent)
    if brave is not None:
        register(brave)


@hookimpl
def dsh_register_tools(register: Any, host: Host) -> None:
    register(WEB_FETCH)
    providers = getattr(host, "search_providers", {})
    if providers:  # web_search only where it can work: never a stub
        register(search_tool(next(iter(providers.values())), limit=host.config_for(WebConfig).search_results))


@hookimpl
def dsh_register_guidance(register: Any, host: Host) -> None:
    from .guidance import sections  # the texts live in their own module (guidance.py)

    for section in sections(fetch="web_fetch" in host.tools):
        register(section)
