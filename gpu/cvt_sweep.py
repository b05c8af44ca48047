"""Sweep cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 over all 2**32 float32 inputs.

    python -m gpu.cvt_sweep --out cvt_sm90.npz          # on the GPU: run-length encode
    python -m gpu.cvt_sweep --check cvt_sm90.npz        # anywhere: compare with fp8sim.encode

The GPU result is stored run-length encoded (the bit patterns where the
output code changes, and the new code): a few thousand entries describe all
2**32 outputs.  ``--check`` expands it chunk by chunk and compares every
input with ``fp8sim.encode(x, fmt, "rne", saturate=True)``, reporting the
mismatch count and examples (NaN outputs are compared as NaN / not NaN and
by bit pattern separately).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import fp8sim


def rle_expand(starts, codes, lo, hi):
    x = np.arange(lo, hi, dtype=np.uint64)
    idx = np.searchsorted(starts.astype(np.uint64), x, side="right") - 1
    return codes[idx]


def check(path, chunk_log2=26, limit_s=None, fmts=("e4m3", "e5m2")):
    z = np.load(path)
    report = {}
    for fmt in fmts:
        starts, codes = z[f"{fmt}_starts"], z[f"{fmt}_codes"]
        f = fp8sim.format(fmt)
        n = 1 << chunk_log2
        bad = 0
        nan_pattern_diff = 0
        examples = []
        t0 = time.time()
        done = 0
        for lo in range(0, 1 << 32, n):
            hw = rle_expand(starts, codes, lo, lo + n)
            x = np.arange(lo, lo + n, dtype=np.uint64).astype(np.uint32).view(np.float32)
            ref = fp8sim.encode(x, f, "rne", saturate=True)
            hwnan = np.array([f.is_nan_code(int(c)) for c in range(256)])[hw]
            refnan = np.array([f.is_nan_code(int(c)) for c in range(256)])[ref]
            diff = (hw != ref) & ~(hwnan & refnan)
            nan_pattern_diff += int(np.sum((hw != ref) & hwnan & refnan))
            k = int(diff.sum())
            if k:
                bad += k
                for i in np.flatnonzero(diff)[: max(0, 8 - len(examples))]:
                    examples.append(
                        {
                            "x_bits": f"0x{lo + int(i):08x}",
                            "x": float(x[i]),
                            "hardware": f"0x{int(hw[i]):02x}",
                            "encode": f"0x{int(ref[i]):02x}",
                        }
                    )
            done += n
            if limit_s and time.time() - t0 > limit_s:
                break
        report[fmt] = {
            "inputs_checked": done,
            "mismatches": bad,
            "nan_bit_pattern_differences": nan_pattern_diff,
            "examples": examples,
            "runs": int(len(starts)),
        }
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gpu.cvt_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="run the sweep on the GPU and write the RLE .npz here")
    ap.add_argument("--check", help="compare a sweep .npz with fp8sim.encode")
    ap.add_argument("--limit-s", type=float, default=None)
    ap.add_argument("--chunk-log2", type=int, default=26)
    args = ap.parse_args(argv)
    if args.out:
        from . import launch as K

        out = {
            "meta": np.array(
                json.dumps(
                    {**K.device_info(), "instructions": ["cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32"]}
                )
            )
        }
        for fmt in ("e4m3", "e5m2"):
            t = time.time()
            s, c = K.cvt_sweep(fmt)
            out[f"{fmt}_starts"], out[f"{fmt}_codes"] = s, c
            print(f"{fmt}: {len(s)} runs, {time.time() - t:.1f} s")
        np.savez_compressed(args.out, **out)
    if args.check:
        print(json.dumps(check(args.check, args.chunk_log2, args.limit_s), indent=1))


if __name__ == "__main__":
    main()
