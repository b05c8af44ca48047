"""Bit-exact models of tensor-core FP8 matrix-multiply-accumulate.

An accumulator model is a frozen dataclass of parameters
(:class:`AccumulatorModel`).  The ``"fused"`` kind describes the multi-term
fused adders of NVIDIA tensor cores, in the style of Fasi, Higham, Mikaitis
& Pranesh (2021) and MMA-Sim (Xie et al. 2025):

1. the K = 32 products of one instruction are split into ``K / block``
   consecutive blocks, processed in order;
2. each block's products are exact; together with the running accumulator
   (C for the first block) they are aligned to the largest exponent among
   the non-zero addends and every addend is cut to ``frac_bits`` fraction
   bits below that exponent (``align_rounding``: ``"rz"`` truncates the
   magnitude, ``"rd"`` truncates the two's-complement value);
3. the aligned addends are summed exactly, and the sum is normalised and
   rounded to ``out_frac_bits`` fraction bits (``out_rounding``) in the
   output format (fp32, or fp16 for the f16-accumulator instructions);
4. with ``c_mode="separate"`` the products are summed without C and C is
   added afterwards by an IEEE fp32 addition.

Other kinds: ``"exact"`` (exact sum of the 32 products and C, one RNE
rounding to fp32 per instruction) and ``"fp32"`` (sequential fp32 RNE
additions, C first, then k = 0..31).

The presets for ``arch="sm90"`` were fitted to and validated against an
NVIDIA H200 (docs/tensorcore.md; the evidence is the captured hardware
vectors in tests/data/, checked bit for bit by tests/test_tensorcore.py).

Public functions: :func:`mma`, :func:`matmul`, :func:`get_model`,
:func:`verify_capture`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numba import njit, prange

from .formats import Format
from .formats import format as _get_format
from .rounding import decode as _decode

__all__ = [
    "AccumulatorModel",
    "PRESETS",
    "get_model",
    "model_names",
    "mma",
    "matmul",
    "verify_capture",
    "load_capture",
]

K_INSTR = 32  # products per FP8 MMA instruction (m*n*k32 shapes)

_ROUNDING = {"rz": 0, "rne": 1, "rd": 2, "ru": 3}
_KINDS = {"fused": 0, "exact": 1, "fp32": 2}
_OUTPUTS = {"f32": (23, -126, 127), "f16": (10, -14, 15)}


@dataclass(frozen=True)
class AccumulatorModel:
    """Parameters of one tensor-core accumulation datapath.

    Parameters
    ----------
    name:
        Label used in reports.
    kind:
        ``"fused"`` (multi-term fused adder, parameters below), ``"exact"``
        (exact sum, one final fp32 RNE rounding per instruction) or
        ``"fp32"`` (fp32 RNE after every addition).
    block:
        Products summed by one fused addition (a divisor of 32).  32 means the
        whole instruction is one fused sum; 16 means two chained halves
        (k = 0..15 first), as when FP8 is run on FP16 k16 hardware.
    frac_bits:
        Fraction bits kept below the largest exponent when aligning addends.
    align_rounding:
        Rounding of the aligned addends: ``"rz"`` (truncate the magnitude) or
        ``"rd"`` (truncate the two's-complement value, i.e. toward -inf).
    product_exponent:
        Exponent used for a product when finding the largest exponent:
        ``"nominal"`` = ea + eb (the significand product lies in [1, 4)),
        ``"normalized"`` = the product's true exponent.
    subnormal_exponent:
        Exponent of a subnormal input: ``"clamp"`` = the format's emin with a
        significand below 1 (the FP8 datapath), ``"normalize"`` = its true
        exponent (inputs first converted to a wider format, e.g. fp16).
    c_mode:
        ``"fused"``: C is one of the addends of the first block; ``"separate"``:
        C is added to the rounded product sum by an IEEE fp32 addition.
    out_frac_bits, out_rounding, output:
        The normalised sum is rounded to ``out_frac_bits`` fraction bits with
        ``out_rounding`` in the ``output`` format (``"f32"`` or ``"f16"``;
        subnormal results are quantised relative to the format's emin).
    zero_sign:
        Sign of an exactly zero result: ``"positive"`` (always +0) or
        ``"ieee"`` (-0 only when every addend is a negative zero).
    nan_bits:
        Bit pattern returned for a NaN result (fp32 pattern; for f16 output
        the fp32 pattern of the f16 NaN).
    validated:
        Whether the preset was checked against hardware captures.
    """

    name: str
    kind: str = "fused"
    block: int = 32
    frac_bits: int = 13
    align_rounding: str = "rz"
    product_exponent: str = "nominal"
    subnormal_exponent: str = "clamp"
    c_mode: str = "fused"
    out_frac_bits: int = 23
    out_rounding: str = "rz"
    output: str = "f32"
    zero_sign: str = "positive"
    k_order: tuple | None = None
    nan_bits: int = 0x7FFFFFFF
    validated: bool = False
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {list(_KINDS)}, got {self.kind!r}")
        if not isinstance(self.block, int) or self.block < 1 or K_INSTR % self.block:
            raise ValueError(f"block must divide {K_INSTR}, got {self.block!r}")
        if not 0 <= self.frac_bits <= 40:
            raise ValueError(f"frac_bits must be in 0..40, got {self.frac_bits!r}")
        if self.align_rounding not in ("rz", "rd"):
            raise ValueError(f"align_rounding must be 'rz' or 'rd', got {self.align_rounding!r}")
        if self.out_rounding not in _ROUNDING:
            raise ValueError(f"out_rounding must be one of {list(_ROUNDING)}, got {self.out_rounding!r}")
        if self.output not in _OUTPUTS:
            raise ValueError(f"output must be 'f32' or 'f16', got {self.output!r}")
        if not 0 <= self.out_frac_bits <= _OUTPUTS[self.output][0]:
            raise ValueError(f"out_frac_bits must be in 0..{_OUTPUTS[self.output][0]}, got {self.out_frac_bits!r}")
        if self.product_exponent not in ("nominal", "normalized"):
            raise ValueError(f"product_exponent must be 'nominal' or 'normalized', got {self.product_exponent!r}")
        if self.subnormal_exponent not in ("clamp", "normalize", "fp16"):
            raise ValueError(
                f"subnormal_exponent must be 'clamp', 'normalize' or 'fp16', got {self.subnormal_exponent!r}"
            )
        if self.k_order is not None:
            ko = tuple(int(k) for k in self.k_order)
            if sorted(ko) != list(range(K_INSTR)):
                raise ValueError(f"k_order must be a permutation of 0..{K_INSTR - 1}, got {self.k_order!r}")
            object.__setattr__(self, "k_order", ko)
        if self.c_mode not in ("fused", "separate"):
            raise ValueError(f"c_mode must be 'fused' or 'separate', got {self.c_mode!r}")
        if self.zero_sign not in ("positive", "ieee"):
            raise ValueError(f"zero_sign must be 'positive' or 'ieee', got {self.zero_sign!r}")

    def summary(self) -> dict:
        return asdict(self)

    def _order(self) -> np.ndarray:
        return np.array(self.k_order if self.k_order is not None else range(K_INSTR), dtype=np.int64)

    def _params(self) -> np.ndarray:
        out_bits, out_emin, out_emax = _OUTPUTS[self.output]
        return np.array(
            [
                _KINDS[self.kind],
                self.block,
                self.frac_bits,
                0 if self.align_rounding == "rz" else 1,
                0 if self.product_exponent == "nominal" else 1,
                0 if self.c_mode == "fused" else 1,
                self.out_frac_bits,
                _ROUNDING[self.out_rounding],
                out_emin,
                out_emax,
                0 if self.zero_sign == "positive" else 1,
            ],
            dtype=np.int64,
        )


# ----------------------------------------------------------------- presets
# Evidence for the sm90 presets: docs/tensorcore.md and tests/data/*.npz
PRESETS: dict[tuple[str, str], AccumulatorModel] = {}


def _register(arch: str, instruction: str, model: AccumulatorModel) -> None:
    PRESETS[(arch, instruction)] = model


_register(
    "sm90",
    "wgmma",
    AccumulatorModel(
        name="sm90 wgmma f32 (FP8)",
        kind="fused",
        block=32,
        frac_bits=13,
        align_rounding="rz",
        product_exponent="nominal",
        subnormal_exponent="clamp",
        c_mode="fused",
        out_frac_bits=13,
        out_rounding="rz",
        output="f32",
        validated=True,
        description="wgmma.mma_async m64nNk32 .f32 with e4m3/e5m2 inputs on sm_90a (H100/H200/H800)",
    ),
)
_register(
    "sm90",
    "wgmma.f16",
    AccumulatorModel(
        name="sm90 wgmma f16 (FP8)",
        kind="fused",
        block=32,
        frac_bits=13,
        align_rounding="rz",
        product_exponent="nominal",
        subnormal_exponent="clamp",
        c_mode="fused",
        out_frac_bits=10,
        out_rounding="rne",
        output="f16",
        nan_bits=0x7FFFE000,
        validated=True,
        description="wgmma.mma_async m64nNk32 .f16 with e4m3/e5m2 inputs on sm_90a (C/D fp16; "
        "C's exponent clamped at fp16 emin; results that round to 0 are +0; NaN = fp16 0x7fff)",
    ),
)
# mma.sync m16n8k32 FP8 on sm_90 is no tensor-core FP8 instruction: ptxas emits
# F2FP.F16.E4M3/E5M2.UNPACK_B (exact fp8 -> fp16), HMMA.16816.F32 on the low
# halves of each 4-byte fragment register (k % 4 in {0, 1}) with a zero
# accumulator, a second HMMA.16816.F32 on the high halves (k % 4 in {2, 3})
# accumulating onto the first, and an FADD of C.  See docs/tensorcore.md.
_HMMA_ORDER = tuple(k for k in range(32) if k % 4 < 2) + tuple(k for k in range(32) if k % 4 >= 2)
_register(
    "sm90",
    "mma.sync",
    AccumulatorModel(
        name="sm90 mma.sync f32 (FP8 via FP16 HMMA)",
        kind="fused",
        block=16,
        frac_bits=25,
        align_rounding="rz",
        product_exponent="nominal",
        subnormal_exponent="fp16",
        c_mode="separate",
        out_frac_bits=23,
        out_rounding="rz",
        output="f32",
        k_order=_HMMA_ORDER,
        validated=True,
        description="mma.sync m16n8k32 .f32 e4m3/e5m2 on sm_90: two FP16 HMMA.16816 (k%4<2, then k%4>=2) + FADD C",
    ),
)
for _arch in ("sm90", "any"):
    _register(
        _arch,
        "exact",
        AccumulatorModel(name="exact", kind="exact", description="exact sum of products and C, one fp32 RNE rounding"),
    )
    _register(
        _arch,
        "fp32",
        AccumulatorModel(name="fp32", kind="fp32", description="fp32 RNE after every addition (C first, k in order)"),
    )
# Literature presets for other architectures (NOT validated on hardware here).
_register(
    "sm89",
    "mma.sync",
    AccumulatorModel(
        name="sm89 mma.sync f32 (FP8), from MMA-Sim",
        kind="fused",
        block=16,
        frac_bits=13,
        out_frac_bits=13,
        out_rounding="rz",
        validated=False,
        description="Ada QMMA as reported by MMA-Sim (split-k, 13 bits); not validated by fp8sim",
    ),
)


def model_names() -> list[tuple[str, str]]:
    """(arch, instruction) pairs that have a preset."""
    return list(PRESETS)


def get_model(instruction="wgmma", arch: str = "sm90") -> AccumulatorModel:
    """Return the preset for ``instruction`` on ``arch`` (a model is returned as is)."""
    if isinstance(instruction, AccumulatorModel):
        return instruction
    if not isinstance(instruction, str):
        raise TypeError(f"instruction must be a name or an AccumulatorModel, got {type(instruction).__name__}")
    key = instruction.strip().lower()
    if key in ("exact", "fp32"):
        arch = "any"
    try:
        return PRESETS[(str(arch).lower(), key)]
    except KeyError:
        known = ", ".join(f"{i!r} (arch {a!r})" for a, i in PRESETS)
        raise ValueError(
            f"no accumulator model for instruction {instruction!r} on arch {arch!r}; known: {known}"
        ) from None


# ------------------------------------------------------------ code tables
_TABLE_CACHE: dict = {}


def _code_table(fmt: Format, subnormal_exponent: str):
    """Per-code (class, sign, significand, exponent, value) for an 8-bit format.

    class: 0 zero, 1 finite non-zero, 2 inf, 3 NaN.  A finite value is
    ``(-1)**sign * sig * 2**(exp - mbits)`` with ``sig`` an integer; for normal
    numbers 2**mbits <= sig < 2**(mbits+1).
    """
    key = (fmt, subnormal_exponent)
    if key in _TABLE_CACHE:
        return _TABLE_CACHE[key]
    codes = np.arange(256, dtype=np.uint8)
    if fmt.ml_dtype is not None:
        vals = codes.view(fmt.ml_dtype).astype(np.float64)
    else:
        vals = np.asarray(_decode(codes, fmt), dtype=np.float64)
    cls = np.zeros(256, np.int64)
    sign = np.zeros(256, np.int64)
    sig = np.zeros(256, np.int64)
    exp = np.zeros(256, np.int64)
    for i, v in enumerate(vals):
        sign[i] = 1 if math.copysign(1.0, v) < 0 else 0
        if math.isnan(v):
            cls[i] = 3
            continue
        if math.isinf(v):
            cls[i] = 2
            continue
        if v == 0:
            continue
        cls[i] = 1
        av = abs(v)
        e = math.frexp(av)[1] - 1  # av in [2**e, 2**(e+1))
        if subnormal_exponent == "clamp" and e < fmt.emin:
            e = fmt.emin
        elif subnormal_exponent == "fp16" and e < -14:
            e = -14
        s = av / 2.0 ** (e - fmt.mbits)
        assert s == int(s), (fmt, i, v)
        sig[i] = int(s)
        exp[i] = e
    vals = np.where(np.isnan(vals), np.nan, vals)
    out = (cls, sign, sig, exp, vals)
    _TABLE_CACHE[key] = out
    return out


# ----------------------------------------------------------- numba kernels
@njit(cache=True, inline="always")
def _bitlen(x):
    n = 0
    while x > 0:
        x >>= 1
        n += 1
    return n


@njit(cache=True)
def _round_out(S, q, neg, P):
    """Round the exact value (-1)**neg * S * 2**q (S >= 0 integer) to the output.

    Returns a float64 holding the rounded value (exact in the output format)."""
    p = P[6]
    mode = P[7]
    emin = P[8]
    emax = P[9]
    if S == 0:
        return 0.0
    L = _bitlen(S)
    E = q + L - 1
    if E < emin:
        E = emin
    qe = E - p
    if qe > q:
        sh = qe - q
        if sh >= 63:
            r = 0
            rem_nz = S != 0
            above_half = False
            is_half = False
            if sh == 63:
                above_half = S > (1 << 62)
                is_half = S == (1 << 62)
        else:
            r = S >> sh
            rem = S - (r << sh)
            half = np.int64(1) << (sh - 1)
            rem_nz = rem != 0
            above_half = rem > half
            is_half = rem == half
        if mode == 1:  # rne
            if above_half or (is_half and (r & 1) == 1):
                r += 1
        elif mode == 2:  # rd (toward -inf)
            if rem_nz and neg:
                r += 1
        elif mode == 3:  # ru
            if rem_nz and not neg:
                r += 1
        # mode 0: rz, nothing
        if r >= (np.int64(1) << (p + 1)):
            r >>= 1
            qe += 1
    else:
        r = S << (q - qe)
    if r == 0:
        return 0.0  # underflow to zero: +0 (the H200 returns +0 for f16 results that round to 0)
    # overflow
    if r > 0 and qe + _bitlen(r) - 1 > emax:
        if mode == 1 or (mode == 3 and not neg) or (mode == 2 and neg):
            return -np.inf if neg else np.inf
        r = (np.int64(1) << (p + 1)) - 1
        qe = emax - p
    v = math.ldexp(float(r), qe)
    return -v if neg else v


@njit(cache=True, inline="always")
def _f32_parts(c, emin):
    """(sig, exp) of a finite non-zero accumulator value c: |c| = sig * 2**(exp - 23),
    with exp clamped at the accumulator format's emin (-126 for fp32, -14 for fp16)."""
    f, x = math.frexp(abs(c))
    e = x - 1
    sig = np.int64(f * 16777216.0)  # 2**24, exact
    if e < emin:
        sig >>= emin - e
        e = emin
    return sig, e


@njit(cache=True)
def _special_block(acc, arow, b, j, kb, order, k0, k1, va, vb):
    s = float(acc)
    for idx in range(k0, k1):
        k = kb + order[idx]
        s += va[arow[k]] * vb[b[j, k]]
    return s


@njit(cache=True)
def _fused_block(acc, use_acc, arow, b, j, kb, order, k0, k1, clsA, sgA, sigA, expA, fa, clsB, sgB, sigB, expB, fb, P):
    """One fused multi-term addition; returns a float64 holding an output value."""
    F = P[2]
    align_rd = P[3] == 1
    prod_norm = P[4] == 1
    # largest exponent among non-zero addends
    emax = -100000
    have = False
    c_nz = use_acc and acc != 0.0
    csig = np.int64(0)
    cexp = 0
    if c_nz:
        csig, cexp = _f32_parts(acc, P[8])
        emax = cexp
        have = True
    sfrac = fa + fb
    for idx in range(k0, k1):
        k = kb + order[idx]
        ca = arow[k]
        cb = b[j, k]
        if clsA[ca] == 0 or clsB[cb] == 0:
            continue
        e = expA[ca] + expB[cb]
        if prod_norm:
            m = sigA[ca] * sigB[cb]
            if m >= (np.int64(1) << (sfrac + 1)):
                e += 1
        if e > emax:
            emax = e
        have = True
    if not have:
        # every addend is zero
        if P[10] == 1:
            allneg = True
            if use_acc:
                allneg = math.copysign(1.0, acc) < 0
            for idx in range(k0, k1):
                k = kb + order[idx]
                if (sgA[arow[k]] ^ sgB[b[j, k]]) == 0:
                    allneg = False
            return -0.0 if allneg else 0.0
        return 0.0
    S = np.int64(0)
    if c_nz:
        sh = cexp - 23 - emax + F
        if sh >= 0:
            t = csig << sh
            rem = False
        elif sh > -63:
            t = csig >> (-sh)
            rem = (t << (-sh)) != csig
        else:
            t = np.int64(0)
            rem = True
        if acc < 0:
            if align_rd and rem:
                t += 1
            S -= t
        else:
            S += t
    for idx in range(k0, k1):
        k = kb + order[idx]
        ca = arow[k]
        cb = b[j, k]
        if clsA[ca] == 0 or clsB[cb] == 0:
            continue
        m = sigA[ca] * sigB[cb]
        sh = expA[ca] + expB[cb] - sfrac - emax + F
        if sh >= 0:
            t = m << sh
            rem = False
        elif sh > -63:
            t = m >> (-sh)
            rem = (t << (-sh)) != m
        else:
            t = np.int64(0)
            rem = True
        if sgA[ca] ^ sgB[cb]:
            if align_rd and rem:
                t += 1
            S -= t
        else:
            S += t
    neg = S < 0
    if neg:
        S = -S
    if S == 0 and P[10] == 1:
        return 0.0  # exact cancellation: +0 under RNE-like rules
    return _round_out(S, emax - F, neg, P)


@njit(cache=True)
def _fsum(vals, n):
    """Correctly rounded (RN64) sum of vals[:n] (Shewchuk / Python's math.fsum)."""
    p = np.empty(n + 1, np.float64)
    m = 0
    for idx in range(n):
        x = vals[idx]
        i = 0
        for t in range(m):
            y = p[t]
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo != 0.0:
                p[i] = lo
                i += 1
            x = hi
        p[i] = x
        m = i + 1
    hi = 0.0
    if m > 0:
        m -= 1
        hi = p[m]
        lo = 0.0
        while m > 0:
            x = hi
            m -= 1
            y = p[m]
            hi = x + y
            yr = hi - x
            lo = y - yr
            if lo != 0.0:
                break
        if m > 0 and ((lo < 0.0 and p[m - 1] < 0.0) or (lo > 0.0 and p[m - 1] > 0.0)):
            y = lo * 2.0
            x = hi + y
            yr = x - hi
            if y == yr:
                hi = x
    return hi


@njit(cache=True)
def _exact_block(acc, arow, b, j, kb, order, k0, k1, va, vb):
    """Exact sum of acc and the block's products, rounded once to fp32 (RNE)."""
    n = k1 - k0 + 1
    vals = np.empty(n + 1, np.float64)
    vals[0] = acc
    for idx in range(k0, k1):
        k = kb + order[idx]
        vals[idx - k0 + 1] = va[arow[k]] * vb[b[j, k]]  # exact
    hi = _fsum(vals, n)
    if hi == 0.0 or not math.isfinite(hi):
        return hi
    # round |hi| to fp32 in float64 arithmetic (all steps exact)
    mag = abs(hi)
    e = math.frexp(mag)[1] - 1
    if e < -126:
        e = -126
    ulp = math.ldexp(1.0, e - 23)
    q = math.floor(mag / ulp)
    down = q * ulp
    if down == mag:
        r = mag
    else:
        mid = down + 0.5 * ulp
        if mag < mid:
            r = down
        elif mag > mid:
            r = down + ulp
        else:
            # hi is an fp32 midpoint: the sign of (exact - hi) decides
            vals[n] = -hi
            res = _fsum(vals, n + 1)
            if hi < 0:
                res = -res
            if res > 0:
                r = down + ulp
            elif res < 0:
                r = down
            else:
                r = down if q % 2 == 0 else down + ulp
    if r > 3.4028234663852886e38:  # rounded beyond FLT_MAX: overflow
        r = np.inf
    return -r if hi < 0 else r


@njit(cache=True)
def _instr(acc, arow, b, j, kb, order, clsA, sgA, sigA, expA, vA, fa, clsB, sgB, sigB, expB, vB, fb, P):
    """One K=32 instruction on columns kb..kb+31 with accumulator input acc
    (a float64 holding an output-format value); returns the new accumulator."""
    kind = P[0]
    blk = P[1]
    separate = P[5] == 1
    if kind == 2:  # fp32: sequential RNE additions, C first
        a32 = np.float32(acc)
        for idx in range(32):
            k = kb + order[idx]
            p = vA[arow[k]] * vB[b[j, k]]  # exact in float64 (and float32)
            a32 = np.float32(float(a32) + p)
        return float(a32)
    t = 0.0 if separate else acc
    for s in range(0, 32, blk):
        special = not math.isfinite(t)
        if not special:
            for idx in range(s, s + blk):
                k = kb + order[idx]
                if clsA[arow[k]] >= 2 or clsB[b[j, k]] >= 2:
                    special = True
                    break
        if special:
            t = _special_block(t, arow, b, j, kb, order, s, s + blk, vA, vB)
        elif kind == 0:
            t = _fused_block(
                t, True, arow, b, j, kb, order, s, s + blk, clsA, sgA, sigA, expA, fa, clsB, sgB, sigB, expB, fb, P
            )
        else:
            t = _exact_block(t, arow, b, j, kb, order, s, s + blk, vA, vB)
    if separate:  # C added to the tensor-core result by an fp32 FADD (RNE)
        return float(np.float32(acc + t))
    return t


@njit(cache=True, parallel=True)
def _matmul_kernel(a, b, c, promote, order, clsA, sgA, sigA, expA, vA, fa, clsB, sgB, sigB, expB, vB, fb, P, out):
    """a (B, M, K) uint8, b (B, N, K) uint8 (B transposed, K contiguous), c (B, M, N) float64, out (B, M, N) float64."""
    nb, M, K = a.shape
    N = b.shape[1]
    for r in prange(nb * M):
        bi = r // M
        i = r % M
        arow = a[bi, i]
        bb = b[bi]
        for j in range(N):
            c0 = c[bi, i, j]
            if promote <= 0:
                acc = c0
                for k0 in range(0, K, 32):
                    acc = _instr(
                        acc, arow, bb, j, k0, order, clsA, sgA, sigA, expA, vA, fa, clsB, sgB, sigB, expB, vB, fb, P
                    )
                out[bi, i, j] = acc
            else:
                tot = np.float32(c0)
                part = 0.0
                cnt = 0
                for k0 in range(0, K, 32):
                    part = _instr(
                        part, arow, bb, j, k0, order, clsA, sgA, sigA, expA, vA, fa, clsB, sgB, sigB, expB, vB, fb, P
                    )
                    cnt += 32
                    if cnt == promote:
                        tot = np.float32(float(tot) + part)
                        part = 0.0
                        cnt = 0
                if cnt > 0:
                    tot = np.float32(float(tot) + part)
                out[bi, i, j] = float(tot)


# -------------------------------------------------------------- public API
def _check_codes(x, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise TypeError(f"{name} must be uint8 FP8 codes, got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dimensions, got shape {x.shape}")
    return x


def _fmt8(name, which: str) -> Format:
    if name is None:
        raise TypeError(f"{which} is required (e.g. 'e4m3' or 'e5m2')")
    f = _get_format(name)
    if f.bits != 8 or not f.fits_float32:
        raise ValueError(f"{which} must be an 8-bit format (e.g. 'e4m3', 'e5m2'), got {f.name!r}")
    return f


def _run(a, b, c, a_format, b_format, model: AccumulatorModel, promote: int) -> np.ndarray:
    fa_ = _fmt8(a_format, "a_format")
    fb_ = _fmt8(b_format, "b_format")
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2], c.shape[:-2] if c is not None else ())
    a3 = np.ascontiguousarray(np.broadcast_to(a, batch + (M, K))).reshape((-1, M, K))
    b3 = np.ascontiguousarray(np.swapaxes(np.broadcast_to(b, batch + (K, N)).reshape((-1, K, N)), 1, 2))
    if c is None:
        c3 = np.zeros((a3.shape[0], M, N), np.float64)
    else:
        c3 = np.broadcast_to(c, batch + (M, N)).reshape((-1, M, N)).astype(np.float64)
        if model.output == "f16":
            with np.errstate(over="ignore"):
                c3 = c3.astype(np.float16).astype(np.float64)
    # one numba signature for every call: C-contiguous, writeable, aligned arrays
    req: Any = ("C_CONTIGUOUS", "WRITEABLE", "ALIGNED")
    a3, b3, c3 = np.require(a3, requirements=req), np.require(b3, requirements=req), np.require(c3, requirements=req)
    tA = _code_table(fa_, model.subnormal_exponent)
    tB = _code_table(fb_, model.subnormal_exponent)
    out = np.empty((a3.shape[0], M, N), np.float64)
    with np.errstate(all="ignore"):
        _matmul_kernel(
            a3,
            b3,
            c3,
            int(promote),
            model._order(),
            tA[0],
            tA[1],
            tA[2],
            tA[3],
            tA[4],
            fa_.mbits,
            tB[0],
            tB[1],
            tB[2],
            tB[3],
            tB[4],
            fb_.mbits,
            model._params(),
            out,
        )
        d = out.astype(np.float32)
    bits = d.view(np.uint32)
    bits[np.isnan(d)] = np.uint32(model.nan_bits)
    return d.reshape(batch + (M, N))


def _check_c(c, M, N):
    c = np.asarray(c)
    if c.dtype != np.float32:
        if c.dtype.kind != "f":
            raise TypeError(f"c must be a float32 array, got dtype {c.dtype}")
        c32 = c.astype(np.float32)
        if not np.array_equal(c32.astype(c.dtype), c, equal_nan=True):
            raise ValueError("c must hold float32 values (got values that are not exactly float32)")
        c = c32
    if c.ndim < 2 or c.shape[-2:] != (M, N):
        raise ValueError(f"c must have shape (..., {M}, {N}), got {c.shape}")
    return c


def mma(a, b, c, *, a_format, b_format, instruction="wgmma", arch: str = "sm90") -> np.ndarray:
    """One FP8 tensor-core instruction D = A @ B + C (K = 32), bit-exact.

    Parameters
    ----------
    a:
        uint8 codes of shape (..., M, 32) in ``a_format``.
    b:
        uint8 codes of shape (..., 32, N) in ``b_format``.
    c:
        float32 array (..., M, N).  Batch dimensions broadcast.
    a_format, b_format:
        ``"e4m3"`` or ``"e5m2"`` (or Format objects).
    instruction:
        ``"wgmma"``, ``"mma.sync"``, ``"wgmma.f16"`` (C/D held in fp16),
        ``"exact"``, ``"fp32"`` or an :class:`AccumulatorModel`.
    arch:
        Architecture of the preset (``"sm90"``).

    Returns
    -------
    float32 array (..., M, N).
    """
    model = get_model(instruction, arch)
    a = _check_codes(a, "a")
    b = _check_codes(b, "b")
    if a.shape[-1] != K_INSTR:
        raise ValueError(f"a must have shape (..., M, 32) for one instruction, got {a.shape}")
    if b.shape[-2] != K_INSTR:
        raise ValueError(f"b must have shape (..., 32, N) for one instruction, got {b.shape}")
    c = _check_c(c, a.shape[-2], b.shape[-1])
    return _run(a, b, c, a_format, b_format, model, 0)


def matmul(
    a, b, c=None, *, a_format, b_format, instruction="wgmma", arch: str = "sm90", promote_every=None
) -> np.ndarray:
    """D = A @ B (+ C) as a tensor-core tile loop along K, bit-exact.

    The K dimension is processed by consecutive K = 32 instructions in order,
    the accumulator staying in the instruction's output format.  With
    ``promote_every`` (a multiple of 32, in K elements) the tensor-core
    partial is added into a separate fp32 accumulator (IEEE RNE addition)
    every ``promote_every`` elements and restarted from zero; a remainder is
    added at the end (DeepGEMM / CUTLASS ``GmmaFP8Accumulation``).  C, if
    given, is the initial value of the fp32 accumulator (without promotion:
    the initial tensor-core accumulator).

    Shapes: a (..., M, K), b (..., K, N), c (..., M, N) float32; K a multiple of 32.
    """
    model = get_model(instruction, arch)
    a = _check_codes(a, "a")
    b = _check_codes(b, "b")
    K = a.shape[-1]
    if b.shape[-2] != K:
        raise ValueError(f"inner dimensions differ: a has K={K}, b has K={b.shape[-2]}")
    if K % K_INSTR or K == 0:
        raise ValueError(f"K must be a positive multiple of 32, got {K}")
    promote = 0
    if promote_every is not None:
        promote = int(promote_every)
        if promote != promote_every or promote <= 0 or promote % K_INSTR:
            raise ValueError(f"promote_every must be a positive multiple of 32, got {promote_every!r}")
    if c is not None:
        c = _check_c(c, a.shape[-2], b.shape[-1])
    return _run(a, b, c, a_format, b_format, model, promote)


# ---------------------------------------------------------- capture scoring
def load_capture(path_or_npz) -> dict:
    """Load a capture (.npz written by ``python -m gpu.capture``) into a dict."""
    import json

    if isinstance(path_or_npz, dict):
        return path_or_npz
    with np.load(path_or_npz, allow_pickle=False) as z:
        d = {k: z[k] for k in z.files}
    meta = d.get("meta")
    d["meta"] = json.loads(str(meta)) if meta is not None else {}
    return d


def _bits_equal(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.float32)
    eq = x.view(np.uint32) == y.view(np.uint32)
    return eq | (np.isnan(x) & np.isnan(y))


def verify_capture(path_or_npz, model=None, *, max_mismatches: int = 5) -> dict:
    """Score the emulator against a hardware capture.

    Returns a dict with ``match_rate``, ``n``, ``mismatches`` (count),
    ``first_mismatches`` (list of dicts) and the capture's metadata.  NaN
    matches NaN; otherwise bit patterns must agree.
    """
    cap = load_capture(path_or_npz)
    meta = cap["meta"]
    instr = meta.get("instruction", "wgmma")
    arch = meta.get("arch", "sm90")
    if "a_format" not in meta or "a" not in cap or "d" not in cap:
        raise ValueError("not a tensor-core capture (needs a, b, c, d and meta with a_format/b_format)")
    fa_, fb_ = meta["a_format"], meta["b_format"]
    a, b = cap["a"], cap["b"]
    results = {}
    total_n = 0
    total_bad = 0
    first: list[dict] = []
    for key in sorted(k for k in cap if k == "d" or k.startswith("d_")):
        if meta.get("kind", "mma") == "chain":
            promote = None
            if key != "d":
                p = int(key.split("_", 1)[1].replace("promote", "") or 0)
                promote = p or None
            ref = matmul(
                a, b, cap["c"], a_format=fa_, b_format=fb_, instruction=model or instr, arch=arch, promote_every=promote
            )
        else:
            ref = mma(a, b, cap["c"], a_format=fa_, b_format=fb_, instruction=model or instr, arch=arch)
        hw = cap[key].astype(np.float32)
        ok = _bits_equal(ref, hw)
        n = ok.size
        bad = int(n - ok.sum())
        total_n += n
        total_bad += bad
        results[key] = {"n": n, "mismatches": bad}
        if bad and len(first) < max_mismatches:
            for idx in np.argwhere(~ok)[: max_mismatches - len(first)]:
                idx = tuple(int(i) for i in idx)
                first.append(
                    {
                        "output": key,
                        "index": idx,
                        "hardware": float(hw[idx]),
                        "hardware_bits": f"0x{int(hw.view(np.uint32)[idx]):08x}",
                        "model": float(ref[idx]),
                        "model_bits": f"0x{int(ref.view(np.uint32)[idx]):08x}",
                    }
                )
    return {
        "match_rate": (total_n - total_bad) / total_n if total_n else float("nan"),
        "n": total_n,
        "mismatches": total_bad,
        "outputs": results,
        "first_mismatches": first,
        "meta": meta,
    }
