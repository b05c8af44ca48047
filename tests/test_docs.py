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


def test_api_reference_renders_tables_links_and_types(site):
    """reST simple tables become HTML tables (not raw ``=====`` text), ``docs/x.md`` mentions are links to
    the page, and no parameter listing has an empty Type column."""
    for page in (site / "api").rglob("*.html"):
        assert not re.search(r"={5,}\s+={3,}", _text(page)), f"{page.relative_to(site)}: raw reST table"
        raw = page.read_text(encoding="utf-8")
        for table in re.findall(r"<table>.*?</table>", raw, flags=re.S):
            heads = [
                html.unescape(re.sub(r"<[^>]+>", "", h)).strip()
                for h in re.findall(r"<th[^>]*>(.*?)</th>", table, re.S)
            ]
            if "Type" in heads:  # a parameter table: every row must name a type
                col = heads.index("Type")
                for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]:
                    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
                    assert re.sub(r"<[^>]+>", "", cells[col]).strip(), f"{page.relative_to(site)}: empty Type"
    training = (site / "api" / "training" / "index.html").read_text(encoding="utf-8")
    table = re.search(r"<table>.*?Fprop.*?</table>", training, flags=re.S)
    assert table and "Dgrad" in table.group(0) and "Wgrad" in table.group(0)  # the three GEMMs of linear.py
    scaling = (site / "api" / "scaling" / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<table>.*?block_shape.*?nvfp4.*?</table>", scaling, flags=re.S)
    gemm = (site / "api" / "gemm" / "index.html").read_text(encoding="utf-8")
    assert re.search(r'<a href="\.\./\.\./gemm/(#[^"]*)?">docs/gemm\.md</a>', gemm), "docs/gemm.md is not a link"


def test_scale_heatmap_ticks_are_block_indices(tmp_path, monkeypatch):
    """A 128x128 scale map of a 128-row tensor has one block row: its only y tick is 0 (not -0.4 .. 0.4);
    every tick of every scale map is an integer block index; the legends of the SQNR bars sit beside them."""
    import matplotlib.pyplot as plt

    from fp8sim.studies import granularity

    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    granularity.run(
        tmp_path,
        progress=False,
        shape=(128, 384),
        formats=["e4m3"],
        distributions=["outlier_channels"],
        granularities=["tensor", "1x128", "128x128", "mx32"],
    )
    heat = next(f for f in figs if f._suptitle is not None and "Per-block scales" in f._suptitle.get_text())
    maps = [ax for ax in heat.axes if ax.get_ylabel().startswith("block row")]
    assert [ax.get_title().split(":")[0] for ax in maps] == ["e4m3 1x128", "e4m3 128x128", "e4m3 mx32"]
    for ax in maps:
        lo, hi = sorted(ax.get_ylim())
        yt = [t for t in ax.get_yticks() if lo <= t <= hi]
        xt = [t for t in ax.get_xticks() if min(ax.get_xlim()) <= t <= max(ax.get_xlim())]
        assert yt and all(float(t).is_integer() for t in yt + xt), (ax.get_title(), yt, xt)
    assert [t for t in maps[1].get_yticks() if -0.5 <= t <= 0.5] == [0]
    assert "128 tokens each" in maps[1].get_ylabel() and "1 token each" in maps[0].get_ylabel()
    bars = figs[0]
    bars.canvas.draw()
    leg = bars.axes[-1].get_legend()
    assert leg.get_window_extent().x0 >= bars.axes[-1].get_window_extent().x1
