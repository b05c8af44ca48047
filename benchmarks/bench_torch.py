"""CPU overhead of the PyTorch adapter (fp8sim.torch.linear) against fp8sim.gemm on the same GEMMs.

    python benchmarks/bench_torch.py [--recipe deepseek-v3] [--shapes 256x512x512,512x1024x1024] [--repeat 5]

For each shape ``T x K x N`` (tokens, in_features, out_features) it times, on float32 CPU tensors:

* ``torch``: ``fp8sim.torch.linear`` forward and backward (Fprop, Dgrad, Wgrad, no bias);
* ``gemm``: the same three GEMMs as three ``fp8sim.gemm`` calls on numpy arrays -- Fprop
  ``gemm(x, weight, r, layout="nk")``, Dgrad ``gemm(dy, weight, r.backward())``, Wgrad
  ``gemm(x.T, dy, r_wgrad)`` with the Wgrad recipe (both operands along the tokens, FP32 out) --
  checked to give the adapter's bits;

and prints both (median of ``--repeat`` alternating runs after one warm-up), the ratio and the overhead.
The target is an overhead of at most 10 %.

Both run in this one process with torch loaded, as a user of ``fp8sim.torch`` runs them: fp8sim is
imported before torch, so that torch's OpenMP runtime, which fp8sim's numba kernels share, takes
fp8sim's default wait policy (``OMP_WAIT_POLICY=PASSIVE`` unless set; see docs/pytorch.md, "Threads").
The header line says which policy and how many threads ran.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import fp8sim  # before torch: its OpenMP runtime then takes fp8sim's wait policy

# isort: split
import numpy as np
import torch

import fp8sim.torch as ft


def wgrad_recipe(r):
    """The recipe of Wgrad as one fp8sim.gemm: x^T in x_format and dy in the gradient format, both with
    the activation granularity laid along the tokens, FP32 output, the backward promotion."""
    rb = r.backward()
    return rb.with_(
        x_format=r.x_format,
        w_format=r.grad_format or r.x_format,
        w_granularity=r.x_granularity,
        output_format="fp32",
    )


def median_times(fs, repeat: int) -> list[float]:
    """The median wall time of each function in ``fs``, run alternately (a shared machine's load drifts
    over the runs of one function less than between them) after one warm-up run each."""
    for f in fs:
        f()
    ts: list[list[float]] = [[] for _ in fs]
    for _ in range(repeat):
        for f, t in zip(fs, ts):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in ts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="deepseek-v3")
    ap.add_argument("--shapes", default="256x512x512,512x1024x1024", help="TxKxN,... (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    r = fp8sim.recipe(args.recipe)
    rw = wgrad_recipe(r)
    import numba

    numba.get_num_threads()  # starts numba's pool, so that its threading layer is known
    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    print(
        f"recipe {r.name}, torch {torch.__version__}, {torch.get_num_threads()} torch threads, "
        f"numba {numba.get_num_threads()} threads ({numba.threading_layer()}), OMP_WAIT_POLICY {policy}"
        f"{' (fp8sim default)' if fp8sim._threads.APPLIED else ''}"
    )
    print(f"{'T x K x N':>16} {'fp8sim.gemm (s)':>16} {'fp8sim.torch (s)':>17} {'ratio':>7} {'overhead':>9}")
    for spec in args.shapes.split(","):
        T, K, N = (int(v) for v in spec.lower().split("x"))
        rng = np.random.default_rng(0)
        x = rng.standard_normal((T, K)).astype(np.float32)
        w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
        dy = (rng.standard_normal((T, N)) * 1e-3).astype(np.float32)
        xt, wt, dyt = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(dy)

        def by_gemm():
            y = fp8sim.gemm(x, w, r, layout="nk")
            dx = fp8sim.gemm(dy, w, r.backward())
            dw = fp8sim.gemm(x.T, dy, rw)
            return y, dx, dw

        def by_torch():
            xg, wg = xt.detach().requires_grad_(), wt.detach().requires_grad_()
            y = ft.linear(xg, wg, recipe=r)
            y.backward(dyt)
            return y.detach(), xg.grad, wg.grad

        y, dx, dw = by_gemm()
        for a, b in zip((y, dx, dw.T), by_torch()):  # the same GEMMs: the same bits (dW as torch's (N, K))
            assert np.array_equal(np.ascontiguousarray(a).view(np.uint32), b.numpy().view(np.uint32)), spec
        tg, tt = median_times([by_gemm, by_torch], args.repeat)
        print(f"{spec:>16} {tg:16.4f} {tt:17.4f} {tt / tg:7.3f} {100 * (tt / tg - 1):8.1f}%")


if __name__ == "__main__":
    main()
