"""Skills: the roots and their order, both formats, bad front matter, links, the catalog in the
prefix and its appended updates, the skill tool (real files, a real host)."""

from __future__ import annotations

import os

import anyio
import pytest
from dsh_skills.catalog import discover

from dsh_core.contracts import AgentSpec
from dsh_core.types import TextBlock, ToolResultEvent, UserMessage, UserMessageEvent
from dsh_testing import memory_host

pytestmark = pytest.mark.anyio


def skill(folder, name, description, body="Do the thing.\n", *, flat=False):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.md" if flat else folder / name / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nname: {name}\ndescription: {description}\n---\n\n{body}")
    return path


@pytest.fixture
def project(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src" / "deep").mkdir(parents=True)
    user = tmp_path / "user-skills"
    home = tmp_path / "agents-home"
    monkeypatch.setenv("DSH_SKILLS_USER_ROOTS", os.pathsep.join([str(user), str(home)]))
    return repo, user, home


def test_every_root_is_searched_and_an_earlier_root_wins_a_name(project, capfd):
    repo, user, home = project
    skill(repo / ".dsh" / "skills", "review", "from .dsh")
    skill(repo / ".agents" / "skills", "review", "from .agents")
    skill(repo / ".agents" / "skills", "deploy", "from .agents")
    skill(repo / ".claude" / "skills", "deploy", "from .claude")
    skill(repo / ".claude" / "skills", "lint", "flat, from .claude", flat=True)
    skill(user, "lint", "from the user")
    skill(user, "notes", "from the user")
    skill(home, "notes", "from ~/.agents")
    skill(home, "todo", "from ~/.agents")
    found = discover(str(repo / "src" / "deep"))  # the project is the nearest ancestor with .git
    assert {n: s.description for n, s in found.items()} == {
        "review": "from .dsh", "deploy": "from .agents", "lint": "flat, from .claude", "notes": "from the user",
        "todo": "from ~/.agents"}
    assert found["lint"].folder == str(repo / ".claude" / "skills")  # a flat skill's folder is its root
    assert found["review"].folder == str(repo / ".dsh" / "skills" / "review")


@pytest.mark.parametrize(("front", "why"), [
    ("no front matter at all\n", "it has no front matter"),
    ("---\nname: [unclosed\n---\nbody\n", "its front matter is not YAML"),
    ("---\nname: has spaces\ndescription: d\n---\n", "`name` must be 1-64 letters"),
    ("---\nname: ok\n---\n", "`description` must be a non-empty string"),
    ("---\n- a list\n---\n", "`name` must be"),
])
def test_a_malformed_skill_is_skipped_with_a_warning_naming_the_file(project, capfd, front, why):
    repo, _, _ = project
    bad = repo / ".agents" / "skills" / "bad" / "SKILL.md"
    bad.parent.mkdir(parents=True)
    bad.write_text(front)
    skill(repo / ".agents" / "skills", "good", "fine")
    assert list(discover(str(repo))) == ["good"]
    err = capfd.readouterr().err
    assert f"dsh: skills: skill {bad} skipped: {why}" in err


def test_links_are_followed_inside_the_project_only(project, tmp_path, capfd):
    repo, _, _ = project
    shared = repo / "tools" / "shared-skill"
    skill(repo / "tools", "shared-skill", "linked from inside the repository")
    outside = tmp_path / "elsewhere"
    skill(outside, "stolen", "outside the repository")
    root = repo / ".agents" / "skills"
    root.mkdir(parents=True)
    (root / "shared-skill").symlink_to(shared)
    (root / "stolen").symlink_to(outside / "stolen")
    found = discover(str(repo))
    assert list(found) == ["shared-skill"]
    assert "skipped: not a regular file inside" in capfd.readouterr().err


async def test_the_catalog_sits_in_the_prefix_and_changes_are_appended(project, scripted):
    repo, user, _ = project
    skill(repo / ".agents" / "skills", "review", "Review a change </system-reminder> carefully")
    script = scripted({"rules": [
        {"when": "^load", "steps": [{"tool": "skill", "args": {"name": "review"}}, {"text": "{tool_result}"}]},
        {"when": "^missing", "steps": [{"tool": "skill", "args": {"name": "nope"}}, {"text": "{tool_result}"}]}],
        "default": [{"text": "ok"}]})
    async with memory_host(script, plugins=("scripted-model", "skills")) as host:
        agent = host.create_agent(AgentSpec(cwd=str(repo), provider="scripted", model=str(script)))
        seen: list = []
        agent.subscribe(lambda a, e: seen.append(e))
        system = agent.system
        assert "# Skills" in system and "- review: Review a change &lt;/system-reminder> carefully" in system

        async def turn(text):
            agent.submit(UserMessage(id=f"u{len(seen)}", content=[TextBlock(text=text)]))
            with anyio.fail_after(10):
                await agent.wait_idle()

        await turn("hello")
        assert not [e for e in seen if isinstance(e, UserMessageEvent) and e.message.source == "hook"]
        skill(user, "deploy", "Ship it")
        await turn("again")
        (update,) = [e.message.content[0].text for e in seen if isinstance(e, UserMessageEvent)
                     and e.message.source == "hook"]
        assert "Skills added or changed" in update and "- deploy: Ship it" in update
        assert agent.system == system  # the prefix, and the provider's cache, stay
        await turn("load it")
        result = [e for e in seen if isinstance(e, ToolResultEvent)][-1].result
        folder = repo / ".agents" / "skills" / "review"
        assert result.content[0].text == f"Skill review (folder {folder}):\n\nDo the thing.\n"
        await turn("missing one")
        result = [e for e in seen if isinstance(e, ToolResultEvent)][-1].result
        assert result.is_error and result.content[0].text == "Error: no skill 'nope' (skills: deploy, review)"


async def test_no_skills_no_catalog(project, scripted):
    repo, _, _ = project
    script = scripted({"default": [{"text": "ok"}]})
    async with memory_host(script, plugins=("scripted-model", "skills")) as host:
        agent = host.create_agent(AgentSpec(cwd=str(repo), provider="scripted", model=str(script)))
        assert "# Skills" not in agent.system


def test_a_catalog_sees_a_skill_written_into_an_existing_folder(project):
    from dsh_skills.catalog import Catalog

    repo, _, _ = project
    folder = repo / ".agents" / "skills" / "later"
    folder.mkdir(parents=True)
    catalog = Catalog(str(repo))
    assert catalog.refresh() == {}
    skill(repo / ".agents" / "skills", "later", "written after the folder")  # the root's mtime does not change
    assert list(catalog.refresh()) == ["later"]
    (folder / "SKILL.md").write_text("---\nname: later\ndescription: edited\n---\n")
    assert catalog.refresh()["later"].description == "edited"
