"""dsh plugin ``skills``: Agent Skills from the project and the user reach the model.

- **The catalog** (``dsh_system_prompt``, in the cached prefix): each skill's name and one-line
  description, bounded (``catalog-bytes``) and escaped as agent instructions are.
- **Changes** (``dsh_prompt_submit``): a skill added, changed or removed since the session last
  saw the catalog is told in an appended message at the next turn; the prefix stays.
- **Loading** (the ``skill {name}`` tool): the skill's body, bounded (``skill-bytes``), and its
  folder, in the original's ``<skill_content>`` block, so the model reads its other files with the
  ordinary tools.
- **Slash commands** (``dsh_slash_commands``, for a door that offers them): ``/<name> [text]``
  submits the skill with the person's text as the prompt.
- **Who may start a skill**: ``disable-model-invocation: true`` keeps a skill out of the catalog
  and the ``skill`` tool (a person still has its slash command); ``user-invocable: false`` keeps
  it out of the slash commands (the model still has it).

Skills are text for the model; dsh never runs anything a skill contains. See README.md and
``catalog.py`` for the roots and the format."""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from msgspec import Meta

from dsh_core import FunctionTool, ToolError, config_type_hook, hookimpl
from dsh_core.config import PluginConfig
from dsh_core.display import escape_system as escape
from dsh_core.display import one_line
from dsh_core.interception import PromptSubmit
from dsh_core.protocols import CommandResult, SlashCommand

from .catalog import Catalog, Skill, discover, read_text, split_front

if TYPE_CHECKING:  # pragma: no cover
    from dsh_core.contracts import AgentSpec, ToolContext
    from dsh_core.protocols import Agent, Host

NAME = "skills"
_SHOWN = "skills/shown"  # AgentSpec.extra: name -> (description, stamp) the prompt showed


class SkillsConfig(PluginConfig):
    """[config.skills]"""

    catalog_bytes: Annotated[int, Meta(ge=0, description="bytes of the catalog in the system prompt")] = 16384
    skill_bytes: Annotated[int, Meta(ge=1, description="bytes of one skill the skill tool returns")] = 262144
    commands: Annotated[bool, Meta(description="offer each skill as a /<name> slash command")] = True


dsh_config_type = config_type_hook(NAME, SkillsConfig)


class Catalogs:
    """The host's catalogs by cwd (a host state slot): the sessions of one workspace share one,
    and it goes with the last of them (weak values)."""

    def __init__(self) -> None:
        self.by_cwd: weakref.WeakValueDictionary[str, Catalog] = weakref.WeakValueDictionary()

    def get(self, cwd: str) -> Catalog:
        catalog = self.by_cwd.get(cwd)
        if catalog is None:
            catalog = self.by_cwd[cwd] = Catalog(cwd)
        return catalog


@dataclass
class Seen:
    """The skills this session knows (its state slot): its cwd's catalog, found on first use."""

    catalog: Catalog | None = None
    # The catalog's answer and the shown list when this session last found nothing to tell: the
    # same two objects again (nothing changed on disk, nothing shown since) need no comparison.
    quiet: tuple[dict[str, Skill], Any] | None = None

    def refresh(self, cwd: str, host: Host) -> dict[str, Skill]:
        if self.catalog is None:
            self.catalog = host.state(Catalogs).get(cwd)
        return self.catalog.refresh()


def _for_model(skills: dict[str, Skill]) -> dict[str, Skill]:
    """The skills the model may start: not ``disable-model-invocation: true``."""
    return {n: s for n, s in skills.items() if s.model_invocable}


def _line(skill: Skill) -> str:
    return f"- {escape(skill.name)}: {escape(one_line(skill.description, 300))}"


def catalog_section(skills: dict[str, Skill], limit: int) -> str | None:
    if not skills:
        return None
    head = ("# Skills\n\nSkills are instructions for particular tasks, kept as files. When one fits the task, "
            "call `skill` with its name to read it (and its folder, for the files it mentions) before you start.\n\n")
    lines, used, left = [], len(head.encode()), 0
    for skill in skills.values():
        line = _line(skill)
        if used + len(line.encode()) + 1 > limit:
            left += 1
            continue
        lines.append(line)
        used += len(line.encode()) + 1
    if not lines:
        return None
    tail = f"\n({left} more: `skill` lists every name)" if left else ""
    return head + "\n".join(lines) + tail


@hookimpl
def dsh_system_prompt(spec: AgentSpec, host: Host) -> str | None:
    skills = _for_model(discover(spec.cwd))
    spec.extra[_SHOWN] = {s.name: (s.description, s.stamp) for s in skills.values()}
    return catalog_section(skills, host.config_for(SkillsConfig).catalog_bytes)


@hookimpl
def dsh_prompt_submit(session: Agent, messages: list[Any], turn: int) -> PromptSubmit | None:
    """What changed in the catalog since the session last saw it, appended after the prompt."""
    shown: dict[str, tuple[str, tuple[int, int]]] | None = session.spec.extra.get(_SHOWN)
    if shown is None:
        return None
    seen = session.state(Seen)
    found = seen.refresh(session.cwd, session.host)
    quiet = seen.quiet
    if quiet is not None and quiet[0] is found and quiet[1] is shown:
        return None
    now = _for_model(found)
    added = [s for n, s in now.items() if n not in shown]
    changed = [s for n, s in now.items() if n in shown and shown[n] != (s.description, s.stamp)]
    gone = [n for n in shown if n not in now]
    if not (added or changed or gone):
        seen.quiet = (found, shown)
        return None
    session.spec.extra[_SHOWN] = {s.name: (s.description, s.stamp) for s in now.values()}
    parts = []
    if added or changed:
        parts.append("Skills added or changed since the list in your instructions:\n"
                     + "\n".join(_line(s) for s in [*added, *changed]))
    if gone:
        parts.append("Skills no longer available: " + ", ".join(escape(n) for n in gone) + ".")
    return PromptSubmit(context=["\n\n".join(parts)])


def _load(session: Agent, name: str, *, by: Literal["model", "person"]) -> tuple[Skill, str]:
    """The skill ``name`` and its file's text, for ``by`` ("model": the ``skill`` tool, which knows
    only the skills the model may start; "person": a slash command, which starts any skill)."""
    skills = session.state(Seen).refresh(session.cwd, session.host)
    known = _for_model(skills) if by == "model" else skills
    skill = skills.get(name)
    if skill is None:
        names = ", ".join(sorted(known)) or "none"
        raise ToolError(f'skill "{name}" is unknown or no longer available (skills: {names})', code="UNKNOWN_SKILL")
    if by == "person" and not skill.user_invocable:
        raise ToolError(f'skill "{name}" is not available as a command: its front matter says user-invocable: false',
                        code="SKILL_NOT_USER_INVOCABLE")
    if by == "model" and not skill.model_invocable:
        raise ToolError(f'skill "{name}" is not available for model invocation: its front matter says '
                        "disable-model-invocation: true, so only a person starts it", code="SKILL_NOT_MODEL_INVOCABLE")
    try:
        text = read_text(skill, session.host.config_for(SkillsConfig).skill_bytes)
    except OSError as exc:
        raise ToolError(f'skill "{name}" cannot be read: {exc.strerror or exc}', code="SKILL_UNREADABLE") from None
    return skill, text


# A body may not open or close the block it is framed in (nor a system block: escape_system).
_FRAME_TAG = re.compile(r"<(\s*/?\s*skill_(?:content|resources|instructions)\b)", re.IGNORECASE)


def _escape_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def skill_content(skill: Skill, text: str) -> str:
    """The block the model reads for a loaded skill, framed as the original frames it: its name,
    its folder (relative paths in the skill resolve against it), then its body. The body is
    escaped as agent instructions are, and so that it cannot close its own frame."""
    _, body = split_front(text)
    body = _FRAME_TAG.sub(r"&lt;\1", escape(body.strip()))
    return "\n".join([
        f'<skill_content name="{skill.name}">',  # a name is letters, digits, '.', '_' and '-' (catalog.NAME)
        "<skill_resources>",
        f"Base directory for this skill: {_escape_text(skill.folder)}",
        "Resolve relative paths mentioned by this skill against the base directory before using them. "
        "Load referenced resources only as needed.",
        "</skill_resources>",
        "",
        "<skill_instructions>",
        body,
        "</skill_instructions>",
        "</skill_content>",
    ])


async def _skill(args: dict[str, Any], ctx: ToolContext) -> str:
    name = args.get("name")
    if not isinstance(name, str) or not name:
        raise ToolError("skill needs `name`: one of the skills listed in your instructions", code="INVALID_ARGUMENTS")
    skill, text = _load(ctx.agent, name, by="model")
    return skill_content(skill, text)


SKILL_TOOL = FunctionTool(
    "skill",
    "Read a skill: its instructions, and its folder (for the files it mentions, which you read with the usual "
    "tools). The skills are listed in your instructions.",
    {"type": "object", "properties": {"name": {"type": "string", "description": "The skill's name."}},
     "required": ["name"], "additionalProperties": False},
    _skill, parallel_safe=True, kind="read",
)


@hookimpl
def dsh_register_tools(register: Any, host: Host) -> None:
    register(SKILL_TOOL)


def _command(skill: Skill) -> SlashCommand:
    async def run(session: Agent, text: str) -> CommandResult:
        try:
            loaded, raw = _load(session, skill.name, by="person")
        except ToolError as exc:
            raise ValueError(exc.message) from None
        ask = f"\n\n{text.strip()}" if text.strip() else ""
        return CommandResult(prompt=skill_content(loaded, raw) + ask)

    return SlashCommand(name=skill.name, description=one_line(skill.description, 200), run=run, hint="what to apply it to")


@hookimpl
def dsh_slash_commands(session: Agent, host: Host) -> list[SlashCommand] | None:
    if not host.config_for(SkillsConfig).commands:
        return None
    skills = session.state(Seen).refresh(session.cwd, session.host)
    return [_command(s) for s in skills.values() if s.user_invocable] or None
