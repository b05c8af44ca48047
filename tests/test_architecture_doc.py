"""docs/architecture.md is written from the code: every module, file and dotted name it cites exists,
and every package and top-level module of fp8sim is on its map (so the page cannot silently go stale
when a module moves, as it did before 0.2.0)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "fp8sim"


def _cited_paths(text: str) -> set[str]:
    """``fp8sim/...``, ``gpu/...``, ``tests/...``, ``benchmarks/...``, ``scripts/...`` paths in backticks."""
    found = set()
    for code in re.findall(r"`([^`\n]+)`", text):
        for m in re.finditer(r"\b((?:fp8sim|gpu|tests|benchmarks|scripts|docs|examples)/[\w/.\-]*)", code):
            found.add(m.group(1).rstrip("."))
    return found


def _cited_names(text: str) -> set[str]:
    """Dotted ``fp8sim.x.y`` names in backticks (calls and attributes included, arguments dropped)."""
    found = set()
    for code in re.findall(r"`([^`\n]+)`", text):
        for m in re.finditer(r"\bfp8sim(?:\.\w+)+", code):
            found.add(m.group(0))
    return found


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_cited_path_exists():
    text = DOC.read_text(encoding="utf-8")
    paths = _cited_paths(text)
    assert len(paths) > 20, "the page should map the code by its files"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md cites files that do not exist: {missing}"


def test_every_cited_name_resolves():
    text = DOC.read_text(encoding="utf-8")
    names = _cited_names(text)
    assert names
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"docs/architecture.md cites names that do not exist: {missing}"


def test_every_package_and_module_is_on_the_map():
    """Each subpackage of fp8sim (``fp8sim/x/``) and each public top-level module (``fp8sim/x.py``)
    is cited by its path."""
    text = DOC.read_text(encoding="utf-8")
    paths = _cited_paths(text)
    units = [f"fp8sim/{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    units += [f"fp8sim/{p.name}" for p in PACKAGE.glob("*.py") if not p.name.startswith("_")]
    cited = {p.rstrip("/") for p in paths}
    absent = sorted(u for u in units if u.rstrip("/") not in cited)
    assert not absent, f"docs/architecture.md does not map: {absent}"


def test_every_module_of_a_package_is_named():
    """Within each package, every module file is named on the page (as ``name.py`` or its path)."""
    text = DOC.read_text(encoding="utf-8")
    absent = []
    for pkg in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        for mod in sorted(pkg.rglob("*.py")):
            if mod.name == "__init__.py":
                continue
            rel = mod.relative_to(PACKAGE.parent).as_posix()
            if rel not in text and f"`{mod.name}`" not in text and f"{mod.stem}`" not in text:
                absent.append(rel)
    assert not absent, f"docs/architecture.md does not name: {absent}"
