"""The error report of :func:`fp8sim.gemm`: errors against fp64 and bf16, and their decomposition.

Each error source of :data:`SOURCES` is switched on alone, everything else exact, and measured as
the size of the change it makes relative to the fp64 GEMM of the unquantized inputs (see
docs/gemm.md for the definitions).  Saturation and underflow counts per scale block come from
:func:`fp8sim.metrics.block_stats`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import metrics
from ..scaling import QuantizedTensor
from ..tensorcore.fast import code_tables
from .engine import SCALE_MODES, cast_output, promote, scaled_matmul, wide_matmul
from .presets import recipe as get_recipe
from .recipes import Recipe

__all__ = ["GemmReport", "SOURCES", "fp8_gemm_report", "wide_gemm_report"]

SOURCES = ("x_quantization", "w_quantization", "scale_rounding", "accumulation", "promotion", "output_cast")


def _metric_dict(ref, approx) -> dict:
    ref = np.asarray(ref, np.float64)
    approx = np.asarray(approx, np.float64)
    fin = np.isfinite(ref) & np.isfinite(approx)
    return {
        "rel_frobenius": metrics.rel_frobenius_error(ref[fin], approx[fin]) if fin.any() else float("nan"),
        "max_rel_error": metrics.max_rel_error(ref[fin], approx[fin]) if fin.any() else float("nan"),
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
    """Error report of one :func:`fp8sim.gemm` call.

    ``error``: the output against the fp64 GEMM of the unquantized inputs (for an operand
    passed as a QuantizedTensor the unquantized values are unknown: its dequantized values
    stand in, and its quantization term is then 0 by construction);
    The terms decompose the arithmetic of one K slice with the scale product applied as
    ``fp32(sa * sb)``; a recipe's split-K (``split_k``) and epilogue order (``epilogue_scale``) are in
    ``error`` (the recipe's real output) but have no term of their own.
    ``error_vs_bf16``: against the BF16 baseline's output (``fp8sim.gemm(..., baseline=)``:
    ``"bf16"``, numpy's BLAS, by default; ``"bf16-cublaslt"`` the H200's BF16 GEMM); ``bf16_error``:
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


def wide_gemm_report(x, w, r: Recipe, y, baseline="bf16") -> GemmReport:
    """The report of an unquantized recipe's output ``y`` (errors only; no decomposition)."""
    xe, we = np.asarray(x, np.float64), np.asarray(w, np.float64)
    ref = xe @ we
    bf = wide_matmul(xe, we, get_recipe(baseline))
    return GemmReport(
        r.name, (x.shape[0], x.shape[1], w.shape[1]), _metric_dict(ref, y), _metric_dict(bf, y), _metric_dict(ref, bf)
    )


def _decode(codes, fmt) -> np.ndarray:
    return code_tables(fmt)[0][codes]


def fp8_gemm_report(x, w, qx: QuantizedTensor, qw: QuantizedTensor, r: Recipe, y, parts, baseline="bf16") -> GemmReport:
    """The report of an FP8 recipe's output ``y``: ``x``, ``w`` as given (float arrays or
    QuantizedTensors), ``qx``, ``qw`` their quantizations and ``parts = (A, B, sa, sb, kscale)``
    what the kernel multiplied (:func:`fp8sim.gemms.operands.kernel_inputs`)."""
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
        bf = wide_matmul(xe, we, get_recipe(baseline))
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
                    tot = promote(tot, p32, s32, SCALE_MODES[r.scale_application])
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
            ref, y_q, cast_output(y_q, r.output_format) if r.output_format != "fp32" else y_q.astype(np.float32)
        )
    blocks = {}
    counts = {}
    for name, a, q in (("x", xin, qx), ("w", win, qw)):
        if a is None:
            continue
        st = metrics.block_stats(a, q)
        blocks[name] = {"n_saturated": st["n_saturated"], "n_underflow": st["n_underflow"]}
        counts[f"{name}: saturated / underflowed / non-finite elements"] = (
            int(st["n_saturated"].sum()),
            int(st["n_underflow"].sum()),
            int((~np.isfinite(a)).sum()),
        )
    return GemmReport(
        r.name, (M, K, N), _metric_dict(ref, y), _metric_dict(bf, y), _metric_dict(ref, bf), terms, blocks, counts
    )
