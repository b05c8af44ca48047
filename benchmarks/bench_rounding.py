"""Rounding/encoding throughput against peers, in one run on the same data.

    python benchmarks/bench_rounding.py [--log2n 24] [--json out.json]

Times, on one 2**24-element float32 N(0,1) array (and its float64 copy):
fp8sim.encode / fp8sim.round (RNE, SR) to E4M3, ml_dtypes ``astype``
(float32 and float64 casts), gfloat's vectorized round/encode and pychop's
numpy Chop.  Prints elements per second and the ratio to ml_dtypes' float32
cast (the issue's targets: RNE encode >= 8x, SR >= 4x; float64 input >= 4x
ml_dtypes' float64 cast).  Each timing is the best of ``--repeat`` runs
after one warm-up (numba compiles on the warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import ml_dtypes
import numpy as np

import fp8sim


def best_time(fn, repeat: int) -> float:
    fn()  # warm-up (compilation, page faults)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--peer-log2n",
        type=int,
        default=None,
        help="smaller size for the slow pure-numpy peers (gfloat, pychop); default: same",
    )
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()

    n = 1 << args.log2n
    x32 = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    x64 = x32.astype(np.float64)
    e4 = fp8sim.E4M3
    out8 = np.empty(n, np.uint8)

    cases = {
        "ml_dtypes astype f32->e4m3": lambda: x32.astype(ml_dtypes.float8_e4m3fn),
        "ml_dtypes astype f64->e4m3": lambda: x64.astype(ml_dtypes.float8_e4m3fn),
        "fp8sim.encode f32 rne": lambda: fp8sim.encode(x32, e4),
        "fp8sim.round f32 rne": lambda: fp8sim.round(x32, e4),
        "fp8sim.encode f32 sr": lambda: fp8sim.encode(x32, e4, "sr", seed=1),
        "fp8sim.round f32 sr (sr_bits=13)": lambda: fp8sim.round(x32, e4, "sr", seed=1, sr_bits=13),
        "fp8sim.encode f64 rne": lambda: fp8sim.encode(x64, e4),
        "fp8sim.round f64 rne": lambda: fp8sim.round(x64, e4),
    }
    results = {}
    for name, fn in cases.items():
        t = best_time(fn, args.repeat)
        results[name] = {"n": n, "seconds": t, "elements_per_s": n / t}
    del out8

    # pure-numpy peers: time them on the same data (a prefix if --peer-log2n is given)
    m = n if args.peer_log2n is None else min(n, 1 << args.peer_log2n)
    xp = x64[:m]
    try:
        import gfloat
        from gfloat.formats import format_info_ocp_e4m3

        results["gfloat round_ndarray f64 rne"] = _time_peer(
            lambda: gfloat.round_ndarray(format_info_ocp_e4m3, xp), m, max(1, args.repeat // 2)
        )
        results["gfloat encode_ndarray (after round)"] = _time_peer(
            lambda: gfloat.encode_ndarray(format_info_ocp_e4m3, gfloat.round_ndarray(format_info_ocp_e4m3, xp)), m, 1
        )
    except ImportError:
        print("gfloat not installed: skipped (pip install gfloat)")
    try:
        import pychop

        pychop.backend("numpy")
        ch = pychop.Chop(exp_bits=4, sig_bits=3, rmode=1)
        xp32 = x32[:m]
        results["pychop Chop(4,3) numpy rne"] = _time_peer(lambda: ch(xp32), m, max(1, args.repeat // 2))
    except ImportError:
        print("pychop not installed: skipped (pip install pychop)")

    base = results["ml_dtypes astype f32->e4m3"]["elements_per_s"]
    base64 = results["ml_dtypes astype f64->e4m3"]["elements_per_s"]
    print(f"{n} float32 N(0,1) elements (peers on {m}); {os.cpu_count()} CPUs; best of {args.repeat}")
    print(f"{'case':40s} {'Melem/s':>10s} {'x ml_dtypes f32':>16s}")
    for name, r in results.items():
        r["ratio_vs_ml_dtypes_f32"] = r["elements_per_s"] / base
        print(f"{name:40s} {r['elements_per_s'] / 1e6:10.1f} {r['ratio_vs_ml_dtypes_f32']:16.2f}")
    targets = {
        "RNE f32 encode >= 8x ml_dtypes": results["fp8sim.encode f32 rne"]["elements_per_s"] / base,
        "SR f32 encode >= 4x ml_dtypes RNE": results["fp8sim.encode f32 sr"]["elements_per_s"] / base,
        "f64 encode >= 4x ml_dtypes f64": results["fp8sim.encode f64 rne"]["elements_per_s"] / base64,
    }
    need = {
        "RNE f32 encode >= 8x ml_dtypes": 8,
        "SR f32 encode >= 4x ml_dtypes RNE": 4,
        "f64 encode >= 4x ml_dtypes f64": 4,
    }
    print()
    for k, v in targets.items():
        print(f"{k:40s} {v:6.2f}x  {'met' if v >= need[k] else 'MISSED'}")
    out = {"n": n, "cpus": os.cpu_count(), "results": results, "targets": targets}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return out


def _time_peer(fn, m, repeat):
    t = best_time(fn, repeat)
    return {"n": m, "seconds": t, "elements_per_s": m / t}


if __name__ == "__main__":
    main()
