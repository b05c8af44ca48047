"""Open a report in a real headless browser and check it (not part of CI).

    python scripts/check_report.py report/index.html [--screenshot docs/figures/report.png [--full-page]]

Loads the page in headless Chromium (through Playwright, using the system's
Chromium: set CHROMIUM=/path/to/chromium if it is not /usr/bin/chromium),
and fails (exit code 1) if the page logs a console error or a page error,
if any image is broken (naturalWidth 0) or if a section has no heading.
Optionally saves a screenshot: of the first screen (the 1200 x 900 viewport,
as docs/figures/report_screenshot.png), or with --full-page of the whole page.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def check(index: Path, screenshot: str | None = None, full_page: bool = False) -> dict:
    """Load ``index`` and check it; save a screenshot to ``screenshot`` (the whole page with
    ``full_page``, else the viewport) if given.  Returns what was found, ``ok`` the verdict."""
    from playwright.sync_api import sync_playwright

    exe = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=exe,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.goto(index.resolve().as_uri())
        page.wait_for_load_state("load")
        images = page.eval_on_selector_all(
            "img", "imgs => imgs.map(i => ({alt: i.alt, w: i.naturalWidth, h: i.naturalHeight}))"
        )
        sections = page.eval_on_selector_all("section", "ss => ss.map(s => !!s.querySelector('h2'))")
        title = page.title()
        if screenshot:
            page.screenshot(path=screenshot, full_page=full_page)
        browser.close()
    broken = [i["alt"] for i in images if not i["w"] or not i["h"]]
    result = {
        "title": title,
        "images": len(images),
        "broken_images": broken,
        "sections": len(sections),
        "sections_without_heading": sections.count(False),
        "errors": errors,
    }
    result["ok"] = not broken and not errors and all(sections) and len(images) > 0
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("index", type=Path)
    ap.add_argument("--screenshot", default=None, help="save a screenshot (PNG) here: the first screen")
    ap.add_argument(
        "--full-page", action="store_true", help="the screenshot is of the whole page, not the first screen"
    )
    args = ap.parse_args(argv)
    if args.full_page and not args.screenshot:
        ap.error("--full-page needs --screenshot PATH")
    r = check(args.index, args.screenshot, full_page=args.full_page)
    for k, v in r.items():
        print(f"{k:>26}: {v}")
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
