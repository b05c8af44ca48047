"""MAC rate of the tensor-core kernels beyond Hopper against the wgmma CPU kernels, same shapes.

    python benchmarks/bench_arch_models.py [--size 256] [--rounds 3] [--repeat 5] [--threads N]
                                           [--only KEY] [--wide] [--cpu-time]

For each instruction row (one format pair per row; not the sm90 FP8 ``wgmma`` / ``mma.sync``
presets, which ``fp8sim.tensorcore`` runs on the bit-level sm90 kernel and ``fp8sim.gemm`` on the
wgmma kernels) it times, on (size x size) @ (size x size) random codes of finite values (as the
wgmma kernel's inputs; inf and NaN codes send their blocks to the kernels' float64 path):

* ``kernels``: :func:`fp8sim.tensorcore.scaled_mma.run_general` from the codes (the operand
  decoding and the kernel of the row's datapath);
* ``matmul``: :func:`fp8sim.tensorcore.matmul` end to end (its checks and instruction lookup too);
* ``wgmma``: the sm90 wgmma CPU kernel ``fp8sim.tensorcore.fast.wgmma_gemm`` on e4m3 values
  (decoded beforehand; no scaling, no promotion), timed right after the row, as the CPUs may be
  shared; ``packed``: the packed kernel ``wgmma_gemm_codes`` that ``fp8sim.gemm`` runs on finite
  codes, from the codes.

Each rate is the best of ``--repeat`` calls after one untimed call (numba compilation); the whole
measurement is repeated ``--rounds`` times and every round's value is printed (rates in M MAC/s,
ratios to the reference timed in the same round).  ``--cpu-time`` times the process's CPU time
instead of the wall clock (steadier on a shared machine; with ``--threads 1`` a one-core rate).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import fp8sim.tensorcore as tc
from fp8sim.formats import format as fmt_of
from fp8sim.tensorcore import archs
from fp8sim.tensorcore.fast import code_tables, wgmma_gemm, wgmma_gemm_codes
from fp8sim.tensorcore.scaled_mma import decode_operand, decode_scales, run_general

_CLOCK = time.perf_counter


def _best(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = _CLOCK()
        fn()
        best = min(best, _CLOCK() - t0)
    return best


def wgmma_rates(size: int, repeat: int, rng) -> tuple[float, float | None]:
    """MAC/s of the wgmma CPU kernel and of the packed kernel (None if it declines) on size^3."""
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
    if wgmma_gemm_codes(a, b, f, f, sa, sb, size, 0, 2, 13, keep) is None:
        return size**3 / t, None
    return size**3 / t, size**3 / _best(lambda: wgmma_gemm_codes(a, b, f, f, sa, sb, size, 0, 2, 13, keep), repeat)


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


def row_rates(row: archs.Row, size: int, repeat: int, rng, wide: bool = False) -> tuple[float, float]:
    """MAC/s of ``row``'s kernels (:func:`run_general` from the codes) and of ``tc.matmul``."""
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
    scales = None
    if row.scales:
        sfmt, block = row.scales[0]
        sname = "ue8m0" if sfmt == "e8m0" else sfmt
        sa = rng.integers(120, 134, (size, size // block)).astype(np.uint8)
        sb = rng.integers(120, 134, (size // block, size)).astype(np.uint8)
        kw.update(a_scale=sa, b_scale=sb, scale_format=sname)
        sf = archs.scale_format(sname)
        scales = (*decode_scales(sa, sf), *decode_scales(sb, sf), block)
    c = np.zeros((size, size))
    with np.errstate(all="ignore"):
        tk = _best(lambda: run_general(a, b, c, f, f, row.model, 0, scales), repeat)
        tm = _best(lambda: tc.matmul(a, b, **kw), repeat)
    return size**3 / tk, size**3 / tm


def _rows(only: str) -> list[archs.Row]:
    seen, rows = set(), []
    for row in archs.ROWS:
        if row.arch == "sm90" and row.key in ("wgmma", "mma.sync"):  # the bit-level sm90 kernel's
            continue
        if (row.model.name, row.scales) in seen or only not in row.key:
            continue
        seen.add((row.model.name, row.scales))
        rows.append(row)
    return rows


def _cells(values, fmt: str) -> str:
    return " ".join("-" if v is None else format(v, fmt) for v in values)


def main() -> None:
    global _CLOCK
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3, help="measurements of every rate (all are printed)")
    p.add_argument("--repeat", type=int, default=5, help="calls per measurement (the best counts)")
    p.add_argument("--threads", type=int, default=0, help="numba threads (0: numba's default)")
    p.add_argument("--wide", action="store_true", help="bf16/fp16/tf32 operands over all their finite codes")
    p.add_argument("--only", default="", help="only the rows whose registry key contains this")
    p.add_argument("--cpu-time", action="store_true", help="time the process's CPU time, not the wall clock")
    args = p.parse_args()
    if args.threads:
        import numba

        numba.set_num_threads(args.threads)
    if args.cpu_time:
        _CLOCK = time.process_time
    rng = np.random.default_rng(0)
    rows = _rows(args.only)
    res = {row.key: [] for row in rows}
    for _ in range(args.rounds):
        for row in rows:
            rk, rm = row_rates(row, args.size, args.repeat, rng, args.wide)
            rw, rp = wgmma_rates(args.size, args.repeat, rng)
            res[row.key].append((rk, rm, rw, rp))
    clock = "CPU time" if args.cpu_time else "wall clock"
    print(f"shape {args.size}^3, {clock}, M MAC/s of {args.rounds} rounds (each the best of {args.repeat} calls); "
          "ratios to the wgmma kernel timed next to each row")  # fmt: skip
    w = 5 * args.rounds
    print(f"{'arch':<6} {'model':<30} {'kernels':<{w}} {'matmul':<{w}} {'wgmma':<{w}} {'packed':<{w}} "
          f"{'kernels/wgmma':<{w}} {'matmul/wgmma':<{w}} kernels/packed")  # fmt: skip
    for row in rows:
        r = res[row.key]
        cols = [_cells([x[0] / 1e6 for x in r], "4.0f"), _cells([x[1] / 1e6 for x in r], "4.0f"),
                _cells([x[2] / 1e6 for x in r], "4.0f"), _cells([None if x[3] is None else x[3] / 1e6 for x in r], "4.0f"),
                _cells([x[0] / x[2] for x in r], "4.2f"), _cells([x[1] / x[2] for x in r], "4.2f"),
                _cells([None if x[3] is None else x[0] / x[3] for x in r], "4.2f")]  # fmt: skip
        print(f"{row.arch:<6} {row.key:<30} " + " ".join(f"{col:<{w}}" for col in cols))


if __name__ == "__main__":
    main()
