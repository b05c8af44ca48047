"""Error measures between a reference array and its approximation.

Every function takes ``ref`` (the exact values) and ``approx`` (e.g. a
dequantized tensor) of the same shape, any float dtype (bfloat16 and
float16 included); the arithmetic is done in float64.

NaN handling
------------
``nan="omit"`` (the default): element pairs where ``ref`` or ``approx`` is
NaN are left out of every measure (fractions are then over the remaining
elements).  ``nan="propagate"``: any NaN pair makes the result NaN.
Infinities enter the arithmetic: equal infinities count as zero error, any
other pair with an infinity gives an infinite error (SQNR ``-inf``).

Measures that need to know about the quantization (saturation, subnormal
codes) take a :class:`~fp8sim.scaling.QuantizedTensor`.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "rel_frobenius_error",
    "max_rel_error",
    "sqnr_db",
    "fraction_saturated",
    "fraction_underflow",
    "fraction_subnormal",
    "block_stats",
    "summary",
]


def _pair(ref, approx, nan: str):
    if nan not in ("omit", "propagate"):
        raise ValueError(f"nan must be 'omit' or 'propagate', got {nan!r}")
    r = np.asarray(ref)
    a = np.asarray(approx)
    if r.shape != a.shape:
        raise ValueError(f"ref and approx must have the same shape, got {r.shape} and {a.shape}")
    for v, nm in ((r, "ref"), (a, "approx")):
        if v.dtype.kind not in "fiu" and v.dtype.name != "bfloat16":
            raise TypeError(f"{nm} must be a numeric array, got dtype {v.dtype}")
    r = r.astype(np.float64).reshape(-1)
    a = a.astype(np.float64).reshape(-1)
    bad = np.isnan(r) | np.isnan(a)
    if bad.any():
        if nan == "propagate":
            return None, None
        r, a = r[~bad], a[~bad]
    return r, a


def _err(r, a):
    with np.errstate(invalid="ignore"):
        e = a - r
    if not np.isfinite(e).all():  # equal infinities: zero error
        e = np.where(r == a, 0.0, e)
    return e


def rel_frobenius_error(ref, approx, *, nan: str = "omit") -> float:
    """``||approx - ref||_F / ||ref||_F`` (0 when both are zero, inf when only ref is zero)."""
    r, a = _pair(ref, approx, nan)
    if r is None:
        return float("nan")
    num = float(np.sqrt(np.sum(_err(r, a) ** 2)))
    den = float(np.sqrt(np.sum(r * r)))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def max_rel_error(ref, approx, *, nan: str = "omit") -> float:
    """``max |approx - ref| / |ref|`` over elements with ``ref != 0``; an element with
    ``ref == 0 != approx`` gives inf; 0.0 for no elements."""
    r, a = _pair(ref, approx, nan)
    if r is None:
        return float("nan")
    e = np.abs(_err(r, a))
    if e.size == 0:
        return 0.0
    nz = r != 0
    if (e[~nz] > 0).any():
        return float("inf")
    if not nz.any():
        return 0.0
    with np.errstate(invalid="ignore"):
        rel = e[nz] / np.abs(r[nz])
    rel = np.where(np.isnan(rel), np.inf, rel)  # inf ref with inf error
    return float(rel.max())


def sqnr_db(ref, approx, *, nan: str = "omit") -> float:
    """Signal to quantization-noise ratio ``10 log10(sum ref^2 / sum (approx-ref)^2)`` in dB
    (inf for an exact approximation, -inf for a zero reference with nonzero error)."""
    r, a = _pair(ref, approx, nan)
    if r is None:
        return float("nan")
    sig = float(np.sum(r * r))
    noise = float(np.sum(_err(r, a) ** 2))
    if noise == 0.0:
        return float("inf")
    if sig == 0.0:
        return float("-inf")
    return float(10.0 * np.log10(sig / noise))


def fraction_underflow(ref, approx, *, nan: str = "omit") -> float:
    """Fraction of elements with ``ref != 0`` that became exactly zero."""
    r, a = _pair(ref, approx, nan)
    if r is None:
        return float("nan")
    if r.size == 0:
        return 0.0
    return float(np.count_nonzero((r != 0) & (a == 0)) / r.size)


def _check_q(q):
    from .scaling import QuantizedTensor

    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"expected a QuantizedTensor, got {type(q).__name__}")


def _saturated_mask(xv, q, d):
    """Elements clipped by ``q``: |x| > fmt.max * scale.  Read from the codes: a clipped element
    has the largest finite code magnitude (saturating conversion) or an inf/NaN code."""
    fmt = q.format
    mag = q.codes.astype(np.int64) & ~fmt.sign_mask
    at_max = mag == fmt.max_code_mag
    beyond = mag > fmt.max_code_mag  # inf or NaN codes (non-saturating conversion)
    with np.errstate(invalid="ignore"):
        return (at_max & (np.abs(xv) > np.abs(d))) | (beyond & ~np.isnan(xv))


def fraction_saturated(x, q, *, nan: str = "omit") -> float:
    """Fraction of the elements of ``x`` that were clipped by the quantization ``q``:
    ``|x| > fmt.max * scale`` (infinities included).  Elements that are NaN in ``x`` or in
    blocks with a NaN scale are omitted (``nan="propagate"``: NaN result)."""
    _check_q(q)
    xv = np.asarray(x).astype(np.float64)
    if xv.shape != q.shape:
        raise ValueError(f"x has shape {xv.shape}, the QuantizedTensor {q.shape}")
    d = q.dequantize(np.float64)
    isn = np.isnan(xv) | (np.isnan(d) & ~np.isinf(xv) & ~np.isnan(q.values()))
    isn |= np.isnan(q.expanded_scales()) if np.isnan(q.scales).any() else False
    if isn.any() and nan == "propagate":
        return float("nan")
    keep = ~isn
    n = int(np.count_nonzero(keep))
    if n == 0:
        return 0.0
    return float(np.count_nonzero(_saturated_mask(xv, q, d) & keep) / n)


def fraction_subnormal(q) -> float:
    """Fraction of the codes of ``q`` that are subnormal (nonzero, exponent field 0)."""
    _check_q(q)
    fmt = q.format
    c = q.codes.astype(np.int64) & ((1 << (fmt.ebits + fmt.mbits)) - 1)
    return float(np.count_nonzero(((c >> fmt.mbits) == 0) & (c != 0)) / max(c.size, 1))


def block_stats(x, q) -> dict:
    """Per-block statistics of the quantization ``q`` of ``x``, each an array of ``q.scales.shape``:
    ``amax``, ``scale``, ``sqnr_db``, ``rel_frobenius``, ``max_abs_error``, ``n_saturated``,
    ``n_underflow``, ``n``.  NaN elements are omitted."""
    _check_q(q)
    xv = np.asarray(x).astype(np.float64)
    if xv.shape != q.shape:
        raise ValueError(f"x has shape {xv.shape}, the QuantizedTensor {q.shape}")
    d = q.dequantize(np.float64)
    sshape = q.scales.shape
    ids = np.arange(int(np.prod(sshape)), dtype=np.int64).reshape(sshape)
    for ax, b in enumerate(q.block_shape):
        ids = np.repeat(ids, b, axis=ax)
    ids = ids[tuple(slice(0, n) for n in q.shape)].reshape(-1)
    xr, dr = xv.reshape(-1), d.reshape(-1)
    keep = ~(np.isnan(xr) | np.isnan(dr))
    ids, xr, dr = ids[keep], xr[keep], dr[keep]
    nb = int(np.prod(sshape))
    e = _err(xr, dr)
    sig = np.bincount(ids, weights=xr * xr, minlength=nb)
    noise = np.bincount(ids, weights=e * e, minlength=nb)
    maxe = np.zeros(nb)
    np.maximum.at(maxe, ids, np.abs(e))
    limit = q.format.max * q.expanded_scales().reshape(-1)[keep]
    with np.errstate(divide="ignore", invalid="ignore"):
        sq = np.where(noise == 0, np.inf, 10 * np.log10(sig / noise))
        rf = np.where(sig == 0, np.where(noise == 0, 0.0, np.inf), np.sqrt(noise / sig))
    return {
        "amax": q.amax.astype(np.float64),
        "scale": q.scales.astype(np.float64) * q.global_scale,
        "sqnr_db": sq.reshape(sshape),
        "rel_frobenius": rf.reshape(sshape),
        "max_abs_error": maxe.reshape(sshape),
        "n_saturated": np.bincount(ids, weights=(np.abs(xr) > limit), minlength=nb).astype(np.int64).reshape(sshape),
        "n_underflow": np.bincount(ids, weights=(xr != 0) & (dr == 0), minlength=nb).astype(np.int64).reshape(sshape),
        "n": np.bincount(ids, minlength=nb).astype(np.int64).reshape(sshape),
    }


def summary(x, q_or_approx, *, nan: str = "omit") -> dict:
    """All scalar measures in one dict; with a QuantizedTensor also saturation and subnormals."""
    from .scaling import QuantizedTensor

    q = q_or_approx if isinstance(q_or_approx, QuantizedTensor) else None
    approx = q.dequantize(np.float64) if q is not None else q_or_approx
    r, a = _pair(x, approx, nan)
    if r is None:
        out = dict.fromkeys(("sqnr_db", "rel_frobenius", "max_rel_error", "fraction_underflow"), float("nan"))
    else:
        e = _err(r, a)
        sig, noise = float(np.dot(r, r)), float(np.dot(e, e))
        out = {
            "sqnr_db": float("inf") if noise == 0 else (float("-inf") if sig == 0 else 10 * np.log10(sig / noise)),
            "rel_frobenius": (0.0 if noise == 0 else float("inf")) if sig == 0 else float(np.sqrt(noise / sig)),
            "max_rel_error": max_rel_error(r, a),
            "fraction_underflow": float(np.count_nonzero((r != 0) & (a == 0)) / max(r.size, 1)),
        }
    if q is not None:
        xv = np.asarray(x).astype(np.float64)
        if np.isnan(xv).any() or np.isnan(q.scales).any():
            out["fraction_saturated"] = fraction_saturated(x, q, nan=nan)
        else:
            out["fraction_saturated"] = float(np.count_nonzero(_saturated_mask(xv, q, approx)) / max(xv.size, 1))
        out["fraction_subnormal"] = fraction_subnormal(q)
    return out
