"""How to use the web tools well: their system-prompt sections (``dsh_register_guidance``), for
every agent that has them."""

from __future__ import annotations

from dsh_core.types import Guidance


def sections(*, fetch: bool) -> tuple[Guidance, ...]:
    """``web_search``'s section (it points at ``web_fetch`` only when that tool exists) and
    ``web_fetch``'s."""
    follow_up = ("Read a result in full with web_fetch when its snippet is not enough. " if fetch
                 else "Work from the snippets the results come with. ")
    return (
        Guidance(
            name="tool:web_search",
            order=110,
            tools=("web_search",),
            text="Use the web_search tool for current information from the web. Its queries argument is a "
            "list: one query, or a few related ones searched in the same call. "
            + follow_up + "Cite the URLs you rely on as markdown links.",
        ),
        Guidance(
            name="tool:web_fetch",
            order=111,
            tools=("web_fetch",),
            text="Use the web_fetch tool to read one http(s) page whose address you know, such as a search "
            "result; it returns the page as text. Cite its URL as a markdown link when you use what it says.",
        ),
    )
