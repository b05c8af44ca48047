"""Installation and packaging: the installed command works outside the checkout, numba's cache of
fp8sim's kernels never lives inside the installed package, the wheel carries what the package reads
at run time (the compact hardware captures, the licence).

The wheel tests build fp8sim from a copy of the checkout with the environment's setuptools (no
download: ``--no-build-isolation``) and install it into throw-away virtual environments that see
the packages of the interpreter running the tests (its site-packages folders, through a ``.pth``
file: ``--system-site-packages`` would give the base interpreter's when the tests run in a venv),
then run the installed ``fp8sim`` from a temporary folder without ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numba
import numpy as np
import pytest

import fp8sim
from fp8sim import _numba_cache, report

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fp8sim"
BIN = "Scripts" if sys.platform == "win32" else "bin"


# --- helpers ----------------------------------------------------------------------------------


def _copy_sources(dest: Path) -> Path:
    """What a build of fp8sim reads: pyproject.toml, README.md, LICENSE and the package."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(PACKAGE, dest / "fp8sim", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _pip(*args: str, python: Path | None = None, cwd: Path | None = None) -> None:
    cmd = [sys.executable, "-m", "pip"]
    if python is not None:
        cmd += ["--python", str(python)]
    cmd += ["--disable-pip-version-check", "--no-input", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)
    assert out.returncode == 0, f"{' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


def _outer_site_dirs() -> list:
    """The site-packages folders of the interpreter running the tests (a venv's, a conda
    environment's, the system's; the user's when enabled), in the order of its ``sys.path``."""
    known = list(site.getsitepackages()) + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    named = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    dirs = [p for p in sys.path if p in known or p in named] + known
    return [d for i, d in enumerate(dirs) if os.path.isdir(d) and d not in dirs[:i]]


def _venv(path: Path) -> Path:
    """A throw-away venv that imports what this interpreter imports, after its own packages.

    ``--system-site-packages`` is not that: from inside a venv it exposes the *base* interpreter's
    packages, not the running venv's (numba, numpy, ... would be missing). Instead a ``.pth`` file
    in the new venv's site-packages adds this interpreter's site folders with ``site.addsitedir``
    (so their own ``.pth`` files work too). Its name sorts after pip's ``__editable__.*.pth`` files,
    so an editable install into the new venv comes before one of the outer interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    py = path / BIN / ("python.exe" if sys.platform == "win32" else "python")
    lines = [f"import site; site.addsitedir({d!r})\n" for d in _outer_site_dirs()]
    (_site_packages(py) / "zz_fp8sim_tests_outer_site.pth").write_text("".join(lines))
    return py


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FP8SIM_CACHE_DIR", "NUMBA_CACHE_DIR")}
    env.update(extra)
    return env


def _run(args: list, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
    )
    return Path(out.stdout.strip())


def _numba_files(folder: Path) -> list:
    return sorted(p for p in folder.rglob("*") if p.suffix in (".nbi", ".nbc")) if folder.exists() else []


def _e4m3(x: float) -> float:
    """Independent E4M3 rounding: ml_dtypes' float8_e4m3fn."""
    return float(np.array([x], np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)[0])


def _need_setuptools() -> None:
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"building fp8sim needs setuptools>=77 (pip install -e '.[test]'), have {setuptools.__version__}")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of the checkout, built from a copy (nothing is written into the checkout)."""
    _need_setuptools()
    base = tmp_path_factory.mktemp("wheel")
    src = _copy_sources(base / "src")
    _pip("wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", str(base / "dist"), str(src), cwd=base)
    (whl,) = (base / "dist").glob("fp8sim-*.whl")
    return whl


# --- the wheel ----------------------------------------------------------------------------------


def test_throwaway_venv_imports_what_this_interpreter_imports(tmp_path):
    """The venvs of these tests import fp8sim's dependencies from where the interpreter running the
    tests does, also when that interpreter is itself a venv (issue #26: ``--system-site-packages``
    gave the base interpreter's packages, and numba was missing), and their own packages first."""
    py = _venv(tmp_path / "venv")
    names = ["numba", "numpy", "ml_dtypes", "setuptools", "pytest"]
    probe = (
        "import importlib.util, json, sys, sysconfig\n"
        "print(json.dumps({'origins': {n: importlib.util.find_spec(n).origin for n in sys.argv[1:]},"
        " 'own': sysconfig.get_paths()['purelib'], 'path': sys.path}))\n"
    )
    r = _run([py, "-c", probe, *names], tmp_path, _clean_env())
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    for name in names:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        assert Path(got["origins"][name]).resolve() == Path(spec.origin).resolve(), name
    own = got["path"].index(got["own"])
    outer = [got["path"].index(d) for d in _outer_site_dirs() if d in got["path"]]
    assert outer and own < min(outer), (own, outer)


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n.split("/")[-1] for n in names if n.startswith("fp8sim/captures/"))
    assert shipped == sorted(p.name for p in (PACKAGE / "captures").glob("*.npz")) and shipped
    assert not [n for n in names if "__pycache__" in n or n.endswith((".nbi", ".nbc", ".pyc"))]
    sources = sorted(p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
    assert sorted(n for n in names if n.endswith(".py")) == sources
    meta = zipfile.ZipFile(wheel).read(f"fp8sim-{fp8sim.__version__}.dist-info/METADATA").decode()
    assert f"\nVersion: {fp8sim.__version__}\n" in meta
    assert "\nLicense-Expression: Apache-2.0\n" in meta
    lic = zipfile.ZipFile(wheel).read(f"fp8sim-{fp8sim.__version__}.dist-info/licenses/LICENSE").decode()
    assert lic == (ROOT / "LICENSE").read_text()
    for extra in ("gpu-cuda12", "gpu-cuda13", "hf"):
        assert f"\nProvides-Extra: {extra}\n" in meta
    assert 'cupy-cuda12x>=13; extra == "gpu-cuda12"' in meta
    assert 'cupy-cuda13x>=13.6; extra == "gpu-cuda13"' in meta
    assert 'transformers>=4.40; extra == "hf"' in meta


def test_installed_command_outside_checkout(wheel, tmp_path):
    """The installed ``fp8sim`` from a temporary folder, no PYTHONPATH: it imports the installed
    copy, rounds correctly, caches its kernels outside the package and finds the shipped captures."""
    py = _venv(tmp_path / "venv")
    _pip("install", "--no-deps", "--no-index", str(wheel), python=py)
    site = _site_packages(py)
    cache = tmp_path / "cache"
    env = _clean_env(FP8SIM_CACHE_DIR=str(cache))
    work = tmp_path / "work"
    work.mkdir()
    fp8 = py.parent / "fp8sim"

    help_ = _run([fp8, "--help"], work, env)
    assert help_.returncode == 0, help_.stderr
    assert "usage: fp8sim" in help_.stdout
    ver = _run([fp8, "--version"], work, env)
    assert ver.returncode == 0 and ver.stdout.strip() == f"fp8sim {fp8sim.__version__}", ver.stdout + ver.stderr

    r = _run([fp8, "round", "0.1", "--format", "e4m3", "--json"], work, env)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["results"][0]
    # 0.1 lies in [2^-4, 2^-3): E4M3's step there is 2^-4 / 8, and 0.1 / 2^-7 = 12.8 rounds to 13
    assert res["value"] == 13 * 2.0**-7 == _e4m3(0.1)
    assert res["code"] == "0x1d"  # sign 0, exponent -4 + 7 = 0b0011, mantissa 0b101

    probe = (
        "import importlib.metadata as m, json, fp8sim\n"
        "from fp8sim import report, _numba_cache as c\n"
        "print(json.dumps({'file': fp8sim.__file__, 'meta': m.version('fp8sim'), 'captures': str(report.capture_dir()),"
        " 'cache': str(c.cache_dir())}))\n"
    )
    p = _run([py, "-c", probe], work, env)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    installed = site / "fp8sim"
    assert Path(info["file"]).resolve() == (installed / "__init__.py").resolve()
    assert info["meta"] == fp8sim.__version__
    assert Path(info["captures"]).resolve() == (installed / "captures").resolve()
    assert Path(info["cache"]).resolve().parent == cache.resolve()
    assert _numba_files(cache), "the kernel compiled by `fp8sim round` was not cached under FP8SIM_CACHE_DIR"
    assert _numba_files(installed) == []


def test_uninstall_then_editable_install(wheel, tmp_path):
    """Issue #18's sequence: a regular installation runs (and caches its kernels in the default
    per-user folder), is uninstalled, the sources are installed in development mode, and the command
    run from another folder must import the new installation, not a leftover ``fp8sim/`` folder."""
    py = _venv(tmp_path / "venv")
    env = _clean_env(XDG_CACHE_HOME=str(tmp_path / "xdg"))
    work = tmp_path / "work"
    work.mkdir()
    fp8 = py.parent / "fp8sim"
    site = _site_packages(py)

    _pip("install", "--no-deps", "--no-index", str(wheel), python=py)
    r = _run([fp8, "round", "0.1", "--format", "e4m3"], work, env)
    assert r.returncode == 0, r.stderr
    assert _numba_files(tmp_path / "xdg" / "fp8sim"), "no kernel cache in $XDG_CACHE_HOME/fp8sim"
    assert _numba_files(site / "fp8sim") == []

    _pip("uninstall", "-y", "fp8sim", python=py)
    assert not (site / "fp8sim").exists(), sorted(map(str, (site / "fp8sim").rglob("*")))

    src = _copy_sources(tmp_path / "src")
    _pip("install", "--no-build-isolation", "--no-deps", "--no-index", "-e", str(src), python=py, cwd=tmp_path)
    h = _run([fp8, "--help"], work, env)
    assert h.returncode == 0, h.stderr
    p = _run([py, "-c", "import fp8sim; print(fp8sim.__file__, fp8sim.__version__)"], work, env)
    assert p.returncode == 0, p.stderr
    where, version = p.stdout.split()
    assert Path(where).resolve() == (src / "fp8sim" / "__init__.py").resolve() and version == fp8sim.__version__


def test_editable_install_seen_from_the_folder_that_contains_the_checkout(tmp_path):
    """Issue #26: a checkout folder named ``fp8sim`` in the current folder (or on PYTHONPATH) shadows
    an editable install of it: Python's path search takes the folder, which has no __init__.py, for an
    empty namespace package before setuptools' editable finder is asked, and fp8sim's __init__ never
    runs. The command must then stop with an error that says so, not run half set up; from any other
    folder it works."""
    _need_setuptools()
    checkout = _copy_sources(tmp_path / "fp8sim")
    py = _venv(tmp_path / "venv")
    _pip("install", "--no-build-isolation", "--no-deps", "--no-index", "-e", str(checkout), python=py, cwd=tmp_path)
    fp8 = py.parent / "fp8sim"
    env = _clean_env(FP8SIM_CACHE_DIR=str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    real = (checkout / "fp8sim" / "__init__.py").resolve()

    for cwd in (work, checkout):  # elsewhere, and inside the checkout: the real package
        p = _run([py, "-c", "import fp8sim; print(fp8sim.__file__)"], cwd, env)
        assert p.returncode == 0 and Path(p.stdout.strip()).resolve() == real, p.stdout + p.stderr
        v = _run([py, "-m", "fp8sim.cli", "--version"], cwd, env)
        assert v.returncode == 0 and v.stdout.strip() == f"fp8sim {fp8sim.__version__}", v.stdout + v.stderr

    p = _run([py, "-c", "import fp8sim; print(fp8sim.__file__)"], tmp_path, env)
    assert p.returncode == 0, p.stderr
    runs = [
        _run([py, "-m", "fp8sim.cli", "round", "0.1", "--format", "e4m3"], tmp_path, env),
        _run([fp8, "round", "0.1", "--format", "e4m3"], work, dict(env, PYTHONPATH=str(tmp_path))),
    ]
    if p.stdout.strip() == "None":  # shadowed (setuptools' editable finder, at least up to 84)
        for r in runs:
            assert r.returncode != 0 and r.stdout == "", r.stdout
            assert "ImportError: fp8sim: Python took the folder " + str(checkout) in r.stderr, r.stderr[-2000:]
            assert "empty namespace package" in r.stderr and "pip install ." in r.stderr
        assert _numba_files(checkout) == []
    else:  # an editable install that Python's path search finds: the real package, and the command works
        assert Path(p.stdout.strip()).resolve() == real, p.stdout
        for r in runs:
            assert r.returncode == 0 and "0x1d" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_installed_report_quick(wheel, tmp_path):
    """``fp8sim report --quick`` from an installed wheel outside the checkout, end to end: every
    section, the tensor-core models scored bit for bit on the shipped captures."""
    py = _venv(tmp_path / "venv")
    _pip("install", "--no-deps", "--no-index", str(wheel), python=py)
    env = _clean_env(FP8SIM_CACHE_DIR=str(tmp_path / "cache"))
    r = _run([py.parent / "fp8sim", "report", "--out", "rep", "--quick", "--quiet"], tmp_path, env, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    text = json.dumps(summary)
    assert "No hardware captures" not in text
    html = (tmp_path / "rep" / "index.html").read_text()
    assert "No hardware captures" not in html
    rows = (tmp_path / "rep" / "tensorcore_validation.csv").read_text().splitlines()
    assert len(rows) == 1 + 3, rows  # wgmma, wgmma.f16, mma.sync
    header = rows[0].split(",")
    for line in rows[1:]:
        row = dict(zip(header, line.split(",")))
        assert int(row["outputs"]) > 0 and row["bit_exact"] == row["outputs"], row


# --- the numba cache (in process) -----------------------------------------------------------------


def _cached_dispatchers() -> dict:
    """Every numba dispatcher with ``cache=True`` in fp8sim's modules, by qualified name."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(fp8sim.__path__, "fp8sim."):  # every module, so every kernel
        importlib.import_module(info.name)
    found = {}
    for mod in [m for name, m in sorted(sys.modules.items()) if name.startswith("fp8sim") and m is not None]:
        for name, obj in vars(mod).items():
            cache = getattr(obj, "_cache", None)
            if isinstance(obj, numba.core.dispatcher.Dispatcher) and hasattr(cache, "_cache_path"):
                if obj.py_func.__module__ == mod.__name__:
                    found[f"{mod.__name__}.{name}"] = cache._cache_path
    return found


def test_every_cached_kernel_caches_outside_the_package():
    found = _cached_dispatchers()
    # independent count: the ``cache=True`` decorators in the package's sources
    n_decorators = sum(
        len(re.findall(r"^@(?:numba\.)?njit\([^)]*cache=True", p.read_text(), re.M)) for p in PACKAGE.rglob("*.py")
    )
    assert len(found) == n_decorators > 0, (len(found), n_decorators)
    root = _numba_cache.cache_dir()
    assert root is not None
    for name, path in found.items():
        p = Path(path).resolve()
        assert p.is_relative_to(root.resolve()), (name, path)
        assert not p.is_relative_to(PACKAGE.resolve()), (name, path)
    # and a compiled kernel's files land there
    fp8sim.round(np.array([0.1, 3.0], np.float32), "e4m3")
    assert _numba_files(root)
    assert root.name == f"numba-{fp8sim.__version__}-{_numba_cache.source_key().split('-')[-1]}"


def test_user_numba_functions_keep_numba_locators(tmp_path, monkeypatch):
    """Only fp8sim's kernels are redirected: a user's cache=True function still caches next to its
    own source (numba's default)."""
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    src = tmp_path / "user_mod_fp8sim_test.py"
    src.write_text("from numba import njit\n\n@njit(cache=True)\ndef f(x):\n    return x + 1\n")
    spec = importlib.util.spec_from_file_location("user_mod_fp8sim_test", src)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if numba.config.CACHE_DIR:
        pytest.skip("NUMBA_CACHE_DIR was set when numba was imported")
    assert Path(mod.f._cache._cache_path).resolve() == (tmp_path / "__pycache__").resolve()
    assert mod.f(1) == 2


def test_cache_root_precedence(tmp_path, monkeypatch):
    for var in ("FP8SIM_CACHE_DIR", "NUMBA_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _numba_cache._default_root() == tmp_path / "home" / ".cache" / "fp8sim"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: relative paths are invalid
    assert _numba_cache._default_root() == tmp_path / "home" / ".cache" / "fp8sim"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _numba_cache._default_root() == tmp_path / "xdg" / "fp8sim"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "nb"))
    assert _numba_cache._default_root() == tmp_path / "nb" / "fp8sim"
    monkeypatch.setenv("FP8SIM_CACHE_DIR", str(tmp_path / "mine"))
    assert _numba_cache._default_root() == tmp_path / "mine"
    got = _numba_cache._choose("9.9-abc")
    assert got == tmp_path / "mine" / "numba-9.9-abc" and got.is_dir() and (got / "last-used").is_file()


def test_unwritable_cache_root_falls_back_with_a_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FP8SIM_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.warns(RuntimeWarning, match="FP8SIM_CACHE_DIR"):
        got = _numba_cache._choose("9.9-abc")
    assert got is not None and got.is_dir() and got.is_relative_to(tmp_path / "tmp")
    assert got.name == "numba-9.9-abc"


def test_cache_key_follows_every_source_file(tmp_path):
    """numba checks only a kernel's own file; the key covers all of them, so a change to a module
    whose functions or constants a kernel compiled in never reuses a stale cache."""
    a = tmp_path / "a"
    shutil.copytree(PACKAGE, a, ignore=shutil.ignore_patterns("__pycache__"))
    b = tmp_path / "b"
    shutil.copytree(a, b)
    key = _numba_cache.package_key(a, "0.1.0")
    assert re.fullmatch(r"0\.1\.0-[0-9a-f]{16}", key)
    assert _numba_cache.package_key(b, "0.1.0") == key  # same sources elsewhere: the same cache
    assert _numba_cache.package_key(a, "0.2.0") != key
    for rel in ("formats.py", "rounding/_kernels.py", "rounding/fast8.py", "scaling/rows.py", "training/__init__.py"):
        f = b / rel
        original = f.read_bytes()
        f.write_bytes(original + b"\n# changed\n")
        assert _numba_cache.package_key(b, "0.1.0") != key, rel
        f.write_bytes(original)
    (b / "new_module.py").write_text("X = 1\n")
    assert _numba_cache.package_key(b, "0.1.0") != key


def test_prune_removes_only_stale_other_keys(tmp_path):
    old, recent, current = (tmp_path / f"numba-{k}" for k in ("old", "recent", "current"))
    other = tmp_path / "unrelated"
    foreign = tmp_path / "numba-not-ours"  # no marker: not fp8sim's, never removed
    for d in (old, recent, current, other, foreign):
        d.mkdir()
        if d is not foreign:
            (d / "last-used").touch()
    long_ago = 1_000_000_000  # 2001
    os.utime(old / "last-used", (long_ago, long_ago))
    os.utime(current / "last-used", (long_ago, long_ago))
    os.utime(other / "last-used", (long_ago, long_ago))
    os.utime(foreign, (long_ago, long_ago))
    _numba_cache._prune(tmp_path, current.name)
    assert not old.exists()
    assert recent.exists() and current.exists() and other.exists() and foreign.exists()


def test_leftover_in_tree_cache_is_removed(tmp_path):
    pkg = tmp_path / "fp8sim"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "scaling" / "__pycache__").mkdir(parents=True)
    (pkg / "training" / "__pycache__").mkdir(parents=True)
    stale = [
        pkg / "__pycache__" / "scaling._apply-1188.py311.nbi",  # (the module of older versions)
        pkg / "scaling" / "__pycache__" / "kernels.apply-40.py311.nbi",
        pkg / "training" / "__pycache__" / "m.f-1.py311.1.nbc",
    ]
    keep = [
        pkg / "scaling" / "__pycache__" / "kernels.cpython-311.pyc",
        pkg / "scaling" / "kernels.py",
        pkg / "scaling" / "__init__.py",
    ]
    for f in stale + keep:
        f.write_bytes(b"x")
    _numba_cache.remove_in_tree_cache(pkg)
    assert [f.exists() for f in stale] == [False, False, False]
    assert [f.exists() for f in keep] == [True, True, True]


# --- the hardware captures ---------------------------------------------------------------------------


def test_shipped_captures_are_copies_of_the_test_data():
    shipped = sorted((PACKAGE / "captures").glob("*.npz"))
    total = sum(f.stat().st_size for f in shipped)
    assert 0 < total < 1_000_000, total
    for f in shipped:
        assert f.read_bytes() == (ROOT / "tests" / "data" / f.name).read_bytes(), f.name
    # every accumulator model the report scores, with normal and with inf/NaN inputs
    for instr in ("wgmma", "wgmma.f16", "mma.sync"):
        assert (PACKAGE / "captures" / f"{instr}_e4m3xe4m3_normal.npz").is_file()
        assert (PACKAGE / "captures" / f"{instr}_e4m3xe4m3_special.npz").is_file()


def test_capture_dir_order_and_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("FP8SIM_CAPTURES", raising=False)
    # a stray tests/data folder in the current directory is not fp8sim's checkout
    stray = tmp_path / "tests" / "data"
    stray.mkdir(parents=True)
    np.savez(stray / "x.npz", a=np.zeros(1))
    monkeypatch.chdir(tmp_path)
    got = report.capture_dir()
    assert got is not None and got.resolve() != stray.resolve()
    if (ROOT / "pyproject.toml").is_file():  # this package is the checkout's (development mode)
        assert got.resolve() == (ROOT / "tests" / "data").resolve()
    # FP8SIM_CAPTURES wins, and a wrong one is an error naming it
    monkeypatch.setenv("FP8SIM_CAPTURES", str(stray))
    assert report.capture_dir() == stray
    monkeypatch.setenv("FP8SIM_CAPTURES", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="FP8SIM_CAPTURES=.*is not a folder"):
        report.capture_dir()
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("FP8SIM_CAPTURES", str(empty))
    with pytest.raises(ValueError, match="FP8SIM_CAPTURES=.*has no .npz files"):
        report.capture_dir()


# --- project files ----------------------------------------------------------------------------------


def test_license_and_metadata_agree():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"  # an SPDX expression (PEP 639), not a table
    assert meta["project"]["license-files"] == ["LICENSE"]
    req = meta["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(\d+)", r) and int(r.split(">=")[1]) >= 77 for r in req), req
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert len(re.findall(r"^\s+\d\. [A-Z]", text, re.M)) == 9  # sections 1-9 (Definitions ... Accepting Warranty)


def test_every_example_import_has_an_extra():
    """Issue #26: examples/hf_tiny.py imports transformers, which no extra provided. Its extra must
    provide what it imports (torch and transformers), and the wheel must declare it."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = meta["project"]["optional-dependencies"]
    names = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in extras["hf"]}
    assert names == {"torch", "transformers"}, extras["hf"]
    src = (ROOT / "examples" / "hf_tiny.py").read_text()
    imported = set(re.findall(r"^\s*(?:import|from) (\w+)", src, re.M)) - set(sys.stdlib_module_names)
    assert imported == {"torch", "transformers", "fp8sim"}, imported
    assert 'pip install "fp8sim[hf]"' in src


def test_hf_example_skips_with_a_message_without_transformers(tmp_path):
    """Without transformers the example says what is missing and how to install it, and exits 0
    (skipped) instead of a traceback. A ``transformers`` module that raises as a missing one does
    stands in for an environment without it."""
    (tmp_path / "transformers.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'transformers'\", name='transformers')\n"
    )
    env = _clean_env(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    r = _run([sys.executable, ROOT / "examples" / "hf_tiny.py", "--tokens", "4"], tmp_path, env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == ""
    missing = "transformers" if importlib.util.find_spec("torch") else "torch"  # it imports torch first
    assert f"hf_tiny.py: skipped: it needs {missing}," in r.stderr and 'pip install "fp8sim[hf]"' in r.stderr
    assert "Traceback" not in r.stderr


def test_pre_commit_runs_the_static_checks():
    yaml = pytest.importorskip("yaml")
    cfg = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    entries = [h["entry"] for repo in cfg["repos"] for h in repo["hooks"]]
    static = (ROOT / "tests" / "test_static.py").read_text()
    ruff_paths = re.search(r'\[ruff, "check", ((?:"[^"]+", )*"[^"]+")\]', static)
    assert ruff_paths is not None
    paths = " ".join(json.loads(f"[{ruff_paths.group(1)}]"))
    assert f"ruff check {paths}" in entries
    assert "ruff format --check ." in entries
    assert "python3 -m mypy fp8sim" in entries
    assert all(h.get("pass_filenames") is False for repo in cfg["repos"] for h in repo["hooks"])
