"""``web_search {queries}`` over the search provider seam, and the Brave Search provider.

The tool exists only when a provider is registered (``host.search_providers``); the Brave
provider registers only when ``BRAVE_SEARCH_API_KEY`` (or ``BRAVE_API_KEY``) is in the
environment. The key travels in one request header to the configured endpoint and nowhere
else: not in the tool's arguments, its result, an error, a log line or ``repr``.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from dsh_core import FunctionTool, ToolError
from dsh_core.display import strip_unsafe
from dsh_core.protocols import SearchHit

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import ToolContext
    from dsh_core.protocols import SearchProvider

BRAVE_ENDPOINT = "https://api.search.brave.com/res/v1/web/search"
KEY_VARIABLES = ("BRAVE_SEARCH_API_KEY", "BRAVE_API_KEY")
MAX_QUERIES = 5
_TAGS = re.compile(r"<[^>]{0,200}>")


def _plain(text: Any) -> str:
    """A result's title or snippet as plain text: Brave marks matches with <strong>."""
    if not isinstance(text, str):
        return ""
    return strip_unsafe(html.unescape(_TAGS.sub("", text))).strip()


class BraveSearch:
    """Brave Search's web endpoint (``GET ?q=…&count=…`` with ``X-Subscription-Token``)."""

    name = "brave"

    def __init__(self, key: str, *, endpoint: str, timeout: float, user_agent: str) -> None:
        self._key = key
        self.endpoint = endpoint
        self.timeout = timeout
        self.user_agent = user_agent

    def __repr__(self) -> str:  # never the key
        return f"BraveSearch(endpoint={self.endpoint!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **kw: Any) -> BraveSearch | None:
        key = next((environ[v].strip() for v in KEY_VARIABLES if environ.get(v, "").strip()), None)
        return cls(key, **kw) if key else None

    async def search(self, query: str, *, limit: int) -> list[SearchHit]:
        import httpx  # on the first search, not at start-up

        headers = {"X-Subscription-Token": self._key, "Accept": "application/json", "User-Agent": self.user_agent}
        try:
            async with httpx.AsyncClient(timeout=self.timeout, follow_redirects=False) as client:
                response = await client.get(self.endpoint, params={"q": query, "count": min(limit, 20)},
                                            headers=headers)
        except httpx.HTTPError as exc:
            raise ToolError(f"Brave Search could not be reached: {type(exc).__name__}", code="SEARCH_FAILED") from None
        if response.status_code in (401, 403):
            raise ToolError(f"Brave Search refused the API key (HTTP {response.status_code}); check "
                            "BRAVE_SEARCH_API_KEY", code="SEARCH_FAILED")
        if response.status_code != 200:
            raise ToolError(f"Brave Search answered HTTP {response.status_code}", code="SEARCH_FAILED")
        try:
            results = response.json().get("web", {}).get("results", [])
        except (ValueError, AttributeError):
            raise ToolError("Brave Search answered something that is not its JSON", code="SEARCH_FAILED") from None
        hits = [SearchHit(title=_plain(r.get("title")), url=r["url"], snippet=_plain(r.get("description")))
                for r in results if isinstance(r, dict) and isinstance(r.get("url"), str)]
        return hits[:limit]


def search_tool(provider: SearchProvider, *, limit: int) -> FunctionTool:
    """``web_search`` over ``provider``: the queries at once, each one's results in order."""

    async def web_search(args: dict[str, Any], ctx: ToolContext) -> str:
        queries = args.get("queries")
        if isinstance(queries, str):
            queries = [queries]
        if (not isinstance(queries, list) or not queries or len(queries) > MAX_QUERIES
                or not all(isinstance(q, str) and q.strip() for q in queries)):
            raise ToolError(f"queries must be a list of 1 to {MAX_QUERIES} non-empty strings", code="INVALID_ARGUMENTS")
        found: dict[int, list[SearchHit] | str] = {}

        async def one(i: int, query: str) -> None:
            try:
                found[i] = await provider.search(query.strip(), limit=limit)
            except ToolError as exc:
                found[i] = str(exc)

        async with anyio.create_task_group() as tg:
            for i, query in enumerate(queries):
                tg.start_soon(one, i, query)
        if all(isinstance(v, str) for v in found.values()):
            raise ToolError("; ".join(sorted({str(v) for v in found.values()})), code="SEARCH_FAILED")
        parts = []
        for i, query in enumerate(queries):
            hits = found[i]
            lines = [f"## {query.strip()}"]
            if isinstance(hits, str):
                lines.append(f"(failed: {hits})")
            elif not hits:
                lines.append("(no results)")
            for n, hit in enumerate(hits if isinstance(hits, list) else [], 1):
                lines.append(f"{n}. {hit.title or hit.url}\n   {hit.url}" + (f"\n   {hit.snippet}" if hit.snippet else ""))
            parts.append("\n".join(lines))
        return "\n\n".join(parts) + "\n\nRead a result with web_fetch."

    return FunctionTool(
        "web_search",
        f"Search the web ({provider.name}). Give 1 to {MAX_QUERIES} queries; each comes back with up to {limit} "
        "results (title, URL, snippet). Read a page with web_fetch.",
        {"type": "object", "properties": {"queries": {
            "type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_QUERIES,
            "description": "What to search for (several phrasings or sub-questions at once)."}},
         "required": ["queries"], "additionalProperties": False},
        web_search, parallel_safe=True, kind="search",
    )
