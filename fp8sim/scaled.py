"""FP8 GEMMs on codes and scales the user already has, as the GEMM libraries run them.

:func:`scaled_gemm` is ``torch._scaled_mm`` / a Triton or DeepGEMM kernel rebuilt on the CPU:
FP8 codes and fp32 scales in, the output format's values out, with every arithmetic choice a
library makes taken from the :class:`~fp8sim.Recipe` (docs/libraries.md):

* the tensor-core accumulator and how often its partial leaves it (``accumulator``,
  ``promote_every``);
* split-K (``split_k`` slices starting on multiples of ``split_granule``, summed in fp32 in
  ``split_order``: cuBLASLt's ``splitKreduce`` kernel);
* where the scales are applied: at each promotion (``scale_at="promotion"``, with
  ``scale_application`` ``"fma"`` or ``"mul-add"``; 1x128 / 128x128 blockwise scales) or in the
  epilogue (``scale_at="epilogue"``, in the fp32 order ``epilogue_scale``; tensorwise and
  rowwise scales);
* the output rounding (``output_format``).

:func:`run_codes` is the one engine: :func:`fp8sim.gemm` calls it after quantizing, and
:func:`fp8sim.identify` searches its parameters.
"""

from __future__ import annotations

import numpy as np

from ._fpenv import ieee_defaults
from ._inputs import float_input
from .formats import Format
from .formats import format as get_format
from .gemm_core import apply_epilogue, cast_output, combine_slices, k_slices, scaled_matmul, split_sum
from .recipes import Recipe
from .recipes import recipe as get_recipe

__all__ = [
    "scaled_gemm",
    "run_codes",
    "k_slices",
    "combine_slices",
    "apply_epilogue",
    "scale_blocks",
    "as_codes",
    "pad_k",
    "padded_k",
]

BLOCK = 128  #: the K (and N) extent of one 1x128 / 128x128 scale block


def padded_k(K: int, promote_every: int | None) -> int:
    """K rounded up to whole promotion intervals (to whole MMAs of 32 without promotion): the
    zero-padded K the kernel runs over."""
    step = max(32, promote_every or 32)
    return -(-K // step) * step


def _xp(a):
    """The array module of ``a``: CuPy for CuPy device arrays, else NumPy."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def pad_k(codes: np.ndarray, Kp: int, axis: int) -> np.ndarray:
    """``codes`` zero-padded along ``axis`` (its K axis) to ``Kp`` (contiguous; NumPy or CuPy)."""
    xp = _xp(codes)
    K = codes.shape[axis]
    if Kp == K:
        return xp.ascontiguousarray(codes)
    pad = [(0, 0), (0, 0)]
    pad[axis] = (0, Kp - K)
    return xp.pad(codes, pad)


def _slice_scales(s: np.ndarray, axis: int, k0: int, k1: int, kscale: int) -> np.ndarray:
    if s.shape[axis] == 1:
        return s
    sl = slice(k0 // kscale, -(-k1 // kscale))
    return _xp(s).ascontiguousarray(s[:, sl] if axis == 1 else s[sl])


def run_codes(A, B, sa, sb, kscale: int, a_format, b_format, r: Recipe, *, K=None, fidelity="exact", backend="cpu"):
    """The fp32 accumulator (before the output cast) of recipe ``r`` on codes ``A (M, Kp)`` and
    ``B (Kp, N)`` (uint8) and fp32 scales ``sa (M, nks)``, ``sb (nks, N)`` per K block of ``kscale``
    elements (``nks == 1``: one scale over all of K).  ``K`` is the true K when the codes are
    already zero-padded (the split-K boundaries depend on it).

    With ``split_k == 1`` and the ``"alpha"`` epilogue this is one :func:`scaled_matmul` call;
    otherwise each K slice is its own :func:`scaled_matmul` (scales at promotion applied inside
    the slice), the slices are summed by :func:`combine_slices`, and epilogue scales are applied
    by :func:`apply_epilogue`.
    """
    Kp = A.shape[1]
    K = Kp if K is None else int(K)
    kw = dict(
        a_format=a_format,
        b_format=b_format,
        accumulator=r.accumulator,
        promote_every=r.promote_every,
        scale_application=r.scale_application,
        fidelity=fidelity,
        backend=backend,
    )
    epi = r.scale_at == "epilogue"
    if r.split_k == 1 and (not epi or r.epilogue_scale == "alpha"):
        return scaled_matmul(A, B, sa, sb, kscale=kscale, scale_at=r.scale_at, **kw)
    M, N = A.shape[0], B.shape[1]
    xp = _xp(A)
    ones_a, ones_b = xp.ones((M, 1), np.float32), xp.ones((1, N), np.float32)

    def part(k0: int, k1: int) -> np.ndarray:
        n = padded_k(k1 - k0, r.promote_every)
        a, b = pad_k(A[:, k0:k1], n, 1), pad_k(B[k0:k1], n, 0)
        if epi:
            return scaled_matmul(a, b, ones_a, ones_b, kscale=n, scale_at="epilogue", **kw)
        if k0 % kscale and sa.shape[1] * sb.shape[0] > 1:
            raise ValueError(
                f"split-K slice at K={k0} does not start on a scale block of {kscale}: split_granule "
                f"({r.split_granule}) must be a multiple of the scale block"
            )
        sa_s, sb_s = _slice_scales(sa, 1, k0, k1, kscale), _slice_scales(sb, 0, k0, k1, kscale)
        ks = kscale if sa_s.shape[1] * sb_s.shape[0] > 1 else n
        return scaled_matmul(a, b, sa_s, sb_s, kscale=ks, scale_at="promotion", **kw)

    acc = split_sum(K, r, part, Kp)  # the zero padding belongs to the last slice
    if epi:
        acc = apply_epilogue(acc, sa[:, :1], sb[:1, :], r.epilogue_scale)
    return acc


# ------------------------------------------------------------------ scaled_gemm: inputs
def _torch_to_numpy(x):
    """A torch tensor as numpy (float8 as uint8 codes, with its format name); anything else as is."""
    mod = type(x).__module__
    if not mod.startswith("torch"):
        return x, None
    t = x.detach().cpu()
    name = str(t.dtype).replace("torch.", "")
    fmts = {
        "float8_e4m3fn": "e4m3",
        "float8_e5m2": "e5m2",
        "float8_e4m3fnuz": "e4m3fnuz",
        "float8_e5m2fnuz": "e5m2fnuz",
    }
    if name in fmts:
        import torch

        return t.contiguous().view(torch.uint8).numpy(), fmts[name]
    if name == "bfloat16":
        return t.float().numpy(), None
    return t.numpy(), None


def as_codes(x, fmt, who: str, name: str) -> tuple[np.ndarray, Format]:
    """``x`` as a 2-D uint8 code array and its format: uint8 codes in format ``fmt``, or an
    ml_dtypes / torch float8 array whose dtype must be ``fmt`` (TypeError / ValueError otherwise)."""
    f = get_format(fmt) if not isinstance(fmt, Format) else fmt
    if f.bits != 8:
        raise ValueError(f"{who}: {name}_format must be an 8-bit format, got {f.name} ({f.bits} bits)")
    if not f.signed or not f.subnormals:
        raise ValueError(
            f"{who}: {name}_format {f.name!r} is not an element format (unsigned, without zero: "
            f"{'E8M0 is the MX scale format' if f.name == 'e8m0' else 'a scale-only format'}); the operands "
            "take signed formats with zero (e4m3, e5m2, ...)"
        )
    x, tfmt = _torch_to_numpy(x)
    a = np.asarray(x)
    if tfmt is not None and get_format(tfmt) != f:
        raise ValueError(f"{who}: {name} is a torch {tfmt} tensor but {name}_format is {f.name!r}")
    if a.dtype != np.uint8:
        dt = str(a.dtype)
        if dt.startswith("float8"):
            if f.ml_dtype is None or np.dtype(f.ml_dtype) != a.dtype:
                raise ValueError(f"{who}: {name} has dtype {dt} but {name}_format is {f.name!r}")
            a = a.view(np.uint8)
        else:
            raise TypeError(
                f"{who}: {name} must hold FP8 codes: a uint8 array, an ml_dtypes float8 array or a "
                f"torch float8 tensor, got dtype {dt}"
            )
    if a.ndim != 2:
        raise ValueError(f"{who}: {name} must be 2-D, got shape {a.shape}")
    if 0 in a.shape:
        raise ValueError(f"{who}: {name} must not be empty, got shape {a.shape}")
    return np.ascontiguousarray(a), f


def _scale_array(s, who: str, name: str) -> np.ndarray:
    s, _ = _torch_to_numpy(s)
    arr = np.asarray(s)
    if arr.dtype.kind not in "fiu" or arr.dtype == np.bool_:
        raise TypeError(f"{who}: {name} must be a float array of scales, got dtype {arr.dtype}")
    if arr.dtype == np.float64 or arr.dtype.kind in "iu":
        # scales are fp32 on every library: a float64 scale that is not an fp32 value is refused
        a32 = arr.astype(np.float32)
        with np.errstate(invalid="ignore"):
            lost = (a32.astype(arr.dtype) != arr) & ~np.isnan(arr.astype(np.float64))
        if np.any(lost):
            raise ValueError(f"{who}: {name} holds values that are not float32 (the libraries' scales are fp32)")
        arr = a32
    else:
        arr, _ = float_input(arr, who, name)
        arr = arr.astype(np.float32)
    return np.ascontiguousarray(arr)


def scale_blocks(a_scale, b_scale, M: int, N: int, K: int, layout: str, who: str = "fp8sim.scaled_gemm"):
    """The scales as the engine takes them: ``(sa (M, nks), sb (nks, N), kscale, kinds)`` with
    ``kinds`` the granularity names of each operand ("tensor", "row", "col", "1x128", "128x128").

    A ``(1, N)`` ``b_scale`` with layout ``"nk"``, ``N <= 128`` and ``ceil(K/128) == N`` fits both
    per-column scales and 128x128 blocks: it is read as blocks when ``a_scale`` holds 1x128 blocks
    (more than one along K), as per-column scales otherwise.

    Accepted shapes: ``a_scale`` ``()`` / ``(1,)`` / ``(1, 1)`` (tensorwise), ``(M, 1)`` (rowwise),
    ``(M, ceil(K/128))`` (1x128); ``b_scale`` ``()`` (tensorwise), ``(1, N)`` (per output column),
    ``(ceil(K/128), ceil(N/128))`` with layout ``"kn"`` or ``(ceil(N/128), ceil(K/128))`` with
    layout ``"nk"`` (128x128).  Anything else is a ValueError naming these shapes."""
    nkb, nnb = -(-K // BLOCK), -(-N // BLOCK)
    sa = np.ones((1, 1), np.float32) if a_scale is None else _scale_array(a_scale, who, "a_scale")
    sb = np.ones((1, 1), np.float32) if b_scale is None else _scale_array(b_scale, who, "b_scale")
    if sa.size == 1 and sa.ndim <= 2:
        ka, sa2 = "tensor", np.full((M, 1), sa.reshape(()), np.float32)
    elif sa.shape == (M, 1):
        ka, sa2 = "row", sa
    elif sa.shape == (M, nkb):
        ka, sa2 = "1x128", sa
    else:
        raise ValueError(
            f"{who}: a_scale has shape {sa.shape}; for a (M, K) = ({M}, {K}) operand it must be () "
            f"(tensorwise), ({M}, 1) (rowwise) or ({M}, {nkb}) (1x128 blocks along K)"
        )
    blk = (nkb, nnb) if layout == "kn" else (nnb, nkb)
    if sb.size == 1 and sb.ndim <= 2:
        kb, sb2 = "tensor", np.full((1, N), sb.reshape(()), np.float32)
    elif sb.shape == (1, N) and not (blk == (1, N) and ka == "1x128" and nkb > 1):
        # (1, N) is also the 128x128 block shape with layout "nk" when N <= 128 and ceil(K/128) == N:
        # blocks when a's scales are 1x128 blocks (the blockwise GEMM), per column otherwise
        kb, sb2 = "col", sb
    elif sb.shape == blk:
        kb = "128x128"
        sbk = sb if layout == "kn" else sb.T
        sb2 = np.repeat(sbk, BLOCK, axis=1)[:, :N]
    else:
        raise ValueError(
            f"{who}: b_scale has shape {sb.shape}; for b of (K, N) = ({K}, {N}) with layout={layout!r} it must "
            f"be () (tensorwise), (1, {N}) (per output column) or {blk} (128x128 blocks"
            f"{', (ceil(K/128), ceil(N/128))' if layout == 'kn' else ', (ceil(N/128), ceil(K/128))'})"
        )
    kblocked = ka == "1x128" or kb == "128x128"
    if not kblocked:
        return np.ascontiguousarray(sa2), np.ascontiguousarray(sb2), None, (ka, kb)
    if sa2.shape[1] != nkb:
        sa2 = np.repeat(sa2, nkb, axis=1)
    if sb2.shape[0] != nkb:
        sb2 = np.repeat(sb2, nkb, axis=0)
    return np.ascontiguousarray(sa2), np.ascontiguousarray(sb2), BLOCK, (ka, kb)


def prepare(a_codes, b_codes, a_scale, b_scale, a_format, b_format, layout, who="fp8sim.scaled_gemm"):
    """The checked inputs of :func:`scaled_gemm`: ``(A (M, K), B (K, N), sa, sb, kscale, fa, fb, kinds)``."""
    if layout not in ("kn", "nk"):
        raise ValueError(f"{who}: layout must be 'kn' (b is (K, N)) or 'nk' (b is (N, K)), got {layout!r}")
    A, fa = as_codes(a_codes, a_format, who, "a")
    B, fb = as_codes(b_codes, b_format, who, "b")
    if layout == "nk":
        B = np.ascontiguousarray(B.T)
    M, K = A.shape
    if B.shape[0] != K:
        bshape = B.shape if layout == "kn" else B.shape[::-1]
        raise ValueError(
            f"{who}: inner dimensions differ: a is {A.shape} (K={K}), b is {bshape} with layout={layout!r} "
            f"(K={B.shape[0]})"
        )
    N = B.shape[1]
    sa, sb, kscale, kinds = scale_blocks(a_scale, b_scale, M, N, K, layout, who)
    return A, B, sa, sb, kscale, fa, fb, kinds


def padded_inputs(A, B, sa, sb, kscale, r: Recipe):
    """Codes zero-padded along K to whole promotion intervals (whole MMAs without promotion) and
    the block length ``kscale`` the engine takes (the padded K for one scale over all of K)."""
    K = A.shape[1]
    Kp = padded_k(K, r.promote_every)
    if kscale is not None and r.promote_every is not None and kscale % r.promote_every:
        raise ValueError(
            f"recipe {r.name!r}: promote_every={r.promote_every} does not divide the scale blocks of {kscale} along K"
        )
    if kscale is not None:
        nks = -(-Kp // kscale)
        if sa.shape[1] < nks:  # the padding's blocks: their codes are zero, any scale will do
            sa = np.pad(sa, ((0, 0), (0, nks - sa.shape[1])), mode="edge")
            sb = np.pad(sb, ((0, nks - sb.shape[0]), (0, 0)), mode="edge")
    return pad_k(A, Kp, 1), pad_k(B, Kp, 0), sa, sb, (Kp if kscale is None else kscale)


def _check_block_scaled_formats(r: Recipe, fa: Format, fb: Format) -> None:
    """A block-scaled recipe (MXFP8 / MXFP4 / NVFP4) in :func:`scaled_gemm`: its MMA must multiply
    the codes' formats (``kind::mxf4`` and ``kind::mxf4nvf4`` take E2M1 only, not 8-bit codes)."""
    from .tensorcore import archs

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
