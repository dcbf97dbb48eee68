"""How fast an exported session page is interactive: a session of N events (default 10,000)
exported with the real ``dsh sessions export --html``, opened in Debian's chromium (Playwright,
``executable_path``), timed from navigation to the page's script having drawn its first rows
(``<html data-ready>``), median of ``--runs`` loads. Also the export's own wall time and the page size.

    python bench/session_export_page.py [--events 10000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins" / "session-export" / "tests"))

from recorded import big_session  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=10_000, help="events in the session (a multiple of 500)")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        sid = big_session(home / "sessions", args.events)
        page_file = Path(tmp) / "page.html"
        started = time.perf_counter()
        subprocess.run([str(Path(sys.executable).with_name("dsh")), "sessions", "export", sid, "--html", "-o",
                        str(page_file)], check=True, env=os.environ | {"DSH_HOME": str(home)})
        export_s = time.perf_counter() - started
        size = page_file.stat().st_size
        times = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"] if os.geteuid() == 0 else [])
            for _ in range(args.runs):
                page = browser.new_page()
                t0 = time.perf_counter()
                page.goto(page_file.as_uri())
                page.wait_for_selector("html[data-ready]")
                times.append(time.perf_counter() - t0)
                page.close()
            browser.close()
    print(f"session of {args.events} events: export {export_s:.2f} s (the dsh process, start-up included), "
          f"page {size / 1e6:.1f} MB")
    print(f"interactive in {statistics.median(times):.2f} s (median of {len(times)}; min {min(times):.2f}, max {max(times):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
