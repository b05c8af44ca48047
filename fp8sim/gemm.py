"""Scaled FP8 GEMMs as real kernels run them, with an error report.

``fp8sim.gemm(x, w, recipe)`` quantizes ``x (M, K)`` and ``w (K, N)`` (or
``(N, K)`` with ``layout="nk"``) as the :class:`~fp8sim.recipes.Recipe` says,
multiplies the FP8 codes on a bit-exact tensor-core accumulator model,
promotes the tensor-core partial into an fp32 accumulator every
``promote_every`` K elements while applying the scales, and casts the result
to the output format.  See docs/gemm.md.

Pipeline for an FP8 recipe (``scale_at="promotion"``, e.g. DeepSeek-V3)::

    codes, scales = quantize(x), quantize(w)           # fp8sim.quantize
    for each promotion interval b (promote_every K elements):
        partial = tensor-core chain over b, starting from 0   # accumulator model
        s = fp32(sa[i, b] * sb[b, j])                         # fp32 multiply
        acc = fma(s, partial, acc)     # or acc + fp32(s * partial) ("mul-add")
    y = round(acc, output_format)                             # bf16: RNE

With ``scale_at="epilogue"`` the promotion is a plain fp32 add and
``y = round(fp32(fp32(sa * sb) * acc))`` (per-tensor scales only).

K that is not a multiple of the promotion interval / 32 is zero-padded at
the end (zero codes), as TMA-fed kernels do; the ragged last scale block is
the quantizer's own smaller block.  Padding does not change any bit: an
all-zero instruction leaves the accumulator as it is.

Bad input: ``x`` and ``w`` must be 2-D real float arrays (float32, float64,
float16 or bfloat16 -- the last two converted to float32 exactly; any other
dtype, np.longdouble included, raises ``TypeError``) or
:class:`~fp8sim.QuantizedTensor` objects with matching K (``ValueError``
naming the shapes otherwise).  With ``layout="nk"`` a QuantizedTensor ``w``
of shape ``(N, K)`` is transposed with its granularity (a ``Tile(r, c)``
becomes ``Tile(c, r)``, ``1x128`` becomes ``128x1``), so its scales stay on
their blocks.  NaN and +-inf follow the
quantizer's rules (a NaN makes its scale block NaN, so every output that
uses the block is NaN; +-inf saturates to +-max * scale) and then propagate
through the accumulator model as on the H200 (an inf or NaN product makes
the instruction's result inf/NaN; fp32 NaN outputs are 0x7fffffff).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from . import _gemm_kernels as _K
from . import metrics as _metrics
from ._inputs import flag, float_input
from .formats import format as _get_format
from .recipes import Recipe
from .recipes import recipe as _get_recipe
from .rounding import round as _round
from .scaling import Granularity, Group, PerColumn, PerRow, QuantizedTensor, Tile
from .scaling import granularity as _granularity
from .scaling import quantize as _quantize
from .tensorcore import AccumulatorModel, get_model
from .tensorcore import matmul as _tc_matmul

__all__ = ["gemm", "GemmReport", "quantize_operands", "scaled_matmul", "transpose_granularity", "SOURCES"]

SOURCES = ("x_quantization", "w_quantization", "scale_rounding", "accumulation", "promotion", "output_cast")


# ------------------------------------------------------------------ input checks
def _as_float2d(a, name: str) -> np.ndarray | QuantizedTensor:
    if isinstance(a, QuantizedTensor):
        return a
    # float32/float64 as they are, float16/bfloat16 exactly to float32, other dtypes: TypeError
    arr, _ = float_input(a, "fp8sim.gemm", name)
    if arr.ndim != 2:
        raise ValueError(f"fp8sim.gemm: {name} must be 2-D, got shape {arr.shape}")
    if 0 in arr.shape:
        raise ValueError(f"fp8sim.gemm: {name} must not be empty, got shape {arr.shape}")
    return arr


def _check_inputs(x, w, layout: str):
    if layout not in ("kn", "nk"):
        raise ValueError(f"fp8sim.gemm: layout must be 'kn' (w is (K, N)) or 'nk' (w is (N, K)), got {layout!r}")
    x = _as_float2d(x, "x")
    w = _as_float2d(w, "w")
    if isinstance(w, QuantizedTensor):
        if len(w.shape) != 2:
            raise ValueError(f"fp8sim.gemm: w must be 2-D, got shape {w.shape}")
        if layout == "nk":
            w = _transpose_q(w)
    elif layout == "nk":
        w = w.T
    if isinstance(x, QuantizedTensor) and len(x.shape) != 2:
        raise ValueError(f"fp8sim.gemm: x must be 2-D, got shape {x.shape}")
    kx, kw = x.shape[1], w.shape[0]
    if kx != kw:
        wshape = tuple(w.shape) if layout == "kn" else tuple(w.shape)[::-1]
        raise ValueError(
            f"fp8sim.gemm: inner dimensions differ: x is {tuple(x.shape)} (K={kx}), "
            f"w is {wshape} with layout={layout!r} (K={kw})"
        )
    return x, w


def transpose_granularity(g) -> Granularity:
    """The granularity of the transpose of a 2-D tensor: the same blocks, axes swapped.

    ``Tile(r, c)`` becomes ``Tile(c, r)`` (``1x128`` -> ``128x1``), per row becomes per column and
    back, groups and MX / NVFP4 blocks move to the other axis; per tensor and delayed scaling stay.
    """
    from dataclasses import replace

    g = _granularity(g)
    if isinstance(g, Tile):
        return Tile(g.cols, g.rows)
    if isinstance(g, Group):  # MX and NVFP4 are Groups
        if g.axis not in (-2, -1, 0, 1):
            raise ValueError(f"transpose_granularity: {g.name} has axis {g.axis}, not an axis of a 2-D tensor")
        return replace(g, axis=0 if g.axis in (-1, 1) else -1)
    if isinstance(g, PerRow):
        return PerColumn()
    if isinstance(g, PerColumn):
        return PerRow()
    return g  # PerTensor, DelayedScaling: one scale, nothing to reorient


def _transpose_q(q: QuantizedTensor) -> QuantizedTensor:
    """The QuantizedTensor of a 2-D ``q``'s transpose: codes, scales, amax AND granularity
    transposed, so that ``_transpose_q(q).dequantize() == q.dequantize().T``."""
    from dataclasses import replace

    g = transpose_granularity(q.granularity)
    shape = tuple(q.shape)[::-1]
    if tuple(q.scales.shape[::-1]) != g.scale_shape(shape):  # scales that do not fit their granularity
        raise ValueError(
            f"fp8sim.gemm: cannot transpose {q!r}: its scales {q.scales.shape} do not match "
            f"its granularity {q.granularity.name} on shape {q.shape}"
        )
    return replace(
        q,
        codes=np.ascontiguousarray(q.codes.T),
        scales=np.ascontiguousarray(q.scales.T),
        shape=shape,
        amax=np.ascontiguousarray(np.asarray(q.amax).T),
        block_shape=g.block_shape(shape),
        granularity=g,
        _view=None,
    )


# ------------------------------------------------------------------ quantization
def _gran_along_k(g, operand: str) -> Granularity:
    """A recipe granularity is spelled for an operand whose last axis is K: ``x (M, K)``, and ``w``
    as torch stores it, ``(N, K)`` (``"1x128"``: 128 along K).  This gives it for the operand as
    the GEMM takes it: ``x (M, K)`` as is, ``w (K, N)`` transposed (:func:`transpose_granularity`,
    the rule of :func:`fp8sim.training.orient`)."""
    g = _granularity(g)
    if operand == "w":
        return transpose_granularity(g)
    return g


def quantize_operands(x, w, recipe) -> tuple[QuantizedTensor, QuantizedTensor]:
    """Quantize ``x (M, K)`` and ``w (K, N)`` as ``recipe`` says (QuantizedTensors pass through)."""
    r = _get_recipe(recipe)
    out = []
    for a, fmt, g, name in ((x, r.x_format, r.x_granularity, "x"), (w, r.w_format, r.w_granularity, "w")):
        if isinstance(a, QuantizedTensor):
            out.append(a)
            continue
        out.append(
            _quantize(
                a,
                fmt,
                _gran_along_k(g, name),
                scale_format=r.scale_format,
                scale_rounding=r.scale_rounding,
                margin=r.margin,
            )
        )
    return out[0], out[1]


def _k_scales(qx: QuantizedTensor, qw: QuantizedTensor, Kp: int):
    """Scales per K block for the kernel: sa (M, nks), sb (nks, N) float32 and the block length."""
    M, K = qx.shape
    N = qw.shape[1]
    bmx, bkx = qx.block_shape
    bkw, bnw = qw.block_shape
    bkx = K if qx.scales.shape[1] == 1 else bkx
    bkw = K if qw.scales.shape[0] == 1 else bkw
    kscale = min(bkx, bkw)
    for b, n in ((bkx, qx.scales.shape[1]), (bkw, qw.scales.shape[0])):
        if n > 1 and b % kscale:
            raise ValueError(f"fp8sim.gemm: scale blocks along K of {bkx} (x) and {bkw} (w) do not nest")
    if kscale % 32 and qx.scales.shape[1] * qw.scales.shape[0] > 1:
        raise ValueError(f"fp8sim.gemm: K scale blocks must be multiples of 32 (one MMA), got {kscale}")
    nks = -(-Kp // kscale) if kscale < K else 1
    j = np.arange(nks) * kscale
    ia = np.minimum(j // bkx, qx.scales.shape[1] - 1) if qx.scales.shape[1] > 1 else np.zeros(nks, int)
    iw = np.minimum(j // bkw, qw.scales.shape[0] - 1) if qw.scales.shape[0] > 1 else np.zeros(nks, int)
    sa = np.repeat(qx.scales.astype(np.float32), bmx, axis=0)[:M][:, ia]
    sb = np.repeat(qw.scales.astype(np.float32), bnw, axis=1)[:, :N][iw]
    gs = float(qx.global_scale) * float(qw.global_scale)
    if gs != 1.0:
        raise ValueError("fp8sim.gemm: two-level (NVFP4) scales are not supported by the FP8 GEMM")
    return np.ascontiguousarray(sa), np.ascontiguousarray(sb), (kscale if kscale < K else Kp), nks


def _pad_k(codes: np.ndarray, Kp: int, axis: int) -> np.ndarray:
    K = codes.shape[axis]
    if Kp == K:
        return np.ascontiguousarray(codes)
    pad = [(0, 0), (0, 0)]
    pad[axis] = (0, Kp - K)
    return np.pad(codes, pad)


def _fast_kernel_ok(model: AccumulatorModel) -> bool:
    return (
        model.kind == "fused"
        and model.block == 32
        and model.c_mode == "fused"
        and model.align_rounding == "rz"
        and model.product_exponent == "nominal"
        and model.subnormal_exponent == "clamp"
        and model.out_rounding == "rz"
        and model.output == "f32"
        and model.k_order is None
        and model.zero_sign == "positive"
        and model.frac_bits <= 13
        and model.out_frac_bits <= 13
    )


_MODES = {"fma": _K.SCALE_FMA, "mul-add": _K.SCALE_MUL_ADD}


def _fma32(a, b, c):
    a, b, c = np.broadcast_arrays(np.asarray(a, np.float32), np.asarray(b, np.float32), np.asarray(c, np.float32))
    out = np.empty(a.shape, np.float32)
    _K.fma32_array(
        np.ascontiguousarray(a).ravel(),
        np.ascontiguousarray(b).ravel(),
        np.ascontiguousarray(c).ravel(),
        out.reshape(-1),
    )
    return out


def _combine(tot, part, s, mode):
    """One promotion step in fp32 (arrays)."""
    if mode == _K.SCALE_FMA:
        return _fma32(s, part, tot)
    if mode == _K.SCALE_MUL_ADD:
        return (tot + (s * part).astype(np.float32)).astype(np.float32)
    return (tot + part).astype(np.float32)


def scaled_matmul(
    a_codes,
    b_codes,
    sa,
    sb,
    *,
    a_format,
    b_format,
    kscale,
    accumulator="wgmma",
    promote_every=128,
    scale_at="promotion",
    scale_application="fma",
    fidelity="exact",
    backend="cpu",
):
    """The FP8 core of :func:`gemm` on codes: ``a_codes (M, Kp)``, ``b_codes (Kp, N)`` uint8 (Kp a
    multiple of 32, already padded), ``sa (M, nks)``, ``sb (nks, N)`` float32 scales per K block of
    ``kscale`` elements (``nks == 1`` for ``scale_at="epilogue"``).  Returns the fp32 result."""
    fa, fb = _get_format(a_format), _get_format(b_format)
    a_codes, b_codes, sa, sb = np.asarray(a_codes), np.asarray(b_codes), np.asarray(sa), np.asarray(sb)
    for name, c, f in (("a", a_codes, fa), ("b", b_codes, fb)):
        if c.dtype != np.uint8 or c.ndim != 2:
            raise TypeError(f"scaled_matmul: {name}_codes must be a 2-D uint8 array, got {c.dtype} of shape {c.shape}")
        if f.bits != 8:
            raise ValueError(f"scaled_matmul: {name}_format must be an 8-bit format, got {f.name} ({f.bits} bits)")
    M, Kp = a_codes.shape
    N = b_codes.shape[1]
    if b_codes.shape[0] != Kp:
        raise ValueError(f"scaled_matmul: inner dimensions differ: a_codes {a_codes.shape}, b_codes {b_codes.shape}")
    if scale_at not in ("promotion", "epilogue"):
        raise ValueError(f"scaled_matmul: scale_at must be 'promotion' or 'epilogue', got {scale_at!r}")
    if scale_application not in _MODES:
        raise ValueError(f"scaled_matmul: scale_application must be one of {list(_MODES)}, got {scale_application!r}")
    if fidelity not in ("exact", "fast") or backend not in ("cpu", "cupy"):
        raise ValueError(
            f"scaled_matmul: fidelity must be 'exact' or 'fast' and backend 'cpu' or 'cupy', "
            f"got {fidelity!r}, {backend!r}"
        )
    if not _is_pos_int(kscale):
        raise ValueError(f"scaled_matmul: kscale must be a positive int, got {kscale!r}")
    nks = -(-Kp // int(kscale)) if scale_at == "promotion" else 1
    if sa.ndim != 2 or sb.ndim != 2 or sa.shape[0] != M or sb.shape[1] != N or sa.shape[1] != sb.shape[0]:
        raise ValueError(f"scaled_matmul: sa {sa.shape} and sb {sb.shape} do not fit ({M}, nks) and (nks, {N})")
    if sa.shape[1] < nks:
        raise ValueError(
            f"scaled_matmul: K = {Kp} in blocks of kscale = {kscale} needs {nks} scales per row, sa has {sa.shape[1]}"
        )
    P = 0 if promote_every is None else int(promote_every)
    if scale_at == "promotion":
        if P == 0 or kscale % P:
            raise ValueError(
                f"scales applied at promotion need promote_every dividing the K scale block "
                f"({kscale}), got {promote_every}"
            )
        mode = _MODES[scale_application]
    else:
        if sa.shape[1] != 1 or sb.shape[0] != 1:
            raise ValueError("scale_at='epilogue' needs one scale per row/column over all of K")
        mode = _K.SCALE_EPILOGUE
    sa = np.ascontiguousarray(sa, np.float32)
    sb = np.ascontiguousarray(sb, np.float32)
    model = None if accumulator == "fp64" else get_model(accumulator)
    if backend == "cupy":
        if not (fidelity == "exact" and model is not None and _fast_kernel_ok(model)):
            raise NotImplementedError(
                "backend='cupy' implements the fused wgmma-type accumulator models "
                f"(fidelity='exact') only, not {accumulator!r} / {fidelity!r}"
            )
        keep = int(np.uint32((0xFFFFFFFF << (23 - model.out_frac_bits)) & 0xFFFFFFFF).view(np.int32))
        return _K.cupy_wgmma_gemm(a_codes, b_codes, fa, fb, sa, sb, int(kscale), P, mode, int(model.frac_bits), keep)
    if fidelity == "exact" and model is not None and _fast_kernel_ok(model):
        va, ea, spa = _K.code_tables(fa)
        vb, eb, spb = _K.code_tables(fb)
        bspec = spb[b_codes].any(axis=1)
        askip = np.ascontiguousarray((va[a_codes] == 0) & ~np.isnan(va[a_codes]) & ~bspec[None, :])
        out = np.empty((M, N), np.float32)
        keep = np.int32(np.uint32((0xFFFFFFFF << (23 - model.out_frac_bits)) & 0xFFFFFFFF).view(np.int32))
        with np.errstate(all="ignore"):
            _K.wgmma_gemm(
                va[a_codes],
                ea[a_codes],
                vb[b_codes],
                eb[b_codes],
                sa,
                sb,
                int(kscale),
                P,
                mode,
                int(model.frac_bits),
                keep,
                askip,
                out,
            )
        return out
    # general path: one partial per promotion interval, combined in fp32 here
    Av = _decode(a_codes, fa)
    Bv = _decode(b_codes, fb)
    step = P if P else Kp
    tot = np.zeros((M, N), np.float32)
    for k0 in range(0, Kp, step):
        k1 = min(Kp, k0 + step)
        if fidelity == "fast":
            with np.errstate(all="ignore"):
                part = (Av[:, k0:k1] @ Bv[k0:k1]).astype(np.float32)
        elif model is None:
            with np.errstate(all="ignore"):
                part = (Av[:, k0:k1].astype(np.float64) @ Bv[k0:k1].astype(np.float64)).astype(np.float32)
        else:
            part = _tc_matmul(a_codes[:, k0:k1], b_codes[k0:k1], a_format=fa, b_format=fb, instruction=model)
        if not P:
            tot = part
            break
        kb = k0 // kscale if mode != _K.SCALE_EPILOGUE else 0
        s = (sa[:, kb : kb + 1] * sb[kb : kb + 1, :]).astype(np.float32)
        with np.errstate(all="ignore"):
            tot = _combine(tot, part, s, mode)
    if mode == _K.SCALE_EPILOGUE:
        with np.errstate(all="ignore"):
            tot = ((sa[:, :1] * sb[:1, :]).astype(np.float32) * tot).astype(np.float32)
    return tot


def _is_pos_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and bool(v > 0)


def _decode(codes, fmt) -> np.ndarray:
    v, _, _ = _K.code_tables(fmt)
    return v[codes]


def _cast_out(y: np.ndarray, out_fmt: str) -> np.ndarray:
    if out_fmt == "fp64":
        return y.astype(np.float64)
    y = y.astype(np.float32)
    if out_fmt == "bf16":
        with np.errstate(all="ignore"):
            y = y.astype(ml_dtypes.bfloat16).astype(np.float32)
        bits = y.view(np.uint32)
        bits[np.isnan(y)] = np.uint32(0x7FFF0000)  # the canonical bf16 NaN (cvt.rn.bf16.f32)
        return y
    bits = y.view(np.uint32)
    bits[np.isnan(y)] = np.uint32(0x7FFFFFFF)
    return y


def _wide(x, w, r: Recipe) -> np.ndarray:
    def cast(a, fmt):
        a = np.asarray(a)
        if fmt == "fp64":
            return a.astype(np.float64)
        if fmt == "bf16":  # RNE once, from float32 or float64 (not float64 -> float32 -> bf16)
            return _round(a, "bf16").astype(np.float32)
        return a.astype(np.float32)

    if isinstance(x, QuantizedTensor) or isinstance(w, QuantizedTensor):
        raise TypeError(f"recipe {r.name!r} takes float arrays, not QuantizedTensors")
    xa, wa = cast(x, r.x_format), cast(w, r.w_format)
    with np.errstate(all="ignore"):
        if r.accumulator == "fp64" or r.x_format == "fp64":
            y = xa.astype(np.float64) @ wa.astype(np.float64)
            if r.output_format == "bf16":  # round the float64 result once, not via float32
                y = _round(y, "bf16")
        else:
            y = xa.astype(np.float32) @ wa.astype(np.float32)
    return _cast_out(y, r.output_format)


def _fp8(qx: QuantizedTensor, qw: QuantizedTensor, r: Recipe, fidelity: str, backend: str = "cpu"):
    M, K = qx.shape
    step = max(32, r.promote_every or 32)
    Kp = -(-K // step) * step
    sa, sb, kscale, nks = _k_scales(qx, qw, Kp)
    A = _pad_k(qx.codes, Kp, 1)
    B = _pad_k(qw.codes, Kp, 0)
    y32 = scaled_matmul(
        A,
        B,
        sa,
        sb,
        a_format=qx.format,
        b_format=qw.format,
        kscale=kscale,
        accumulator=r.accumulator,
        promote_every=r.promote_every,
        scale_at=r.scale_at,
        scale_application=r.scale_application,
        fidelity=fidelity,
        backend=backend,
    )
    return y32, (A, B, sa, sb, kscale)


# ------------------------------------------------------------------ report
def _metric_dict(ref, approx) -> dict:
    ref = np.asarray(ref, np.float64)
    approx = np.asarray(approx, np.float64)
    fin = np.isfinite(ref) & np.isfinite(approx)
    return {
        "rel_frobenius": _metrics.rel_frobenius_error(ref[fin], approx[fin]) if fin.any() else float("nan"),
        "max_rel_error": _metrics.max_rel_error(ref[fin], approx[fin]) if fin.any() else float("nan"),
        "median_rel_error": float(np.median(np.abs(approx[fin] - ref[fin]) / np.maximum(np.abs(ref[fin]), 1e-300)))
        if fin.any()
        else float("nan"),
        "n_nonfinite": int((~fin).sum()),
        "n_nan": int(np.isnan(approx).sum()),  # NaN outputs (left out of the measures above)
    }


def _term(ref, base, on) -> dict:
    """Size of the change ``on - base`` relative to the reference ``ref`` (fp64 GEMM)."""
    ref = np.asarray(ref, np.float64)
    d = np.asarray(on, np.float64) - np.asarray(base, np.float64)
    fin = np.isfinite(ref) & np.isfinite(d)
    nr = float(np.linalg.norm(ref[fin]))
    nd = float(np.linalg.norm(d[fin]))
    with np.errstate(all="ignore"):
        rel = np.abs(d[fin]) / np.abs(ref[fin])
    rel = rel[np.isfinite(rel)]
    return {
        "rel_frobenius": (nd / nr) if nr > 0 else (0.0 if nd == 0 else float("inf")),
        "max_rel_error": float(rel.max()) if rel.size else 0.0,
        "median_rel_error": float(np.median(rel)) if rel.size else 0.0,
    }


@dataclass
class GemmReport:
    """Error report of one :func:`gemm` call.

    ``error``: the output against the fp64 GEMM of the unquantized inputs (for an operand
    passed as a QuantizedTensor the unquantized values are unknown: its dequantized values
    stand in, and its quantization term is then 0 by construction);
    ``error_vs_bf16``: against the ``"bf16"`` recipe's output; ``bf16_error``:
    the bf16 recipe against fp64.  ``terms``: each error source switched on
    alone (everything else exact), as the size of the change it makes,
    relative to the fp64 result (see docs/gemm.md for the definitions).
    ``blocks``: per scale block ``n_saturated`` / ``n_underflow`` for ``x``
    and ``w`` (arrays of the scales' shapes).
    """

    recipe: str
    shape: tuple
    error: dict
    error_vs_bf16: dict
    bf16_error: dict
    terms: dict = field(default_factory=dict)
    blocks: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)

    def __str__(self) -> str:
        M, K, N = self.shape
        lines = [
            f"fp8sim.gemm report: recipe {self.recipe!r}, M={M} K={K} N={N}",
            f"  vs fp64: rel. Frobenius {self.error['rel_frobenius']:.3e}, max rel. "
            f"{self.error['max_rel_error']:.3e}, median rel. {self.error['median_rel_error']:.3e}",
            f"  vs bf16 recipe: rel. Frobenius {self.error_vs_bf16['rel_frobenius']:.3e}; "
            f"bf16 recipe vs fp64: {self.bf16_error['rel_frobenius']:.3e}",
            "  error sources switched on one at a time (rel. Frobenius of the change / max rel.):",
        ]
        for k, v in self.terms.items():
            lines.append(f"    {k:<16s} {v['rel_frobenius']:.3e}  {v['max_rel_error']:.3e}")
        for k, v in self.counts.items():
            lines.append(f"  {k}: {v}")
        return "\n".join(lines)


def _report(x, w, qx, qw, r: Recipe, y, y32, parts) -> GemmReport:
    A, B, sa, sb, kscale = parts
    M, K = qx.shape
    N = qw.shape[1]
    Kp = A.shape[1]
    xin = None if isinstance(x, QuantizedTensor) else np.asarray(x, np.float64)
    win = None if isinstance(w, QuantizedTensor) else np.asarray(w, np.float64)
    xq = qx.dequantize(np.float64)
    wq = qw.dequantize(np.float64)
    xe = xq if xin is None else xin
    we = wq if win is None else win
    with np.errstate(all="ignore"):
        ref = xe @ we
        y_q = xq @ wq  # quantized inputs, exact arithmetic
        bf = _wide(xe, we, _get_recipe("bf16"))
        terms = {}
        terms["x_quantization"] = _term(ref, ref, xq @ we)
        terms["w_quantization"] = _term(ref, ref, xe @ wq)
        # scale rounding: the fp32 rounding of the scale product sa*sb applied to exact partials
        sa64, sb64 = sa.astype(np.float64), sb.astype(np.float64)
        step = r.promote_every or Kp
        ys = np.zeros((M, N))
        yexact_s = np.zeros((M, N))
        Ap, Bp = _decode(A, qx.format).astype(np.float64), _decode(B, qw.format).astype(np.float64)
        xe_p = np.zeros((M, Kp))
        xe_p[:, :K] = xe
        we_p = np.zeros((Kp, N))
        we_p[:K] = we
        part_exact = []
        part_model = []
        for k0 in range(0, Kp, step):
            k1 = min(Kp, k0 + step)
            kb = k0 // kscale if r.scale_at == "promotion" else 0
            s_ex = sa64[:, kb : kb + 1] * sb64[kb : kb + 1, :]
            s_32 = (sa[:, kb : kb + 1] * sb[kb : kb + 1, :]).astype(np.float32).astype(np.float64)
            pe = xe_p[:, k0:k1] @ we_p[k0:k1]
            ratio = np.where(s_ex != 0, s_32 / np.where(s_ex != 0, s_ex, 1), 1.0)
            ys += ratio * pe
            yexact_s += pe
            pq = Ap[:, k0:k1] @ Bp[k0:k1]
            part_exact.append((s_ex, pq))
            if r.accumulator == "fp64":
                pm = pq
            else:
                pm = scaled_matmul(
                    A[:, k0:k1],
                    B[k0:k1],
                    np.ones((M, 1), np.float32),
                    np.ones((1, N), np.float32),
                    a_format=qx.format,
                    b_format=qw.format,
                    kscale=k1 - k0,
                    accumulator=r.accumulator,
                    promote_every=None,
                    scale_at="epilogue",
                ).astype(np.float64)
            part_model.append((s_ex, pm))
        terms["scale_rounding"] = _term(ref, yexact_s, ys)
        y_acc = sum(s * p for s, p in part_model)
        y_base = sum(s * p for s, p in part_exact)
        terms["accumulation"] = _term(ref, y_base, y_acc)
        if r.promote_every is None:
            terms["promotion"] = _term(ref, ref, ref)
        else:
            # exact partials rounded to fp32, combined by the recipe's fp32 promotion arithmetic
            tot = np.zeros((M, N), np.float32)
            base = np.zeros((M, N))
            for k0, (_s_ex, pq) in zip(range(0, Kp, step), part_exact):
                kb = k0 // kscale if r.scale_at == "promotion" else 0
                p32 = pq.astype(np.float32)
                if r.scale_at == "promotion":
                    s32 = (sa[:, kb : kb + 1] * sb[kb : kb + 1, :]).astype(np.float32)
                    tot = _combine(tot, p32, s32, _MODES[r.scale_application])
                    base += s32.astype(np.float64) * p32
                else:
                    tot = (tot + p32).astype(np.float32)
                    base += p32
            if r.scale_at == "epilogue":
                s = sa64[:, :1] * sb64[:1, :]
                tot = tot.astype(np.float64) * s
                base = base * s
            terms["promotion"] = _term(ref, base, tot)
        terms["output_cast"] = _term(
            ref, y_q, _cast_out(y_q, r.output_format) if r.output_format != "fp32" else y_q.astype(np.float32)
        )
    blocks = {}
    counts = {}
    for name, a, q in (("x", xin, qx), ("w", win, qw)):
        if a is None:
            continue
        st = _metrics.block_stats(a, q)
        blocks[name] = {"n_saturated": st["n_saturated"], "n_underflow": st["n_underflow"]}
        counts[f"{name}: saturated / underflowed / non-finite elements"] = (
            int(st["n_saturated"].sum()),
            int(st["n_underflow"].sum()),
            int((~np.isfinite(a)).sum()),
        )
    return GemmReport(
        r.name, (M, K, N), _metric_dict(ref, y), _metric_dict(bf, y), _metric_dict(ref, bf), terms, blocks, counts
    )


# ------------------------------------------------------------------ public
def gemm(
    x,
    w,
    recipe="deepseek-v3",
    *,
    report: bool = False,
    layout: str = "kn",
    backend: str = "cpu",
    fidelity: str = "exact",
):
    """``y = x @ w`` as the FP8 GEMM ``recipe`` describes.

    Parameters
    ----------
    x : (M, K) float array (float32, float64, float16 or bfloat16; float16 and bfloat16 are
        converted to float32 exactly, other dtypes raise TypeError) or a QuantizedTensor
    w : (K, N) float array or QuantizedTensor; (N, K) with ``layout="nk"`` (torch Linear weights)
    recipe : a preset name (:func:`fp8sim.recipe`) or a :class:`~fp8sim.Recipe`
    report : also return a :class:`GemmReport` (costs a few fp64 GEMMs and one more model GEMM)
    layout : ``"kn"`` or ``"nk"``
    backend : ``"cpu"`` (numba) or ``"cupy"`` (the same arithmetic as a CUDA-core kernel on an NVIDIA
        GPU, bit-identical; needs CuPy; wgmma-type accumulators and fidelity="exact" only)
    fidelity : ``"exact"`` (bit-exact accumulator model) or ``"fast"`` (exact quantization and scale
        application, but each promotion interval's partial from float32 BLAS instead of the
        tensor-core model: NOT bit-exact; see docs/gemm.md for its measured deviation)

    Returns
    -------
    float32 (M, N) array holding output-format values (float64 for the ``"fp64"`` recipe / output),
    and the report when ``report=True``.
    """
    r = _get_recipe(recipe)
    report = flag(report, "fp8sim.gemm", "report")
    if backend not in ("cpu", "cupy"):
        raise ValueError(f"fp8sim.gemm: backend must be 'cpu' or 'cupy', got {backend!r}")
    if fidelity not in ("exact", "fast"):
        raise ValueError(f"fp8sim.gemm: fidelity must be 'exact' or 'fast', got {fidelity!r}")
    x, w = _check_inputs(x, w, layout)
    if not r.is_fp8:
        y = _wide(x, w, r)
        if report:
            xe, we = np.asarray(x, np.float64), np.asarray(w, np.float64)
            ref = xe @ we
            bf = _wide(xe, we, _get_recipe("bf16"))
            return y, GemmReport(
                r.name,
                (x.shape[0], x.shape[1], w.shape[1]),
                _metric_dict(ref, y),
                _metric_dict(bf, y),
                _metric_dict(ref, bf),
            )
        return y
    qx, qw = quantize_operands(x, w, r)
    for name, q in (("x", qx), ("w", qw)):
        if q.format.bits != 8 or not q.format.fits_float32:
            raise ValueError(
                f"fp8sim.gemm: the tensor-core model multiplies 8-bit codes; {name} is quantized "
                f"to {q.format.name} ({q.format.bits} bits)"
            )
    y32, parts = _fp8(qx, qw, r, fidelity, backend)
    y = _cast_out(y32, r.output_format)
    if report:
        return y, _report(x, w, qx, qw, r, y, y32, parts)
    return y
