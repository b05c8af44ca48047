"""Studies that produce CSV tables and figures (``fp8sim study <name>``), and the sections of the
report (:mod:`fp8sim.studies.sections`).

The standalone studies are :data:`STUDY_NAMES`, each a module of this package with a
``run(out_dir, *, quick, progress, seed, ...)`` function; :func:`study` returns one by name.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .._names import unknown_name_error

__all__ = ["STUDY_NAMES", "TABLE_COLUMNS", "study"]

#: the studies of ``fp8sim study NAME``: the modules of this package
STUDY_NAMES = ("granularity", "accumulation")

#: the columns of the table of formats (``fp8sim info --all``, the report's Formats section):
#: keys of :meth:`fp8sim.Format.summary`
TABLE_COLUMNS = (
    "name",
    "bits",
    "ebits",
    "mbits",
    "bias",
    "inf",
    "nan",
    "max",
    "min_normal",
    "min_subnormal",
    "eps",
    "emax",
    "emin",
    "ml_dtype",
)


def study(name: str) -> ModuleType:
    """The module of the study ``name`` (one of :data:`STUDY_NAMES`); an unknown name raises
    :class:`~fp8sim.formats.UnknownNameError`."""
    if name not in STUDY_NAMES:
        raise unknown_name_error("study", name, STUDY_NAMES, plural="studies")
    return importlib.import_module(f"{__name__}.{name}")
