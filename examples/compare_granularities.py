"""Compare scaling granularities on your own tensor.

    python examples/compare_granularities.py [tensor.npy] [--format e4m3] [--dtype bfloat16]

The file holds a float32, float64, float16 or bfloat16 array (tokens x channels); numpy saves
an ml_dtypes.bfloat16 array as raw 2-byte records, so pass --dtype bfloat16 for one.  Other
dtypes are refused (fp8sim never casts silently).  Without a file it makes an activation-like
tensor with a few outlier channels.
"""

import argparse
import sys

import numpy as np

import fp8sim
from fp8sim import metrics
from fp8sim.cli import UsageError, load_float_npy

ap = argparse.ArgumentParser()
ap.add_argument("npy", nargs="?", help="a .npy file with a float array of 2 dims (tokens x channels)")
ap.add_argument("--format", default="e4m3")
ap.add_argument("--dtype", choices=["bfloat16"], default=None, help="read raw 2-byte records as bfloat16")
args = ap.parse_args()

if args.npy:
    try:
        x = load_float_npy(args.npy, args.dtype)  # the same rule as fp8sim.quantize and the CLI
    except UsageError as e:
        sys.exit(f"compare_granularities: {e}")
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
