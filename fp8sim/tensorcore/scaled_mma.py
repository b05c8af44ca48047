"""Bit-exact GEMMs on the tensor-core instructions beyond Hopper, block scales included.

The operands are decoded once into their values and *nominal* exponents (subnormals clamped at
the format's emin; zero, inf and NaN get no exponent); the numba kernels of
:mod:`fp8sim.tensorcore._mma_kernels` (whose docstring proves each step exact) then run one of
three datapaths, reading :class:`~fp8sim.tensorcore.model.AccumulatorModel` parameters:

* ``kind="fused"`` with ``group=1``: per block of ``block`` products, C and the products aligned
  to the largest nominal exponent (at least ``zero_exponent``), cut to ``frac_bits`` bits, summed
  exactly, rounded to the output (MMA-Sim's T-FDPA; with MX scales, whose exponents add to the
  products', its ST-FDPA);
* ``kind="fused"`` with ``group > 1``: the products of each group of ``group`` are summed exactly,
  the group sum is multiplied by its scales' significands and takes its scales' exponent, then C
  and the groups are one fused sum (MMA-Sim's GST-FDPA: MXFP4/NVFP4);
* ``kind="interleaved"``: AMD CDNA3's FP8 MFMA (MMA-Sim's GTR-FDPA): the even and the odd products
  of a block are two fused sums of ``frac_bits`` bits (truncated), added with truncation toward
  -inf at ``frac_bits`` bits, C cut to ``frac_bits`` bits and added to the lane sum cut to
  ``sum_frac_bits + 1`` bits, the total cut toward -inf to ``sum_frac_bits`` bits and rounded to
  nearest-even fp32.

Blocks whose elements are finite with magnitudes in [2**-24, 2**16) (every FP8/FP6/FP4 and fp16
value; bf16/tf32 data of moderate range) take the fast path (float32 products, int32 sums); the
others the float64 path, where inf and NaN propagate by IEEE arithmetic.
"""

from __future__ import annotations

import functools

import numpy as np

from ..formats import Format, NanStyle
from ..rounding import RoundMode, decode, decode_table, round_mode
from . import _mma_decode as _d
from . import _mma_kernels as _k
from . import _mma_tiles as _t
from .model import OUT_ROUNDINGS, OUTPUTS, AccumulatorModel

__all__ = [
    "NO_EXP",
    "decode_operand",
    "decode_scales",
    "run_general",
]

#: exponent of an element that has none (zero, inf, NaN) in :func:`decode_operand`
NO_EXP = -(1 << 20)

assert _t.ROUND_CODES == tuple(int(m) for m in (RoundMode.RNE, RoundMode.RTZ, RoundMode.RUP, RoundMode.RDN))

_outside = _d.outside
_NO_TABLES = (np.zeros(1, np.float32), np.zeros(1, np.int16), np.zeros(1, np.uint8))  # for the bits path


@functools.lru_cache(maxsize=64)
def _tables(fmt: Format, subnormal_exponent: str) -> tuple[np.ndarray, np.ndarray]:
    """(value float64, nominal exponent int64) of every code of a format of at most 16 bits."""
    vals = np.asarray(decode_table(fmt), dtype=np.float64)
    exps = np.full(vals.shape, NO_EXP, np.int64)
    fin = np.isfinite(vals) & (vals != 0)
    e = np.frexp(np.abs(vals[fin]))[1].astype(np.int64) - 1
    if subnormal_exponent == "clamp":
        e = np.maximum(e, fmt.emin)
    exps[fin] = e
    vals.setflags(write=False)
    exps.setflags(write=False)
    return vals, exps


def _checked(codes, fmt: Format) -> np.ndarray:
    """``codes`` as an array of ``fmt``'s code dtype with every code below ``fmt.num_codes``
    (``TypeError`` / ``ValueError`` naming the problem otherwise)."""
    codes = np.asarray(codes)
    want = fmt.code_dtype
    if codes.dtype != want:
        raise TypeError(f"codes of {fmt.name} must be {want}, got {codes.dtype}")
    if fmt.bits < 8 * want.itemsize and codes.size and int(codes.max()) >= fmt.num_codes:
        raise ValueError(
            f"codes of {fmt.name} ({fmt.bits} bits, held in the low bits of {want}) must be < {fmt.num_codes}, "
            f"got {int(codes.max())}"
        )
    return codes


def decode_operand(codes: np.ndarray, fmt: Format, subnormal_exponent: str = "clamp") -> tuple[np.ndarray, np.ndarray]:
    """(values float64, nominal exponents int64) of an operand's codes, elementwise.

    ``codes`` hold one element each: uint8 for formats of up to 8 bits (FP6/FP4 in the low bits),
    uint16 for bf16/fp16, uint32 for tf32 (its 19-bit code).  A code with bits above the format's
    width raises ``ValueError``.  Zero, inf and NaN have the exponent :data:`NO_EXP`.
    """
    codes = _checked(codes, fmt)
    if fmt.bits <= 16:
        vals, exps = _tables(fmt, subnormal_exponent)
        return vals[codes], exps[codes]
    v = np.asarray(decode(codes, fmt), dtype=np.float64)
    e = np.full(v.shape, NO_EXP, np.int64)
    fin = np.isfinite(v) & (v != 0)
    ee = np.frexp(np.abs(v[fin]))[1].astype(np.int64) - 1
    e[fin] = np.maximum(ee, fmt.emin) if subnormal_exponent == "clamp" else ee
    return v, e


def decode_scales(codes: np.ndarray, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """(significand float64, exponent int64) of block-scale codes: value = sig * 2**exp.

    The significand is 1 for E8M0 (UE8M0), in [0, 2) for UE4M3 (subnormals at its emin); a zero
    scale has significand 0, a NaN scale significand NaN (both exponent 0).
    """
    vals, _ = _tables(fmt, "clamp")
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"scale codes must be uint8 ({fmt.name}), got {codes.dtype}")
    if fmt.bits < 8 and codes.size and int(codes.max()) >= fmt.num_codes:
        raise ValueError(f"scale codes of {fmt.name} must be < {fmt.num_codes}, got {int(codes.max())}")
    v = vals[codes]
    fin = np.isfinite(v) & (v != 0)
    e = np.zeros(v.shape, np.int64)
    e[fin] = np.maximum(np.frexp(v[fin])[1].astype(np.int64) - 1, fmt.emin)
    sig = np.where(fin, np.ldexp(v, -e), v)
    return sig, e


def _narrow(fmt: Format) -> bool:
    """Whether products of two ``fmt`` values are exact in float32 (at most 12 significant bits
    each); their range is checked per block (:func:`fp8sim.tensorcore._mma_decode.outside`)."""
    return fmt.bits <= 19 and fmt.mbits <= 11


def _float32_shift(fmt: Format) -> int:
    """``32 - bits`` for a format laid out as the top of a float32 pattern (tf32, fp32), else -1."""
    f32_like = fmt.ebits == 8 and fmt.mbits == fmt.bits - 9 and fmt.signed and fmt.inf and fmt.nan == NanStyle.IEEE
    return 32 - fmt.bits if f32_like and fmt.bits <= 32 else -1


@functools.lru_cache(maxsize=64)
def _kernel_tables(fmt: Format, subnormal_exponent: str):
    """(value float32, nominal exponent int16 with NONE16, outside uint8) of every code."""
    vals, exps = _tables(fmt, subnormal_exponent)
    e16 = np.where(exps > NO_EXP // 2, exps, _t.NONE16).astype(np.int16)
    return vals.astype(np.float32), e16, _outside(vals).astype(np.uint8)


def _decoded(codes, fmt: Format, subnormal_exponent: str, L: int, side: str):
    """(values float32, nominal exponents int16, fast-path flags) of an operand's codes, in one
    pass (:mod:`fp8sim.tensorcore._mma_decode`): A's flags per row and block of ``L``, B's per block
    and column tile."""
    codes = np.ascontiguousarray(_checked(codes, fmt))
    R, C = codes.shape
    v = np.empty((R, C), np.float32)
    e = np.empty((R, C), np.int16)
    shift = _float32_shift(fmt) if fmt.bits > 16 else -1
    if fmt.bits <= 16 or shift >= 0:
        vt, et, ot = _kernel_tables(fmt, subnormal_exponent) if shift < 0 else _NO_TABLES
        args = (codes, vt, et, ot, shift, subnormal_exponent == "normalize", fmt.emin, L, v, e)
        if side == "a":
            spec = np.empty((R, C // L), np.bool_)
            _d.decode_a(*args, spec)
        else:
            spec = np.empty((R // L, -(-C // _t.COLUMNS_PER_TASK)), np.bool_)
            _d.decode_b(*args, spec)
        return v, e, spec
    vals, exps = decode_operand(codes, fmt, subnormal_exponent)  # a wider format not laid out as float32
    v[:] = vals
    e[:] = np.where(exps > NO_EXP // 2, exps, _t.NONE16)
    bad = _outside(vals)
    if side == "a":
        return v, e, np.asarray(bad.reshape(R, C // L, L).any(axis=2))
    return v, e, _column_tiles(np.asarray(bad.reshape(R // L, L, C).any(axis=1)))


def _column_tiles(bad: np.ndarray) -> np.ndarray:
    """(rows, N) flags -> (rows, column tiles): any flag in the tile's columns."""
    nb, N = bad.shape
    nt = -(-N // _t.COLUMNS_PER_TASK)
    pad = np.zeros((nb, nt * _t.COLUMNS_PER_TASK), bool)
    pad[:, :N] = bad
    return np.ascontiguousarray(pad.reshape(nb, nt, _t.COLUMNS_PER_TASK).any(axis=2))


def _specials(av: np.ndarray, bv: np.ndarray, L: int):
    """(aspec (M, K // L), bspec (K // L, column tiles)) of decoded values: the blocks for the
    float64 path (an element :func:`_outside` the fast path's range)."""
    M, K = av.shape
    nb = K // L
    aspec = _outside(av).reshape(M, nb, L).any(axis=2)
    return np.ascontiguousarray(aspec), _column_tiles(np.asarray(_outside(bv).reshape(nb, L, bv.shape[1]).any(axis=1)))


def _nan_scales(aspec, bspec, sa, sb, sblk: int, L: int) -> None:
    """Send the blocks under a NaN scale to the float64 path (in place)."""
    r = sblk // L
    aspec |= np.repeat(np.isnan(sa), r, axis=1)
    bspec |= np.repeat(_column_tiles(np.isnan(sb)), r, axis=0)


def _params(model: AccumulatorModel):
    p = model.out_frac_bits
    _, emin, emax = OUTPUTS[model.output]
    mode = int(round_mode(model.out_rounding, OUT_ROUNDINGS))
    zexp = _t.NONE32 if model.zero_exponent is None else model.zero_exponent
    return p, mode, emin, emax, model.overflow == "inf", zexp


def run_general(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    fa: Format,
    fb: Format,
    model: AccumulatorModel,
    promote: int = 0,
    scales=None,
) -> np.ndarray:
    """(M, K) @ (K, N) + C on ``model`` along K (blocks of ``model.block``); float64 (M, N).

    a, b: codes; c: float64 (M, N) holding output-format values.  ``scales``: ``None`` or
    ``(sa_sig, sa_exp, sb_sig, sb_exp, sblock)`` from :func:`decode_scales` (A's (M, K // sblock),
    B's (K // sblock, N)).  The caller checks shapes and that :func:`fp8sim.tensorcore.kernels.select` picks ``"general"``.
    """
    sub = model.subnormal_exponent
    M, K = a.shape
    N = b.shape[1]
    c = np.ascontiguousarray(c, dtype=np.float64)
    out = np.empty((M, N), np.float64)
    L = model.block
    F = model.frac_bits
    p, mode, emin, emax, ovf_inf, zexp = _params(model)
    if scales is None:
        sam, sae = np.ones((M, 1)), np.zeros((M, 1), np.int64)
        sbm, sbe = np.ones((1, N)), np.zeros((1, N), np.int64)
        sblk = K
    else:
        sam, sae, sbm, sbe, sblk = scales
    xa = np.ascontiguousarray(sae, dtype=np.int32)
    xb = np.ascontiguousarray(sbe, dtype=np.int32)
    sga = np.ascontiguousarray(sam, dtype=np.float64)
    sgb = np.ascontiguousarray(sbm, dtype=np.float64)
    if model.kind == "interleaved":
        av, ae, aspec = _decoded(a, fa, sub, L, "a")
        bv, be, bspec = _decoded(b, fb, sub, L, "b")
        if not (_narrow(fa) and _narrow(fb)):
            aspec[:] = True
        _k.interleaved_kernel(av, ae, bv, be, aspec, bspec, c, L, F, model.sum_frac_bits, promote, out)
        return out
    if model.group > 1:
        e2m1 = fa.name == fb.name == "e2m1" and fa.bits == 4  # values times 2 are integers: exact int16 sums
        av = _group_values(a, fa, sub, e2m1)
        bv = _group_values(b, fb, sub, e2m1)
        bnz = _group_values(b, fb, sub, e2m1, nonzero=True)
        _k.grouped_kernel(av, bv, bnz, 0.25 if e2m1 else 1.0, xa, sga, xb, sgb, int(sblk), c, L, model.group, F, p,
                          mode, emin, emax, ovf_inf, zexp, promote, out)  # fmt: skip
        return out
    rd = int(model.align_rounding == "rd")
    all_f64 = not (_narrow(fa) and _narrow(fb)) or F > 27
    if scales is not None and (sblk % L or not _unit_sigs(sam, sbm)):
        if sblk % L:  # the scales change within a block: fold them into the values (float64)
            av, ae = _folded(a, fa, sub, sam, sae, sblk, 1)
            bv, be = _folded(b, fb, sub, sbm, sbe, sblk, 0)
            xa, xb = np.zeros((M, 1), np.int32), np.zeros((1, N), np.int32)
            sga, sgb = np.ones((M, 1)), np.ones((1, N))
            sblk = K
            aspec, bspec = _specials(av, bv, L)
            _k.fused_kernel(av, ae, bv, be, xa, xb, sga, sgb, True, K, aspec, bspec, c, L, F, rd, True, p, mode, emin,
                            emax, ovf_inf, zexp, promote, out)  # fmt: skip
            return out
        all_f64 = True
    sgu = bool((sga == 1).all() and (sgb == 1).all())
    av, ae, aspec = _decoded(a, fa, sub, L, "a")
    bv, be, bspec = _decoded(b, fb, sub, L, "b")
    if scales is not None:
        _nan_scales(aspec, bspec, sga, sgb, int(sblk), L)
    _k.fused_kernel(av, ae, bv, be, xa, xb, sga, sgb, sgu, int(sblk), aspec, bspec, c, L, F, rd, all_f64, p, mode, emin,
                    emax, ovf_inf, zexp, promote, out)  # fmt: skip
    return out


@functools.lru_cache(maxsize=64)
def _group_table(fmt: Format, subnormal_exponent: str, e2m1: bool, nonzero: bool) -> np.ndarray:
    vals, _ = _tables(fmt, subnormal_exponent)
    if nonzero:
        return (vals != 0).astype(np.int16)
    return (vals * 2).astype(np.int16) if e2m1 else vals


def _group_values(codes, fmt: Format, sub: str, e2m1: bool, nonzero: bool = False) -> np.ndarray:
    """The grouped kernel's operand: values times 2 as int16 (e2m1 pairs) or float64 values; with
    ``nonzero`` the int16 flag of a nonzero element."""
    codes = np.ascontiguousarray(_checked(codes, fmt))
    if fmt.bits > 16:
        v = decode_operand(codes, fmt, sub)[0]
        return np.ascontiguousarray((v != 0).astype(np.int16) if nonzero else v)
    table = _group_table(fmt, sub, e2m1, nonzero)
    out = np.empty(codes.shape, table.dtype)
    _d.gather(codes, table, out)
    return out


def _unit_sigs(sam: np.ndarray, sbm: np.ndarray) -> bool:
    """Whether every scale significand is 1 (or NaN: a NaN scale takes the fallback path)."""
    return bool(((sam == 1) | np.isnan(sam)).all() and ((sbm == 1) | np.isnan(sbm)).all())


def _folded(codes, fmt: Format, sub: str, sig, sexp, block: int, axis: int):
    """Values (float64) and exponents (int16) with per-``block`` scales folded in along ``axis``:
    the value times the scale, the exponent plus the scale's (a NaN scale: no exponent)."""
    v, e = decode_operand(codes, fmt, sub)
    s = np.repeat(sig, block, axis=axis)
    x = np.repeat(sexp, block, axis=axis)
    fv = v * s * np.ldexp(1.0, x)
    fe = np.where((e > NO_EXP // 2) & np.isfinite(s), e + x, _t.NONE16).astype(np.int16)
    return np.ascontiguousarray(fv), np.ascontiguousarray(fe)
