"""The documentation site (mkdocs.yml, docs/) builds with warnings as errors, its API reference
is generated from the docstrings, and the figures it shows are in the built site."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fp8sim

ROOT = Path(__file__).resolve().parent.parent


def _text(page: Path) -> str:
    """The text of an HTML page without its tags, whitespace collapsed."""
    s = re.sub(r"<(script|style)\b.*?</\1>", " ", page.read_text(encoding="utf-8"), flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", s)).split())


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("docs") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode != 0:
        print(out.stdout)
        print(out.stderr)
    assert out.returncode == 0, out.stderr[-5000:]
    return out_dir


def test_api_reference_comes_from_docstrings(site):
    page = _text(site / "api" / "rounding" / "index.html")
    first_line = fp8sim.round.__doc__.strip().splitlines()[0].replace("``", "")
    assert first_line in page  # "Round x to the values of fmt."
    assert "clamp overflow and +-inf to +-max (OCP satfinite)" in page  # a parameter's description
    assert ":func:" not in page  # Sphinx roles are rendered (docs/_ext/griffe_rst.py)


def test_figures_are_in_the_site(site):
    figures = sorted(p.name for p in (ROOT / "docs" / "figures").glob("*.png"))
    assert figures
    results = (site / "results" / "index.html").read_text(encoding="utf-8")
    for name in figures:
        assert f"figures/{name}" in results, f"docs/figures/{name} is not shown on the Results page"
    for page in site.rglob("*.html"):
        for src in re.findall(r'<img[^>]+src="([^"]+)"', page.read_text(encoding="utf-8")):
            if "figures/" in src and "://" not in src:
                assert (page.parent / src).resolve().is_file(), f"{page.relative_to(site)}: broken image {src}"
