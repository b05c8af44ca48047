"""Commands on numbers and tensors: ``info`` (formats), ``round`` (values) and ``quantize`` (a
tensor from a ``.npy`` file)."""

from __future__ import annotations

import json
import os
import re

import numpy as np

from ..rounding import MODES
from .common import (
    GRANULARITY_FORMS,
    UsageError,
    check_in_file,
    check_out_file,
    command,
    emit_json,
    fmt_value,
    format_table,
    granularity_list,
    int_type,
    lookup_format,
    lookup_mode,
    progress_enabled,
    seed_type,
)

__all__ = ["load_float_npy"]

_MODE_NAMES = ", ".join(MODES)
#: a negative number as Python's float() reads it (exponents, inf, nan, underscores): for argparse, a value
_NEGATIVE_NUMBER = re.compile(
    r"^-(?:(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][-+]?\d[\d_]*)?|inf|infinity|nan)$", re.IGNORECASE
)


# ---------------------------------------------------------------- info
@command(
    "info",
    "show a format's properties, or a table of all formats",
    "examples:\n  fp8sim info e4m3\n  fp8sim info --all\n  fp8sim info e5m2 --json\n"
    "  fp8sim info --kernels deepseek-v3\n  fp8sim info --kernels nvfp4 --backend cupy",
)
def _info(args) -> int:
    from .. import formats

    if args.kernels is not None:
        from ..gemms.kernels import kernel_choice

        choice = kernel_choice(args.kernels, backend=args.backend, fidelity=args.fidelity)
        if args.json:
            emit_json(choice.summary())
        else:
            print(choice.explain())
        return 0
    if args.models:
        from ..tensorcore import models_listing

        print(models_listing())
        return 0
    if args.all or not args.name:
        fmts = list(formats.CATALOGUE.values())
    else:
        fmts = [lookup_format(args.name, "")]
    rows = [f.summary() for f in fmts]
    if args.json:
        emit_json(rows if len(rows) > 1 or args.all else rows[0])
        return 0
    if len(rows) == 1 and not args.all:
        for k, v in _shown_summary(fmts[0], rows[0], long=True).items():
            print(f"{k:>14}: {fmt_value(v)}")
        return 0
    print(format_table([_shown_summary(f, r, long=False) for f, r in zip(fmts, rows)]))
    return 0


def _nan_text(fmt, long: bool) -> str:
    """Which codes of ``fmt`` are NaN, for the text output of ``info``: the style's name, or the codes
    themselves where the style's name would mislead (E8M0's reserved all-ones exponent is one code,
    0xff: it has no mantissa to make an IEEE-like NaN)."""
    style = fmt.nan.value
    width = (fmt.bits + 3) // 4

    def hexs(codes) -> str:
        return " and ".join(f"0x{c:0{width}x}" for c in codes)

    if style == "none":
        return "none"
    signs = (0, fmt.sign_mask) if fmt.signed else (0,)
    if style == "ieee" and fmt.mbits == 0:
        codes = hexs(fmt.nan_code | s for s in signs)
        return f"{codes} (the all-ones code)" if long else codes
    if not long:
        return style
    if style == "ieee":
        rest = "mantissa nonzero; mantissa 0 is inf" if fmt.inf else "any mantissa"
        return f"ieee (exponent all ones, {rest})"
    if style == "ocp":
        return f"ocp ({hexs(fmt.nan_code | s for s in signs)} only)"
    return f"fnuz ({hexs([fmt.sign_mask])} only, the negative-zero code)"


def _shown_summary(fmt, row: dict, long: bool) -> dict:
    """``fmt.summary()`` as ``info`` prints it: NaN as :func:`_nan_text`, and no smallest subnormal for a
    format without subnormals (the JSON output keeps ``numpy.finfo``'s convention, the smallest value)."""
    row = dict(row, nan=_nan_text(fmt, long))
    if not fmt.subnormals:
        row["min_subnormal"] = "none (no subnormals)" if long else "none"
    return row


@_info.arguments
def _info_args(p):
    p.add_argument("name", nargs="?", help="format name (e4m3, e5m2, e8m0, bf16, ...)")
    p.add_argument("--all", action="store_true", help="side-by-side table of every catalogue format")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--models", action="store_true", help="every tensor-core model with its evidence label")
    p.add_argument(
        "--kernels",
        metavar="RECIPE",
        help="which kernel computes RECIPE's GEMM on this machine, and why each faster one was not taken",
    )
    p.add_argument(
        "--backend", default="cpu", choices=("cpu", "cupy"), help="with --kernels: the backend (default cpu)"
    )
    p.add_argument(
        "--fidelity", default="exact", choices=("exact", "fast"), help="with --kernels: the fidelity (default exact)"
    )


# ---------------------------------------------------------------- round
@command(
    "round",
    "round numbers to a format and show values, codes and errors",
    "examples:\n  fp8sim round 0.1 300 -431.99999999999994 --format e4m3\n"
    "  fp8sim round 1.3 -1e-9 --format e5m2 --mode rtz --json\n"
    "  fp8sim round 1e6 --format e4m3 --saturate",
)
def _round(args) -> int:
    from .. import rounding

    fmt = lookup_format(args.format)
    mode = lookup_mode(args.mode)
    if mode == "sr" and args.seed is None:
        raise UsageError("--mode sr needs --seed N (stochastic rounding is reproducible from its seed)")
    if mode != "sr" and args.sr_bits is not None:
        raise UsageError(f"--sr-bits applies only to --mode sr (got --mode {args.mode})")
    try:
        x = np.array([float(v) for v in args.values], dtype=np.float64)
    except ValueError as e:
        raise UsageError(f"values must be numbers: {e}") from None
    kw = dict(saturate=args.saturate, flush_subnormals=args.flush_subnormals, seed=args.seed, sr_bits=args.sr_bits)
    y = rounding.round(x, fmt, mode, **kw)
    codes = rounding.encode(x, fmt, mode, **kw) if fmt.nan.value != "none" or not np.isnan(x).any() else None
    width = (fmt.bits + 3) // 4
    rows = []
    for i, (xi, yi) in enumerate(zip(x, y)):
        err = float(yi - xi) if np.isfinite(yi) and np.isfinite(xi) else float("nan")
        rel = abs(err / xi) if xi != 0 and np.isfinite(err) else (0.0 if err == 0 else float("nan"))
        rows.append(
            {
                "input": float(xi),
                "value": float(yi),
                "code": None if codes is None else f"0x{int(codes[i]):0{width}x}",
                "abs_error": err,
                "rel_error": rel,
            }
        )
    if args.json:
        emit_json({"format": fmt.name, "mode": args.mode, "saturate": args.saturate, "results": rows})
    else:
        print(f"format {fmt.name}, mode {args.mode}{', saturating' if args.saturate else ''}")
        for r in rows:
            print(f"{r['input']!r:>24} -> {r['value']!r:<14} code {r['code']}  rel.err {r['rel_error']:.3g}")
    return 0


@_round.arguments
def _round_args(p):
    # argparse reads "-1e-9", "-inf" (any negative number but plain "-5" and "-0.5") as an unknown option;
    # round has no option that looks like a number, so every such token is a value
    p._negative_number_matcher = _NEGATIVE_NUMBER
    p.add_argument("values", nargs="+", help="numbers to round (float64; negative ones too, e.g. -1e-9 -inf)")
    p.add_argument("-f", "--format", default="e4m3", help="target format (default e4m3)")
    p.add_argument("-m", "--mode", default="rne", help=f"rounding mode: {_MODE_NAMES} or an alias (default rne)")
    p.add_argument("--saturate", action="store_true", help="clamp overflow to +-max (OCP satfinite)")
    p.add_argument("--flush-subnormals", action="store_true", help="flush subnormal results to zero")
    p.add_argument("--seed", type=seed_type, default=None, help="seed for --mode sr (an integer >= 0; required)")
    p.add_argument(
        "--sr-bits",
        type=int_type(1, 52),
        default=None,
        help="random bits for --mode sr, 1..52 (default 52)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (NaN and inf as strings)")


# ------------------------------------------------------------- quantize
def load_float_npy(path: str, dtype: str | None = None) -> np.ndarray:
    """The array of a ``.npy`` file, under the input rule of the API (:mod:`fp8sim._inputs`):
    float32, float64, float16 or bfloat16, else :class:`UsageError` naming the dtype.

    numpy saves an ``ml_dtypes.bfloat16`` array as raw 2-byte records (descr ``'<V2'``; loaded
    as ``|V2``), which cannot be told apart from other 2-byte records: ``dtype="bfloat16"``
    (``--dtype bfloat16``) reads them as bfloat16; without it such a file is refused with a
    message that says so.
    """
    import ml_dtypes

    from .._inputs import ACCEPTED, float_input

    x = np.load(path, allow_pickle=False)
    raw2 = x.dtype.kind == "V" and x.dtype.itemsize == 2 and x.dtype.fields is None
    if dtype is not None:
        if str(dtype).strip().lower() not in ("bfloat16", "bf16"):
            raise UsageError(f"--dtype must be bfloat16 (the only dtype numpy saves as raw records), got {dtype!r}")
        if raw2:
            x = x.view(ml_dtypes.bfloat16)
        elif x.dtype != np.dtype(ml_dtypes.bfloat16):
            raise UsageError(f"--dtype bfloat16: {path} holds {x.dtype}, not raw 2-byte (bfloat16) records")
    elif raw2:
        raise UsageError(
            f"{path} holds raw 2-byte records ({x.dtype}), which is how numpy saves an ml_dtypes.bfloat16 "
            "array; if it is bfloat16, pass --dtype bfloat16"
        )
    try:
        float_input(x, path)
    except TypeError:
        raise UsageError(
            f"{path} holds {x.dtype}; fp8sim quantizes {ACCEPTED} arrays "
            "(convert it explicitly, e.g. np.save(path, x.astype(np.float32)))"
        ) from None
    return x


def _npz_name(path: str) -> str:
    """``path`` as ``np.savez`` names it: ``.npz`` appended when missing."""
    return path if path.lower().endswith(".npz") else path + ".npz"


def _quantize_one(args, x: np.ndarray, q) -> dict:
    """The metrics of one quantization ``q`` of ``x`` (and its ``.npz`` when ``--out`` is given)."""
    from .. import metrics

    summ = metrics.summary(x, q, mode=args.mode, progress=progress_enabled(args))
    res = {
        "file": args.file,
        "shape": list(x.shape),
        "dtype": str(x.dtype),
        "format": q.format.name,
        "granularity": q.granularity.name,
        "scale_format": q.scale_format,
        "scales_shape": list(q.scales.shape),
        "n": summ["n"],
        "n_nan": summ["n_nan"],
        "n_inf": summ["n_inf"],
        "sqnr_db": summ["sqnr_db"],
        "rel_frobenius_error": summ["rel_frobenius"],
        "max_rel_error": summ["max_rel_error"],
        "max_rel_error_excl_underflow": summ["max_rel_error_excl_underflow"],
        "fraction_saturated": summ["fraction_saturated"],
        "fraction_underflow": summ["fraction_underflow"],
        "fraction_subnormal": summ["fraction_subnormal"],
    }
    if args.out:
        path = args.out
        settings = {
            "format": q.format.name,
            "granularity": q.granularity.name,
            "scale_format": q.scale_format,
            "scale_rounding": q.scale_rounding,
            "mode": args.mode,
            "saturate": not args.no_saturate,
            "margin": args.margin,
        }
        np.savez_compressed(
            path,
            codes=q.codes,
            scales=q.scales,
            amax=q.amax,
            global_scale=np.float64(q.global_scale),
            block_shape=np.asarray(q.block_shape, dtype=np.int64),
            shape=np.asarray(q.shape, dtype=np.int64),
            dtype=np.str_(str(np.dtype(q.dtype))),
            format=np.str_(q.format.name),
            granularity=np.str_(q.granularity.name),
            scale_format=np.str_(q.scale_format),
            scale_rounding=np.str_(q.scale_rounding or "none"),
            mode=np.str_(args.mode),
            saturate=np.bool_(not args.no_saturate),
            margin=np.int64(args.margin),
            settings=json.dumps(settings),
        )
        res["out"] = path
    return res


@command(
    "quantize",
    "quantize a tensor from a .npy file with a scaling granularity and report the error",
    "examples:\n  fp8sim quantize acts.npy --format e4m3 --granularity 1x128\n"
    "  fp8sim quantize acts.npy --granularity tensor,1x128,128x128,mx32   # one result per granularity\n"
    "  fp8sim quantize grads.npy --format e5m2 --granularity mx32 --out grads_q.npz --json\n"
    "--out writes a .npz (the suffix is added when missing) with everything needed to rebuild\n"
    "the values: codes, scales (float32), amax, global_scale, block_shape, shape, dtype, format,\n"
    "granularity, scale_format, scale_rounding, mode, saturate, margin.  Rebuild them exactly\n"
    "(the values fp8sim's dequantize gives) with numpy:\n"
    "  z = np.load('q.npz'); s = z['scales'].astype(np.float64)\n"
    "  for ax, b in enumerate(z['block_shape']): s = np.repeat(s, b, axis=ax)\n"
    "  s = s[tuple(slice(0, n) for n in z['shape'])] * float(z['global_scale'])\n"
    "  y = fp8sim.decode(z['codes'], str(z['format'])).astype(np.float64) * s\n"
    "Metrics: sqnr_db in dB; rel_frobenius_error = ||y - x|| / ||x||; max_rel_error =\n"
    "max |y - x| / |x| over x != 0 as a ratio (1.0 = 100 %; an element flushed to zero gives\n"
    "exactly 1, max_rel_error_excl_underflow leaves those out); a NaN output where x is not NaN\n"
    "is an infinite error (n_nan counts NaN outputs); fraction_saturated: elements the\n"
    "conversion clipped (rounded beyond the format's max).",
)
def _quantize(args) -> int:
    from ..scaling import quantize

    check_in_file(args.file, "input", (".npy",))
    grans = granularity_list(args.granularity, "--granularity")
    if args.out:
        if len(grans) > 1:
            raise UsageError("--out writes one quantized tensor: give one --granularity, not a list")
        if os.path.isdir(args.out):
            raise UsageError(f"--out {args.out} is a folder; give a file name")
        args.out = check_out_file(_npz_name(args.out), "--out", force=args.force, suffixes=(".npz",))
    if lookup_mode(args.mode) == "sr" and args.seed is None:
        raise UsageError("--mode sr needs --seed N (stochastic rounding is reproducible from its seed)")
    fmt = args.format
    if fmt is None:  # NVFP4 is defined with E2M1 elements; everything else defaults to E4M3
        fmt = "e2m1" if all(g.lower() == "nvfp4" for g in grans) else "e4m3"
    lookup_format(fmt)
    x = load_float_npy(args.file, args.dtype)
    if x.ndim == 0:
        raise UsageError(f"input {args.file} holds a scalar (shape ()); quantize needs an array of 1 or more dims")
    opts = dict(mode=args.mode, seed=args.seed, saturate=not args.no_saturate, margin=args.margin)
    for g in grans:  # every setting checked on a one-element tensor of x's rank, before any work
        try:
            quantize(np.ones((1,) * x.ndim, dtype=x.dtype), fmt, g, **opts)
        except (ValueError, TypeError) as e:
            raise UsageError(f"--granularity {g} with --format {fmt}: {e}") from None
    # what fails now is the data's (e.g. NaN in a format without NaN): exit 1, not a usage error
    results = [_quantize_one(args, x, quantize(x, fmt, g, **opts)) for g in grans]
    if args.json:
        emit_json(results[0] if len(results) == 1 else results)
        return 0
    units = {
        "sqnr_db": "dB",
        "rel_frobenius_error": "||y - x|| / ||x||",
        "max_rel_error": "max |y - x| / |x| over x != 0; 1 = an element flushed to zero",
        "max_rel_error_excl_underflow": "the same without the flushed elements",
        "fraction_saturated": "of the elements, clipped by the conversion",
        "fraction_underflow": "of the elements, nonzero flushed to zero",
        "fraction_subnormal": "of the codes",
        "n_nan": "NaN outputs (each an infinite error)",
        "n_inf": "infinite outputs",
    }
    for i, res in enumerate(results):
        if i:
            print()
        for k, v in res.items():
            note = f"  ({units[k]})" if k in units else ""
            print(f"{k:>28}: {fmt_value(v)}{note}")
    return 0


@_quantize.arguments
def _quantize_args(p):
    p.add_argument("file", help="a .npy file with a float32, float64, float16 or bfloat16 array (1 or more dims)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16"],
        help="read the file's raw 2-byte records as bfloat16 (numpy saves ml_dtypes.bfloat16 arrays so)",
    )
    p.add_argument(
        "-f", "--format", default=None, help="element format (default e4m3; e2m1 when every granularity is nvfp4)"
    )
    p.add_argument(
        "-g",
        "--granularity",
        default="tensor",
        help=f"one granularity or a comma list (tensor,1x128,mx32): {GRANULARITY_FORMS} "
        "(default tensor, as fp8sim.quantize)",
    )
    p.add_argument(
        "-m", "--mode", default="rne", help=f"element rounding mode: {_MODE_NAMES} or an alias (default rne)"
    )
    p.add_argument("--seed", type=seed_type, default=None, help="seed for --mode sr (required with it)")
    p.add_argument("--margin", type=int, default=0, help="scale margin in powers of two (default 0)")
    p.add_argument("--no-saturate", action="store_true", help="overflow to inf/NaN instead of clamping")
    p.add_argument(
        "--out",
        default=None,
        help="write codes, scales and everything needed to rebuild the values to this .npz "
        "(.npz is appended when missing; see below)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="machine-readable output")
