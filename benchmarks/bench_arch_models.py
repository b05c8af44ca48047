"""MAC rate of the tensor-core kernels beyond Hopper against the wgmma CPU kernel, same shapes.

    python benchmarks/bench_arch_models.py [--size 256] [--repeat 3]

For each instruction row (one format pair per row) it times ``fp8sim.tensorcore.matmul`` on
(size x size) @ (size x size) random codes of finite values (as the wgmma kernel's inputs; inf and
NaN codes send their blocks to the kernels' float64 path) and prints the MAC rate and its ratio to the sm90 wgmma CPU
kernel (timed right after it, as the CPUs may be shared) (``fp8sim.tensorcore.fast.wgmma_gemm``, the kernel of ``fp8sim.gemm``) on the same shape.
The first call of each kernel (numba compilation) is not timed.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import fp8sim.tensorcore as tc
from fp8sim.formats import format as fmt_of
from fp8sim.tensorcore import archs
from fp8sim.tensorcore.fast import code_tables, wgmma_gemm
from fp8sim.tensorcore.scaled_mma import decode_operand


def _best(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def wgmma_rate(size: int, repeat: int, rng) -> float:
    """MAC/s of the wgmma CPU kernel (no scaling, no promotion) on size^3."""
    f = fmt_of("e4m3")
    v, e, sp = code_tables(f)
    a = rng.integers(0, 0x7E, (size, size)).astype(np.uint8)
    b = rng.integers(0, 0x7E, (size, size)).astype(np.uint8)
    av, ae = v[a], e[a].astype(np.int16)
    bv, be = np.ascontiguousarray(v[b]), np.ascontiguousarray(e[b].astype(np.int16))
    sa = np.ones((size, 1), np.float32)
    sb = np.ones((1, size), np.float32)
    skip = (a == 0) & ~sp[b].any()
    out = np.empty((size, size), np.float32)
    keep = np.int32(-(1 << (23 - 13)))
    t = _best(lambda: wgmma_gemm(av, ae, bv, be, sa, sb, size, 0, 2, 13, keep, skip, out), repeat)
    return size**3 / t


def finite_codes(f, shape, rng) -> np.ndarray:
    """Random codes: FP8/FP6/FP4 uniform over the finite values (as the wgmma kernel's: no inf/NaN),
    bf16/fp16/tf32 of standard normal data (their whole code space spans exponents whose blocks
    take the kernels' float64 path; ``--wide`` times that)."""
    if f.bits > 8:
        x = rng.standard_normal(shape).astype(np.float32)
        if f.name == "fp16":
            return x.astype(np.float16).view(np.uint16)
        return (x.view(np.uint32) >> (32 - f.bits)).astype(f.code_dtype)
    codes = np.arange(f.num_codes, dtype=f.code_dtype)
    v, _ = decode_operand(codes, f)
    return rng.choice(codes[np.isfinite(v)], shape)


def row_rate(row: archs.Row, size: int, repeat: int, rng, wide: bool = False) -> float:
    fa = fb = row.formats[0]
    f = fmt_of(fa)
    if wide:  # every finite code: bf16/tf32 blocks on the float64 path
        codes = np.arange(min(f.num_codes, 1 << 16), dtype=f.code_dtype)
        v, _ = decode_operand(codes, f)
        a, b = (rng.choice(codes[np.isfinite(v)], (size, size)) for _ in range(2))
    else:
        a = finite_codes(f, (size, size), rng)
        b = finite_codes(f, (size, size), rng)
    kw = dict(a_format=fa, b_format=fb, instruction=row.instruction, arch=row.arch, out_format=row.out)
    if row.scales:
        sfmt, block = row.scales[0]
        sname = "ue8m0" if sfmt == "e8m0" else sfmt
        kw.update(a_scale=rng.integers(120, 134, (size, size // block)).astype(np.uint8),
                  b_scale=rng.integers(120, 134, (size // block, size)).astype(np.uint8), scale_format=sname)  # fmt: skip
    with np.errstate(all="ignore"):
        t = _best(lambda: tc.matmul(a, b, **kw), repeat)
    return size**3 / t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--wide", action="store_true", help="bf16/fp16 operands over all their finite codes")
    p.add_argument("--only", default="", help="only the rows whose registry key contains this")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    print(f"shape {args.size}^3; the wgmma CPU kernel (fp8sim.gemm's) timed next to each row (shared CPUs)")
    print(f"{'arch':<6} {'model':<30} {'M MAC/s':>9} {'wgmma':>9} {'ratio':>6}")
    seen = set()
    for row in archs.ROWS:
        m = row.model
        if (m.name, row.scales) in seen or args.only not in row.key:
            continue
        seen.add((m.name, row.scales))
        r = row_rate(row, args.size, args.repeat, rng, args.wide)
        ref = wgmma_rate(args.size, args.repeat, rng)
        print(f"{row.arch:<6} {row.key:<30} {r / 1e6:9.1f} {ref / 1e6:9.1f} {r / ref:6.2f}")


if __name__ == "__main__":
    main()
