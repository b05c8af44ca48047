"""Error measures between a reference array and its approximation.

Every function takes ``ref`` (the exact values) and ``approx`` (e.g. a
dequantized tensor) of the same shape, any float dtype (bfloat16 and
float16 included); the arithmetic is done in float64.  Large arrays are
processed in blocks of ``2**18`` elements (in C order), so the memory a
measure needs is bounded whatever the size of the tensor; sums are
accumulated in float64, block by block, and every function (and
:func:`summary`) uses the same blocks, so they agree with each other to the
last bit.

NaN and infinity semantics
--------------------------
An output that is NaN where the reference is not NaN is a **destroyed**
value and counts as an infinite error: one such element makes ``sqnr_db``
``-inf`` and ``rel_frobenius_error`` and ``max_rel_error`` ``inf``.  A
metric never calls a tensor with NaN outputs good.

``nan="omit"`` (the default): element pairs whose *reference* is NaN are
left out of every measure (fractions are then over the remaining elements);
there is nothing to compare them with.  ``nan="propagate"``: any NaN, in
``ref`` or in ``approx``, makes every error measure NaN.

Infinities enter the arithmetic: equal infinities count as zero error, any
other pair with an infinity gives an infinite error (SQNR ``-inf``; NaN when
the reference itself is infinite, as ``inf / inf``).

:func:`summary` also reports how many outputs are NaN (``n_nan``) and
infinite (``n_inf``), and how many pairs were omitted (``n_omitted``).

Relative error
--------------
``max_rel_error`` is the plain ratio ``|approx - ref| / |ref|`` (1.0 means
100 %), maximized over elements with ``ref != 0``.  An element flushed to
zero (underflow) has relative error exactly 1, so any underflow makes it at
least 1; ``exclude_underflow=True`` leaves flushed elements out (they are
counted by ``fraction_underflow``).

Saturation and underflow
------------------------
Measures that need to know about the quantization take a
:class:`~fp8sim.scaling.QuantizedTensor`.  An element is **saturated** when
the conversion clipped it: rounded in the element format's rounding mode
``mode`` with an unbounded exponent, ``x / scale`` lands beyond ``fmt.max``,
so the saturating conversion clamped it to ``+-max`` (or the non-saturating
one gave inf/NaN).  ``+-inf`` inputs count as saturated.  A value above
``fmt.max`` that rounds to ``fmt.max`` anyway (for RNE: below
``max + ulp(max) / 2``, e.g. a block amax that lands a float32 step above
448 because the fp32 scale ``amax / 448`` was rounded) is *not* saturated.
For ``mode="sr"`` the outcome of the random rounding is not recorded, so
every ``|x / scale| > max`` counts (an upper bound).  An element is
**underflowed** when it is nonzero (and not NaN) and its output is exactly
zero.  :func:`fraction_saturated`, :func:`block_stats`,
:func:`quantization_counts` and the training instruments all use these two
definitions.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from functools import lru_cache

import numpy as np
from numba import njit

from ._fpenv import ieee_defaults

__all__ = [
    "rel_frobenius_error",
    "max_rel_error",
    "sqnr_db",
    "fraction_saturated",
    "fraction_underflow",
    "fraction_subnormal",
    "quantization_counts",
    "block_stats",
    "summary",
]

_CHUNK = 1 << 18  # elements per streamed block (float64: 2 MiB per temporary)


# ------------------------------------------------------------------ input checks
def _check_nan(nan: str) -> None:
    if nan not in ("omit", "propagate"):
        raise ValueError(f"nan must be 'omit' or 'propagate', got {nan!r}")


def _numeric(v, nm: str) -> np.ndarray:
    a = np.asarray(v)
    if a.dtype.kind not in "fiu" and a.dtype.name != "bfloat16":
        raise TypeError(f"{nm} must be a numeric (float or integer) array, got dtype {a.dtype}")
    return a


def _flat_pair(ref, approx) -> tuple[np.ndarray, np.ndarray]:
    r = _numeric(ref, "ref")
    a = _numeric(approx, "approx")
    if r.shape != a.shape:
        raise ValueError(f"ref and approx must have the same shape, got {r.shape} and {a.shape}")
    return r.reshape(-1), a.reshape(-1)


def _check_q(q):
    from .scaling import QuantizedTensor

    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"expected a QuantizedTensor, got {type(q).__name__}")


def _mode_id(mode: str | None, q=None) -> int:
    """The kernel id of ``mode``; None means the mode ``q`` was quantized with (``q.mode``)."""
    from .rounding import round_mode

    if mode is None:
        mode = getattr(q, "mode", "rne")
    return int(round_mode(mode))  # raises UnknownNameError listing the known modes


# ------------------------------------------------------------------ streaming
class _Acc:
    """float64 accumulators of the error measures over the blocks of a pair of arrays."""

    def __init__(self) -> None:
        self.n = 0  # all elements
        self.n_kept = 0  # pairs with a non-NaN reference
        self.n_nan = 0  # NaN outputs
        self.n_inf = 0  # infinite outputs
        self.n_destroyed = 0  # NaN outputs where the reference is not NaN
        self.any_nan = False
        self.sig = 0.0
        self.noise = 0.0
        self.max_rel = 0.0
        self.max_rel_nz = 0.0  # excluding underflows
        self.n_underflow = 0

    def add(self, r: np.ndarray, a: np.ndarray) -> None:
        """Fold one block (float64, 1-D) in."""
        self.n += r.size
        rn = np.isnan(r)
        an = np.isnan(a)
        n_rn = int(np.count_nonzero(rn))
        n_an = int(np.count_nonzero(an))
        self.n_nan += n_an
        self.n_inf += int(np.count_nonzero(np.isinf(a)))
        if n_rn or n_an:
            self.any_nan = True
            self.n_destroyed += int(np.count_nonzero(an & ~rn))
        if n_rn:
            keep = ~rn
            r, a = r[keep], a[keep]
        self.n_kept += r.size
        if r.size == 0:
            return
        with np.errstate(invalid="ignore", over="ignore"):
            e = a - r
            if n_an or not np.isfinite(e).all():
                # equal infinities: no error; a destroyed (NaN) output: infinite error
                e = np.where(np.isnan(e), np.where(r == a, 0.0, np.inf), e)
            self.sig += float(np.sum(r * r))
            self.noise += float(np.sum(e * e))
        e = np.abs(e)
        nz = r != 0
        if not nz.all():
            if (e[~nz] > 0).any():
                self.max_rel = self.max_rel_nz = float("inf")
            e, r2, a2 = e[nz], r[nz], a[nz]
        else:
            r2, a2 = r, a
        if e.size == 0:
            return
        with np.errstate(invalid="ignore"):
            rel = e / np.abs(r2)
        if not np.isfinite(rel).all():
            rel = np.where(np.isnan(rel), np.inf, rel)  # inf ref with inf error
        self.max_rel = max(self.max_rel, float(rel.max()))
        under = a2 == 0
        nu = int(np.count_nonzero(under))
        self.n_underflow += nu
        if nu:
            rel = rel[~under]
        if rel.size:
            self.max_rel_nz = max(self.max_rel_nz, float(rel.max()))

    def nan_result(self, nan: str) -> bool:
        return nan == "propagate" and self.any_nan

    def sqnr_db(self, nan: str) -> float:
        if self.nan_result(nan):
            return float("nan")
        if self.noise == 0.0:
            return float("inf")
        if self.sig == 0.0:
            return float("-inf")
        with np.errstate(invalid="ignore", divide="ignore"):
            return float(10.0 * np.log10(self.sig / self.noise))

    def rel_frobenius(self, nan: str) -> float:
        if self.nan_result(nan):
            return float("nan")
        if self.sig == 0.0:
            return 0.0 if self.noise == 0.0 else float("inf")
        with np.errstate(invalid="ignore"):
            return float(np.sqrt(self.noise) / np.sqrt(self.sig))

    def max_rel_error(self, nan: str, exclude_underflow: bool = False) -> float:
        if self.nan_result(nan):
            return float("nan")
        if self.n_destroyed:
            return float("inf")
        return self.max_rel_nz if exclude_underflow else self.max_rel

    def fraction_underflow(self, nan: str) -> float:
        if self.nan_result(nan):
            return float("nan")
        return self.n_underflow / self.n_kept if self.n_kept else 0.0


def _spans(n: int) -> Iterator[tuple[int, int]]:
    step = max(int(_CHUNK), 1)
    for f0 in range(0, n, step):
        yield f0, min(f0 + step, n)


def _acc_arrays(ref, approx) -> _Acc:
    r, a = _flat_pair(ref, approx)
    acc = _Acc()
    for f0, f1 in _spans(r.size):
        acc.add(r[f0:f1].astype(np.float64), a[f0:f1].astype(np.float64))
    return acc


@njit(cache=True)
def _dequant_span(codes, table, scales, M, N, bm, bn, nbm, nbn, glob, f0, out_d, out_s, out_id):
    """Elements ``f0 .. f0 + out_d.size`` (C order) of a QuantizedTensor seen as (B, M, N) with
    blocks (bm, bn): the dequantized value ``table[code] * (scale * glob)`` (the arithmetic of
    ``QuantizedTensor.dequantize``), the element's ``scale * glob`` and its flat block index."""
    n = out_d.size
    k = 0
    t = f0 // N
    j = f0 - t * N
    while k < n:
        b = t // M
        i = t - b * M
        base = (b * nbm + i // bm) * nbn
        jb = j // bn
        while j < N and k < n:
            s = np.float64(scales[base + jb]) * glob
            jend = min((jb + 1) * bn, N, j + (n - k))
            for _jj in range(j, jend):
                out_s[k] = s
                out_d[k] = np.float64(table[codes[f0 + k]]) * s
                out_id[k] = base + jb
                k += 1
            j = jend
            jb += 1
        j = 0
        t += 1


def _q_view(q) -> tuple[int, int, int, int, int, int, int]:
    from .scaling.granularities import view_of

    B, M, N, bm, bn = view_of(q.granularity, q.shape)
    return B, M, N, bm, bn, -(-M // bm), -(-N // bn)


def _q_spans(x, q, progress: bool = False):
    """Yield ``(x, d, s, ids, codes)`` per block: float64 ``x``, dequantized values, scales,
    block indices and codes of consecutive C-order spans of ``q``."""
    from .rounding import decode_table

    _check_q(q)
    xv = _numeric(x, "x")
    if xv.shape != tuple(q.shape):
        raise ValueError(f"x has shape {xv.shape}, the QuantizedTensor {tuple(q.shape)}")
    xf = xv.reshape(-1)
    codes = np.ascontiguousarray(q.codes).reshape(-1)
    scales = np.ascontiguousarray(q.scales).reshape(-1)
    table = decode_table(q.format)
    _B, M, N, bm, bn, nbm, nbn = _q_view(q)
    glob = float(q.global_scale)
    n = xf.size
    bar = None
    if progress and n > _CHUNK:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc="metrics", unit="el", unit_scale=True, file=sys.stderr, leave=False)
    try:
        for f0, f1 in _spans(n):
            m = f1 - f0
            d = np.empty(m, np.float64)
            s = np.empty(m, np.float64)
            ids = np.empty(m, np.int64)
            _dequant_span(codes, table, scales, M, N, bm, bn, nbm, nbn, glob, f0, d, s, ids)
            yield xf[f0:f1].astype(np.float64), d, s, ids, codes[f0:f1]
            if bar is not None:
                bar.update(m)
    finally:
        if bar is not None:
            bar.close()


@lru_cache(maxsize=64)
def _code_classes(fmt) -> np.ndarray:
    """Per code: 1 if its magnitude is ``fmt.max``, 2 if it is inf or NaN, else 0."""
    from .rounding import decode_table

    t = decode_table(fmt).astype(np.float64)
    out = np.zeros(t.size, dtype=np.uint8)
    out[np.abs(t) == fmt.max] = 1
    out[~np.isfinite(t)] = 2
    out.setflags(write=False)
    return out


def _clipped(x, s, codes, fmt, mode: int) -> tuple[np.ndarray, np.ndarray]:
    """``(clipped, omitted)`` masks of one block: elements the conversion clipped (module
    docstring), and elements left out of the saturation count (NaN in ``x`` or NaN scale)."""
    from .rounding import RDN, RNA, RNE, RTO, RTZ, RUP

    omitted = np.isnan(x) | np.isnan(s)
    cls = _code_classes(fmt)[codes]  # 1: largest finite magnitude, 2: inf or NaN code
    clipped = np.zeros(x.size, dtype=bool)
    idx = np.flatnonzero((cls != 0) & ~omitted)
    if idx.size == 0:
        return clipped, omitted
    beyond = cls[idx] == 2  # a non-saturating overflow (or an inf input)
    with np.errstate(over="ignore", invalid="ignore"):
        v = x[idx] / s[idx]  # the quotient quantize rounds (formed in float64, as there)
    av = np.abs(v)
    mx = fmt.max
    ulp = 2.0 ** (fmt.emax - fmt.mbits)
    half = mx + ulp / 2
    nxt = mx + ulp
    max_odd = bool(fmt.max_code_mag & 1)
    neg = v < 0
    if mode == RNE:
        c = (av > half) | ((av == half) & max_odd)
    elif mode == RNA:
        c = av >= half
    elif mode == RTZ:
        c = av >= nxt
    elif mode == RUP:
        c = np.where(neg, av >= nxt, av > mx)
    elif mode == RDN:
        c = np.where(neg, av > mx, av >= nxt)
    elif mode == RTO:
        c = av >= nxt if max_odd else av > mx
    else:  # stochastic: may have rounded up
        c = av > mx
    clipped[idx] = beyond | c
    return clipped, omitted


def _underflowed(x, d) -> np.ndarray:
    """Mask of the elements the quantization flushed: nonzero, non-NaN ``x`` whose dequantized
    value ``d`` is exactly zero (module docstring)."""
    return (d == 0) & (x != 0) & ~np.isnan(x)


# ------------------------------------------------------------------ measures on two arrays
@ieee_defaults
def rel_frobenius_error(ref, approx, *, nan: str = "omit") -> float:
    """``||approx - ref||_F / ||ref||_F`` (0 when both are zero, inf when only ref is zero;
    inf when an output is NaN where ``ref`` is not: see the module docstring)."""
    _check_nan(nan)
    return _acc_arrays(ref, approx).rel_frobenius(nan)


@ieee_defaults
def max_rel_error(ref, approx, *, nan: str = "omit", exclude_underflow: bool = False) -> float:
    """``max |approx - ref| / |ref|`` as a plain ratio (1.0 = 100 %) over elements with
    ``ref != 0``.  An element flushed to zero has relative error exactly 1; with
    ``exclude_underflow=True`` such elements are left out.  An element with
    ``ref == 0 != approx``, and a NaN output where ``ref`` is not NaN, give inf; 0.0 for no
    elements."""
    _check_nan(nan)
    return _acc_arrays(ref, approx).max_rel_error(nan, bool(exclude_underflow))


@ieee_defaults
def sqnr_db(ref, approx, *, nan: str = "omit") -> float:
    """Signal to quantization-noise ratio ``10 log10(sum ref^2 / sum (approx-ref)^2)`` in dB
    (inf for an exact approximation, -inf for a zero reference with nonzero error and for any
    NaN output where ``ref`` is not NaN)."""
    _check_nan(nan)
    return _acc_arrays(ref, approx).sqnr_db(nan)


@ieee_defaults
def fraction_underflow(ref, approx, *, nan: str = "omit") -> float:
    """Fraction of the elements (with a non-NaN ``ref``) whose ``ref`` is nonzero and whose
    ``approx`` is exactly zero."""
    _check_nan(nan)
    return _acc_arrays(ref, approx).fraction_underflow(nan)


# ------------------------------------------------------------------ measures on a quantization
@ieee_defaults
def quantization_counts(x, q, *, mode: str | None = None) -> dict:
    """Counts of the quantization ``q`` of ``x``: ``n`` (elements), ``n_saturated`` (clipped by
    the conversion; module docstring), ``n_underflow`` (nonzero, non-NaN elements that became
    exactly zero), ``n_nan`` (NaN outputs), ``n_omitted`` (elements left out of the saturation
    count: NaN in ``x`` or in a block with a NaN scale).  ``mode`` is the element rounding mode
    ``q`` was made with (``fp8sim.quantize``'s ``mode``)."""
    m = _mode_id(mode, q)
    n = n_sat = n_und = n_nan = n_om = 0
    for xv, d, s, _ids, c in _q_spans(x, q):
        clipped, omitted = _clipped(xv, s, c, q.format, m)
        n += xv.size
        n_sat += int(np.count_nonzero(clipped))
        n_om += int(np.count_nonzero(omitted))
        n_und += int(np.count_nonzero(_underflowed(xv, d)))
        n_nan += int(np.count_nonzero(np.isnan(d)))
    return {"n": n, "n_saturated": n_sat, "n_underflow": n_und, "n_nan": n_nan, "n_omitted": n_om}


@ieee_defaults
def fraction_saturated(x, q, *, nan: str = "omit", mode: str | None = None) -> float:
    """Fraction of the elements of ``x`` that the quantization ``q`` clipped (module docstring:
    rounded in ``mode`` -- the mode ``q`` was made with -- ``x / scale`` lands beyond
    ``fmt.max``; infinities included).  Elements that are NaN in ``x`` or in blocks with a NaN
    scale are omitted (``nan="propagate"``: NaN result)."""
    _check_nan(nan)
    c = quantization_counts(x, q, mode=mode)
    if c["n_omitted"] and nan == "propagate":
        return float("nan")
    kept = c["n"] - c["n_omitted"]
    return c["n_saturated"] / kept if kept else 0.0


@ieee_defaults
def fraction_subnormal(q) -> float:
    """Fraction of the codes of ``q`` that are subnormal (nonzero, exponent field 0)."""
    _check_q(q)
    fmt = q.format
    codes = np.ascontiguousarray(q.codes).reshape(-1)
    mask = np.asarray((1 << (fmt.ebits + fmt.mbits)) - 1, dtype=codes.dtype)
    lim = np.asarray(1 << fmt.mbits, dtype=codes.dtype)
    n = 0
    for f0, f1 in _spans(codes.size):
        c = codes[f0:f1] & mask
        n += int(np.count_nonzero((c < lim) & (c != 0)))
    return n / max(codes.size, 1)


@ieee_defaults
def block_stats(x, q, *, mode: str | None = None) -> dict:
    """Per-block statistics of the quantization ``q`` of ``x``, each an array of ``q.scales.shape``:
    ``amax``, ``scale``, ``sqnr_db``, ``rel_frobenius``, ``max_abs_error``, ``n_saturated``,
    ``n_underflow``, ``n_nan`` (NaN outputs), ``n``.  Elements that are NaN in ``x`` are omitted;
    a NaN output where ``x`` is not NaN is an infinite error (SQNR ``-inf``).  Saturated and
    underflowed as in the module docstring (``mode``: the mode ``q`` was made with)."""
    m = _mode_id(mode, q)
    _check_q(q)
    sshape = tuple(q.scales.shape)
    nb = int(np.prod(sshape))
    sig = np.zeros(nb)
    noise = np.zeros(nb)
    maxe = np.zeros(nb)
    n_sat = np.zeros(nb, np.int64)
    n_und = np.zeros(nb, np.int64)
    n_nan = np.zeros(nb, np.int64)
    n = np.zeros(nb, np.int64)
    for xv, d, s, ids, c in _q_spans(x, q):
        clipped, _om = _clipped(xv, s, c, q.format, m)
        n_sat += np.bincount(ids[clipped], minlength=nb)
        n_und += np.bincount(ids[_underflowed(xv, d)], minlength=nb)
        dn = np.isnan(d)
        n_nan += np.bincount(ids[dn], minlength=nb)
        keep = ~np.isnan(xv)
        if not keep.all():
            xv, d, ids = xv[keep], d[keep], ids[keep]
        n += np.bincount(ids, minlength=nb)
        with np.errstate(invalid="ignore", over="ignore"):
            e = d - xv
            if not np.isfinite(e).all():
                e = np.where(np.isnan(e), np.where(xv == d, 0.0, np.inf), e)
            sig += np.bincount(ids, weights=xv * xv, minlength=nb)
            noise += np.bincount(ids, weights=e * e, minlength=nb)
        np.maximum.at(maxe, ids, np.abs(e))
    with np.errstate(divide="ignore", invalid="ignore"):
        sq = np.where(noise == 0, np.inf, 10 * np.log10(sig / noise))
        rf = np.where(sig == 0, np.where(noise == 0, 0.0, np.inf), np.sqrt(noise / sig))
    return {
        "amax": q.amax.astype(np.float64),
        "scale": q.scales.astype(np.float64) * q.global_scale,
        "sqnr_db": sq.reshape(sshape),
        "rel_frobenius": rf.reshape(sshape),
        "max_abs_error": maxe.reshape(sshape),
        "n_saturated": n_sat.reshape(sshape),
        "n_underflow": n_und.reshape(sshape),
        "n_nan": n_nan.reshape(sshape),
        "n": n.reshape(sshape),
    }


@ieee_defaults
def summary(x, q_or_approx, *, nan: str = "omit", mode: str | None = None, progress: bool = False) -> dict:
    """All scalar measures in one dict, computed in one streamed pass:

    * ``n``, ``n_nan`` (NaN outputs), ``n_inf`` (infinite outputs), ``n_omitted`` (pairs left
      out because ``x`` is NaN; with ``nan="propagate"`` every error measure is then NaN),
    * ``sqnr_db`` (dB), ``rel_frobenius`` (ratio), ``max_rel_error`` (ratio ``|err| / |x|``
      over ``x != 0``; 1.0 when an element is flushed to zero), ``max_rel_error_excl_underflow``
      (the same without the flushed elements), ``fraction_underflow``,
    * with a QuantizedTensor also ``fraction_saturated`` (``mode``: the rounding mode ``q`` was
      made with) and ``fraction_subnormal``.

    ``progress``: a progress bar on stderr for tensors of more than one block.
    """
    from .scaling import QuantizedTensor

    _check_nan(nan)
    acc = _Acc()
    if isinstance(q_or_approx, QuantizedTensor):
        q = q_or_approx
        m = _mode_id(mode, q)
        fmt = q.format
        n_sat = n_om = n_sub = 0
        mask = np.asarray((1 << (fmt.ebits + fmt.mbits)) - 1, dtype=q.codes.dtype)
        lim = np.asarray(1 << fmt.mbits, dtype=q.codes.dtype)
        for xv, d, s, _ids, c in _q_spans(x, q, progress):
            acc.add(xv, d)
            clipped, omitted = _clipped(xv, s, c, fmt, m)
            n_sat += int(np.count_nonzero(clipped))
            n_om += int(np.count_nonzero(omitted))
            cm = c & mask
            n_sub += int(np.count_nonzero((cm < lim) & (cm != 0)))
        kept = acc.n - n_om
        sat = float("nan") if (n_om and nan == "propagate") else (n_sat / kept if kept else 0.0)
        extra = {"fraction_saturated": sat, "fraction_subnormal": n_sub / max(acc.n, 1)}
    else:
        acc = _acc_arrays(x, q_or_approx)
        extra = {}
    return {
        "n": acc.n,
        "n_nan": acc.n_nan,
        "n_inf": acc.n_inf,
        "n_omitted": acc.n - acc.n_kept,
        "sqnr_db": acc.sqnr_db(nan),
        "rel_frobenius": acc.rel_frobenius(nan),
        "max_rel_error": acc.max_rel_error(nan),
        "max_rel_error_excl_underflow": acc.max_rel_error(nan, True),
        "fraction_underflow": acc.fraction_underflow(nan),
        **extra,
    }
