"""Accumulators by architecture: Hopper, Blackwell and CDNA3 on the same FP8 products.

For each input family of :mod:`fp8sim.studies.accumulation` (``"normal"``, ``"uniform"``,
``"outlier"``) A (M x K) and B (K x N) are drawn, scaled so that their largest magnitude is 240
and quantized to e4m3 without block scales (RNE, saturating).  Every such value is also an
e4m3fnuz value (e4m3 below 240 re-encoded), so the three accumulators multiply *the same*
products:

* ``"sm90 wgmma"`` -- Hopper's FP8 ``wgmma`` (13 fraction bits, truncation; validated on H200),
  without promotion and with promotion into fp32 every 128 (DeepSeek-V3);
* ``"sm100 tcgen05 f8f6f4"`` -- Blackwell's ``tcgen05.mma kind::f8f6f4`` (25 bits, truncation),
  without and with promotion every 128;
* ``"cdna3 mfma"`` -- MI300's fp8 MFMA (two interleaved 24-bit lanes, round-down, RNE at the
  output), without and with promotion every 128.

The reference is the float64 product of the same FP8 values, so the errors are the accumulators'
alone.  Errors are :func:`fp8sim.studies.accumulation.errors` (max and median elementwise relative
error, relative Frobenius norm).  The Blackwell and CDNA3 models are "matches MMA-Sim (validated
by its authors)", not validated by fp8sim on hardware (docs/accelerators.md).
"""

from __future__ import annotations

import numpy as np

from ..formats import format as _get_format
from .accumulation import DISTRIBUTIONS, errors, make_inputs

__all__ = ["ACCUMULATORS", "KS", "COLUMNS", "compare_accumulators", "fnuz_codes"]

#: (label, arch, instruction, a/b format): the accumulators compared
ACCUMULATORS = (
    ("sm90 wgmma", "sm90", "wgmma", "e4m3"),
    ("sm100 tcgen05 f8f6f4", "sm100", "tcgen05.mma", "e4m3"),
    ("cdna3 mfma", "cdna3", "mfma", "e4m3fnuz"),
)
KS = (128, 512, 2048, 4096, 8192, 16384)
COLUMNS = ("distribution", "accumulator", "K", "promote_every", "max_rel", "median_rel", "rel_frobenius", "n")
_AMAX = 240.0  # the largest e4m3 value that e4m3fnuz also holds is 240


def _quantize(x: np.ndarray) -> np.ndarray:
    """The e4m3 values (RNE) of ``x`` scaled to amax 240 (the scale only sets the range)."""
    s = np.float32(_AMAX / float(np.max(np.abs(x))))
    y = np.minimum(np.abs(x * s), np.float32(_AMAX)) * np.sign(x)
    return y.astype(np.float32).astype(_get_format("e4m3").ml_dtype).astype(np.float32)


def fnuz_codes(values: np.ndarray) -> np.ndarray:
    """The e4m3fnuz codes of float values that e4m3fnuz holds exactly (ValueError otherwise)."""
    dt = _get_format("e4m3fnuz").ml_dtype
    codes = np.asarray(values, np.float32).astype(dt)
    if not np.array_equal(codes.astype(np.float32), np.asarray(values, np.float32)):
        raise ValueError("values not exactly representable in e4m3fnuz")
    return codes.view(np.uint8)


def _codes(values: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "e4m3fnuz":
        return fnuz_codes(values)
    return np.asarray(values, np.float32).astype(_get_format(fmt).ml_dtype).view(np.uint8)


def compare_accumulators(
    Ks=KS,
    distributions=DISTRIBUTIONS,
    M: int = 16,
    N: int = 16,
    promotions=(None, 128),
    seed: int = 0,
) -> list[dict]:
    """The accumulators of :data:`ACCUMULATORS` on the same e4m3 products, errors vs fp64.

    Returns one dict per (distribution, accumulator, K, promotion) with the keys of
    :data:`COLUMNS` (``promote_every`` 0 for none).  Inputs are drawn once per (distribution, K)
    with ``numpy.random.default_rng(seed)``.
    """
    import fp8sim.tensorcore as tc

    rows = []
    for dist in distributions:
        for K in Ks:
            rng = np.random.default_rng([seed, K, DISTRIBUTIONS.index(dist) if dist in DISTRIBUTIONS else 0])
            x, w = make_inputs(dist, M, K, N, rng)
            xq, wq = _quantize(x), _quantize(w)
            ref = xq.astype(np.float64) @ wq.astype(np.float64)
            for label, arch, instr, fmt in ACCUMULATORS:
                a, b = _codes(xq, fmt), _codes(wq, fmt)
                for p in promotions:
                    y = tc.matmul(a, b, a_format=fmt, b_format=fmt, instruction=instr, arch=arch, promote_every=p)
                    e = errors(ref, y)
                    rows.append({"distribution": dist, "accumulator": label, "K": K, "promote_every": p or 0, **e})
    return rows
