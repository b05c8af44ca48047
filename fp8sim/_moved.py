"""The modules that 0.2.0 moved into :mod:`fp8sim.gemms`, kept importable with a DeprecationWarning.

``from fp8sim.recipes import Recipe`` (or ``fp8sim.pipeline.quantize_operands``, ``from fp8sim.gemm import
scaled_matmul``) still works: each old name is a small proxy module in ``sys.modules`` that finds the
attribute in the modules it moved to and warns, naming the new place.  The proxies are registered
when fp8sim is imported (nothing is imported through them until an attribute is read), so
``import fp8sim.gemm`` leaves the function ``fp8sim.gemm`` as it is.  They go in 0.3.0.
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings

#: old module (under fp8sim) -> the modules its names now live in, searched in order
MOVED: dict[str, tuple[str, ...]] = {
    "recipes": ("fp8sim.gemms.recipes", "fp8sim.gemms.presets"),
    "recipes_blackwell": ("fp8sim.gemms.presets",),
    "gemm_core": ("fp8sim.gemms.engine", "fp8sim.gemms.operands"),
    "scaled": ("fp8sim.gemms.api", "fp8sim.gemms.engine", "fp8sim.gemms.operands"),
    "pipeline": (
        "fp8sim.gemms.api",
        "fp8sim.gemms.operands",
        "fp8sim.gemms.engine",
        "fp8sim.gemms.error_report",
        "fp8sim.scaling.orientation",
    ),
    "gemm": (
        "fp8sim.gemms.api",
        "fp8sim.gemms.operands",
        "fp8sim.gemms.engine",
        "fp8sim.gemms.error_report",
        "fp8sim.scaling.orientation",
    ),
    "gemm_report": ("fp8sim.gemms.error_report",),
    "identification": ("fp8sim.gemms.identification",),
    "device": ("fp8sim.gemms.device",),
    "tensorcore.block_gemm": ("fp8sim.gemms.block_scaled", "fp8sim.tensorcore.block_scales"),
}


class MovedModule(types.ModuleType):
    """A deprecated module name: attribute reads find the attribute where it moved, with a warning."""

    def __init__(self, old: str, targets: tuple[str, ...]) -> None:
        super().__init__(old, f"Deprecated alias (fp8sim 0.2.0): {old} moved to {', '.join(targets)}.")
        self._targets = targets

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_targets":
            raise AttributeError(name)
        for target in self._targets:
            mod = importlib.import_module(target)
            if hasattr(mod, name):
                warnings.warn(
                    f"{self.__name__} is deprecated since fp8sim 0.2.0 and goes in 0.3.0: "
                    f"use {target}.{name} (or the fp8sim / fp8sim.gemms facade)",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return getattr(mod, name)
        raise AttributeError(
            f"module {self.__name__!r} (moved to {', '.join(self._targets)}) has no attribute {name!r}"
        )

    def __dir__(self) -> list[str]:
        names: set[str] = set()
        for target in self._targets:
            names.update(n for n in dir(importlib.import_module(target)) if not n.startswith("_"))
        return sorted(names)


def install() -> None:
    """Register the proxies (``fp8sim.<old>`` for each entry of :data:`MOVED`)."""
    for old, targets in MOVED.items():
        sys.modules.setdefault(f"fp8sim.{old}", MovedModule(f"fp8sim.{old}", targets))


def attribute(name: str):
    """``fp8sim.<name>`` for a moved module name read as an attribute of the package (a warning
    there too), else AttributeError."""
    if name in MOVED and name != "gemm" and "." not in name:
        warnings.warn(
            f"fp8sim.{name} is deprecated since fp8sim 0.2.0 and goes in 0.3.0: use fp8sim.gemms",
            DeprecationWarning,
            stacklevel=3,
        )
        return sys.modules[f"fp8sim.{name}"]
    raise AttributeError(f"module 'fp8sim' has no attribute {name!r}")
