"""Pages in a real headless Chromium, as a person would open them: Debian's ``chromium`` driven
by Playwright (``executable_path``: Playwright downloads no browser here). Used by the tests of
exported session pages and batch reports (fixture ``chromium_browser``, class ``Page``).

Without chromium or Playwright the fixture skips with the reason, except under ``CI=true``, where
the set-up installs both (``.ci/run``) and their absence fails."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def launch() -> Iterator[Any]:
    """One browser for the caller's scope (a generator for a fixture to delegate to)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None  # type: ignore[assignment]
    missing = ("Debian's chromium is not installed (apt-get install chromium)" if chromium is None
               else "playwright is not installed (pip install playwright)" if sync_playwright is None else None)
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI installs the browser tests' parts: {missing}")
        pytest.skip(missing)
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # chromium refuses its own sandbox as root
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=args)
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """One page opened from a file, with everything it logged and asked for: ``requests`` (every
    request it made), ``routed`` (every one that reached the network layer: only the page's own
    file goes on, the rest is aborted), ``errors`` (console errors and uncaught exceptions),
    ``seconds`` (until ``ready``, a selector, matched)."""

    def __init__(self, browser: Any, path: Path, *, ready: str = "body") -> None:
        self.url = path.resolve().as_uri()
        self.context = browser.new_context()
        self.requests: list[str] = []
        self.routed: list[str] = []
        self.errors: list[str] = []

        def observe(route: Any) -> None:
            self.routed.append(route.request.url)
            if route.request.url == self.url:
                route.continue_()
            else:
                route.abort()

        self.context.route("**/*", observe)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        started = time.perf_counter()
        self.page.goto(self.url)
        self.page.wait_for_selector(ready)
        self.seconds = time.perf_counter() - started

    def close(self) -> None:
        self.context.close()

    def clean(self) -> None:
        """No console error, and no request but the page's own file."""
        assert self.errors == []
        assert self.requests == [self.url]
        assert self.routed == [self.url]


def expect(locator: Any) -> Any:
    """Playwright's ``expect`` (imported here: without Playwright a test module still loads, and skips)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)
