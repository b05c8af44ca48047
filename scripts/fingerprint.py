"""Fingerprint fp8sim's numerical results, to show that a change is bit-identical.

    python scripts/fingerprint.py --out before.json      # on the old commit
    python scripts/fingerprint.py --out after.json       # on the new commit
    python scripts/fingerprint.py --compare before.json after.json

Each entry is the SHA-256 of the raw bytes of one family of outputs, computed
through the public API only (so the same script runs on both commits):

* ``round``/``encode``/``decode`` for every format of the catalogue, every
  mode, with and without saturation, on float32 and float64 inputs (random bit
  patterns, the specials, every value near each format's grid);
* ``quantize`` for every granularity, scale format and scale rounding on
  matrices with outliers, NaN and zeros (codes, scales, amax, dequantized);
* the error metrics and block statistics of those;
* ``tensorcore.mma`` and ``tensorcore.matmul`` for every registered model;
* ``gemm`` for every recipe, both fidelities, with and without the report;
* a few training steps for three recipes (losses and final weights);
* the stdout of every example and the CSV files of both studies (quick).

``--compare`` prints the entries that differ and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import fp8sim  # noqa: E402
from fp8sim import metrics, tensorcore  # noqa: E402


def h(*arrays) -> str:
    d = hashlib.sha256()
    for a in arrays:
        if isinstance(a, (str, bytes)):
            d.update(a.encode() if isinstance(a, str) else a)
            continue
        a = np.ascontiguousarray(np.asarray(a))
        d.update(str(a.dtype).encode() + str(a.shape).encode())
        d.update(a.tobytes())
    return d.hexdigest()[:24]


def float_inputs(rng) -> tuple[np.ndarray, np.ndarray]:
    bits = rng.integers(0, 1 << 32, size=1 << 18, dtype=np.uint64).astype(np.uint32)
    x32 = bits.view(np.float32).copy()
    near = []
    for name in fp8sim.format_names():
        fmt = fp8sim.format(name)
        if fmt.bits > 16:
            continue
        t = fp8sim.decode_table(fmt).astype(np.float64)
        t = t[np.isfinite(t)]
        for f in (1.0, 1 + 2**-12, 1 - 2**-12, 1.5, 0.5, 2.0):
            near.append(t * f)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, -3.4e38, 1e300, 1e-300])
    x64 = np.concatenate([x32.astype(np.float64), np.concatenate(near), special, rng.standard_normal(1 << 16) * 100])
    x32b = np.concatenate([x32, x64[len(x32) :].astype(np.float32)])
    return x32b, x64


def rounding(out: dict, rng) -> None:
    x32, x64 = float_inputs(rng)
    for name in fp8sim.format_names():
        fmt = fp8sim.format(name)
        if fmt.bits <= 16:
            out[f"decode_table/{name}"] = h(fp8sim.decode_table(fmt))
        for mode in fp8sim.MODES:
            for sat in (False, True):
                kw = {"seed": 7} if mode == "sr" else {}
                parts = []
                for x in (x32, x64):
                    with np.errstate(all="ignore"):
                        try:
                            r = fp8sim.round(x, fmt, mode, saturate=sat, **kw)
                        except Exception as e:  # noqa: BLE001  (the error is part of the fingerprint)
                            r = type(e).__name__
                        parts.append(r)
                        if fmt.bits <= 8:
                            try:
                                c = fp8sim.encode(x, fmt, mode, saturate=sat, **kw)
                                parts.append(c)
                                parts.append(fp8sim.decode(c, fmt))
                            except Exception as e:  # noqa: BLE001
                                parts.append(type(e).__name__)
                out[f"round/{name}/{mode}/{'sat' if sat else 'nosat'}"] = h(*parts)
        if fmt.bits <= 8:
            for b in (4, 8, 13):
                with np.errstate(all="ignore"):
                    out[f"round/{name}/sr/sr_bits={b}"] = h(fp8sim.round(x32, fmt, "sr", seed=3, sr_bits=b))


GRANS = ["tensor", "row", "col", "1x128", "128x128", "1x32", "32x32", "g32", "g16", "mx32", "nvfp4", "delayed"]


def matrices(rng) -> dict:
    a = rng.standard_normal((256, 384)).astype(np.float32)
    a[3, 5] = 3e4
    a[100, :] *= 1e-6
    b = a.copy()
    b[7, 9] = np.nan
    b[8, :] = 0.0
    c = (rng.standard_normal((96, 160)) * 10).astype(np.float64)
    c[::7, ::5] = 0
    return {"a": a, "nan": b, "f64": c}


def quantization(out: dict, rng) -> None:
    mats = matrices(rng)
    for mname, x in mats.items():
        for g in GRANS:
            for fname in ("e4m3", "e5m2", "e2m1"):
                if g == "nvfp4" and fname != "e2m1":
                    continue
                for sf in (None, "fp32", "bf16", "pow2", "e8m0", "e4m3"):
                    for sr in (None, "floor", "ceil", "rceil", "even"):
                        for ign in (False, True):
                            if mname != "nan" and ign:
                                continue
                            key = f"quantize/{mname}/{g}/{fname}/{sf}/{sr}/ign={ign}"
                            try:
                                with np.errstate(all="ignore"):
                                    # delayed scaling keeps state: a fresh object (empty history) per call
                                    gg = fp8sim.scaling.DelayedScaling() if g == "delayed" else g
                                    q = fp8sim.quantize(
                                        x, fname, gg, scale_format=sf, scale_rounding=sr, ignore_nan=ign
                                    )
                                    d = fp8sim.dequantize(q)
                                    parts = [q.codes, np.asarray(q.scales), d]
                                    if mname == "a" and sr in (None, "floor"):
                                        parts += [
                                            repr(sorted(metrics.quantization_counts(x, q).items())),
                                            np.array([metrics.fraction_saturated(x, q), metrics.fraction_subnormal(q)]),
                                            repr(sorted(metrics.block_stats(x, q).items())),
                                        ]
                            except Exception as e:  # noqa: BLE001
                                parts = [type(e).__name__]  # the kind of error, not its wording
                            out[key] = h(*parts)
    x = mats["a"]
    for mode in ("rtz", "rup", "sr"):
        kw = {"seed": 1} if mode == "sr" else {}
        q = fp8sim.quantize(x, "e4m3", "1x128", mode=mode, **kw)
        out[f"quantize/mode/{mode}"] = h(q.codes, np.asarray(q.scales))
    for margin in (1, 2):
        q = fp8sim.quantize(x, "e4m3", "128x128", margin=margin, saturate=False)
        out[f"quantize/margin/{margin}"] = h(q.codes, np.asarray(q.scales))
    y = x + rng.standard_normal(x.shape).astype(np.float32) * 1e-3
    out["metrics/pairs"] = h(
        np.array(
            [
                metrics.rel_frobenius_error(x, y),
                metrics.max_rel_error(x, y),
                metrics.max_rel_error(x, y, exclude_underflow=True),
                metrics.sqnr_db(x, y),
                metrics.fraction_underflow(x, y),
            ]
        )
    )


def tensor_cores(out: dict, rng) -> None:
    for arch, instr in tensorcore.model_names():
        for fa, fb in (("e4m3", "e4m3"), ("e5m2", "e4m3")):
            tab_a = fp8sim.decode_table(fp8sim.format(fa))
            tab_b = fp8sim.decode_table(fp8sim.format(fb))
            ok_a = np.flatnonzero(np.isfinite(tab_a)).astype(np.uint8)
            ok_b = np.flatnonzero(np.isfinite(tab_b)).astype(np.uint8)
            a = rng.choice(ok_a, size=(64, 96))
            b = rng.choice(ok_b, size=(96, 48))
            sp_a = rng.integers(0, 256, size=(16, 32)).astype(np.uint8)
            sp_b = rng.integers(0, 256, size=(32, 8)).astype(np.uint8)
            c = rng.standard_normal((64, 48)).astype(np.float32) * 50
            parts = []
            for args in ((a[:16, :32], b[:32, :8], c[:16, :8]), (sp_a, sp_b, c[:16, :8])):
                try:
                    with np.errstate(all="ignore"):
                        parts.append(tensorcore.mma(*args, a_format=fa, b_format=fb, instruction=instr, arch=arch))
                except Exception as e:  # noqa: BLE001
                    parts.append(type(e).__name__)
            for pe in (None, 1, 2, 3):
                try:
                    with np.errstate(all="ignore"):
                        parts.append(
                            tensorcore.matmul(
                                a, b, c, a_format=fa, b_format=fb, instruction=instr, arch=arch, promote_every=pe
                            )
                        )
                except Exception as e:  # noqa: BLE001
                    parts.append(type(e).__name__)
            out[f"tensorcore/{arch}/{instr}/{fa}x{fb}"] = h(*parts)


def gemms(out: dict, rng) -> None:
    x = rng.standard_normal((96, 640)).astype(np.float32)
    x[5, :] *= 40
    w = (rng.standard_normal((640, 80)) / 25).astype(np.float32)
    for name in fp8sim.recipe_names():
        for fid in ("exact", "fast"):
            try:
                y = fp8sim.gemm(x, w, name, fidelity=fid)
                y2, rep = fp8sim.gemm(x, w, name, fidelity=fid, report=True)
                parts = [y, y2, repr(rep)]
                yt = fp8sim.gemm(x, np.ascontiguousarray(w.T), name, fidelity=fid, layout="nk")
                parts.append(yt)
            except Exception as e:  # noqa: BLE001
                parts = [type(e).__name__]  # the kind of error, not its wording
            out[f"gemm/{name}/{fid}"] = h(*parts)


def training(out: dict) -> None:
    from fp8sim.training import train

    with tempfile.TemporaryDirectory() as d:
        for fid in ("exact", "fast"):
            res = train(
                ["bf16", "deepseek-v3", "per-tensor"],
                steps=6,
                seed=3,
                out_dir=d,
                fidelity=fid,
                progress=False,
                figures=False,
            )
            for k in sorted(res):
                if k == "gemm_backend":  # (a label, removed with the fallback GEMM)
                    continue
                text = json.dumps(res[k], sort_keys=True, default=repr)
                # timings are not results
                text = re.sub(r'(wall_time_s=|"wall_time_s": |"s_per_step": )[0-9.e+-]+', r"\1", text)
                out[f"train/{fid}/{k}"] = h(text)


def scripts_and_studies(out: dict) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT, MPLBACKEND="Agg")
    for ex in sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([sys.executable, ex], cwd=d, env=env, capture_output=True, text=True, timeout=900)
            out[f"example/{os.path.basename(ex)}"] = h(str(p.returncode), re.sub(r"\([0-9.]+ s\)", "", p.stdout))
    from fp8sim.studies import accumulation, granularity

    for mod in (accumulation, granularity):
        with tempfile.TemporaryDirectory() as d:
            mod.run(d, quick=True, progress=False, seed=0)
            for f in sorted(glob.glob(os.path.join(d, "*.csv"))):
                with open(f, "rb") as fh:
                    out[f"study/{mod.__name__.rsplit('.', 1)[1]}/{os.path.basename(f)}"] = h(fh.read())


def captures(out: dict) -> None:
    for f in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "*.npz"))):
        try:
            r = tensorcore.verify_capture(f)
            r = {k: v for k, v in r.items() if k not in ("seconds", "path", "file")}
            out[f"verify/{os.path.basename(f)}"] = h(json.dumps(r, sort_keys=True, default=repr))
        except Exception as e:  # noqa: BLE001
            out[f"verify/{os.path.basename(f)}"] = h(type(e).__name__)


PARTS = {
    "rounding": rounding,
    "quantization": quantization,
    "tensorcore": tensor_cores,
    "gemm": gemms,
    "training": lambda out, rng: training(out),
    "captures": lambda out, rng: captures(out),
    "scripts": lambda out, rng: scripts_and_studies(out),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the fingerprint JSON here")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {','.join(PARTS)}")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    args = ap.parse_args()
    if args.compare:
        with open(args.compare[0]) as f0, open(args.compare[1]) as f1:
            a, b = json.load(f0), json.load(f1)
        diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        for k in diff:
            print(f"DIFFERS {k}: {a.get(k)} -> {b.get(k)}")
        print(f"{len(a.keys() & b.keys()) - len([k for k in diff if k in a and k in b])} identical, {len(diff)} differ")
        return 1 if diff else 0
    out: dict = {}
    for part in args.parts.split(","):
        PARTS[part](out, np.random.default_rng(12345))
        print(f"{part}: {len(out)} entries", flush=True)
    text = json.dumps(out, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
