"""An independent, slow-but-simple rounding reference for tests and scripts.

It shares no code with fp8sim's kernel: it sorts the finite values of a
format (from the decode table, itself checked code by code against
ml_dtypes and gfloat), brackets each input between its two neighbours with
``searchsorted`` and applies each mode's definition literally:

* nearest modes compare against the exact midpoint (exact in float64 for
  formats of up to 16 bits);
* ties to even / round to odd look at the parity of the code;
* overflow: a virtual value one top-binade ulp past ``max`` stands for the
  next value of an unbounded exponent range (IEEE 754 7.4).
"""

from __future__ import annotations

import numpy as np


def finite_values(fmt, table):
    """Sorted non-negative finite values of the format and their codes."""
    codes = np.arange(table.size)
    mag_ok = (codes & ~fmt.sign_mask) == codes if fmt.signed else np.ones(table.size, bool)
    ok = np.isfinite(table) & mag_ok & (table >= 0)
    vals = table[ok].astype(np.float64)
    cods = codes[ok]
    order = np.argsort(vals, kind="stable")
    vals, cods = vals[order], cods[order]
    # drop duplicates (+0 appears once since we kept sign-clear codes only)
    return vals, cods


def bracket(x, fmt, table):
    """The mode-independent part: each input's two neighbouring values.

    Returns a dict with the input's sign and magnitude, the neighbours ``lo
    <= |x| <= hi`` (``hi`` may be the virtual value past max), whether ``|x|``
    is exact, its position against the midpoint and the parity of ``lo``'s
    code.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:  # float32 input stays float32: all values below are float32-exact
        x = x.astype(np.float64)
    vals, codes = finite_values(fmt, table)
    vmax = vals[-1]
    top_ulp = 2.0 ** (fmt.emax - fmt.mbits)
    ext_vals = np.append(vals, vmax + top_ulp).astype(x.dtype)  # virtual next value
    ext_codes = np.append(codes, codes[-1] + 1)  # its parity = next code's
    neg = np.signbit(x)
    a = np.abs(x)
    nan = np.isnan(x)
    inf = np.isinf(x)
    af = np.where(nan | inf, 0.0, a)
    af_c = np.minimum(af, ext_vals[-1])
    hi_i = np.minimum(np.searchsorted(ext_vals, af_c, side="left"), ext_vals.size - 1)  # first value >= a
    exact = ext_vals[hi_i] == af_c
    lo_i = np.maximum(np.where(exact, hi_i, hi_i - 1), 0)
    lo = ext_vals[lo_i]
    hi = ext_vals[hi_i]
    mid = (lo + hi) / 2  # neighbours: exact (<= 12 significant bits) for formats of up to 16 bits
    return dict(
        neg=neg,
        a=a,
        af=af,
        af_c=af_c,
        nan=nan,
        inf=inf,
        lo=lo,
        hi=hi,
        exact=exact,
        above_mid=af_c > mid,
        at_mid=af_c == mid,
        lo_odd=(ext_codes[lo_i] & 1) == 1,
        beyond=af > ext_vals[-1],
        below=af < vals[0],
        vals=vals,
        vmax=vmax,
    )
    # (for float32 input the midpoint test is exact too: lo and hi are adjacent
    # values of a format of at most 16 bits, so (lo + hi) / 2 has at most 13
    # significant bits)


def round_reference(x, fmt, table, mode, saturate=False, u=None, b=None):
    """Round float64 array ``x`` to ``fmt`` by bracketing (see module doc).

    ``u`` (uniform in (0, 1]) is needed for mode "sr": round away iff
    ``u <= frac`` where frac is the fractional distance.  ``b`` is a
    precomputed :func:`bracket` of ``x`` (to try several modes cheaply).
    """
    b = bracket(x, fmt, table) if b is None else b
    neg, a, af, af_c = b["neg"], b["a"], b["af"], b["af_c"]
    lo, hi, exact, lo_odd = b["lo"], b["hi"], b["exact"], b["lo_odd"]
    vals, vmax = b["vals"], b["vmax"]
    if mode == "rne":
        up = b["above_mid"] | (b["at_mid"] & lo_odd)
    elif mode == "rna":
        up = b["above_mid"] | b["at_mid"]
    elif mode == "rtz":
        up = np.zeros(a.shape, bool)
    elif mode == "rup":
        up = ~neg
    elif mode == "rdn":
        up = neg
    elif mode == "rto":
        up = ~lo_odd  # pick the odd neighbour
    elif mode == "sr":
        up = u * np.where(hi > lo, hi - lo, 1.0) <= af_c - lo
    else:
        raise ValueError(mode)
    up = up & ~exact
    r = np.where(up, hi, lo)
    over = (r > vmax) | b["beyond"]
    if saturate or fmt.nan.value == "none":
        r = np.where(over, vmax, r)
    else:
        to_max = {"rtz": np.ones(a.shape, bool), "rto": np.ones(a.shape, bool), "rup": neg, "rdn": ~neg}.get(
            mode, np.zeros(a.shape, bool)
        )
        big = np.inf if fmt.inf else np.nan
        r = np.where(over, np.where(to_max, vmax, big), r)
    if not fmt.has_zero:
        r = np.where(b["below"], vals[0], r)
        r = np.where(af == 0, np.nan, r)
    out = np.where(neg, -r, r) if fmt.signed else r
    inf = b["inf"]
    if inf.any():
        sat_inf = saturate or fmt.nan.value == "none"
        inf_val = vmax if sat_inf else (np.inf if fmt.inf else np.nan)
        out = np.where(inf, np.where(neg, -inf_val, inf_val), out)
    if not fmt.signed:
        out = np.where(neg & (a != 0), np.nan, out)
    out = np.where(b["nan"], np.nan, out)
    if not fmt.has_negative_zero:
        out = np.where(out == 0, 0.0, out)
    return out
