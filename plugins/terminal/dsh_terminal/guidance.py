"""How to use the terminals well: the system-prompt section (``dsh_register_guidance``) of the
six terminal tools, for every agent that has them (not the persistent ``bash``)."""

from __future__ import annotations

from dsh_core.types import Guidance

TERMINALS = Guidance(
    name="tool:terminal",
    order=108,
    tools=("terminal_open", "terminal_send", "terminal_read", "terminal_list", "terminal_signal", "terminal_close"),
    text="Open a terminal only when the work needs state that outlives a single call, or a program that reads "
    "its input interactively; for a bounded, one-off step use the one-shot shell and the read, write and edit "
    "tools instead. Keep note of every terminal id you get, and close the terminals you no longer need. A send "
    "that ends with inferred_idle or timeout does not show that the foreground command has finished: it may "
    "still be running.",
)

SECTIONS = (TERMINALS,)
