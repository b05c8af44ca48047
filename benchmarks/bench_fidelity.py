"""``fidelity="exact"`` (the default) against ``fidelity="fast"``: time of fp8sim.gemm and of a training step.

    python benchmarks/bench_fidelity.py [--sizes 1024,2048] [--rounds 3] [--train-steps 3] [--train-rounds 2] [--record FILE]

For each size n it times, on N(0,1) float32 inputs (seed 0), numpy's float32 matmul and
``fp8sim.gemm(x, w, recipe)`` end to end (quantization, GEMM, output cast) with each fidelity, for
the recipes deepseek-v3, per-tensor and per-tensor-no-promotion; then ``fp8sim.training.train_one``
for deepseek-v3 and bf16 with each fidelity (seconds per step of the default model, from its ``wall_time_s``: the training loop).  Timing goes
in rounds: each round times every case once, exact and fast one after the other, and each case
keeps its best round.  One warm-up call per case first (numba compiles there).

``--record FILE`` writes the results with the date, commit, machine, load average and versions
(see benchmarks/record.py); benchmarks/RESULTS.md and README.md show the committed record
``benchmarks/records/fidelity.json`` (``python benchmarks/figures.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from record import command, environment, write  # noqa: E402

import fp8sim  # noqa: E402
from fp8sim.training import train_one  # noqa: E402

GEMM_RECIPES = ("deepseek-v3", "per-tensor", "per-tensor-no-promotion")
TRAIN_RECIPES = ("deepseek-v3", "bf16")
FIDELITIES = ("exact", "fast")


def time_rounds(cases: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Best wall time of each case over ``rounds`` rounds, each round timing every case once in order."""
    for fn in cases.values():
        fn()  # warm-up (compilation, page faults)
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(rounds):
        for name, fn in cases.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1024,2048", help="comma-separated n of the n x n x n GEMMs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=3, help="training steps per timed run (0: no training)")
    ap.add_argument("--train-rounds", type=int, default=2, help="rounds of the training runs (default 2)")
    ap.add_argument("--record", default=None, help="write the record here (JSON)")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    rng = np.random.default_rng(0)
    gemm = []
    for n in (int(s) for s in args.sizes.split(",")):
        x = rng.standard_normal((n, n)).astype(np.float32)
        w = rng.standard_normal((n, n)).astype(np.float32)
        cases: dict[str, Callable[[], object]] = {"numpy": lambda x=x, w=w: x @ w}
        for r in GEMM_RECIPES:
            for f in FIDELITIES:
                cases[f"{r} {f}"] = lambda x=x, w=w, r=r, f=f: fp8sim.gemm(x, w, r, fidelity=f)
        t = time_rounds(cases, args.rounds)
        for r in GEMM_RECIPES:
            row = {"n": n, "recipe": r, "numpy_s": t["numpy"], "exact_s": t[f"{r} exact"], "fast_s": t[f"{r} fast"]}
            row["fast_over_exact"] = row["fast_s"] / row["exact_s"]
            gemm.append(row)
            print(
                f"{n}^3 {r:24s} numpy {row['numpy_s'] * 1e3:8.1f} ms  exact {row['exact_s'] * 1e3:8.1f} ms  "
                f"fast {row['fast_s'] * 1e3:8.1f} ms  fast/exact {row['fast_over_exact']:.2f}",
                flush=True,
            )
    train = []
    if args.train_steps > 0:
        steps = args.train_steps
        for r in TRAIN_RECIPES:
            for f in FIDELITIES:
                train_one(r, 1, 0, fidelity=f)  # warm-up
        per_step = {(r, f): float("inf") for r in TRAIN_RECIPES for f in FIDELITIES}
        for _ in range(args.train_rounds):
            for r, f in per_step:
                res = train_one(r, steps, 0, fidelity=f)  # wall_time_s: the training loop
                per_step[r, f] = min(per_step[r, f], res.wall_time_s / res.iterations)
        for r in TRAIN_RECIPES:
            row = {
                "recipe": r,
                "steps": steps,
                "exact_s_per_step": per_step[r, "exact"],
                "fast_s_per_step": per_step[r, "fast"],
            }
            row["fast_over_exact"] = row["fast_s_per_step"] / row["exact_s_per_step"]
            train.append(row)
            print(
                f"train {r:18s} exact {row['exact_s_per_step']:.3f} s/step  fast {row['fast_s_per_step']:.3f} s/step"
                f"  fast/exact {row['fast_over_exact']:.2f}",
                flush=True,
            )
    load_after = os.getloadavg()
    print(f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after, on {os.cpu_count()} CPUs")
    out = {
        "benchmark": "bench_fidelity",
        "command": command("benchmarks/bench_fidelity.py", sys.argv[1:] if argv is None else argv),
        **environment([]),
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "rounds": args.rounds,
        "train_rounds": args.train_rounds if train else 0,
        "gemm": gemm,
        "train": train,
    }
    write(args.record, out)
    return out


if __name__ == "__main__":
    main()
