"""Check fp8sim's rounding on all 2**32 float32 inputs (not part of CI).

    python scripts/exhaustive_check.py [--formats e4m3,e5m2] [--modes rne,rna,rtz,rup,rdn,rto]
                                       [--log2-chunk 24] [--json results.json]

For every float32 bit pattern, every listed format and deterministic mode,
with and without saturation, it compares

* ``fp8sim.round`` on the float32 input (the memoized float32 path for
  formats with <= 7 mantissa bits) and on the same input as float64 (the
  float64 kernel) with the bracketing reference of ``tests/reference.py``
  (sorted values + searchsorted + each mode's definition: shares no code
  with the kernels);
* for RNE without saturation, ``fp8sim.encode`` with ml_dtypes'
  float32 cast, code for code (NaN: both NaN; ml_dtypes keeps the input's
  NaN sign).

It prints and records the number of mismatches for each case.  Chunks are
independent: ``--processes N`` spreads them over N worker processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import fp8sim  # noqa: E402
from tests.reference import bracket, round_reference  # noqa: E402


def same(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


def check_chunk(job):
    """Mismatch counts for one chunk of float32 bit patterns."""
    c, log2_chunk, format_names, modes = job
    chunk = 1 << log2_chunk
    bits = np.arange(c * chunk, (c + 1) * chunk, dtype=np.uint64).astype(np.uint32)
    x32 = bits.view(np.float32)
    x64 = x32.astype(np.float64)
    counts: dict[str, int] = {}
    for name in format_names:
        fmt = fp8sim.format(name)
        table = fp8sim.decode_table(fmt)
        if fmt.ml_dtype is not None:
            with np.errstate(all="ignore"):
                ref = x32.astype(fmt.ml_dtype)
            codes = fp8sim.encode(x32, fmt)
            refnan = np.isnan(ref.astype(np.float32))
            bad = (codes != ref.view(fmt.code_dtype)) & ~refnan
            bad |= refnan & ~np.isnan(fp8sim.decode(codes, fmt))
            counts[f"{name}/rne/encode-vs-ml_dtypes"] = int(bad.sum())
        b = bracket(x32, fmt, table)
        for mode in modes:
            for sat in (False, True):
                want = round_reference(x32, fmt, table, mode, sat, b=b)
                for path, x in (("f32", x32), ("f64", x64)):
                    got = fp8sim.round(x, fmt, mode, saturate=sat)
                    key = f"{name}/{mode}/{'sat' if sat else 'nosat'}/{path}-vs-reference"
                    counts[key] = int((~same(got, want)).sum())
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default="e4m3,e5m2")
    ap.add_argument("--modes", default="rne,rna,rtz,rup,rdn,rto")
    ap.add_argument("--log2-chunk", type=int, default=24)
    ap.add_argument("--limit-chunks", type=int, default=None, help="check only this many chunks (smoke test)")
    ap.add_argument("--processes", type=int, default=1, help="worker processes (one numba thread each)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from tqdm import tqdm

    nchunks = (1 << 32) >> args.log2_chunk
    if args.limit_chunks:
        nchunks = min(nchunks, args.limit_chunks)
    jobs = [(c, args.log2_chunk, args.formats.split(","), args.modes.split(",")) for c in range(nchunks)]
    totals: dict[str, int] = {}
    t0 = time.time()
    if args.processes > 1:
        import multiprocessing as mp

        os.environ["NUMBA_NUM_THREADS"] = "1"
        with mp.get_context("spawn").Pool(args.processes) as pool:
            results = pool.imap_unordered(check_chunk, jobs)
            for counts in tqdm(results, total=nchunks, disable=not sys.stderr.isatty()):
                for k, v in counts.items():
                    totals[k] = totals.get(k, 0) + v
    else:
        for job in tqdm(jobs, disable=not sys.stderr.isatty()):
            for k, v in check_chunk(job).items():
                totals[k] = totals.get(k, 0) + v
    inputs = nchunks << args.log2_chunk
    result = {
        "inputs_per_case": inputs,
        "all_inputs": inputs == 1 << 32,
        "seconds": round(time.time() - t0, 1),
        "mismatches": totals,
        "fp8sim": fp8sim.__version__,
    }
    for k, v in sorted(totals.items()):
        print(f"{k:45s} {inputs:>12d} inputs  {v} mismatches")
    print(
        f"total mismatches: {sum(totals.values())} over {len(totals)} cases of {inputs} inputs ({result['seconds']} s)"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 1 if sum(totals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
