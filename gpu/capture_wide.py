"""Capture Hopper's bf16, fp16 and tf32 ``wgmma`` and ``mma.sync`` on the GPU: single instructions on crafted tiles.

    PYTHONPATH=. python3 -m gpu.capture_wide --out tests/data/wide_sm90

One file per instruction form (``wgmma_wide_<form>.npz``; forms ``bf16`` (m64n8k16.f32.bf16.bf16),
``fp16`` (.f32.f16.f16), ``fp16.f16`` (.f16.f16.f16, f16 accumulator) and ``tf32``
(m64n8k8.f32.tf32.tf32)), and ``mma.sync.<form>.npz`` for the same four forms of ``mma.sync``
(m16n8k16, m16n8k8), each holding for every family ``<family>_a`` (T, R, K) and ``<family>_b``
(T, K, 8) codes as fp8sim holds them (uint16; tf32 its 19-bit code in uint32), ``<family>_c`` (T, R,
8) float32 (fp16 values for the f16 accumulator) and ``<family>_d`` the hardware's D (float32), with
R = 64 rows for wgmma and 16 for mma.sync (32,768 outputs per family either way), plus
``meta`` (JSON: GPU, driver, CUDA, the seed, the families).  The families:

* ``normal``: standard normal data, C normal times 2**[-20, 20] (2**[-10, 10] for the f16 accumulator);
* ``wide``: exponents spread over most of the format's range (alignment, cancellation), C as well;
* ``whole``: codes uniform over the whole code space (subnormals, inf, NaN), C over many magnitudes
  with zeros, fp32 subnormals, +-inf and NaN;
* ``overflow``: sums at and beyond the accumulator's largest finite value, of both signs, C near it;
* ``tiny``: products below 2**-133 (bf16, tf32; 2**-21 for the f16 accumulator) with C = 0 or a
  few units of 2**-149.

``tests/test_wide_h200.py`` scores fp8sim's sm90 models (and records MMA-Sim's) against these files.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

#: form -> (fp8sim format, accumulator, K, instruction)
FORMS = {"bf16": ("bf16", "f32", 16, "wgmma"), "fp16": ("fp16", "f32", 16, "wgmma"),
         "fp16.f16": ("fp16", "f16", 16, "wgmma"), "tf32": ("tf32", "f32", 8, "wgmma"),
         "mma.sync.bf16": ("bf16", "f32", 16, "mma.sync"), "mma.sync.fp16": ("fp16", "f32", 16, "mma.sync"),
         "mma.sync.fp16.f16": ("fp16", "f16", 16, "mma.sync"),
         "mma.sync.tf32": ("tf32", "f32", 8, "mma.sync")}  # fmt: skip
FAMILIES = ("normal", "wide", "whole", "overflow", "tiny")
ROWS = {"wgmma": 64, "mma.sync": 16}  # rows of a tile (8 columns)
OUTPUTS = 64 * 64 * 8  # per family: 64 wgmma tiles, 256 mma.sync tiles


def codes_of(x: np.ndarray, fmt: str) -> np.ndarray:
    """Codes of float64 values ``x``: fp16 rounded to nearest, bf16/tf32 truncated from float32
    (any code is a valid operand; the values come from the codes)."""
    if fmt == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).view(np.uint16)
    bits = x.astype(np.float32).view(np.uint32)
    return (bits >> 16).astype(np.uint16) if fmt == "bf16" else (bits >> 13).astype(np.uint32)


def _signed(rng, shape, lo: int, hi: int) -> np.ndarray:
    """Random values: significands in [1, 2), exponents in [lo, hi], random signs."""
    return rng.uniform(1, 2, shape) * np.exp2(rng.integers(lo, hi + 1, shape)) * rng.choice([-1.0, 1.0], shape)


def _c_many(rng, shape, lo: int, hi: int, specials: bool) -> np.ndarray:
    c = _signed(rng, shape, lo, hi)
    r = rng.random(shape)
    c[r < 0.1] = 0.0
    c[(r >= 0.1) & (r < 0.15)] *= 2.0**-100
    if specials:
        c[(r >= 0.15) & (r < 0.16)] = np.inf
        c[(r >= 0.16) & (r < 0.17)] = -np.inf
        c[(r >= 0.17) & (r < 0.18)] = np.nan
    return c


def family(rng, form: str, name: str):
    """(a codes, b codes, c float32) of one family for one form: INSTANCES tiles."""
    fmt, acc, K, instr = FORMS[form]
    R = ROWS[instr]
    T = OUTPUTS // (R * 8)
    sa, sb, sc = (T, R, K), (T, K, 8), (T, R, 8)
    f16 = acc == "f16"
    big = 15 if fmt == "fp16" else 127  # largest operand exponent
    if name == "normal":
        a, b = rng.standard_normal(sa), rng.standard_normal(sb)
        c = rng.standard_normal(sc) * np.exp2(rng.integers(-10, 11, sc) if f16 else rng.integers(-20, 21, sc))
    elif name == "wide":
        lo = -14 if fmt == "fp16" else -60
        a, b = _signed(rng, sa, lo, big // 2), _signed(rng, sb, lo, big // 2)
        c = _c_many(rng, sc, -30 if f16 else -60, 14 if f16 else 60, False)
    elif name == "whole":
        n = 1 << (19 if fmt == "tf32" else 16)
        dt = np.uint32 if fmt == "tf32" else np.uint16
        a_c = rng.integers(0, n, sa).astype(dt)
        b_c = rng.integers(0, n, sb).astype(dt)
        c = _c_many(rng, sc, -20 if f16 else -40, 14 if f16 else 40, True)
        return a_c, b_c, _c_dtype(c, f16)
    elif name == "overflow":
        if f16:  # products of 2^6..2^8 sum beyond 65504
            a, b = _signed(rng, sa, 5, 7), np.abs(_signed(rng, sb, 1, 3))
            c = _signed(rng, sc, 13, 15)
        elif fmt == "fp16":  # products below 2^32: only C takes the sum past FLT_MAX
            a, b = _signed(rng, sa, 12, 15), np.abs(_signed(rng, sb, 12, 15))
            c = np.abs(_signed(rng, sc, 127, 127)) * rng.choice([-1.0, 1.0], sc)
        else:
            a, b = _signed(rng, sa, 120, 127), np.abs(_signed(rng, sb, -2, 2))
            c = _signed(rng, sc, 125, 127)
            c[rng.random(sc) < 0.3] = 0.0
        a = a * (rng.random(sa) < 0.5)  # a few products per output, so that sums of one sign occur
    else:  # tiny
        if f16:
            lo, hi = -24, -8
        elif fmt == "fp16":
            lo, hi = -24, -10  # products >= 2^-48: far above 2^-133 (the check of C = 0 alone)
        else:  # products of at most 2^-134 (and a few outputs with larger ones)
            lo, hi = -82, -68
        a, b = _signed(rng, sa, lo, hi), _signed(rng, sb, lo, hi)
        c = np.zeros(sc)
        r = rng.random(sc)
        c[r < 0.2] = 2.0**-149 * rng.integers(1, 8, sc)[r < 0.2] * (-1.0) ** rng.integers(0, 2, sc)[r < 0.2]
    return codes_of(a, fmt), codes_of(b, fmt), _c_dtype(c, f16)


def _c_dtype(c: np.ndarray, f16: bool) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (c.astype(np.float16) if f16 else c).astype(np.float32)


def main() -> None:
    from . import launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    info = launch.device_info()
    for k, form in enumerate(FORMS):
        fmt, acc, _, instr = FORMS[form]
        run = launch.wgmma_wide if instr == "wgmma" else launch.mma_sync_wide
        rng = np.random.default_rng([args.seed, k])
        arrays = {}
        for name in FAMILIES:
            a, b, c = family(rng, form, name)
            d = run(a, b, c, fmt, acc)
            arrays.update({f"{name}_a": a, f"{name}_b": b, f"{name}_c": c, f"{name}_d": d.astype(np.float32)})
        meta = dict(info, form=form, format=fmt, accumulator=acc, instruction=instr, families=list(FAMILIES),
                    seed=args.seed, tiles=OUTPUTS // (ROWS[instr] * 8), capture="gpu/capture_wide.py")  # fmt: skip
        name = f"wgmma_wide_{form}.npz" if instr == "wgmma" else f"{form}.npz"
        path = os.path.join(args.out, name)
        np.savez_compressed(path, meta=json.dumps(meta), **arrays)
        print(f"wrote {path}: {len(FAMILIES)} families x {meta['tiles']} tiles")


if __name__ == "__main__":
    main()
