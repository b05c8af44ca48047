"""Rounding/encoding throughput against peers, in one run on the same data.

    python benchmarks/bench_rounding.py [--log2n 24] [--peer-log2n 22] [--record FILE]

Times, on one 2**24-element float32 N(0,1) array (and its float64 copy):
fp8sim.encode / fp8sim.round (RNE, SR) to E4M3, ml_dtypes ``astype``
(float32 and float64 casts), gfloat's vectorized round/encode and pychop's
numpy Chop.  Prints elements per second and the ratio to ml_dtypes' float32
cast, and each target (RNE encode >= 8x, SR encode >= 4x ml_dtypes' RNE cast;
float64 encode >= 4x ml_dtypes' float64 cast) as ``met`` or ``MISSED`` with a
closing count of the missed ones.  Timing goes in rounds: each round times every
case once, after one warm-up call per case (numba compiles there), and each case
keeps its best round, so a change in the machine's load during the run hits all
cases alike.  The ratios are only comparable within one run.

``--record FILE`` writes the results with what the figures depend on: date,
commit (and whether the tree had uncommitted changes), CPU, core and numba
thread counts, the load average before and after, package versions and the
BLAS-related environment variables.  The figures in README.md,
benchmarks/RESULTS.md and docs/rounding.md are rendered from the committed
record ``benchmarks/records/rounding.json`` by ``python benchmarks/figures.py``
(``tests/test_readme_figures.py`` checks that they agree).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from record import command, environment, write  # noqa: E402

import fp8sim  # noqa: E402

#: (name, case of the numerator, case of the denominator, at least this ratio)
TARGETS = [
    ("RNE f32 encode >= 8x ml_dtypes", "fp8sim.encode f32 rne", "ml_dtypes astype f32->e4m3", 8.0),
    ("SR f32 encode >= 4x ml_dtypes RNE", "fp8sim.encode f32 sr", "ml_dtypes astype f32->e4m3", 4.0),
    ("f64 encode >= 4x ml_dtypes f64", "fp8sim.encode f64 rne", "ml_dtypes astype f64->e4m3", 4.0),
]


def time_rounds(cases: dict[str, tuple[Callable[[], object], int]], rounds: int) -> dict[str, float]:
    """Best wall time of each case over ``rounds`` rounds; every round times every case once, in order
    (``cases`` maps a name to the function and the number of rounds it takes part in, at most ``rounds``)."""
    for fn, _ in cases.values():
        fn()  # warm-up (compilation, page faults)
    best = dict.fromkeys(cases, float("inf"))
    for i in range(rounds):
        for name, (fn, k) in cases.items():
            if i < k:
                t = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t)
    return best


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
    ap.add_argument(
        "--peer-log2n",
        type=int,
        default=None,
        help="smaller size for the slow pure-numpy peers (gfloat, pychop); default: same",
    )
    ap.add_argument("--record", "--json", dest="record", default=None, help="write the record here (JSON)")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()

    n = 1 << args.log2n
    x32 = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    x64 = x32.astype(np.float64)
    e4 = fp8sim.E4M3
    r = args.repeat
    cases: dict[str, tuple[Callable[[], object], int]] = {
        "ml_dtypes astype f32->e4m3": (lambda: x32.astype(ml_dtypes.float8_e4m3fn), r),
        "ml_dtypes astype f64->e4m3": (lambda: x64.astype(ml_dtypes.float8_e4m3fn), r),
        "fp8sim.encode f32 rne": (lambda: fp8sim.encode(x32, e4), r),
        "fp8sim.round f32 rne": (lambda: fp8sim.round(x32, e4), r),
        "fp8sim.encode f32 sr": (lambda: fp8sim.encode(x32, e4, "sr", seed=1), r),
        "fp8sim.round f32 sr (sr_bits=13)": (lambda: fp8sim.round(x32, e4, "sr", seed=1, sr_bits=13), r),
        "fp8sim.encode f64 rne": (lambda: fp8sim.encode(x64, e4), r),
        "fp8sim.round f64 rne": (lambda: fp8sim.round(x64, e4), r),
    }
    sizes = dict.fromkeys(cases, n)

    # pure-numpy peers: time them on the same data (a prefix if --peer-log2n is given), in fewer rounds
    m = n if args.peer_log2n is None else min(n, 1 << args.peer_log2n)
    xp = x64[:m]
    skipped = []
    try:
        import gfloat
        from gfloat.formats import format_info_ocp_e4m3

        cases["gfloat round_ndarray f64 rne"] = (
            lambda: gfloat.round_ndarray(format_info_ocp_e4m3, xp),
            max(1, r // 2),
        )
        cases["gfloat encode_ndarray (after round)"] = (
            lambda: gfloat.encode_ndarray(format_info_ocp_e4m3, gfloat.round_ndarray(format_info_ocp_e4m3, xp)),
            1,
        )
        sizes["gfloat round_ndarray f64 rne"] = sizes["gfloat encode_ndarray (after round)"] = m
    except ImportError:
        skipped.append("gfloat")
        print("gfloat not installed: skipped (pip install gfloat)")
    try:
        import pychop

        pychop.backend("numpy")
        ch = pychop.Chop(exp_bits=4, sig_bits=3, rmode=1)
        xp32 = x32[:m]
        cases["pychop Chop(4,3) numpy rne"] = (lambda: ch(xp32), max(1, r // 2))
        sizes["pychop Chop(4,3) numpy rne"] = m
    except ImportError:
        skipped.append("pychop")
        print("pychop not installed: skipped (pip install pychop)")

    times = time_rounds(cases, r)
    results = {name: {"n": sizes[name], "seconds": t, "elements_per_s": sizes[name] / t} for name, t in times.items()}
    base = results["ml_dtypes astype f32->e4m3"]["elements_per_s"]
    print(f"{n} float32 N(0,1) elements (peers on {m}); {os.cpu_count()} CPUs; best of {r} rounds")
    print(f"{'case':40s} {'Melem/s':>10s} {'x ml_dtypes f32':>16s}")
    for name, res in results.items():
        res["ratio_vs_ml_dtypes_f32"] = res["elements_per_s"] / base
        print(f"{name:40s} {res['elements_per_s'] / 1e6:10.1f} {res['ratio_vs_ml_dtypes_f32']:16.2f}")
    targets = []
    for name, num, den, need in TARGETS:
        ratio = results[num]["elements_per_s"] / results[den]["elements_per_s"]
        targets.append({"name": name, "case": num, "against": den, "ratio": ratio, "need": need, "met": ratio >= need})
    load_after = os.getloadavg()
    print()
    for t in targets:
        print(f"{t['name']:40s} {t['ratio']:6.2f}x  {'met' if t['met'] else 'MISSED'}")
    missed = [t["name"] for t in targets if not t["met"]]
    print(
        f"{len(missed)} of {len(targets)} targets MISSED" if missed else f"all {len(targets)} targets met",
        f"(load average {load_before[0]:.1f} before, {load_after[0]:.1f} after, on {os.cpu_count()} CPUs)",
    )
    out = {
        "benchmark": "bench_rounding",
        "command": command("benchmarks/bench_rounding.py", sys.argv[1:] if argv is None else argv),
        **environment(["ml_dtypes", "gfloat", "pychop"]),
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "n": n,
        "peer_n": m,
        "rounds": r,
        "skipped": skipped,
        "results": results,
        "targets": targets,
    }
    write(args.record, out)
    return out


if __name__ == "__main__":
    main()
