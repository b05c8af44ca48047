"""Capture hardware test vectors from the GPU's FP8 tensor-core instructions.

    python -m gpu.capture --out tests/data                # everything
    python -m gpu.capture --out DIR --instruction wgmma --family normal --pair e4m3xe4m3
    python -m gpu.capture --out DIR --chain               # K=4096 tile loops only

Each file is a compressed .npz with ``a`` (uint8 codes, (T, M, 32) or (M, K)),
``b`` (uint8 codes, (T, 32, N) or (K, N)), ``c`` (float32), ``d`` (float32,
the hardware result; chained captures add ``d_promote128`` etc.) and ``meta``
(JSON: GPU, driver, CUDA runtime, nvcc, instruction, formats, family, seed).
Score the emulator against any capture with ``python -m gpu.verify FILE``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os

import numpy as np

import fp8sim

PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]
FAMILIES = ["normal", "wide", "cancel", "largec", "subnormal", "nearmax", "special"]
SHAPES = {"wgmma": (64, 8), "wgmma.f16": (64, 8), "mma.sync": (16, 8)}
INSTANCES = {"wgmma": 16, "wgmma.f16": 16, "mma.sync": 64}


# --------------------------------------------------------------- generators
def _classes(fmt):
    f = fp8sim.format(fmt)
    v = fp8sim.decode(np.arange(256, dtype=np.uint8), f).astype(np.float64)
    finite = np.flatnonzero(np.isfinite(v)).astype(np.uint8)
    sub = np.flatnonzero(np.isfinite(v) & (v != 0) & (np.abs(v) < f.min_normal)).astype(np.uint8)
    top = np.flatnonzero(np.isfinite(v) & (np.abs(v) >= 2.0**f.emax)).astype(np.uint8)
    special = np.flatnonzero(~np.isfinite(v)).astype(np.uint8)
    return finite, sub, top, special


def _q(x, fmt):
    return fp8sim.encode(np.asarray(x, np.float32), fmt, "rne", saturate=True)


def _rand_f32(rng, shape, lo, hi):
    """Random float32 with full 24-bit significands and exponents in [lo, hi]."""
    sig = rng.integers(1 << 23, 1 << 24, size=shape).astype(np.float64) / (1 << 23)
    e = rng.integers(lo, hi + 1, size=shape)
    s = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    return (s * sig * 2.0**e).astype(np.float32)


def family_inputs(family, fa, fb, ashape, bshape, cshape, rng, c_f16=False):
    """(a codes, b codes, c float32) for one family."""
    finA, subA, topA, spA = _classes(fa)
    finB, subB, topB, spB = _classes(fb)
    if family == "normal":
        a = _q(rng.standard_normal(ashape), fa)
        b = _q(rng.standard_normal(bshape), fb)
        c = rng.standard_normal(cshape).astype(np.float32)
    elif family == "wide":
        a = rng.choice(finA, ashape)
        b = rng.choice(finB, bshape)
        c = _rand_f32(rng, cshape, -30, 30)
    elif family == "cancel":
        a = _q(rng.standard_normal(ashape), fa)
        b = _q(rng.standard_normal(bshape), fb)
        # second half cancels the first half, except a few perturbed entries
        b[..., 16:, :] = b[..., :16, :]
        a[..., 16:] = a[..., :16] ^ 0x80
        mask = rng.random(ashape) < 0.06
        a = np.where(mask, _q(rng.standard_normal(ashape) * 2.0 ** rng.integers(-8, 1, ashape), fa), a)
        c = (rng.standard_normal(cshape) * 2.0 ** rng.integers(-24, 0, cshape)).astype(np.float32)
        c[rng.random(cshape) < 0.3] = 0
    elif family == "largec":
        a = _q(rng.standard_normal(ashape), fa)
        b = _q(rng.standard_normal(bshape), fb)
        c = _rand_f32(rng, cshape, 4, 40)
    elif family == "subnormal":
        a = np.where(
            rng.random(ashape) < 0.6,
            rng.choice(subA, ashape),
            _q(rng.standard_normal(ashape) * 2.0 ** fp8sim.format(fa).emin, fa),
        )
        b = np.where(
            rng.random(bshape) < 0.6,
            rng.choice(subB, bshape),
            _q(rng.standard_normal(bshape) * 2.0 ** fp8sim.format(fb).emin, fb),
        )
        bits = rng.integers(1, 1 << 23, cshape).astype(np.uint32) | (rng.integers(0, 2, cshape).astype(np.uint32) << 31)
        c = bits.view(np.float32).copy()
        sel = rng.random(cshape)
        c = np.where(sel < 0.3, _rand_f32(rng, cshape, -40, -20), c)
        c = np.where((sel >= 0.3) & (sel < 0.5), _rand_f32(rng, cshape, -130, -110), c).astype(np.float32)
        c[rng.random(cshape) < 0.1] = 0
    elif family == "nearmax":
        a = np.where(rng.random(ashape) < 0.8, rng.choice(topA, ashape), rng.choice(finA, ashape))
        b = np.where(rng.random(bshape) < 0.8, rng.choice(topB, bshape), rng.choice(finB, bshape))
        c = _rand_f32(rng, cshape, 0, 40)
        c[rng.random(cshape) < 0.1] = np.float32(np.finfo(np.float32).max)
    elif family == "special":
        a = _q(rng.standard_normal(ashape), fa)
        b = _q(rng.standard_normal(bshape), fb)
        a = np.where(rng.random(ashape) < 0.01, rng.choice(spA, ashape), a)
        b = np.where(rng.random(bshape) < 0.01, rng.choice(spB, bshape), b)
        a = np.where(rng.random(ashape) < 0.02, np.uint8(0x80), a)
        c = rng.standard_normal(cshape).astype(np.float32)
        sel = rng.random(cshape)
        c[sel < 0.02] = np.inf
        c[(sel >= 0.02) & (sel < 0.04)] = -np.inf
        c[(sel >= 0.04) & (sel < 0.06)] = np.nan
        c[(sel >= 0.06) & (sel < 0.1)] = -0.0
    else:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    a = np.asarray(a, np.uint8)
    b = np.asarray(b, np.uint8)
    c = np.asarray(c, np.float32)
    if c_f16:
        with np.errstate(over="ignore"):
            c = c.astype(np.float16).astype(np.float32)
    return a, b, c


def chain_inputs(dist, M, N, K, rng, fmt="e4m3"):
    if dist == "normal":
        x = rng.standard_normal((M, K))
        w = rng.standard_normal((K, N))
    elif dist == "uniform":
        x = rng.random((M, K))
        w = rng.random((K, N))
    else:
        raise ValueError(dist)
    return _q(x, fmt), _q(w, fmt)


# ----------------------------------------------------------------- capture
def meta_base(info, **kw):
    m = {"arch": "sm90", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    m.update(info)
    m.update(kw)
    return m


def capture_family(K, instruction, fa, fb, family, seed, info):
    Mi, Ni = SHAPES[instruction]
    T = INSTANCES[instruction]
    rng = np.random.default_rng([seed, FAMILIES.index(family), PAIRS.index((fa, fb)), list(SHAPES).index(instruction)])
    a, b, c = family_inputs(
        family, fa, fb, (T, Mi, 32), (T, 32, Ni), (T, Mi, Ni), rng, c_f16=instruction == "wgmma.f16"
    )
    with np.errstate(all="ignore"):
        d = K.run(instruction, a, b, c, fa, fb)
    meta = meta_base(
        info,
        kind="mma",
        instruction=instruction,
        a_format=fa,
        b_format=fb,
        family=family,
        seed=seed,
        shape=[T, Mi, Ni, 32],
    )
    return {"a": a, "b": b, "c": c, "d": np.asarray(d, np.float32), "meta": meta}


def capture_chain(K, dist, seed, info, M=128, N=128, Kdim=4096, promote=(128,)):
    rng = np.random.default_rng([seed, 100, ["normal", "uniform"].index(dist)])
    a, b = chain_inputs(dist, M, N, Kdim, rng)
    c = np.zeros((M, N), np.float32)
    out = {"a": a, "b": b, "c": c, "d": K.wgmma_chain(a, b, c, "e4m3", "e4m3", None)}
    for p in promote:
        out[f"d_promote{p}"] = K.wgmma_chain(a, b, c, "e4m3", "e4m3", p)
    out["meta"] = meta_base(
        info,
        kind="chain",
        instruction="wgmma",
        a_format="e4m3",
        b_format="e4m3",
        family=f"chain_{dist}",
        seed=seed,
        shape=[M, N, Kdim],
        promote=list(promote),
    )
    return out


def save(path, cap):
    cap = dict(cap)
    cap["meta"] = np.array(json.dumps(cap["meta"]))
    np.savez_compressed(path, **cap)


def error_stats(d, a, b, fmt="e4m3"):
    """Elementwise relative error of d against the fp64 product of the same codes."""
    ref = fp8sim.decode(a, fmt).astype(np.float64) @ fp8sim.decode(b, fmt).astype(np.float64)
    rel = np.abs(d.astype(np.float64) - ref) / np.abs(ref)
    absa = np.abs(fp8sim.decode(a, fmt).astype(np.float64)) @ np.abs(fp8sim.decode(b, fmt).astype(np.float64))
    nrm = np.abs(d.astype(np.float64) - ref) / absa
    return {
        "max_rel": float(np.max(rel)),
        "median_rel": float(np.median(rel)),
        "max_err_over_abs_dot": float(np.max(nrm)),
        "median_err_over_abs_dot": float(np.median(nrm)),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gpu.capture", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="captures")
    ap.add_argument("--instruction", action="append", choices=list(SHAPES))
    ap.add_argument("--family", action="append", choices=FAMILIES)
    ap.add_argument("--pair", action="append")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chain", action="store_true", help="only the chained K=4096 captures")
    ap.add_argument("--no-chain", action="store_true")
    args = ap.parse_args(argv)
    from . import launch as K

    info = K.device_info()
    os.makedirs(args.out, exist_ok=True)
    print(json.dumps(info))
    written = []
    if not args.chain:
        instrs = args.instruction or list(SHAPES)
        pairs = [tuple(p.split("x")) for p in args.pair] if args.pair else PAIRS
        for ins in instrs:
            for fa, fb in pairs:
                for fam in args.family or FAMILIES:
                    cap = capture_family(K, ins, fa, fb, fam, args.seed, info)
                    path = os.path.join(args.out, f"{ins}_{fa}x{fb}_{fam}.npz")
                    save(path, cap)
                    written.append(path)
    if not args.no_chain:
        stats = {}
        for dist in ("normal", "uniform"):
            cap = capture_chain(K, dist, args.seed, info)
            path = os.path.join(args.out, f"chain_wgmma_e4m3_{dist}.npz")
            save(path, cap)
            written.append(path)
            stats[dist] = {k: error_stats(cap[k], cap["a"], cap["b"]) for k in cap if k.startswith("d")}
        print(json.dumps({"gemm_error_stats_hardware": stats}, indent=1))
    for p in written:
        print("wrote", p, os.path.getsize(p))
    return written


if __name__ == "__main__":
    main()
