"""How to use this plugin's tools well together: system-prompt sections (``dsh_register_guidance``)
that an agent gets only with the tool each is about. What one call's schema says stays in the
tool's description; this is what the schema of one call cannot say."""

from __future__ import annotations

from dsh_core.types import Guidance


def _section(tool: str, order: int, text: str) -> Guidance:
    """The section about one tool, in the prompt only with that tool."""
    return Guidance(name=f"tool:{tool}", order=order, tools=(tool,), text=text)


READ = _section("read", 100, (
    "Read text files with the read tool rather than cat, head or sed in bash: its lines come numbered, "
    "and offset and limit page through a file too long for one read."
))

WRITE = _section("write", 101, (
    "The write tool creates a file or replaces everything in it. Read an existing file before you "
    "replace it, and change part of a file with edit instead."
))

EDIT = _section("edit", 102, (
    "The edit tool swaps one exact piece of text (old_string) for new_string in a file you have read "
    "in this session. old_string must occur exactly once: when it occurs more often, include more of the "
    "surrounding lines to make it unique, or set replace_all to true to change every occurrence."
))

GLOB = _section("glob", 103, (
    "Find files by their path with the glob tool rather than find or ls in bash."
))

GREP = _section("grep", 104, (
    "Search inside files with the grep tool rather than grep or rg in bash; then read a matching file "
    "when you need the lines around a match."
))

BASH = _section("bash", 105, (
    "Every bash call starts a new shell: a cd, an exported variable or a shell function does not "
    "carry over to the next call. To run a command in another directory, pass workdir instead of "
    "starting the command with cd. Give each call a description of a few words saying what it does "
    "(the person sees it). Each result ends with an [exit code: N] marker: check it every time, and when "
    "a command failed, find out why before you go on."
))

SECTIONS = (READ, WRITE, EDIT, GLOB, GREP, BASH)
