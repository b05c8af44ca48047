"""Where numba caches fp8sim's compiled kernels: a per-user cache folder, never the package.

numba's default puts a ``cache=True`` kernel's ``.nbi``/``.nbc`` files in the ``__pycache__``
folder next to its source. For an installed package that is ``site-packages/fp8sim/__pycache__``:
``pip uninstall`` does not know these files and leaves the folder behind, and Python then imports
the leftover ``fp8sim/`` folder as an empty namespace package that hides a later (editable)
installation (``ImportError: cannot import name '__version__' from 'fp8sim' (unknown location)``).

This module registers a numba cache locator for the kernels defined in fp8sim's own source files
(the user's numba functions keep numba's usual locators). Their cache lives in

* ``$FP8SIM_CACHE_DIR/numba-<key>/`` when ``FP8SIM_CACHE_DIR`` is set, else
* ``$NUMBA_CACHE_DIR/fp8sim/numba-<key>/`` when ``NUMBA_CACHE_DIR`` is set, else
* ``$XDG_CACHE_HOME/fp8sim/numba-<key>/`` (``~/.cache`` when unset; ``%LOCALAPPDATA%`` on Windows),

falling back to ``<temp dir>/fp8sim-<user>/numba-<key>/`` with a warning when that is not
writable. ``<key>`` is fp8sim's version and a hash of all of fp8sim's source files: numba checks
only the source file a kernel is defined in, not the modules whose inlined functions and
constants it compiled in, so a cache built from other sources is never used. Folders of other
keys unused for 30 days are removed.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from numba.core import caching as _caching

__all__ = ["FP8SimCacheLocator", "cache_dir", "install", "package_key", "remove_in_tree_cache", "source_key"]

_PACKAGE = Path(__file__).resolve().parent
_STALE_DAYS = 30
_MARKER = "last-used"


def _version() -> str:
    from ._version import __version__

    return __version__


def package_key(package: Path, version: str) -> str:
    """``version`` and the SHA-256 (16 hex digits) of the names and contents of every ``.py`` file
    under ``package``."""
    h = hashlib.sha256()
    for f in sorted(package.rglob("*.py")):
        h.update(f.relative_to(package).as_posix().encode())
        h.update(b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return f"{version}-{h.hexdigest()[:16]}"


@functools.lru_cache(maxsize=1)
def source_key() -> str:
    """The cache key of this installation: fp8sim's version and a hash of all its source files."""
    return package_key(_PACKAGE, _version())


def _default_root() -> Path:
    if os.environ.get("FP8SIM_CACHE_DIR"):
        return Path(os.environ["FP8SIM_CACHE_DIR"]).expanduser()
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"]).expanduser() / "fp8sim"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "fp8sim" / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and os.path.isabs(os.path.expanduser(xdg)) else Path.home() / ".cache"
    return base / "fp8sim"


def _temp_root() -> Path:
    getuid = getattr(os, "getuid", None)
    user = str(getuid()) if getuid is not None else os.environ.get("USERNAME", "user")
    return Path(tempfile.gettempdir()) / f"fp8sim-{user}"


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def _prune(root: Path, keep: str) -> None:
    """Remove the cache folders of other keys (folders ``numba-*`` with fp8sim's marker file) whose
    marker is older than ``_STALE_DAYS`` days."""
    limit = time.time() - _STALE_DAYS * 86400
    try:
        entries = list(root.glob("numba-*"))
    except OSError:
        return
    for d in entries:
        if d.name == keep or not d.is_dir():
            continue
        try:
            stamp = (d / _MARKER).stat().st_mtime
        except OSError:
            continue  # not one of ours
        if stamp < limit:
            shutil.rmtree(d, ignore_errors=True)


def _choose(key: str | None = None) -> Path | None:
    """The cache folder of this version and source of fp8sim (key ``key``), created; None if nothing
    is writable."""
    name = f"numba-{key or source_key()}"
    try:
        root = _default_root()
    except RuntimeError:  # no home folder
        root = _temp_root()
    for i, cand in enumerate((root, _temp_root())):
        path = cand / name
        if _writable(path):
            if i:
                warnings.warn(
                    f"fp8sim: cannot write its numba cache under {root} (set FP8SIM_CACHE_DIR to a writable "
                    f"folder); using {path}",
                    RuntimeWarning,
                    stacklevel=3,
                )
            try:
                (path / _MARKER).touch()
            except OSError:
                pass
            _prune(cand, name)
            return path
    warnings.warn(
        f"fp8sim: no writable folder for its numba cache ({root}, {_temp_root()}); set FP8SIM_CACHE_DIR. "
        "Kernels fall back to numba's own cache locations.",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


_CACHE: list[Path | None] = []
_LOCK = threading.Lock()


def cache_dir() -> Path | None:
    """The folder holding fp8sim's numba cache (chosen once per process, also when several threads
    compile kernels at once), or None if none is writable."""
    with _LOCK:
        if not _CACHE:
            _CACHE.append(_choose())
        return _CACHE[0]


_LocatorBase: type = getattr(_caching, "_CacheLocator", object)


class FP8SimCacheLocator(_LocatorBase):  # type: ignore[valid-type,misc]
    """numba cache locator for kernels defined in fp8sim's own source files (see the module docstring)."""

    def __init__(self, py_func, py_file: str, root: Path) -> None:
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        rel = Path(py_file).resolve().parent.relative_to(_PACKAGE)
        self._cache_path = str(root.joinpath("fp8sim", *rel.parts))

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self) -> str:
        # the folder is already specific to the package's sources; a content stamp (not the file's
        # mtime) lets installations of the same sources share it
        return source_key()

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file: str) -> FP8SimCacheLocator | None:
        try:
            Path(py_file).resolve().relative_to(_PACKAGE)
        except (OSError, ValueError):
            return None  # not fp8sim's code: numba's own locators decide
        root = cache_dir()
        if root is None:
            return None
        self = cls(py_func, py_file, root)
        try:
            self.ensure_cache_path()
        except OSError:
            return None
        return self


def remove_in_tree_cache(package: Path = _PACKAGE) -> None:
    """Delete numba cache files (``.nbi``, ``.nbc``) that older fp8sim versions wrote into the
    package's ``__pycache__`` folders: ``pip uninstall`` would leave them behind (see the module
    docstring)."""
    for pycache in package.rglob("__pycache__"):
        try:
            files = [f for f in pycache.iterdir() if f.suffix in (".nbi", ".nbc")]
        except OSError:
            continue
        for f in files:
            try:
                f.unlink()
            except OSError:
                pass


def install() -> None:
    """Put :class:`FP8SimCacheLocator` first in numba's list of cache locators (once) and remove the
    cache files older versions left in the package."""
    remove_in_tree_cache()
    impl = getattr(_caching, "CacheImpl", None) or getattr(_caching, "_CacheImpl", None)  # newer / older numba
    locators = getattr(impl, "_locator_classes", None)
    if isinstance(locators, list) and _LocatorBase is not object:
        if FP8SimCacheLocator not in locators:
            locators.insert(0, FP8SimCacheLocator)
        return
    # numba changed its private caching API: keep the cache out of the package through numba's
    # documented setting instead (it then holds the user's cached functions too)
    from numba import config

    if not config.CACHE_DIR:  # type: ignore[attr-defined]
        root = cache_dir()
        if root is not None:
            config.CACHE_DIR = str(root)  # type: ignore[attr-defined]


install()
