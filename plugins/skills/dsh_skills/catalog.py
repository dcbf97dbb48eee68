"""Finding skills: the roots, the two formats, the front matter, and what is refused.

A skill is a folder holding ``SKILL.md`` (the open Agent Skills format) or a flat ``<name>.md``
file; both start with YAML front matter naming it (``name``, ``description``), then the body.
Two flags, as skill authors write them for other agents, say who may start a skill:
``disable-model-invocation: true`` keeps it from the model (out of the catalog, refused by the
``skill`` tool; a person still starts it as a slash command), ``user-invocable: false`` keeps it
from the person (no slash command; the model still sees and loads it). A flag that is not a
boolean, or spelt in camelCase, skips the skill with a warning; other keys are ignored.
Roots, earliest first (an earlier root wins a name): ``<project>/.dsh/skills``,
``<project>/.agents/skills``, ``<project>/.claude/skills``, ``$DSH_HOME/skills``,
``~/.agents/skills``; the project is the nearest ancestor of the cwd holding ``.git``, else the
cwd. A file is read only as a regular file inside its root (a symlink leading out is not
followed, as agent instructions do); a malformed one is skipped with a warning naming it.
Skills are text for the model: nothing in them is ever run by dsh."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from dsh_core.paths import data_home, open_inside

log = logging.getLogger("dsh.skills")

PROJECT_ROOTS = (".dsh/skills", ".agents/skills", ".claude/skills")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DESCRIPTION_MAX = 1024  # characters of a description (the Agent Skills format's bound)
FRONT_MAX = 16 * 1024  # bytes read to find the front matter
SKILL_FILE = "SKILL.md"


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    path: str  # the file: SKILL.md, or the flat .md
    folder: str  # its folder (the root itself for a flat skill)
    root: str  # where reads must stay: the project for its skills, the user's root for theirs
    stamp: tuple[int, int]  # (mtime_ns, size): changes show up as an update
    model_invocable: bool = True  # not `disable-model-invocation: true`: in the catalog, loaded by `skill`
    user_invocable: bool = True  # not `user-invocable: false`: offered as a slash command


# A flag's value is a YAML boolean, or one of these words (quoted, any case) as other skill readers
# accept them; anything else skips the skill.
_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
# Spellings of the flags that other readers refuse rather than silently ignore: a skill meant to be
# kept from the model must not reach it because its author wrote the key in camelCase.
MISSPELT = {"disableModelInvocation": "disable-model-invocation", "modelInvocable": "disable-model-invocation",
            "userInvocable": "user-invocable"}


def flag(meta: dict, key: str) -> bool | None:
    """The boolean ``meta[key]`` says (None when absent); ValueError when it is not a boolean."""
    if key not in meta:
        return None
    value = meta[key]
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _WORDS:
        return _WORDS[value.strip().lower()]
    raise ValueError(f"`{key}` must be true or false, not {value!r}")


def project_root(cwd: str) -> str:
    """The nearest ancestor of ``cwd`` holding ``.git`` (inclusive), else ``cwd``."""
    here = os.path.realpath(cwd)
    d = here
    while not os.path.lexists(os.path.join(d, ".git")):
        parent = os.path.dirname(d)
        if parent == d:
            return here
        d = parent
    return d


USER_ROOTS_ENV = "DSH_SKILLS_USER_ROOTS"  # replaces the user's roots (os.pathsep-separated; empty: none)


def user_roots() -> list[str]:
    """``$DSH_HOME/skills`` and ``~/.agents/skills``, or what ``DSH_SKILLS_USER_ROOTS`` says (the
    test kit sets it empty, so no skill of the developer's reaches a test)."""
    env = os.environ.get(USER_ROOTS_ENV)
    if env is not None:
        return [os.path.abspath(os.path.expanduser(p)) for p in env.split(os.pathsep) if p]
    return [str(data_home() / "skills"), str(Path("~/.agents/skills").expanduser())]


def roots(cwd: str) -> list[tuple[str, str]]:
    """(root, bound) pairs, earliest first: a file is read only inside its bound (a project's
    skills may link within the project, as agent instructions may; a user's within their root)."""
    project = project_root(cwd)
    return [*((os.path.join(project, r), project) for r in PROJECT_ROOTS), *((u, u) for u in user_roots())]


class Catalog:
    """The skills of one cwd, kept up to date cheaply: the roots are found once, a root is listed
    again only when its directory changed, and a skill file is read again only when its mtime or
    size did (each turn costs a stat per root and per skill: a per-turn rediscovery cost a
    session 0.16 ms a prompt, bench/startup_cpu.py)."""

    def __init__(self, cwd: str) -> None:
        self.roots = roots(cwd)
        self.listed: dict[str, tuple[int, list[tuple[str, str]]]] = {}  # root -> (its mtime, candidates)
        self.by_path: dict[str, Skill] = {}
        self.found: dict[str, Skill] | None = None  # the last refresh's answer

    def refresh(self) -> dict[str, Skill]:
        """name → skill, over every root (earlier roots win). The same dict as last time when
        no root's listing and no skill file changed (a caller may compare by identity)."""
        found: dict[str, Skill] = {}
        by_path: dict[str, Skill] = {}
        same = self.found is not None
        listed = self.listed
        for root, bound in self.roots:
            try:
                mtime = os.stat(root).st_mtime_ns
            except OSError:
                if listed.pop(root, None) is not None:
                    same = False
                continue
            known = listed.get(root)
            if known is not None and known[0] == mtime:
                candidates = known[1]
            else:
                same = False
                candidates = _candidates(root)
                listed[root] = (mtime, candidates)
            for path, folder in candidates:
                try:
                    st = os.stat(path)
                except OSError:
                    if path in self.by_path:
                        same = False
                    continue
                stamp = (st.st_mtime_ns, st.st_size)
                skill = self.by_path.get(path)
                if skill is None or skill.stamp != stamp:
                    same = False
                    skill = _read(path, folder, bound, stamp)
                if skill is None:
                    continue
                by_path[path] = skill
                if skill.name in found:
                    log.debug(f"skill {skill.name!r} of {path} is hidden by {found[skill.name].path}")
                    continue
                found[skill.name] = skill
        if same and len(by_path) == len(self.by_path):
            return self.found  # type: ignore[return-value]
        self.by_path = by_path
        self.found = found
        return found


def discover(cwd: str) -> dict[str, Skill]:
    """name → skill for ``cwd``, read now."""
    return Catalog(cwd).refresh()


def _candidates(root: str) -> list[tuple[str, str]]:
    """(file, folder) of each skill-shaped entry of ``root``, by name."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out = []
    for name in names:
        if name.startswith("."):
            continue
        full = os.path.join(root, name)
        if os.path.isdir(full):  # its SKILL.md may come later: each refresh stats it
            out.append((os.path.join(full, SKILL_FILE), full))
        elif name.endswith(".md") and name != SKILL_FILE:
            out.append((full, root))
    return out


def read_text(skill: Skill, limit: int) -> str:
    """The skill's file as text, at most ``limit`` bytes (a cut file says so); only a regular file
    inside its root."""
    fd = open_inside(skill.root, skill.path)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    text = data[:limit].decode("utf-8", errors="replace")
    return text + (f"\n[… {skill.path} cut at {limit} bytes]" if len(data) > limit else "")


def split_front(text: str) -> tuple[str | None, str]:
    """(the YAML front matter, the body); None when the file has none."""
    if not text.startswith("---"):
        return None, text
    first = text.find("\n")
    if first < 0 or text[:first].strip() != "---":
        return None, text
    end = re.search(r"^---\s*$", text[first + 1:], re.MULTILINE)
    if end is None:
        return None, text
    return text[first + 1:first + 1 + end.start()], text[first + 1 + end.end():].lstrip("\n")


def _read(path: str, folder: str, root: str, stamp: tuple[int, int]) -> Skill | None:
    try:
        fd = open_inside(root, path)
    except OSError as exc:
        log.warning(f"skill {path} skipped: not a regular file inside {root} ({exc.strerror or exc})")
        return None
    with os.fdopen(fd, "rb") as f:
        head = f.read(FRONT_MAX).decode("utf-8", errors="replace")
    front, _ = split_front(head)
    if front is None:
        log.warning(f"skill {path} skipped: it has no front matter (---, name, description, ---)")
        return None
    import yaml  # on the first skill found, not at start-up

    try:
        meta = yaml.safe_load(front)
    except yaml.YAMLError as exc:
        log.warning(f"skill {path} skipped: its front matter is not YAML ({str(exc).splitlines()[0]})")
        return None
    name = meta.get("name") if isinstance(meta, dict) else None
    description = meta.get("description") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not NAME.match(name):
        log.warning(f"skill {path} skipped: `name` must be 1-64 letters, digits, '.', '_' or '-'")
        return None
    if not isinstance(description, str) or not description.strip():
        log.warning(f"skill {path} skipped: `description` must be a non-empty string")
        return None
    description = " ".join(description.split())[:DESCRIPTION_MAX]
    meta = meta if isinstance(meta, dict) else {}  # it is: `name` came from it
    misspelt = [k for k in MISSPELT if k in meta]
    if misspelt:
        log.warning(f"skill {path} skipped: `{misspelt[0]}` is not read; write `{MISSPELT[misspelt[0]]}`")
        return None
    try:
        no_model, user = flag(meta, "disable-model-invocation"), flag(meta, "user-invocable")
    except ValueError as exc:
        log.warning(f"skill {path} skipped: {exc}")
        return None
    return Skill(name=name, description=description, path=path, folder=folder, root=root, stamp=stamp,
                 model_invocable=no_model is not True, user_invocable=user is not False)
