"""Exported pages in a real headless Chromium (Debian's ``chromium``, driven by Playwright with
``executable_path``: Playwright downloads no browser here). What a person sees is asserted: the
turns, a tool call's result, a diff line, the totals, search; no console error and no request but
the page's own file. Without chromium (or playwright) the tests skip, except under CI=true, where
the set-up installs both and their absence fails."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from recorded import big_session, run_dsh
from test_session_export import XSS, _session

from dsh_testing.browser import Page as _Page
from dsh_testing.browser import expect


@pytest.fixture
def browser(chromium_browser):
    return chromium_browser


def Page(browser, path: Path) -> _Page:
    return _Page(browser, path, ready="html[data-ready]")


def recorded_page(browser, recorded_store, tmp_path: Path, scenario: str) -> _Page:
    """The page ``dsh sessions export --html`` writes for a recorded scenario's session, opened."""
    home, recorded = recorded_store
    [rec] = [r for r in recorded if r.scenario == scenario]
    out = tmp_path / "page.html"
    assert run_dsh(home, rec.ids[0], "--html", "-o", str(out)).returncode == 0
    return Page(browser, out)


def test_a_recorded_session_as_a_person_sees_it(browser, recorded_store, tmp_path):
    """acp-agent/fs-delete-recreate (a read, a bash call, a failed read, a write that makes a diff)."""
    view = recorded_page(browser, recorded_store, tmp_path, "acp-agent/fs-delete-recreate")
    try:
        page = view.page
        assert page.locator("section.turn").count() == 1
        assert page.locator("[data-total=turns]").inner_text() == "1"
        assert page.locator("[data-total=tool-calls]").inner_text() == "4"
        assert page.locator("[data-total=model-calls]").inner_text() == "5"
        assert page.locator("[data-total=errors]").inner_text() == "1"
        assert page.locator(".prompt").inner_text() == "delete and recreate deleted.txt"
        bash = page.locator('details.call[data-call="call_2"]')
        assert bash.locator(".name").inner_text() == "bash"
        assert "rm deleted.txt" in bash.locator("pre.args").inner_text()
        assert bash.locator("pre.result").inner_text() == "(no output)"
        failed = page.locator('details.call[data-call="call_3"] .status')
        assert failed.inner_text() == "error NOT_FOUND"
        write = page.locator('details.call[data-call="call_4"]')
        assert write.locator("pre.diff .add").all_inner_texts() == ["+fresh"]
        assert write.locator("pre.diff .add").is_visible()
        assert page.locator(".answer").inner_text() == "DONE"
        page.fill("#q", "old contents")
        expect(page.locator("#hits")).to_have_text("1 of 1")
        assert "1: old contents" in page.locator(".hit").inner_text()
        view.clean()
    finally:
        view.close()


def test_a_subagent_opens_under_its_call(browser, recorded_store, tmp_path):
    view = recorded_page(browser, recorded_store, tmp_path, "acp-agent/spawn-report")
    try:
        page = view.page
        assert page.locator("section.turn").count() == 4
        child = page.locator('details.call[data-call="call_1"] details.child')
        assert not child.locator(".answer").count()  # drawn when opened
        child.locator("summary").click()
        assert child.locator(".answer").inner_text() == "REPORTER_DONE"
        assert "halfway there" in child.locator('details.call[data-call="call_1"] pre.args').inner_text()
        view.clean()
    finally:
        view.close()


def test_markup_in_a_tool_result_and_a_file_name_never_runs(browser, tmp_path):
    home = tmp_path / "home"
    sid = _session(home / "sessions", result=f"output {XSS}", path=f"{XSS}.txt")
    out = tmp_path / "page.html"
    assert run_dsh(home, sid, "--html", "-o", str(out)).returncode == 0
    view = Page(browser, out)
    try:
        page = view.page
        assert page.locator("html[data-pwned]").count() == 0
        assert page.locator("pre.result").inner_text() == f"output {XSS}"
        assert json.dumps(f"{XSS}.txt") in page.locator("pre.args").inner_text()
        assert page.locator("h1").inner_text() == f"write {XSS}.txt"
        assert page.locator("img").count() == 0
        view.clean()
    finally:
        view.close()


def test_a_10000_event_session_is_interactive_at_once(browser, tmp_path):
    """Drawn lazily: the first rows at once, the rest as the reader scrolls; search reaches the last
    event. The time to interactive is printed (bench/session_export_page.py prints it too), not
    asserted: a loaded machine must not fail the suite."""
    home = tmp_path / "home"
    sid = big_session(home / "sessions", 10_000)
    out = tmp_path / "big.html"
    assert run_dsh(home, sid, "--html", "-o", str(out)).returncode == 0
    view = Page(browser, out)
    try:
        page = view.page
        print(f"\n10,000-event session ({out.stat().st_size / 1e6:.1f} MB page): interactive in {view.seconds:.2f} s")
        turns = int(page.locator("[data-total=turns]").inner_text())
        assert turns == 500
        assert 0 < page.locator("section.turn").count() < turns  # not all drawn up front
        page.fill("#q", "the last output, number 2499")
        expect(page.locator("#hits")).to_have_text("1 of 1")
        assert "the last output, number 2499" in page.locator(".hit").inner_text()
        assert page.locator(".hit").is_visible()
        view.clean()
    finally:
        view.close()


SCRIPT = {"rules": [{"when": "notes", "steps": [
    {"tool": "bash", "args": {"command": "printf 'made <b>notes</b> & more\\n'", "description": "say it"}},
    {"tool": "write", "args": {"file_path": "notes.txt", "content": "one\ntwo\nthree\n"}},
    {"tool": "edit", "args": {"file_path": "notes.txt", "old_string": "two", "new_string": "TWO"}},
    {"text": "notes written"},
]}]}


def test_a_session_run_over_real_stdio_as_a_person_sees_it(browser, tmp_path):
    """acp-agent with the scripted model, over real stdio through the official ACP client: a bash
    call, a write and an edit (a diff against the text the write left); its log exported by the
    real dsh, the page opened in chromium."""
    import anyio
    from acp import text_block

    from dsh_testing import minimal_env, spawn_acp

    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))

    async def session() -> str:
        async with spawn_acp(script, cwd=work, env=minimal_env(DSH_HOME=str(home), DEEPSEEK_API_KEY="")) as run:
            sid = await run.start()
            answer = await run.conn.prompt(session_id=sid, prompt=[text_block("write the notes")])
            assert answer.stop_reason == "end_turn"
            assert run.client.text(sid)[-1] == "notes written"
            assert await run.close_stdin() == 0
        return sid

    with ThreadPoolExecutor(1) as pool:  # the sync Playwright API holds this thread's event loop
        sid = pool.submit(anyio.run, session).result(timeout=120)
    assert (work / "notes.txt").read_text() == "one\nTWO\nthree\n"
    out = tmp_path / "page.html"
    done = run_dsh(home, sid, "--html", "-o", str(out))
    assert done.returncode == 0, done.stderr
    view = Page(browser, out)
    try:
        page = view.page
        assert page.locator("section.turn").count() == 1 and page.locator("[data-total=turns]").inner_text() == "1"
        assert page.locator("[data-total=tool-calls]").inner_text() == "3"
        calls = page.locator("details.call")
        assert calls.locator(".name").all_inner_texts() == ["bash", "write", "edit"]
        assert calls.nth(0).locator("pre.result").inner_text().startswith("made <b>notes</b> & more")
        assert calls.nth(1).locator("pre.diff .add").all_inner_texts() == ["+one", "+two", "+three"]
        edit = calls.nth(2).locator("pre.diff")
        assert edit.locator(".del").all_inner_texts() == ["-two"] and edit.locator(".add").all_inner_texts() == ["+TWO"]
        assert edit.locator(".ctx").all_inner_texts() == [" one", " three"]
        assert page.locator(".answer").inner_text() == "notes written"
        view.clean()
    finally:
        view.close()
