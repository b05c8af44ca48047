"""fp8sim's default OpenMP wait policy: passive, unless the user chose one.

fp8sim's kernels run in numba's thread pool. Where numba's threading layer is ``omp`` (the
default of a pip installation on Linux, which has no TBB), that pool is an OpenMP runtime's --
GNU OpenMP's, or the copy PyTorch loaded (numba's kernels then share torch's runtime and its
threads). An OpenMP runtime's threads keep spinning on a core after each parallel region before
they sleep (GNU OpenMP: ``GOMP_SPINCOUNT``, 300,000 turns, when ``OMP_WAIT_POLICY`` is unset).
fp8sim runs many short kernels between numpy and torch work; the spinning threads take the
cores that work needs, worst on a machine of few cores shared with other processes (on a shared
2-core machine: ``fp8sim.gemm`` 2-3x slower, ``fp8sim train --backend torch`` 8x slower per step;
benchmarks/RESULTS.md).

So at ``import fp8sim``, :func:`apply` sets ``OMP_WAIT_POLICY=PASSIVE`` in ``os.environ`` (threads
sleep as soon as a region ends) unless the user set one of :data:`USER_CHOICES` (for example
``OMP_WAIT_POLICY=ACTIVE``): never over a variable the user set. An OpenMP runtime reads the
variable once, when it is loaded, so the policy holds for runtimes loaded after ``import fp8sim``:
numba's (loaded at the first parallel kernel) and, with ``import fp8sim`` before ``import torch``,
torch's. A runtime already loaded -- ``import torch`` before ``import fp8sim`` -- keeps its own
policy, and fp8sim's kernels then share it: import fp8sim first, or set ``OMP_WAIT_POLICY=PASSIVE``
in the environment. Child processes inherit the variable.

numba's threading layer itself stays numba's choice (``NUMBA_THREADING_LAYER``): ``workqueue``
spins less but aborts the process when two threads launch parallel kernels at once, and
starting the pool at import would make a later ``os.fork`` abort.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["APPLIED", "DEFAULTS", "USER_CHOICES", "apply"]

#: the variables fp8sim sets when the user set none of :data:`USER_CHOICES`
DEFAULTS: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}

#: variables by which the user chooses how OpenMP threads wait (GNU OpenMP reads the first two,
#: LLVM's and Intel's OpenMP the first and the last): any of them set, fp8sim sets nothing
USER_CHOICES: tuple[str, ...] = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")

#: what :func:`apply` set at ``import fp8sim`` (empty where the user had chosen)
APPLIED: dict[str, str] = {}


def apply(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :data:`DEFAULTS` in ``environ`` (``os.environ`` by default) unless one of
    :data:`USER_CHOICES` is set there, even to an empty string; returns what it set."""
    env = os.environ if environ is None else environ
    if any(name in env for name in USER_CHOICES):
        return {}
    env.update(DEFAULTS)
    return dict(DEFAULTS)


APPLIED.update(apply())
