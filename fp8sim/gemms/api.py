"""The public GEMMs: :func:`gemm` (float operands, quantized as the recipe says) and
:func:`scaled_gemm` (FP8 codes and scales the user already has, as a library runs them).

``fp8sim.gemm(x, w, recipe)`` quantizes ``x (M, K)`` and ``w (K, N)`` (or
``(N, K)`` with ``layout="nk"``) as the :class:`~fp8sim.gemms.recipes.Recipe` says,
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

The stages are: :func:`quantize_operands` (recipe granularities laid along K by
:func:`along_k`), :func:`kernel_inputs` (codes zero-padded along K, scales per K block:
:func:`k_scales`, :func:`pad_k`), :func:`~fp8sim.gemms.engine.scaled_matmul` (the arithmetic, in
:mod:`fp8sim.gemms.engine`), the output cast, and on request the :class:`GemmReport`
(:mod:`fp8sim.gemms.error_report`).

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

:func:`scaled_gemm` is ``torch._scaled_mm`` / a Triton or DeepGEMM kernel rebuilt on the CPU: FP8
codes and fp32 scales in, the output format's values out, with every arithmetic choice a library
makes taken from the :class:`~fp8sim.Recipe` (docs/libraries.md).
"""

from __future__ import annotations

import numpy as np

from .._fpenv import ieee_defaults
from .._inputs import flag
from ..formats import Format
from ..formats import format as get_format
from ..scaling import QuantizedTensor
from .device import is_device_array
from .engine import cast_output, run_codes, wide_matmul
from .error_report import GemmReport, fp8_gemm_report, wide_gemm_report
from .operands import check_inputs, kernel_inputs, padded_inputs, prepare, quantize_operands
from .presets import recipe as get_recipe
from .recipes import Recipe

__all__ = ["gemm", "scaled_gemm", "GemmReport"]


def _fp8(qx: QuantizedTensor, qw: QuantizedTensor, r: Recipe, fidelity: str, backend: str = "cpu"):
    parts = kernel_inputs(qx, qw, r.promote_every)
    A, B, sa, sb, kscale = parts
    y32 = run_codes(A, B, sa, sb, kscale, qx.format, qw.format, r, K=qx.shape[1], fidelity=fidelity, backend=backend)
    return y32, parts


def _gemm_on_device(x, w, r: Recipe, report: bool, layout: str, fidelity: str):
    """:func:`gemm` on GPU device arrays (:mod:`fp8sim.gemms.device`): a CuPy array out."""
    from .device import as_cupy, gemm_device, is_device_array  # noqa: F811

    if not (is_device_array(x) and is_device_array(w)):
        raise TypeError("fp8sim.gemm: x and w must both be device arrays (CuPy or CUDA torch) or both host arrays")
    if report:
        raise NotImplementedError("fp8sim.gemm: report=True needs host arrays (the report's fp64 GEMMs run on the CPU)")
    if fidelity != "exact":
        raise NotImplementedError("fp8sim.gemm: fidelity='fast' on device arrays; the GPU path is the exact model")
    if not r.is_fp8:  # the wide recipes: computed on the host, returned on the device
        import cupy as cp

        return cp.asarray(gemm(cp.asnumpy(as_cupy(x)), cp.asnumpy(as_cupy(w)), r, layout=layout))
    return gemm_device(x, w, r, layout)


# ------------------------------------------------------------------ public
@ieee_defaults
def gemm(
    x,
    w,
    recipe="deepseek-v3",
    *,
    report: bool = False,
    layout: str = "kn",
    backend: str = "cpu",
    fidelity: str = "exact",
    baseline="bf16",
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
        GPU, bit-identical; needs CuPy; wgmma-type accumulators and fidelity="exact" only).  With
        ``"cupy"``, ``x`` and ``w`` may be CuPy arrays or CUDA torch tensors: quantization, kernel
        and output cast then run on the GPU (:mod:`fp8sim.gemms.device`) and the result is a CuPy array
    baseline : the BF16 recipe the report compares against: ``"bf16"`` (numpy's float32 BLAS, the
        fast option) or ``"bf16-cublaslt"`` (the BF16 GEMM the H200 computes, cuBLASLt's
        arithmetic; pass ``.with_(split_k=...)`` for the library's split at your shape)
    fidelity : ``"exact"`` (bit-exact accumulator model) or ``"fast"`` (exact quantization and scale
        application, but each promotion interval's partial from float32 BLAS instead of the
        tensor-core model: NOT bit-exact, and not faster than ``"exact"`` for recipes that promote
        partial sums; see docs/gemm.md for its measured deviation and speed)

    Returns
    -------
    float32 (M, N) array holding output-format values (float64 for the ``"fp64"`` recipe / output),
    and the report when ``report=True``.
    """
    r = get_recipe(recipe)
    report = flag(report, "fp8sim.gemm", "report")
    base = get_recipe(baseline)
    if base.x_format != "bf16" or base.w_format != "bf16":
        raise ValueError(f"fp8sim.gemm: baseline must be a BF16 recipe ('bf16', 'bf16-cublaslt'), got {base.name!r}")
    if backend not in ("cpu", "cupy"):
        raise ValueError(f"fp8sim.gemm: backend must be 'cpu' or 'cupy', got {backend!r}")
    if fidelity not in ("exact", "fast"):
        raise ValueError(f"fp8sim.gemm: fidelity must be 'exact' or 'fast', got {fidelity!r}")
    if backend == "cupy" and (is_device_array(x) or is_device_array(w)):
        return _gemm_on_device(x, w, r, report, layout, fidelity)
    x, w = check_inputs(x, w, layout)
    if not r.is_fp8:
        y = wide_matmul(x, w, r)
        if report:
            return y, wide_gemm_report(x, w, r, y, baseline)
        return y
    if r.block_scaled:  # MX / NVFP4 scales folded into the MMA (Blackwell): fp8sim.gemms.block_scaled
        if report:
            raise NotImplementedError(f"fp8sim.gemm: report=True is not available for block-scaled recipes ({r.name})")
        from .block_scaled import block_scaled_gemm

        return block_scaled_gemm(x, w, r)
    qx, qw = quantize_operands(x, w, r)
    for name, q in (("x", qx), ("w", qw)):
        if q.format.bits != 8 or not q.format.fits_float32:
            raise ValueError(
                f"fp8sim.gemm: the tensor-core model multiplies 8-bit codes; {name} is quantized "
                f"to {q.format.name} ({q.format.bits} bits)"
            )
    y32, parts = _fp8(qx, qw, r, fidelity, backend)
    y = cast_output(y32, r.output_format)
    if report:
        return y, fp8_gemm_report(x, w, qx, qw, r, y, parts, baseline)
    return y


def _check_block_scaled_formats(r: Recipe, fa: Format, fb: Format) -> None:
    """A block-scaled recipe (MXFP8 / MXFP4 / NVFP4) in :func:`scaled_gemm`: its MMA must multiply
    the codes' formats (``kind::mxf4`` and ``kind::mxf4nvf4`` take E2M1 only, not 8-bit codes)."""
    from ..tensorcore import archs

    assert isinstance(r.accumulator, str)
    arch, _, key = r.accumulator.partition(":")
    takes = sorted({f for row in archs.ROWS if (row.arch, row.key) == (arch, key) for f in row.formats})
    bad = [f"{n}={f.name!r}" for n, f in (("a_format", fa), ("b_format", fb)) if f.name not in takes]
    if bad:
        eight = [f for f in takes if get_format(f).bits == 8]
        hint = (
            f"of these scaled_gemm takes {', '.join(eight)} codes"
            if eight
            else "scaled_gemm takes 8-bit codes, so it cannot run this recipe: use fp8sim.gemm (which quantizes "
            "with the recipe's block scales) or fp8sim.tensorcore.matmul with a_scale / b_scale"
        )
        raise ValueError(
            f"fp8sim.scaled_gemm: recipe {r.name!r} runs on the block-scaled MMA {r.accumulator!r}, which "
            f"multiplies {', '.join(takes)} only, not {' and '.join(bad)}; {hint}"
        )


@ieee_defaults
def scaled_gemm(
    a_codes,
    b_codes,
    a_scale,
    b_scale,
    recipe="cublaslt-tensor",
    *,
    a_format="e4m3",
    b_format="e4m3",
    layout: str = "kn",
    backend: str = "cpu",
) -> np.ndarray:
    """``y = (a_scale * a) @ (b_scale * b)`` on FP8 codes, as the library configuration ``recipe``
    computes it (bit for bit where the preset is ``validated``; docs/libraries.md).

    Parameters
    ----------
    a_codes : (M, K) uint8 codes of ``a_format``, an ml_dtypes float8 array or a torch float8 tensor
    b_codes : (K, N) codes (``layout="kn"``), or (N, K) (``layout="nk"``, torch's weight layout)
    a_scale : fp32 scales: ``()`` tensorwise, ``(M, 1)`` rowwise, ``(M, ceil(K/128))`` 1x128 blocks
    b_scale : ``()`` tensorwise, ``(1, N)`` per output column, 128x128 blocks as
        ``(ceil(K/128), ceil(N/128))`` (``"kn"``) or ``(ceil(N/128), ceil(K/128))`` (``"nk"``: the
        blocks of b as given).  torch's ``scale_b`` for ``torch._scaled_mm(a, w.t(), ...)`` is the
        ``(ceil(K/128), ceil(N/128))`` one: pass ``scale_b.T`` with ``layout="nk"`` (a square grid of
        blocks cannot tell the two apart)
    recipe : a preset name (``fp8sim.recipe_names()``: ``"cublaslt-tensor"``, ``"cublaslt-row-fast"``,
        ``"cublaslt-block"``, ``"triton"``, ``"deepseek-v3"``, ...) or a :class:`~fp8sim.Recipe`; its
        arithmetic fields are used (accumulator, promotion, scale placement and order, split-K,
        output format), not its formats and granularities (the codes' formats are given here, the
        granularity follows from the scale shapes)
    backend : ``"cpu"`` or ``"cupy"`` (the CUDA-core emulation kernel, bit-identical)

    Returns
    -------
    (M, N) float32 array holding values of the recipe's output format (float64 for ``"fp64"``).
    NaN / inf codes and scales follow IEEE arithmetic as the hardware does (a NaN scale makes
    every output it scales NaN).
    """
    r = get_recipe(recipe)
    if not r.is_fp8:
        raise ValueError(f"fp8sim.scaled_gemm: recipe {r.name!r} is not an FP8 recipe (its operands are {r.x_format})")
    A, B, sa, sb, kscale, fa, fb, kinds = prepare(a_codes, b_codes, a_scale, b_scale, a_format, b_format, layout)
    if r.block_scaled:
        _check_block_scaled_formats(r, fa, fb)
    if r.scale_at == "epilogue" and kscale is not None:
        raise ValueError(
            f"fp8sim.scaled_gemm: recipe {r.name!r} applies the scales in the epilogue (one scale per row / "
            f"column over all of K), but the scales are {kinds[0]} x {kinds[1]} blocks along K: use a recipe "
            "with scale_at='promotion' (e.g. 'cublaslt-block', 'deepseek-v3')"
        )
    if kscale is not None and r.split_k > 1 and r.split_granule % kscale:
        raise ValueError(f"fp8sim.scaled_gemm: split_granule {r.split_granule} is not a multiple of the scale block")
    K = A.shape[1]
    Ap, Bp, sa, sb, ks = padded_inputs(A, B, sa, sb, kscale, r)
    y = run_codes(Ap, Bp, sa, sb, ks, fa, fb, r, K=K, backend=backend)
    return cast_output(y, r.output_format)
