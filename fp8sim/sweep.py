"""Sweeps: many independent tasks, run serially or through dask.distributed.

A sweep is a list of parameter dicts and a task function (a module-level
function, so that it can be sent to other processes and machines) that maps
one dict to one result row.  :func:`run` executes the tasks

* ``scheduler="serial"``: in this process, one after the other;
* ``scheduler="local"`` (default): on a ``dask.distributed.LocalCluster``
  sized to this machine (one single-threaded worker process per core);
* ``scheduler="tcp://HOST:PORT"``: on an existing dask cluster, e.g. one
  started by dask-jobqueue on Slurm or by the dask Kubernetes operator.

Every task derives its randomness from its own parameters (``seed``), so the
rows are identical whichever scheduler runs them, and :func:`run` returns them
in task order.

The built-in sweep :func:`granularity_task` quantizes one synthetic tensor
with one granularity and format and measures the error.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable

import numpy as np

from ._fpenv import ieee_defaults
from ._names import unknown_name_error
from .studies import granularity as _study

__all__ = [
    "run",
    "granularity_task",
    "granularity_params",
    "check_axis",
    "check_scheduler",
    "SchedulerError",
    "SCHEDULERS",
    "AXES",
    "DEFAULT_DISTRIBUTIONS",
    "DEFAULT_FORMATS",
    "DEFAULT_GRANULARITIES",
    "DEFAULT_SEEDS",
    "DEFAULT_SIZES",
]

SCHEDULERS = ("serial", "local", "tcp://HOST:PORT")

#: the axes of the granularity sweep (:func:`granularity_params`), and their defaults
AXES = ("distributions", "formats", "granularities", "seeds", "sizes")
DEFAULT_DISTRIBUTIONS = ("gaussian", "outlier_channels", "lognormal_grad")
DEFAULT_FORMATS = _study.FORMATS
DEFAULT_GRANULARITIES = ("tensor", "1x128", "128x128", "mx32")
DEFAULT_SEEDS = (0,)
DEFAULT_SIZES = ((256, 1024),)


class SchedulerError(ConnectionError):
    """No dask scheduler answered at the given address within the connection timeout."""


def check_scheduler(scheduler: str | None) -> str:
    """``scheduler`` if it is ``"serial"``, ``"local"`` or an address ``PROTOCOL://HOST:PORT``; else ValueError."""
    scheduler = scheduler or "local"
    if not isinstance(scheduler, str) or not (
        scheduler in ("serial", "local") or ("://" in scheduler and scheduler.split("://", 1)[1])
    ):
        raise unknown_name_error("scheduler", str(scheduler), SCHEDULERS)
    return scheduler


@ieee_defaults
def run(
    task: Callable[[dict], dict],
    params: Iterable[dict],
    *,
    scheduler: str | None = "local",
    workers: int | None = None,
    progress: bool = False,
    connect_timeout: float = 10.0,
) -> list[dict]:
    """Run ``task(p)`` for every ``p`` in ``params``; return the results in order.

    The scheduler name and ``workers`` are checked first (ValueError), and a scheduler address must
    answer within ``connect_timeout`` seconds (else :class:`SchedulerError`), before any task is sent.
    """
    params = list(params)
    scheduler = check_scheduler(scheduler)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive integer or None, got {workers!r}")
    if not params:
        return []
    if scheduler == "serial":
        return [task(p) for p in _progress(params, progress)]
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError as e:  # pragma: no cover - distributed is a dependency
        raise ImportError("dask.distributed is needed for scheduler != 'serial': pip install distributed") from e
    if scheduler == "local":
        n = workers or os.cpu_count() or 1
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        cluster = None
        try:
            client = Client(scheduler, timeout=connect_timeout)
        except OSError as e:
            raise SchedulerError(
                f"no dask scheduler answered at {scheduler} within {connect_timeout:g} s ({e})"
            ) from None
    try:
        futures = client.map(task, params, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        out: list = [None] * len(futures)
        for fut in _progress(as_completed(futures), progress, total=len(futures)):
            out[index[fut.key]] = fut.result()
        return out
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _progress(it, enabled: bool, total: int | None = None):
    if not enabled:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, total=total, desc="sweep", unit="task")


def check_axis(axis: str, values) -> list:
    """The values of one axis of the granularity sweep (one of :data:`AXES`) as a list, each checked,
    so that a bad value fails before any task runs: no axis empty, known distributions, formats the
    quantizer accepts as elements (signed, at most 16 bits), granularity names, seeds >= 0, sizes of
    two positive ints.  An unknown name raises :class:`~fp8sim.formats.UnknownNameError`, any other
    bad value ``ValueError``."""
    from .formats import format as _format
    from .scaling import granularity as _granularity

    if axis not in AXES:
        raise unknown_name_error("axis", axis, AXES, plural="axes")
    if isinstance(values, str):
        raise ValueError(f"{axis}: expected a non-empty list, got {values!r}")
    values = list(values)
    if not values:
        raise ValueError(f"{axis}: expected a non-empty list, got {values!r}")
    for v in values:
        if axis == "distributions":
            if v not in _study.DISTRIBUTIONS:
                raise unknown_name_error("distribution", v, _study.DISTRIBUTIONS)
        elif axis == "formats":
            fmt = _format(v)
            if not fmt.signed or fmt.bits > 16:
                raise ValueError(
                    f"{fmt.name} cannot hold quantized elements (a signed format of at most 16 bits, "
                    "e.g. e4m3, e5m2, e2m1, bf16)"
                )
        elif axis == "granularities":
            _granularity(v)
        elif axis == "seeds":
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"seeds must be integers >= 0, got {v!r}")
        elif len(v) != 2 or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n > 0 for n in v):
            raise ValueError(f"sizes must be pairs of positive integers (rows, cols), got {v!r}")
    return values


def granularity_params(
    distributions=DEFAULT_DISTRIBUTIONS,
    formats=DEFAULT_FORMATS,
    granularities=DEFAULT_GRANULARITIES,
    seeds=DEFAULT_SEEDS,
    sizes=DEFAULT_SIZES,
) -> list[dict]:
    """The cross product of the sweep's axes as task parameters, every axis checked first
    (:func:`check_axis`)."""
    axes = dict(distributions=distributions, formats=formats, granularities=granularities, seeds=seeds, sizes=sizes)
    axes = {name: check_axis(name, v) for name, v in axes.items()}
    for g in axes["granularities"]:
        if str(g).strip().lower().startswith("delayed"):
            raise ValueError(
                f"sweep: granularity {g!r}: each task quantizes one tensor, and delayed scaling needs the "
                "amax history of earlier tensors (the granularity study builds one: fp8sim study granularity)"
            )
    return [
        {"distribution": d, "format": f, "granularity": g, "seed": int(s), "rows": int(m), "cols": int(n)}
        for d, f, g, s, (m, n) in itertools.product(*axes.values())
    ]


def granularity_task(p: dict) -> dict:
    """Quantize one synthetic tensor (from p's seed) and measure the error."""
    from . import metrics
    from .scaling import quantize

    rng = np.random.default_rng([p["seed"], p["rows"], p["cols"], _stable_hash(p["distribution"])])
    x = _study.make_tensor(p["distribution"], (p["rows"], p["cols"]), rng)
    q = quantize(x, p["format"], p["granularity"])
    y = q.dequantize()
    return dict(
        p,
        sqnr_db=float(metrics.sqnr_db(x, y)),
        rel_frobenius=float(metrics.rel_frobenius_error(x, y)),
        fraction_underflow=float(metrics.fraction_underflow(x, y)),
        fraction_saturated=float(metrics.fraction_saturated(x, q)),
        n_scales=int(q.scales.size),
    )


def _stable_hash(s: str) -> int:
    """A hash of a string that is the same in every process (unlike hash())."""
    h = 2166136261
    for ch in s.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h
