"""The one GEMM engine: FP8 codes and their scales in, the fp32 accumulator out, then the output cast.

* :func:`run_codes`: the engine of every FP8 GEMM of a recipe (:func:`fp8sim.gemm` after
  quantizing, :func:`fp8sim.scaled_gemm` on the user's codes, :func:`fp8sim.identify` searching its
  parameters, the device path on CuPy arrays): split-K slices (:func:`k_slices`, summed by
  :func:`combine_slices`), each one :func:`scaled_matmul`, then the epilogue scale order
  (:func:`apply_epilogue`);
* :func:`scaled_matmul`: codes and scales per K block in, fp32 out: the tensor-core partial of every
  promotion interval (an accumulator model of :mod:`fp8sim.tensorcore`), scaled and promoted into
  an fp32 accumulator (:func:`promote`), or scaled once in the epilogue;
* :func:`cast_output`: the fp32 accumulator to the recipe's output format (RNE, the hardware's
  canonical NaN);
* :func:`wide_matmul`: the unquantized recipes (bf16, fp32, fp64 operands, :func:`cast_operand`),
  on numpy's BLAS or, for ``accumulator="wgmma.bf16"``, on the H200's BF16 tensor-core model.
"""

from __future__ import annotations

import numpy as np

from .._fpenv import ieee_defaults
from ..formats import format as get_format
from ..intrinsics import fma32_array
from ..rounding import cast
from ..scaling import QuantizedTensor
from ..tensorcore import get_model
from ..tensorcore import matmul as tc_matmul
from ..tensorcore.cuda import cupy_wgmma_gemm, device_wgmma_gemm
from ..tensorcore.fast import (
    SCALE_EPILOGUE,
    SCALE_FMA,
    SCALE_MUL_ADD,
    code_tables,
    wgmma_gemm,
    wgmma_gemm_codes,
)
from ..tensorcore.kernels import NoKernelError, scaled_request, select, with_facts
from .operands import pad_k, padded_k, xp_of
from .recipes import BF16_ACCUMULATORS, SCALE_ATS, Recipe, is_int
from .specs import GemmSpec

__all__ = [
    "scaled_matmul",
    "promote",
    "cast_output",
    "cast_operand",
    "wide_matmul",
    "k_slices",
    "combine_slices",
    "apply_epilogue",
    "split_sum",
    "run_codes",
    "SCALE_MODES",
]

#: ``scale_application`` name -> the kernels' mode constant
SCALE_MODES = {"fma": SCALE_FMA, "mul-add": SCALE_MUL_ADD}


def _fma32(a, b, c):
    a, b, c = np.broadcast_arrays(np.asarray(a, np.float32), np.asarray(b, np.float32), np.asarray(c, np.float32))
    out = np.empty(a.shape, np.float32)
    fma32_array(
        np.ascontiguousarray(a).ravel(),
        np.ascontiguousarray(b).ravel(),
        np.ascontiguousarray(c).ravel(),
        out.reshape(-1),
    )
    return out


def promote(tot, part, s, mode):
    """One promotion step in fp32 (arrays): ``fma(s, part, tot)`` (``SCALE_FMA``),
    ``tot + fp32(s * part)`` (``SCALE_MUL_ADD``) or ``tot + part`` (``SCALE_EPILOGUE``)."""
    if mode == SCALE_FMA:
        return _fma32(s, part, tot)
    if mode == SCALE_MUL_ADD:
        return (tot + (s * part).astype(np.float32)).astype(np.float32)
    return (tot + part).astype(np.float32)


def _keep_bits(model) -> int:
    """The int32 mask that truncates an fp32 pattern to the model's output fraction bits."""
    return int(np.uint32((0xFFFFFFFF << (23 - model.out_frac_bits)) & 0xFFFFFFFF).view(np.int32))


def _check(a_codes, b_codes, sa, sb, fa, fb, kscale, promote_every, scale_at, scale_application, fidelity, backend):
    """The checks of :func:`scaled_matmul`; returns ``(P, mode)``."""
    for name, c, f in (("a", a_codes, fa), ("b", b_codes, fb)):
        if c.dtype != np.uint8 or c.ndim != 2:
            raise TypeError(f"scaled_matmul: {name}_codes must be a 2-D uint8 array, got {c.dtype} of shape {c.shape}")
        if f.bits != 8:
            raise ValueError(f"scaled_matmul: {name}_format must be an 8-bit format, got {f.name} ({f.bits} bits)")
    M, Kp = a_codes.shape
    N = b_codes.shape[1]
    if b_codes.shape[0] != Kp:
        raise ValueError(f"scaled_matmul: inner dimensions differ: a_codes {a_codes.shape}, b_codes {b_codes.shape}")
    if scale_at not in SCALE_ATS:
        raise ValueError(f"scaled_matmul: scale_at must be 'promotion' or 'epilogue', got {scale_at!r}")
    if scale_application not in SCALE_MODES:
        raise ValueError(
            f"scaled_matmul: scale_application must be one of {list(SCALE_MODES)}, got {scale_application!r}"
        )
    if fidelity not in ("exact", "fast") or backend not in ("cpu", "cupy"):
        raise ValueError(
            f"scaled_matmul: fidelity must be 'exact' or 'fast' and backend 'cpu' or 'cupy', "
            f"got {fidelity!r}, {backend!r}"
        )
    if not (is_int(kscale) and kscale > 0):
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
        return P, SCALE_MODES[scale_application]
    if sa.shape[1] != 1 or sb.shape[0] != 1:
        raise ValueError("scale_at='epilogue' needs one scale per row/column over all of K")
    return P, SCALE_EPILOGUE


@ieee_defaults
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
    kernel=None,
):
    """The FP8 core of :func:`fp8sim.gemm` on codes: ``a_codes (M, Kp)``, ``b_codes (Kp, N)`` uint8 (Kp a
    multiple of 32, already padded), ``sa (M, nks)``, ``sb (nks, N)`` float32 scales per K block of
    ``kscale`` elements (``nks == 1`` for ``scale_at="epilogue"``).  Returns the fp32 result.

    The kernel is the one :func:`fp8sim.tensorcore.kernels.select` picks for the accumulator model,
    formats, shape, ``fidelity`` and ``backend``; ``kernel`` (a name of a ``"scaled"`` kernel there)
    runs that one instead where it computes the request (for cross-checks and benchmarks)."""
    if isinstance(accumulator, str) and accumulator.strip().lower() in BF16_ACCUMULATORS:
        raise ValueError(
            f"scaled_matmul: accumulator {accumulator!r} is the BF16 tensor-core datapath; FP8 codes need "
            "an FP8 accumulator (e.g. 'wgmma')"
        )
    fa, fb = get_format(a_format), get_format(b_format)
    if type(a_codes).__module__.startswith("cupy"):  # device arrays in, a device array out
        return _device_scaled_matmul(
            a_codes,
            b_codes,
            sa,
            sb,
            fa,
            fb,
            kscale,
            accumulator,
            promote_every,
            scale_at,
            scale_application,
            fidelity,
            kernel,
        )
    a_codes, b_codes, sa, sb = np.asarray(a_codes), np.asarray(b_codes), np.asarray(sa), np.asarray(sb)
    P, mode = _check(
        a_codes, b_codes, sa, sb, fa, fb, kscale, promote_every, scale_at, scale_application, fidelity, backend
    )
    M, Kp = a_codes.shape
    N = b_codes.shape[1]
    sa = np.ascontiguousarray(sa, np.float32)
    sb = np.ascontiguousarray(sb, np.float32)
    model = None if accumulator == "fp64" else get_model(accumulator)
    # the kernel: fp8sim.tensorcore.kernels.select (the packed kernel checks the codes for inf / NaN
    # while it runs; where it finds some, the next kernel for finite_codes=False runs)
    req = scaled_request(model, fa, fb, m=M, n=N, k=Kp, fidelity=fidelity, backend=backend)
    kern = select(req, kernel)
    if kern.name == "cuda":
        assert model is not None
        return cupy_wgmma_gemm(
            a_codes, b_codes, fa, fb, sa, sb, int(kscale), P, mode, int(model.frac_bits), _keep_bits(model)
        )
    if kern.name == "packed":
        assert model is not None
        keep = np.int32(_keep_bits(model))
        out = wgmma_gemm_codes(a_codes, b_codes, fa, fb, sa, sb, int(kscale), P, mode, int(model.frac_bits), keep)
        if out is not None:
            return out
        if kernel is not None:
            raise NoKernelError("kernel 'packed' does not compute these operands: they hold inf / NaN codes")
        kern = select(with_facts(req, finite_codes=False))
    if kern.name == "wgmma":  # any codes, inf / NaN included
        assert model is not None
        keep = np.int32(_keep_bits(model))
        va, ea, spa = code_tables(fa)
        vb, eb, spb = code_tables(fb)
        bspec = spb[b_codes].any(axis=1)
        askip = np.ascontiguousarray((va[a_codes] == 0) & ~np.isnan(va[a_codes]) & ~bspec[None, :])
        out = np.empty((M, N), np.float32)
        with np.errstate(all="ignore"):
            wgmma_gemm(
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
    # "blas-fast", "fp64", "chain-loop": one partial per promotion interval, combined in fp32 here
    Av = code_tables(fa)[0][a_codes]
    Bv = code_tables(fb)[0][b_codes]
    step = P if P else Kp
    tot = np.zeros((M, N), np.float32)
    for k0 in range(0, Kp, step):
        k1 = min(Kp, k0 + step)
        if kern.name == "blas-fast":
            with np.errstate(all="ignore"):
                part = (Av[:, k0:k1] @ Bv[k0:k1]).astype(np.float32)
        elif kern.name == "fp64":
            with np.errstate(all="ignore"):
                part = (Av[:, k0:k1].astype(np.float64) @ Bv[k0:k1].astype(np.float64)).astype(np.float32)
        else:
            part = tc_matmul(a_codes[:, k0:k1], b_codes[k0:k1], a_format=fa, b_format=fb, instruction=model)
        if not P:
            tot = part
            break
        kb = k0 // kscale if mode != SCALE_EPILOGUE else 0
        s = (sa[:, kb : kb + 1] * sb[kb : kb + 1, :]).astype(np.float32)
        with np.errstate(all="ignore"):
            tot = promote(tot, part, s, mode)
    if mode == SCALE_EPILOGUE:
        with np.errstate(all="ignore"):
            tot = ((sa[:, :1] * sb[:1, :]).astype(np.float32) * tot).astype(np.float32)
    return tot


def _device_scaled_matmul(
    a_codes, b_codes, sa, sb, fa, fb, kscale, accumulator, promote_every, scale_at, scale_application, fidelity, kernel
):
    """:func:`scaled_matmul` on CuPy device arrays (``b_codes`` may be the transposed view of an
    (N, Kp) array: the kernel reads that layout without a copy)."""
    P, mode = _check(
        a_codes, b_codes, sa, sb, fa, fb, kscale, promote_every, scale_at, scale_application, fidelity, "cupy"
    )
    model = None if accumulator == "fp64" else get_model(accumulator)
    M, Kp = a_codes.shape
    req = scaled_request(model, fa, fb, m=M, n=b_codes.shape[1], k=Kp, fidelity=fidelity, backend="cupy")
    select(req, kernel)  # the one kernel on device arrays ("cuda"), or NoKernelError with every kernel's reason
    assert model is not None
    return device_wgmma_gemm(
        a_codes, b_codes, fa, fb, sa, sb, int(kscale), P, mode, int(model.frac_bits), _keep_bits(model)
    )


def k_slices(K: int, split_k: int, granule: int) -> list[tuple[int, int]]:
    """The K ranges ``[k0, k1)`` of a split-K GEMM: ``ceil(ceil(K / granule) / split_k)`` granules
    per slice, the last slice shorter; slices past the end of K are dropped (cuBLASLt's layout:
    docs/libraries.md)."""
    if split_k <= 1:
        return [(0, K)]
    granules = -(-K // granule)
    per = -(-granules // split_k) * granule
    return [(k0, min(K, k0 + per)) for k0 in range(0, K, per)]


def combine_slices(parts: list[np.ndarray], order: str) -> np.ndarray:
    """The fp32 sum of the slices' results: ``"sequential"`` (``((p0 + p1) + p2) + ...``),
    ``"reverse"`` (from the last slice) or ``"pairwise"`` (a binary tree over neighbours)."""
    if order == "reverse":
        parts = parts[::-1]
    # IEEE semantics, silently: slices that overflow fp32 add to inf, opposite infinities to NaN
    with np.errstate(over="ignore", invalid="ignore"):
        if order == "pairwise":
            while len(parts) > 1:
                nxt = [(parts[i] + parts[i + 1]).astype(np.float32) for i in range(0, len(parts) - 1, 2)]
                if len(parts) % 2:
                    nxt.append(parts[-1])
                parts = nxt
            return parts[0]
        tot = parts[0]
        for p in parts[1:]:
            tot = (tot + p).astype(np.float32)
    return tot


def apply_epilogue(acc: np.ndarray, sa: np.ndarray, sb: np.ndarray, order: str) -> np.ndarray:
    """The epilogue scaling of the fp32 accumulator by ``sa (M, 1)`` and ``sb (1, N)`` in fp32:
    ``"alpha"`` ``(sa * sb) * acc``, ``"b-then-a"`` ``(acc * sb) * sa``, ``"a-then-b"``
    ``(acc * sa) * sb``, each product rounded to fp32."""
    f = np.float32
    with np.errstate(all="ignore"):
        if order == "alpha":
            return ((sa * sb).astype(f) * acc).astype(f)
        if order == "b-then-a":
            return ((acc * sb).astype(f) * sa).astype(f)
        if order == "a-then-b":
            return ((acc * sa).astype(f) * sb).astype(f)
    raise ValueError(f"unknown epilogue_scale {order!r}")


def cast_output(y: np.ndarray, out_fmt: str) -> np.ndarray:
    """The accumulator ``y`` in the output format ``out_fmt``: ``"fp64"`` as float64; ``"bf16"``
    and ``"fp32"`` rounded once (RNE) into float32 storage, NaN as the hardware's canonical quiet
    NaN (``cvt.rn.bf16.f32``: 0x7FFF, fp32: 0x7FFFFFFF)."""
    if out_fmt == "fp64":
        return y.astype(np.float64)
    y = y.astype(np.float32)
    with np.errstate(all="ignore"):
        return cast(y, out_fmt, canonical_nan=True)


def cast_operand(a, fmt) -> np.ndarray:
    """An operand of an unquantized recipe in its format ``fmt`` (``"bf16"``, ``"fp32"``,
    ``"fp64"``): float64 for fp64, else float32 storage; bf16 rounded once (RNE) from the input's
    own precision (not float64 -> float32 -> bf16)."""
    a = np.asarray(a)
    if fmt == "fp64":
        return a.astype(np.float64)
    if fmt == "bf16":
        return cast(a, "bf16").astype(np.float32)
    return a.astype(np.float32)


def split_sum(K: int, r: Recipe, part, Kp: int | None = None) -> np.ndarray:
    """The split-K result of recipe ``r``: ``part(k0, k1)`` (the fp32 result of the K range
    ``[k0, k1)`` on its own accumulator, from zero) for each slice of
    ``k_slices(K, r.split_k, r.split_granule)``, summed by :func:`combine_slices` in
    ``r.split_order``.  With ``Kp`` the last slice runs to ``Kp`` (the zero padding of K)."""
    slices = k_slices(K, r.split_k, r.split_granule)
    if Kp is not None:
        slices[-1] = (slices[-1][0], Kp)
    return combine_slices([part(k0, k1) for k0, k1 in slices], r.split_order)


def bf16_tensorcore_matmul(xa: np.ndarray, wa: np.ndarray, r: Recipe) -> np.ndarray:
    """The fp32 accumulator of a BF16 recipe on a tensor-core model (``accumulator="wgmma.bf16"``):
    bf16 operands (float32 storage) multiplied by :func:`~fp8sim.tensorcore.wide.bf16_matmul` on
    each split-K slice (:func:`k_slices`), the slices summed by :func:`combine_slices`."""
    from ..tensorcore.wide import bf16_matmul

    a_bits = (np.ascontiguousarray(xa, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    b_bits = (np.ascontiguousarray(wa, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    acc = r.accumulator
    assert isinstance(acc, str), acc
    model = get_model(acc)
    return split_sum(
        a_bits.shape[1],
        r,
        lambda k0, k1: bf16_matmul(np.ascontiguousarray(a_bits[:, k0:k1]), np.ascontiguousarray(b_bits[k0:k1]), model),
    )


def wide_matmul(x, w, r: Recipe) -> np.ndarray:
    """The GEMM of an unquantized recipe (``r.is_fp8`` False): operands cast by :func:`cast_operand`,
    products summed by numpy (float32 BLAS; float64 for fp64), output cast as :func:`cast_output`."""
    if isinstance(x, QuantizedTensor) or isinstance(w, QuantizedTensor):
        raise TypeError(f"recipe {r.name!r} takes float arrays, not QuantizedTensors")
    xa, wa = cast_operand(x, r.x_format), cast_operand(w, r.w_format)
    y: np.ndarray
    if r.accumulator in BF16_ACCUMULATORS:
        return cast_output(bf16_tensorcore_matmul(xa, wa, r), r.output_format)
    with np.errstate(all="ignore"):
        if r.accumulator == "fp64" or r.x_format == "fp64":
            y = xa.astype(np.float64) @ wa.astype(np.float64)
            if r.output_format == "bf16":  # round the float64 result once, not via float32
                y = cast(y, "bf16")
        else:
            y = xa.astype(np.float32) @ wa.astype(np.float32)
    return cast_output(y, r.output_format)


def _slice_scales(s: np.ndarray, axis: int, k0: int, k1: int, kscale: int) -> np.ndarray:
    if s.shape[axis] == 1:
        return s
    sl = slice(k0 // kscale, -(-k1 // kscale))
    return xp_of(s).ascontiguousarray(s[:, sl] if axis == 1 else s[sl])


def run_codes(
    A, B, sa, sb, kscale: int, a_format, b_format, spec: GemmSpec | Recipe, *, K=None, fidelity="exact", backend="cpu"
):
    """The fp32 accumulator (before the output cast) of GEMM ``spec`` (a
    :class:`~fp8sim.gemms.specs.GemmSpec`, or a :class:`Recipe`: its Fprop GEMM, ``recipe.fprop``)
    on codes ``A (M, Kp)`` and ``B (Kp, N)`` (uint8) and fp32 scales ``sa (M, nks)``, ``sb (nks, N)``
    per K block of ``kscale`` elements (``nks == 1``: one scale over all of K).  ``K`` is the true K
    when the codes are already zero-padded (the split-K boundaries depend on it).

    Without split-K and with the ``"alpha"`` epilogue this is one :func:`scaled_matmul` call;
    otherwise each K slice is its own :func:`scaled_matmul` (scales at promotion applied inside
    the slice), the slices are summed by :func:`combine_slices`, and epilogue scales are applied
    by :func:`apply_epilogue`.
    """
    g = spec.fprop if isinstance(spec, Recipe) else spec
    split = g.split_k
    Kp = A.shape[1]
    K = Kp if K is None else int(K)
    kw = dict(
        a_format=a_format,
        b_format=b_format,
        accumulator=g.accumulator_name,
        promote_every=g.promote_every,
        scale_application=g.scale_application,
        fidelity=fidelity,
        backend=backend,
    )
    epi = g.scale_at == "epilogue"
    if split.slices == 1 and (not epi or g.epilogue_scale == "alpha"):
        return scaled_matmul(A, B, sa, sb, kscale=kscale, scale_at=g.scale_at, **kw)
    M, N = A.shape[0], B.shape[1]
    xp = xp_of(A)
    ones_a, ones_b = xp.ones((M, 1), np.float32), xp.ones((1, N), np.float32)

    def part(k0: int, k1: int) -> np.ndarray:
        n = padded_k(k1 - k0, g.promote_every)
        a, b = pad_k(A[:, k0:k1], n, 1), pad_k(B[k0:k1], n, 0)
        if epi:
            return scaled_matmul(a, b, ones_a, ones_b, kscale=n, scale_at="epilogue", **kw)
        if k0 % kscale and sa.shape[1] * sb.shape[0] > 1:
            raise ValueError(
                f"split-K slice at K={k0} does not start on a scale block of {kscale}: split_granule "
                f"({split.granule}) must be a multiple of the scale block"
            )
        sa_s, sb_s = _slice_scales(sa, 1, k0, k1, kscale), _slice_scales(sb, 0, k0, k1, kscale)
        ks = kscale if sa_s.shape[1] * sb_s.shape[0] > 1 else n
        return scaled_matmul(a, b, sa_s, sb_s, kscale=ks, scale_at="promotion", **kw)

    slices = k_slices(K, split.slices, split.granule)
    slices[-1] = (slices[-1][0], Kp)  # the zero padding belongs to the last slice
    acc = combine_slices([part(k0, k1) for k0, k1 in slices], split.order)
    if epi:
        acc = apply_epilogue(acc, sa[:, :1], sb[:1, :], g.epilogue_scale)
    return acc
