"""The version of fp8sim (one source: the package, pyproject.toml and the numba cache key read it)."""

__version__ = "0.2.0"
