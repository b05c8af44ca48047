"""Compare scaling granularities on your own tensor.

    python examples/compare_granularities.py [tensor.npy] [--format e4m3]

Without a file it makes an activation-like tensor with a few outlier channels.
"""

import argparse

import numpy as np

import fp8sim
from fp8sim import metrics

ap = argparse.ArgumentParser()
ap.add_argument("npy", nargs="?", help="a .npy file with a float array of 2 dims (tokens x channels)")
ap.add_argument("--format", default="e4m3")
args = ap.parse_args()

if args.npy:
    x = np.load(args.npy)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float32)  # explicit: fp8sim never casts silently
else:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    x[:, rng.choice(1024, 8, replace=False)] *= 100  # outlier channels

print(f"tensor {x.shape} {x.dtype}, amax {np.abs(x).max():.3g}, format {args.format}")
print(f"{'granularity':>12} {'SQNR dB':>8} {'rel. err':>9} {'underflow':>10} {'saturated':>10} {'scales':>8}")
for g in ["tensor", "row", "col", "1x128", "128x128", "mx32", "g32"]:
    q = fp8sim.quantize(x, args.format, g)
    y = q.dequantize()
    print(
        f"{g:>12} {metrics.sqnr_db(x, y):8.2f} {metrics.rel_frobenius_error(x, y):9.2e} "
        f"{metrics.fraction_underflow(x, y):10.2%} {metrics.fraction_saturated(x, q):10.2%} {q.scales.size:8d}"
    )
