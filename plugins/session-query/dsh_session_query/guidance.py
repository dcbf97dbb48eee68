"""How to look things up in earlier history: the system-prompt section (``dsh_register_guidance``)
of the session-query tools, for every agent that has them."""

from __future__ import annotations

from dsh_core.types import Guidance

SESSION_QUERY = Guidance(
    name="tool:session-query",
    order=113,
    tools=("session_search", "session_event_search", "session_trace", "session_event_trace", "session_event_read"),
    text="To find work done in earlier sessions, call session_search; to look through the earlier events of a "
    "single session, call session_event_search. Searches only cover this workspace and return everything at "
    "once, with no cursor to page through. When a hit looks useful and you need more, go on with session_trace "
    "(how sessions descend from one another), session_event_trace (what replaced or cites an event) or "
    "session_event_read (the exact content of an event).",
)

SECTIONS = (SESSION_QUERY,)
