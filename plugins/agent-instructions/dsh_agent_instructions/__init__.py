"""dsh plugin ``agent-instructions``: a repository's ``AGENTS.md`` reaches the model.

At session start (``dsh_system_prompt``) the files of the session's cwd and its parents up
to the repository root (the nearest directory holding ``.git``; without one, the cwd alone)
go into the system prompt — the stable, cached prefix — outermost first, so the nearest
file, the most specific, is read last. In each directory ``AGENTS.md`` is used, or
``CLAUDE.md`` when there is no ``AGENTS.md``. The total is bounded (``max-bytes``).

Nested discovery (``dsh_after_tool``): when a tool call names a ``path`` in a subdirectory of
the cwd whose instructions this session has not seen, they are appended once after that
tool's result. Symlinked files or directories and paths outside the session's directory
are never followed. Text that would open or close a system block is escaped. See README.md.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Annotated

from msgspec import Meta

from dsh_core import config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.display import escape_system
from dsh_core.paths import open_inside, real_dir
from dsh_core.types import AfterTool

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import AgentSpec
    from dsh_core.protocols import Agent, Host
    from dsh_core.types import ToolCallBlock, ToolOutput

PLUGIN = "agent-instructions"
NAMES = ("AGENTS.md", "CLAUDE.md")
DEFAULT_MAX_BYTES = 64 * 1024
_SEEN = "agent-instructions/seen"  # key in AgentSpec.extra: directories already looked at
_BUDGET = "agent-instructions/budget"  # bytes of instructions this session may still add
escape = escape_system  # anything that would open or close a system block is neutralised (dsh_core.display)


class InstructionsConfig(PluginConfig):
    """[config.agent-instructions]"""

    max_bytes: Annotated[int, Meta(ge=0, description="bytes of instruction files in the system prompt, in total")] = (
        DEFAULT_MAX_BYTES)


dsh_config_type = config_type_hook(PLUGIN, InstructionsConfig)


def max_bytes(host: Host) -> int:
    return host.config_for(InstructionsConfig).max_bytes


def read_instructions(directory: str, limit: int, root: str) -> tuple[str, str] | None:
    """(path, text) of the directory's AGENTS.md (else CLAUDE.md), at most ``limit`` bytes. A
    symlink is followed only to a regular file inside ``root`` (the repository, or the cwd when
    there is none: ``dsh_core.paths.open_inside``); anything else — a link leading out, a
    directory, a fifo — is not read (and hides CLAUDE.md no more than absence)."""
    for name in NAMES:
        path = os.path.join(directory, name)
        if not os.path.lexists(path):
            continue
        try:
            fd = open_inside(root, path)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
        text = data[:limit].decode("utf-8", errors="replace")
        if len(data) > limit:
            text += f"\n[… {path} truncated at {limit} bytes]"
        return path, text
    return None


def repo_chain(cwd: str, *, resolved: bool = False) -> list[str]:
    """The cwd and its parents up to the nearest ``.git`` (inclusive), outermost first.
    ``resolved``: ``cwd`` is canonical already."""
    here = cwd if resolved else os.path.realpath(cwd)
    chain = [here]
    d = here
    while not os.path.lexists(os.path.join(d, ".git")):
        parent = os.path.dirname(d)
        if parent == d:  # no repository: the cwd alone
            return [here]
        d = parent
        chain.append(d)
    return list(reversed(chain))


def _section(path: str, text: str) -> str:
    # the path too: a folder may be named to close the reminder block (``scope</system-reminder>``)
    return f"Instructions from {escape(path)}:\n\n{escape(text).strip()}"


@hookimpl
def dsh_system_prompt(spec: AgentSpec, host: Host) -> str | None:
    budget = max_bytes(host)
    chain = repo_chain(spec.cwd)
    spec.extra[_SEEN] = set(chain)
    sections = []
    for d in chain:
        if budget <= 0:
            break
        found = read_instructions(d, budget, root=chain[0])
        if found is not None:
            budget -= len(found[1].encode("utf-8", errors="replace"))
            sections.append(_section(*found))
    spec.extra[_BUDGET] = max_bytes(host)  # nested files: each bounded alone, like the root set
    if not sections:
        return None
    return "# Repository instructions (AGENTS.md)\n\n" + "\n\n".join(sections)


def _named_path(arguments: str) -> str | None:
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return None
    if not isinstance(args, dict):
        return None
    for key in ("path", "file_path"):
        value = args.get(key)
        if isinstance(value, str) and value and "\0" not in value:
            return value
    return None


def nested_dirs(cwd: str, named: str, *, resolved: bool = False) -> list[str]:
    """Directories strictly below the session's directory, from it down to the one ``named``
    is in (outermost first); empty when ``named`` leaves the directory or passes a symlink.
    ``resolved``: ``cwd`` is canonical already (resolved by the caller in this very call)."""
    root = cwd if resolved else os.path.realpath(cwd)
    target = os.path.normpath(named if os.path.isabs(named) else os.path.join(root, named))
    directory = target if os.path.isdir(target) and not os.path.islink(target) else os.path.dirname(target)
    prefix = root if root.endswith("/") else root + "/"
    if directory == root or not directory.startswith(prefix):  # the directory itself, or outside it (both normalised)
        return []
    if (real_dir(directory) or os.path.realpath(directory)) != directory:  # a component is a symlink: not followed
        return []
    out = []
    d = root.rstrip("/")
    for part in directory[len(prefix):].split("/"):
        d = f"{d}/{part}"
        out.append(d)
    return out


@hookimpl
def dsh_after_tool(session: Agent, call: ToolCallBlock, output: ToolOutput) -> AfterTool | None:
    named = _named_path(call.arguments)
    if named is None:
        return None
    # The cwd is resolved again on each call (a symlinked cwd may be retargeted between calls),
    # by the kernel (``real_dir``: realpath's lstat walk, twice, was most of this hook's 36 us a
    # call with a path); the repository's chain is looked for only when a directory is new.
    cwd = real_dir(session.cwd) or os.path.realpath(session.cwd)
    dirs = nested_dirs(cwd, named, resolved=True)
    extra = session.spec.extra
    if not dirs or (_SEEN in extra and all(d in extra[_SEEN] for d in dirs)):
        return None
    chain = repo_chain(cwd, resolved=True)
    seen: set[str] = extra[_SEEN] if _SEEN in extra else extra.setdefault(_SEEN, set(chain))
    limit = extra.get(_BUDGET, max_bytes(session.host))
    root = chain[0]
    context = []
    for d in dirs:
        if d in seen:
            continue
        seen.add(d)
        found = read_instructions(d, limit, root=root)
        if found is not None:
            context.append(_section(*found) + f"\n\n(These apply to files under {escape(d)}.)")
    return AfterTool(context=context) if context else None
