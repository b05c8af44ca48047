"""Random Hadamard transforms (RHT): the 16x16 rotation TransformerEngine's NVFP4 recipe applies to
the operands of the Wgrad GEMM before quantizing them.

``H_n`` is the Sylvester Hadamard matrix (entries +-1, ``H_n H_n^T = n I``; ``n`` a power of two).
The random Hadamard transform of size ``n`` multiplies every run of ``n`` consecutive elements
along one axis by ``R = S H_n / sqrt(n)``, ``S`` a diagonal matrix of random signs (the sign of
row ``i`` of ``H_n``); ``R`` is orthogonal (``R R^T = I``), so transforming both GEMM operands along
their reduction axis leaves the product unchanged::

    (A R_bd) (R_bd^T B) = A B        # R_bd: R repeated along the diagonal, K / n times

while each run of ``n`` elements is spread over all ``n`` outputs, which makes outliers smaller
relative to the rest of their block (TransformerEngine's NVFP4 documentation: "smoothing outliers
in the tensor distributions").

Signs: TransformerEngine uses one fixed sign vector for every layer and step
(:data:`TE_SIGNS`, hard-coded in its NVFP4 tensor module); :func:`rht_signs` returns it for
``seed=None`` and otherwise draws ``n`` signs from ``numpy.random.default_rng(seed)``, a fixed seed
giving fixed signs.

Arithmetic: :func:`rht` applies ``R`` with the fast Walsh-Hadamard butterfly in float64 (``log2 n``
stages of exact-order additions, then the exact scaling by ``1/sqrt(n)``, a power of two for
``n = 4**j``; for other powers of two the scaling is one float64 multiply), the same operations in
the same order on every machine.  When every partial sum is representable (float32 inputs whose
magnitudes span fewer than ``53 - 24 - 2 log2 n`` binades, e.g. data without tiny elements) the
result is exact, and :func:`inverse_rht` recovers the input bit for bit.  TransformerEngine computes
the transform on BF16 tensor cores with FP32 accumulation inside its fused quantization kernel;
that rounding is not modelled (:func:`rht` rounds once, where the caller casts the float64 result).
"""

from __future__ import annotations

import numpy as np

__all__ = ["TE_SIGNS", "hadamard_matrix", "rht_signs", "rht_matrix", "rht", "inverse_rht"]

#: the sign vector of TransformerEngine's NVFP4 random Hadamard transform (``get_wgrad_sign_vector``
#: in ``transformer_engine/pytorch/tensor/nvfp4_tensor.py``): ``S = diag(TE_SIGNS)``, shared by all
#: layers throughout training
TE_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], dtype=np.int8)


def _size(n) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1 or (int(n) & (int(n) - 1)):
        raise ValueError(f"Hadamard size must be a positive power of two, got {n!r}")
    return int(n)


def hadamard_matrix(n: int = 16) -> np.ndarray:
    """The ``n x n`` Sylvester Hadamard matrix (int8 entries +-1; ``H H^T = n I``), ``H_1 = [1]``,
    ``H_2n = [[H_n, H_n], [H_n, -H_n]]``.  ``n`` must be a power of two."""
    n = _size(n)
    h = np.ones((1, 1), dtype=np.int8)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]]).astype(np.int8)
    return h


def rht_signs(seed: int | None = None, n: int = 16) -> np.ndarray:
    """The ``n`` random signs (int8 +-1) of the transform: TransformerEngine's :data:`TE_SIGNS`
    for ``seed=None`` (``n`` must be 16 then), else ``n`` signs drawn from
    ``numpy.random.default_rng(seed)`` (the same seed, the same signs)."""
    n = _size(n)
    if seed is None:
        if n != TE_SIGNS.size:
            raise ValueError(f"TransformerEngine's sign vector has {TE_SIGNS.size} entries; pass a seed for n={n}")
        return TE_SIGNS.copy()
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"rht seed must be None (TransformerEngine's signs) or an int, got {type(seed).__name__}")
    rng = np.random.default_rng(int(seed))
    return np.where(rng.integers(0, 2, size=n) == 1, 1, -1).astype(np.int8)


def rht_matrix(n: int = 16, seed: int | None = None) -> np.ndarray:
    """``R = diag(signs) H_n / sqrt(n)`` (float64; orthogonal): the matrix :func:`rht` applies to
    every run of ``n`` elements (``y = x R`` for a row ``x``)."""
    n = _size(n)
    s = rht_signs(seed, n).astype(np.float64)
    return (s[:, None] * hadamard_matrix(n).astype(np.float64)) / np.sqrt(np.float64(n))


def _butterfly(v: np.ndarray, n: int) -> np.ndarray:
    """``v (..., n) @ H_n`` by the fast Walsh-Hadamard transform (float64, fixed order)."""
    h = 1
    while h < n:
        v = v.reshape(v.shape[:-1] + (n // (2 * h), 2, h))
        a, b = v[..., 0, :], v[..., 1, :]
        v = np.stack([a + b, a - b], axis=-2).reshape(v.shape[:-3] + (n,))
        h *= 2
    return v


def _runs(x, axis: int, n: int, who: str) -> tuple[np.ndarray, int]:
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise TypeError(f"{who}: x must be a float array, got dtype {a.dtype}")
    if a.ndim == 0:
        raise ValueError(f"{who}: x must have at least one dimension")
    ax = axis % a.ndim if -a.ndim <= axis < a.ndim else None
    if ax is None:
        raise ValueError(f"{who}: axis {axis} out of range for {a.ndim} dimensions")
    if a.shape[ax] % n:
        raise ValueError(
            f"{who}: the length along axis {axis} ({a.shape[ax]}) must be a multiple of the transform size {n} "
            "(TransformerEngine needs the same for its 16x16 transform)"
        )
    return np.moveaxis(a.astype(np.float64), ax, -1), ax


def rht(x, axis: int = -1, n: int = 16, seed: int | None = None) -> np.ndarray:
    """The random Hadamard transform of ``x`` along ``axis``: every run of ``n`` consecutive
    elements ``v`` becomes ``v R`` with ``R = diag(signs) H_n / sqrt(n)`` (:func:`rht_matrix`).

    Returns float64.  The length along ``axis`` must be a multiple of ``n`` (ValueError naming
    it); NaN and inf propagate to their run (IEEE arithmetic).  For a GEMM ``A @ B``, transform
    ``A`` along axis 1 and ``B`` along axis 0 with the same ``n`` and ``seed``: the product is
    unchanged (up to the rounding of the transformed operands).
    """
    n = _size(n)
    v, ax = _runs(x, axis, n, "rht")
    s = rht_signs(seed, n).astype(np.float64)
    shp = v.shape
    v = v.reshape(shp[:-1] + (shp[-1] // n, n)) * s  # S first: (v S) H = v (S H)
    with np.errstate(invalid="ignore", over="ignore"):
        y = _butterfly(v, n) * (1.0 / np.sqrt(np.float64(n)))
    return np.moveaxis(y.reshape(shp), -1, ax)


def inverse_rht(y, axis: int = -1, n: int = 16, seed: int | None = None) -> np.ndarray:
    """The inverse of :func:`rht` (``v -> v R^T``; float64): ``inverse_rht(rht(x)) == x`` exactly
    when the transform's sums are exact (see the module docstring)."""
    n = _size(n)
    v, ax = _runs(y, axis, n, "inverse_rht")
    s = rht_signs(seed, n).astype(np.float64)
    shp = v.shape
    v = v.reshape(shp[:-1] + (shp[-1] // n, n))
    with np.errstate(invalid="ignore", over="ignore"):
        x = _butterfly(v, n) * (1.0 / np.sqrt(np.float64(n))) * s  # v R^T = v H^T S / sqrt(n), H symmetric
    return np.moveaxis(x.reshape(shp), -1, ax)
