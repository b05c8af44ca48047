"""Lint and type checks of the package (ruff and mypy, configured in pyproject.toml), and the rules of
its public surface, checked on the sources (ast): no import cycle among fp8sim's modules, no use of
another module's private (underscore) names, an ``__all__`` in every public module."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fp8sim"

#: private modules that are the packages' shared internal helpers: their non-underscore names are public
#: to the other modules of fp8sim (and to gpu/ and benchmarks/)
SHARED_PRIVATE_MODULES = {
    "fp8sim._inputs",
    "fp8sim._version",
    "fp8sim._names",
    "fp8sim._json",
    "fp8sim._buffers",
    "fp8sim._numba_cache",
    "fp8sim._threads",
    "fp8sim._fpenv",
    "fp8sim._moved",
    "fp8sim.training._detmath",
}


def test_ruff_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed (pip install -e '.[test]')")
    out = subprocess.run(
        [ruff, "check", "fp8sim", "tests", "gpu", "examples", "scripts", "benchmarks", "analysis"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-3000:]


def test_mypy_clean():
    pytest.importorskip("mypy")
    out = subprocess.run([sys.executable, "-m", "mypy", "fp8sim"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]


def test_ruff_format_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed (pip install -e '.[test]')")
    out = subprocess.run([ruff, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]


# ------------------------------------------------------------------ sources
def _modules() -> dict[str, Path]:
    """Every module of fp8sim: dotted name -> file (a package by its ``__init__.py``)."""
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES.get(module, Path()).name == "__init__.py"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports that never run)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def _imports(module: str, path: Path):
    """``(node, target module, imported names)`` for every import statement of ``path`` that runs
    (module level and inside functions), the target resolved to a dotted name; names are
    ``(name, asname)`` pairs, empty for ``import x``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node, a.name, [], a
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node, target, [(a.name, a.asname) for a in node.names], None


def _import_graph() -> dict[str, set[str]]:
    """module -> the fp8sim modules it imports (a name imported from a package that is one of its
    submodules counts as that submodule)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for _node, target, names, _alias in _imports(mod, path):
            while target and target not in MODULES:  # a name registered in sys.modules: its package
                target = target.rpartition(".")[0]
            if not target:
                continue
            subs = [f"{target}.{n}" for n, _ in names if f"{target}.{n}" in MODULES]
            if subs and len(subs) == len(names):
                graph[mod].update(subs)
            else:
                graph[mod].add(target)
                graph[mod].update(subs)
        graph[mod].discard(mod)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    """No fp8sim module imports (at module level or inside a function) one that imports it back."""
    graph = _import_graph()
    cycles = _cycles(graph)
    detail = [
        " <-> ".join(c) + "  (" + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) + ")" for c in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(detail)


def _private_uses(path: Path, module: str | None) -> list[str]:
    """Where ``path`` uses a private name of another fp8sim module: ``from X import _n``, an import of a
    private module that is neither one of :data:`SHARED_PRIVATE_MODULES` nor of ``path``'s own package
    (a package's ``_kernels``), or ``X._n`` on an imported module."""
    where = path.relative_to(ROOT)
    found = []
    aliases: dict[str, str] = {}  # local name -> the fp8sim module it is bound to

    own = (module if path.name == "__init__.py" else module.rpartition(".")[0]) if module else None

    def private_module(mod: str) -> bool:
        # a package's private modules (its kernels) are private to that package
        parent, _, leaf = mod.rpartition(".")
        if own is not None and parent == own and not any(_private(p) for p in parent.split(".")) and _private(leaf):
            return False
        return any(_private(p) for p in mod.split(".")) and mod not in SHARED_PRIVATE_MODULES

    for node, target, names, alias in _imports(module or "", path):
        if not (target == "fp8sim" or target.startswith("fp8sim.")):
            continue
        if alias is not None:  # import fp8sim.x [as y]
            if private_module(target):
                found.append(f"{where}:{node.lineno}: import {target}")
            if alias.asname:
                aliases[alias.asname] = target
            else:
                aliases.setdefault(target.split(".")[0], target.split(".")[0])
            continue
        if private_module(target) and target != module:
            found.append(f"{where}:{node.lineno}: from {target} import ...")
        for name, asname in names:
            sub = f"{target}.{name}"
            if sub in MODULES:
                if private_module(sub) and sub != module:
                    found.append(f"{where}:{node.lineno}: from {target} import {name}")
                aliases[asname or name] = sub
            elif _private(name) and target != module:
                found.append(f"{where}:{node.lineno}: from {target} import {name}")
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        chain, v = [], node.value
        while isinstance(v, ast.Attribute):
            chain.append(v.attr)
            v = v.value
        if not isinstance(v, ast.Name) or v.id not in aliases:
            continue
        mod = ".".join([aliases[v.id], *reversed(chain)])
        if mod in MODULES and mod != module and f"{mod}.{node.attr}" not in SHARED_PRIVATE_MODULES:
            found.append(f"{where}:{node.lineno}: {mod}.{node.attr}")
    return found


def test_no_private_names_across_modules():
    """fp8sim's modules, gpu/ and benchmarks/ use only public names of the other fp8sim modules (the
    shared private helper modules count as public)."""
    found = []
    for mod, path in MODULES.items():
        found += _private_uses(path, mod)
    for folder in ("gpu", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += _private_uses(path, None)
    assert not found, "private names used across modules:\n" + "\n".join(found)


def _top_level_names(tree: ast.Module) -> set[str] | None:
    """The names a module binds at its top level (None when it has a star import)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    return None
                names.add(a.asname or a.name.split(".")[0])
    return names


def _all_of(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
            return list(ast.literal_eval(node.value))
    return None


def test_every_public_module_has_all():
    """Every public module of fp8sim (no underscore in its dotted name; packages included) defines
    ``__all__``, and every name in it is defined in the module."""
    missing, undefined = [], []
    for mod, path in MODULES.items():
        if any(_private(p) for p in mod.split(".")) or path.name == "__main__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        names = _all_of(tree)
        if names is None:
            missing.append(mod)
            continue
        bound = _top_level_names(tree)
        if bound is not None:
            subs = {m.rpartition(".")[2] for m in MODULES if m.rpartition(".")[0] == mod}
            undefined += [f"{mod}.{n}" for n in names if n not in bound and n not in subs]
    assert not missing, "public modules without __all__: " + ", ".join(missing)
    assert not undefined, "names in __all__ that the module does not define: " + ", ".join(undefined)


# ------------------------------------------------------------------ layering between packages
#: fp8sim's units (a subpackage or a top-level module) by rank: a unit imports only units of a lower
#: rank (docs/architecture.md has the same table); units of one rank do not import each other
LAYERS: tuple[tuple[str, ...], ...] = (
    ("fp8sim._version",),
    (
        "fp8sim._names",
        "fp8sim._inputs",
        "fp8sim._json",
        "fp8sim._buffers",
        "fp8sim._fpenv",
        "fp8sim._numba_cache",
        "fp8sim._threads",
    ),
    ("fp8sim.formats", "fp8sim.intrinsics"),
    ("fp8sim.rounding",),
    ("fp8sim.scaling", "fp8sim.tensorcore"),
    ("fp8sim.metrics",),
    ("fp8sim.gemms",),
    ("fp8sim.training",),
    ("fp8sim.torch", "fp8sim.plotting"),
    ("fp8sim.studies",),
    ("fp8sim.sweep", "fp8sim.report"),
    ("fp8sim.cli",),
    ("fp8sim._moved",),
    ("fp8sim",),
)


def _unit(module: str) -> str:
    parts = module.split(".")
    return module if len(parts) == 1 else ".".join(parts[:2])


def test_layers_cover_every_unit():
    """Every subpackage and top-level module of fp8sim has a rank in :data:`LAYERS` (once)."""
    ranked = [u for layer in LAYERS for u in layer]
    assert len(ranked) == len(set(ranked)), "a unit is listed twice in LAYERS"
    units = {_unit(m) for m in MODULES}
    assert units == set(ranked), f"unranked: {sorted(units - set(ranked))}; gone: {sorted(set(ranked) - units)}"


def test_packages_import_only_lower_layers():
    """Imports between fp8sim's packages point down :data:`LAYERS` (module level or inside functions):
    nothing in tensorcore/ or scaling/ imports gemms/, gemms/ imports neither training/ nor torch/, and
    so on; siblings of one rank (scaling and tensorcore) do not import each other."""
    rank = {u: i for i, layer in enumerate(LAYERS) for u in layer}
    bad = []
    for mod, targets in _import_graph().items():
        for target in targets:
            a, b = _unit(mod), _unit(target)
            if a != b and rank[b] >= rank[a]:
                bad.append(f"{mod} -> {target} ({a} rank {rank[a]}, {b} rank {rank[b]})")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))
