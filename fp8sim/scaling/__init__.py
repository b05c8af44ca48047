"""Scaled quantization: granularities, scale policies and :class:`QuantizedTensor`.

FP8 is only usable with scaling: a tensor is cut into blocks, each block
gets a scale, and the elements are divided by their block's scale before
they are rounded to the FP8 format.  This package offers every granularity
and scale policy in common use through one mechanism.

Modules: :mod:`~fp8sim.scaling.granularities` (how blocks are cut),
:mod:`~fp8sim.scaling.policy` (a block's scale from its amax),
:mod:`~fp8sim.scaling.rows` and ``fp8sim.scaling._kernels`` (the numba
kernels), :mod:`~fp8sim.scaling.tensor` (:class:`QuantizedTensor`) and
:mod:`~fp8sim.scaling.quantization` (:func:`quantize`).

Scale convention
----------------
Every scale stored here is a **dequantization scale**::

    x  ~=  decode(codes) * scale * global_scale

so that ``scale = amax * 2**margin / fmt.max`` for the amax-based policies
(DeepSeek-V3 / DeepGEMM store ``amax / 448`` in the same sense; OCP MX's
``X`` is one too).  TransformerEngine stores the reciprocal ("quantization
scale" ``fmt.max / amax``); :attr:`QuantizedTensor.scales` holds ``1/that``.
``global_scale`` is 1.0 except for the two-level NVFP4-style granularity.

Elements are converted as ``round(x / (scale * global_scale))``, the single
rounding of the exact quotient in every mode and for every input dtype: a
float64 quotient is re-rounded to odd from its exact (FMA) residual, and
where it would underflow (tiny elements, large scales) the element is
rounded with the exponent range shifted instead, so directed modes see
every nonzero quotient (float32 paths: see :func:`~fp8sim.scaling.rows.round_row`).

Granularities and scale layouts
-------------------------------
``scales`` always has as many dimensions as ``x``; along each axis its
length is ``ceil(x.shape[d] / block_shape[d])``: the blocks tile ``x`` from
the origin and the **ragged edge is its own smaller block** (never padded
with values that would enter the amax).  ``scales[idx]`` belongs to the
elements ``x[idx[0]*b0 : (idx[0]+1)*b0, ...]``.  A 1-D ``x`` is one row.
Dimensions before the last two are batch dimensions: blocks never span two
matrices of a batch, except for ``"tensor"`` (one scale for everything).

============== ==================== ============================================
name           block_shape           scales shape for x of shape (..., M, N)
============== ==================== ============================================
``tensor``     whole tensor          (1, ..., 1, 1)
``row``        (1, N)                (..., M, 1)        per token
``col``        (M, 1)                (..., 1, N)        per channel
``1xN``        (1, N)  e.g. 1x128    (..., M, ceil(N/128))  DeepSeek-V3 activations
``RxC``        (R, C)  e.g. 128x128  (..., ceil(M/128), ceil(N/128))  DeepSeek-V3 weights
``gG``         G along ``axis``      ``x.shape`` with ``shape[axis] -> ceil(shape[axis]/G)``
``mxK``        K along ``axis``      like ``gK``; E8M0 scales (OCP MX v1.0)
``nvfp4``      16 along ``axis``     like ``g16``; E4M3 block scales x FP32 ``global_scale``
``delayed``    whole tensor          (1, ..., 1); scale from an amax history
============== ==================== ============================================

Delayed scaling keeps state (its amax history): make the object once
(``g = fp8sim.granularity("delayed")`` or :class:`DelayedScaling`) and pass it
to every :func:`quantize` call; the name alone raises ValueError.  The object is frozen
(``history_len``, ``algo``); its history is the :class:`AmaxHistory` in ``g.state``.

New granularities
-----------------
Subclass :class:`Granularity` (a frozen dataclass: ``name``, ``_view`` and, where they differ from
the defaults, ``transposed()``, ``k_block()``, ...) and register its spelling with
:func:`register_granularity`: ``fp8sim.granularity``, :func:`quantize` and recipe strings then
know it.

Scale policies
--------------
``scale_format``: ``"fp32"`` (amax/max rounded to float32), ``"bf16"``,
``"pow2"`` (a power of two in float32, exponent in -126..127) or ``"e8m0"``
(a power of two, exponent in -127..127, OCP MX).  Power-of-two scales are
rounded by ``scale_rounding``:

* ``"floor"`` (the round mode ``"rdn"``): ``2**(floor(log2 amax) - emax_elem)``
  (OCP MX v1.0; the largest elements may exceed ``fmt.max`` and saturate),
* ``"ceil"`` (``"rup"``): ``2**(ceil(log2 amax) - emax_elem)`` (never
  overflows; may waste a binade),
* ``"rceil"``: ``2**ceil(log2(float32(amax / fmt.max)))`` (NVIDIA's MXFP8
  recipe, cuBLAS "RCEIL", PTX ``cvt.rp`` to ue8m0: the smallest power of two
  with which nothing overflows),
* ``"even"``: ``2**(floor(log2 r) - emax_elem)`` with ``r`` = amax rounded
  to the element's precision, half up (torchao's EVEN).

``"rceil"`` and ``"even"`` are scale rules, not element rounding modes; the
mode names and aliases of ``"floor"`` and ``"ceil"`` are accepted
(``"rdn"``, ``RoundMode.RDN``, ``"rup"``, ...) and stored by these two names.

``bf16`` scales round the float32 scale up (``"ceil"``/``"rceil"``, the
default, so nothing overflows), down (``"floor"``) or to nearest
(``"even"``).  ``margin`` (an int) multiplies every scale by
``2**margin`` (TransformerEngine's margin: headroom of ``margin`` binades).

Zero, tiny and non-finite values
--------------------------------
* Scales are clamped to the scale format's positive normal range (fp32,
  bf16, pow2: ``[2**-126, max]``; e8m0 ``[2**-127, 2**127]``), so all-zero
  and all-tiny blocks get a finite, nonzero scale (never NaN/inf).
* ``+-inf`` does not enter amax; it is converted like any overflow:
  ``saturate=True`` (the default, OCP "satfinite") gives ``+-max``, else
  inf (e5m2) or NaN (e4m3).  :func:`fp8sim.metrics.fraction_saturated`
  reports it.
* NaN enters amax, so a block holding a NaN gets a NaN scale and
  dequantizes to NaN -- the NaN propagates to its block only (as in OCP MX,
  where a NaN scale makes the whole block NaN).  With ``ignore_nan=True``
  amax skips NaN and only the NaN element itself stays NaN.
"""

from __future__ import annotations

from .granularities import (
    MX,
    NVFP4,
    AmaxHistory,
    DelayedScaling,
    Granularity,
    Group,
    PerColumn,
    PerRow,
    PerTensor,
    Tile,
)
from .names import granularity, granularity_names, register_granularity
from .quantization import quantize
from .tensor import QuantizedTensor, dequantize

__all__ = [
    "Granularity",
    "PerTensor",
    "PerRow",
    "PerColumn",
    "Tile",
    "Group",
    "MX",
    "NVFP4",
    "DelayedScaling",
    "AmaxHistory",
    "register_granularity",
    "QuantizedTensor",
    "granularity",
    "granularity_names",
    "quantize",
    "dequantize",
]
