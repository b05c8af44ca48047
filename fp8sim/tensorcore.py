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

import functools
import math
import operator
from dataclasses import asdict, dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
from numba import njit, prange

from ._names import close_matches, unknown_name_error
from .formats import Format, UnknownNameError
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
    "capture_kind",
    "CaptureError",
    "NotTensorCoreCaptureError",
]

_BF16 = np.dtype(ml_dtypes.bfloat16)
K_INSTR = 32  # products per FP8 MMA instruction (m*n*k32 shapes)

_ROUNDING = {"rz": 0, "rne": 1, "rd": 2, "ru": 3}
_KINDS = {"fused": 0, "exact": 1, "fp32": 2}
_OUTPUTS = {"f32": (23, -126, 127), "f16": (10, -14, 15)}


def _int_field(key: str, value: Any) -> int:
    """``value`` as a Python int; floats (even integral ones), bools and strings are refused."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{key} must be an integer, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{key} must be an integer, got {value!r} ({type(value).__name__})") from None


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
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a string, got {type(self.name).__name__}")
        self._check_name("kind", list(_KINDS))
        block = _int_field("block", self.block)
        if block < 1 or K_INSTR % block:
            raise ValueError(f"block must be a divisor of {K_INSTR} (1, 2, 4, 8, 16 or 32), got {self.block!r}")
        frac_bits = _int_field("frac_bits", self.frac_bits)
        if not 0 <= frac_bits <= 40:
            raise ValueError(f"frac_bits must be an integer in 0..40, got {self.frac_bits!r}")
        self._check_name("align_rounding", ["rz", "rd"])
        self._check_name("out_rounding", list(_ROUNDING))
        self._check_name("output", list(_OUTPUTS))
        out_frac_bits = _int_field("out_frac_bits", self.out_frac_bits)
        top = _OUTPUTS[self.output][0]
        if not 0 <= out_frac_bits <= top:
            raise ValueError(
                f"out_frac_bits must be an integer in 0..{top} for output {self.output!r}, got {self.out_frac_bits!r}"
            )
        self._check_name("product_exponent", ["nominal", "normalized"])
        self._check_name("subnormal_exponent", ["clamp", "normalize", "fp16"])
        ko = None
        if self.k_order is not None:
            if isinstance(self.k_order, (str, bytes)) or not hasattr(self.k_order, "__iter__"):
                raise TypeError(f"k_order must be a sequence of {K_INSTR} integers or None, got {self.k_order!r}")
            items = list(self.k_order)
            if any(isinstance(k, (bool, np.bool_)) for k in items):
                raise TypeError(f"k_order must hold integers, got {self.k_order!r}")
            try:
                ko = tuple(operator.index(k) for k in items)
            except TypeError:
                raise TypeError(f"k_order must hold integers, got {self.k_order!r}") from None
            if sorted(ko) != list(range(K_INSTR)):
                raise ValueError(f"k_order must be a permutation of 0..{K_INSTR - 1}, got {self.k_order!r}")
        self._check_name("c_mode", ["fused", "separate"])
        self._check_name("zero_sign", ["positive", "ieee"])
        nan_bits = _int_field("nan_bits", self.nan_bits)
        if not (0 <= nan_bits < 2**32 and (nan_bits >> 23) & 0xFF == 0xFF and nan_bits & 0x7FFFFF):
            raise ValueError(
                f"nan_bits must be the bit pattern of a float32 NaN (exponent bits all ones, mantissa not 0, "
                f"e.g. 0x7fffffff), got {self.nan_bits!r}" + (f" = 0x{nan_bits:08x}" if 0 <= nan_bits < 2**32 else "")
            )
        if not isinstance(self.validated, (bool, np.bool_)):
            raise TypeError(f"validated must be True or False, got {self.validated!r}")
        if not isinstance(self.description, str):
            raise TypeError(f"description must be a string, got {type(self.description).__name__}")
        # store plain Python values (numpy integers are accepted, and compare equal)
        for key, value in (
            ("block", block),
            ("frac_bits", frac_bits),
            ("out_frac_bits", out_frac_bits),
            ("nan_bits", nan_bits),
            ("k_order", ko),
            ("validated", bool(self.validated)),
        ):
            object.__setattr__(self, key, value)

    def _check_name(self, key: str, known: list[str]) -> None:
        value = getattr(self, key)
        if not isinstance(value, str):
            raise TypeError(f"{key} must be one of {known}, got {value!r} ({type(value).__name__})")
        if value not in known:
            raise unknown_name_error(f"{key}", value, known, where="AccumulatorModel")

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


def get_model(instruction: str | AccumulatorModel = "wgmma", arch: str = "sm90") -> AccumulatorModel:
    """Return the preset for ``instruction`` on ``arch`` (a model is returned as is).

    An unknown instruction or arch raises :class:`~fp8sim.formats.UnknownNameError` (a
    ``ValueError``) naming the closest known names and every (instruction, arch) preset.
    """
    if isinstance(instruction, AccumulatorModel):
        return instruction
    if not isinstance(instruction, str):
        raise TypeError(f"instruction must be a name or an AccumulatorModel, got {type(instruction).__name__}")
    if not isinstance(arch, str):
        raise TypeError(f"arch must be a name such as 'sm90', got {type(arch).__name__}")
    key = instruction.strip().lower()
    arch_key = arch.strip().lower()
    if key in ("exact", "fp32"):
        arch_key = "any"
    model = PRESETS.get((arch_key, key))
    if model is not None:
        return model
    known = ", ".join(f"{i!r} (arch {a!r})" for a, i in PRESETS)
    instrs = sorted({i for _, i in PRESETS})
    archs = sorted({a for a, _ in PRESETS if a != "any"})
    if key not in instrs:
        hint = close_matches(key, instrs)
        what = f"unknown instruction {instruction!r}"
    elif arch_key not in archs:
        hint = close_matches(arch_key, archs)
        what = f"unknown arch {arch!r}"
    else:
        hint = [a for a, i in PRESETS if i == key]
        what = f"instruction {instruction!r} has no preset for arch {arch!r}"
    msg = f"no accumulator model for instruction {instruction!r} on arch {arch!r} ({what})"
    if hint:
        msg += f"; did you mean {' or '.join(map(repr, hint))}?"
    raise UnknownNameError(f"{msg}; known: {known}")


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


def _batch_shape(a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> tuple[int, ...]:
    shapes = [a.shape[:-2], b.shape[:-2]] + ([c.shape[:-2]] if c is not None else [])
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        names = "a, b" + (", c" if c is not None else "")
        raise ValueError(
            f"the batch dimensions of {names} do not broadcast: {', '.join(map(str, shapes))} "
            f"(shapes a {a.shape}, b {b.shape}" + (f", c {c.shape})" if c is not None else ")")
        ) from None


def _run(a, b, c, a_format, b_format, model: AccumulatorModel, promote: int) -> np.ndarray:
    fa_ = _fmt8(a_format, "a_format")
    fb_ = _fmt8(b_format, "b_format")
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = _batch_shape(a, b, c)
    nb = math.prod(batch)
    if nb * M * N == 0:  # nothing to compute (reshape(-1, ...) cannot size an empty array)
        return np.zeros(batch + (M, N), np.float32)
    if K == 0:  # no instruction at all: D = C exactly (IEEE: NaN payloads kept), or +0 without C
        if c is None:
            return np.zeros(batch + (M, N), np.float32)
        return np.array(np.broadcast_to(c, batch + (M, N)), dtype=np.float32)
    a3 = np.ascontiguousarray(np.broadcast_to(a, batch + (M, K))).reshape((nb, M, K))
    b3 = np.ascontiguousarray(np.swapaxes(np.broadcast_to(b, batch + (K, N)).reshape((nb, K, N)), 1, 2))
    if c is None:
        c3 = np.zeros((nb, M, N), np.float64)
    else:
        c3 = np.broadcast_to(c, batch + (M, N)).reshape((nb, M, N)).astype(np.float64)
        if model.output == "f16" and promote <= 0:
            # C is the initial tensor-core accumulator, held in fp16; with promotion C is the
            # initial value of the separate fp32 accumulator and keeps its fp32 value
            with np.errstate(over="ignore"):
                c3 = c3.astype(np.float16).astype(np.float64)
    # one numba signature for every call: C-contiguous, writeable, aligned arrays
    req: Any = ("C_CONTIGUOUS", "WRITEABLE", "ALIGNED")
    a3, b3, c3 = np.require(a3, requirements=req), np.require(b3, requirements=req), np.require(c3, requirements=req)
    tA = _code_table(fa_, model.subnormal_exponent)
    tB = _code_table(fb_, model.subnormal_exponent)
    out = np.empty((nb, M, N), np.float64)
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
    if c is None:
        raise TypeError("c is required for mma (a float32 array (..., M, N); zeros for D = A @ B)")
    c = np.asarray(c)
    if c.dtype != np.float32:
        if c.dtype.kind != "f" and c.dtype != _BF16:
            raise TypeError(
                f"c must be a float32 array (float64, float16 or bfloat16 holding float32 values are "
                f"converted exactly), got dtype {c.dtype}"
            )
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
    Empty shapes work: M = 0 or N = 0 give an empty (..., M, N) result, K = 0 gives C
    unchanged (zeros without C).
    """
    model = get_model(instruction, arch)
    a = _check_codes(a, "a")
    b = _check_codes(b, "b")
    K = a.shape[-1]
    if b.shape[-2] != K:
        raise ValueError(f"inner dimensions differ: a has K={K}, b has K={b.shape[-2]}")
    if K % K_INSTR:
        raise ValueError(f"K must be a multiple of 32 (one instruction per 32 elements), got {K}")
    promote = 0
    if promote_every is not None:
        if isinstance(promote_every, (bool, np.bool_)):
            raise TypeError(f"promote_every must be None or a positive multiple of 32, got {promote_every!r}")
        try:
            promote = operator.index(promote_every)
        except TypeError:
            raise TypeError(
                f"promote_every must be None or a positive multiple of 32 (an integer), got {promote_every!r}"
            ) from None
        if promote <= 0 or promote % K_INSTR:
            raise ValueError(f"promote_every must be a positive multiple of 32, got {promote_every!r}")
    if c is not None:
        c = _check_c(c, a.shape[-2], b.shape[-1])
    return _run(a, b, c, a_format, b_format, model, promote)


# ---------------------------------------------------------- capture scoring
class CaptureError(ValueError):
    """A file that cannot be scored: unreadable, not an .npz archive, or a capture with
    missing keys, wrong shapes or dtypes, or no outputs (the message says which)."""


class NotTensorCoreCaptureError(CaptureError):
    """A readable hardware capture of another kind (the GEMM oracle's ``gemm_sm90.npz``, the
    conversion sweep ``cvt_sm90.npz``): :attr:`kind` names it, the message says how it is checked."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _where(path_or_npz) -> str:
    return "capture" if isinstance(path_or_npz, dict) else str(path_or_npz)


def load_capture(path_or_npz) -> dict:
    """Load a capture (.npz written by ``python -m gpu.capture``, ``gpu.characterize --save``,
    ``gpu.gemm`` or ``gpu.cvt_sweep``) into a dict, ``meta`` parsed from its JSON.

    A dict is returned as is.  A missing file raises ``FileNotFoundError``; a file that is not an
    .npz archive, holds pickled objects or has no readable ``meta`` raises :class:`CaptureError`.
    """
    import json
    import os
    import zipfile

    if isinstance(path_or_npz, dict):
        return path_or_npz
    where = str(path_or_npz)
    if isinstance(path_or_npz, (str, os.PathLike)):
        if not os.path.exists(path_or_npz):
            raise FileNotFoundError(f"no such file: {where}")
        if os.path.isdir(path_or_npz):
            raise CaptureError(f"{where}: is a directory, not an .npz capture")
        try:
            with open(path_or_npz, "rb") as fh:
                head = fh.read(6)
        except OSError as e:
            raise CaptureError(f"{where}: cannot be read ({e})") from None
        if head[:6] == b"\x93NUMPY":
            raise CaptureError(f"{where}: not an .npz capture (a single .npy array; captures are .npz archives)")
        if head[:4] not in (b"PK\x03\x04", b"PK\x05\x06"):
            what = "an empty file" if not head else f"not a zip archive: it starts with {head!r}"
            raise CaptureError(f"{where}: not an .npz capture ({what})")
    try:
        z = np.load(path_or_npz, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise CaptureError(f"{where}: not an .npz capture (numpy cannot read it: {e})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise CaptureError(f"{where}: not an .npz capture (a single .npy array of shape {np.shape(z)})")
    try:
        with z:
            d: dict[str, Any] = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise CaptureError(f"{where}: damaged .npz archive ({e})") from None
    meta = d.get("meta")
    if meta is None:
        d["meta"] = {}
        return d
    if meta.ndim != 0 or meta.dtype.kind not in "US":
        raise CaptureError(
            f"{where}: 'meta' must be a JSON string, got an array of dtype {meta.dtype}, shape {meta.shape}"
        )
    try:
        d["meta"] = json.loads(str(meta))
    except ValueError as e:
        raise CaptureError(f"{where}: 'meta' is not valid JSON ({e})") from None
    return d


def capture_kind(cap: dict) -> str:
    """The kind of a loaded capture: ``"mma"`` (single instructions, ``gpu.capture``),
    ``"chain"`` (K-long tile loops), ``"probes"`` (``gpu.characterize --save``), ``"gemm"``
    (``gpu.gemm``), ``"cvt"`` (``gpu.cvt_sweep``) or ``"unknown"``."""
    meta = cap.get("meta")
    if isinstance(meta, dict):
        if "e4m3_starts" in cap or "e5m2_starts" in cap or "instructions" in meta:
            return "cvt"
        kind = meta.get("kind", "mma")
        if kind in ("mma", "chain") and ("a_format" in meta or "d" in cap):
            return str(kind)
        return "unknown"
    if isinstance(meta, list) and meta and all(isinstance(m, dict) for m in meta):
        if "A0" in cap or all("labels" in m for m in meta):
            return "probes"
        if any(k.endswith("/d") for k in cap) or all("checksum" in m for m in meta):
            return "gemm"
    return "unknown"


_OTHER_KINDS = {
    "gemm": "GEMM capture of gpu.gemm (sampled rows of whole FP8 GEMMs); tests/test_gemm.py "
    "regenerates its operands and reproduces it (python3 -m pytest tests/test_gemm.py -k gpu_gemm)",
    "cvt": "conversion sweep of gpu.cvt_sweep (cvt.rn.satfinite over all 2**32 inputs); check it with "
    "PYTHONPATH=. python -m gpu.cvt_sweep --check FILE",
}


def _bits_equal(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Equal float32 bit patterns, any NaN matching any NaN (used by the probe fitter of
    ``gpu.characterize``, where the NaN pattern is not one of the fitted parameters).
    Verification uses :func:`_bits_identical`."""
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.float32)
    eq = x.view(np.uint32) == y.view(np.uint32)
    return eq | (np.isnan(x) & np.isnan(y))


def _bits_identical(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Identical float32 bit patterns, NaN sign and payload included (both must be float32)."""
    return x.view(np.uint32) == y.view(np.uint32)


def _need(cap: dict, key: str, where: str, dtype, ndim: int, what: str) -> np.ndarray:
    if key not in cap:
        raise CaptureError(f"{where}: capture has no {key!r} ({what})")
    x = cap[key]
    if not isinstance(x, np.ndarray) or x.dtype != dtype:
        got = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        hint = " (hardware outputs are compared bit for bit and must be stored as float32)" if key[:1] in "dD" else ""
        raise CaptureError(f"{where}: {key!r} must be {np.dtype(dtype).name} ({what}), got {got}{hint}")
    if x.ndim != ndim:
        raise CaptureError(f"{where}: {key!r} must have {ndim} dimensions ({what}), got shape {x.shape}")
    return x


def _meta_str(meta: dict, key: str, where: str, default: str | None = None) -> str:
    v = meta.get(key, default)
    if not isinstance(v, str):
        raise CaptureError(f"{where}: meta[{key!r}] must be a string, got {v!r}")
    return v


def verify_capture(path_or_npz, model=None, *, max_mismatches: int = 5) -> dict:
    """Score the emulator against a hardware capture, bit for bit.

    Every output is compared as a float32 bit pattern, NaN included: a NaN must have the
    hardware's sign and payload (the H200 writes 0x7fffffff, 0x7fffe000 for the fp16
    accumulator), so any change of a stored output is detected.  Scores single-instruction
    captures (``gpu.capture``), chained tile loops (``kind: "chain"``) and probe captures
    (``gpu.characterize --save``).  ``model`` (a name or an :class:`AccumulatorModel`) replaces
    the capture's own instruction.

    Returns a dict with ``match_rate``, ``n``, ``mismatches`` (count), ``outputs`` (per stored
    output), ``first_mismatches`` (list of dicts), ``kind`` and the capture's metadata.

    Raises :class:`NotTensorCoreCaptureError` for a GEMM or conversion capture,
    :class:`CaptureError` for a file that is not a readable capture (missing keys, wrong
    dtypes or shapes, outputs not stored as float32, no outputs at all), and ``UnknownNameError``
    for an unknown ``model``.
    """
    if isinstance(max_mismatches, (bool, np.bool_)) or not isinstance(max_mismatches, (int, np.integer)):
        raise TypeError(f"max_mismatches must be a non-negative integer, got {max_mismatches!r}")
    if max_mismatches < 0:
        raise ValueError(f"max_mismatches must be a non-negative integer, got {max_mismatches!r}")
    if model is not None and not isinstance(model, (str, AccumulatorModel)):
        raise TypeError(f"model must be None, a name or an AccumulatorModel, got {type(model).__name__}")
    where = _where(path_or_npz)
    cap = load_capture(path_or_npz)
    kind = capture_kind(cap)
    if kind in _OTHER_KINDS:
        raise NotTensorCoreCaptureError(f"{where}: not a tensor-core capture: {_OTHER_KINDS[kind]}", kind)
    if kind == "unknown":
        raise CaptureError(
            f"{where}: not a tensor-core capture (needs a, b, c, d and meta with a_format/b_format, "
            f"as python -m gpu.capture writes; keys found: {sorted(cap)})"
        )
    if isinstance(model, str):
        # a preset name: resolved on the capture's own arch (meta["arch"]) when replayed; an unknown
        # name is the caller's error, raised now
        if model.strip().lower() not in {i for _, i in PRESETS}:
            get_model(model)  # raises UnknownNameError with the close matches
        model = model.strip().lower()
    first: list[dict] = []
    results: dict[str, dict] = {}
    if kind == "probes":
        jobs, meta = _probe_jobs(cap, where, model)
    else:
        jobs, meta = _mma_jobs(cap, where, model, kind)
    total_n = total_bad = 0
    for key, run, hw in jobs:
        try:
            ref = run()
        except CaptureError:
            raise
        except (ValueError, TypeError) as e:
            raise CaptureError(f"{where}: cannot replay {key!r}: {e}") from None
        if ref.shape != hw.shape:
            raise CaptureError(
                f"{where}: {key!r} has shape {hw.shape}, but its inputs give outputs of shape {ref.shape}"
            )
        ok = _bits_identical(ref, hw)
        n = int(ok.size)
        bad = int(n - np.count_nonzero(ok))
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
    if total_n == 0:
        raise CaptureError(f"{where}: the capture has no outputs (0 batches or empty arrays): nothing to verify")
    return {
        "match_rate": (total_n - total_bad) / total_n,
        "n": total_n,
        "mismatches": total_bad,
        "outputs": results,
        "first_mismatches": first,
        "kind": kind,
        "meta": meta,
    }


def _mma_jobs(cap: dict, where: str, model: AccumulatorModel | str | None, kind: str):
    meta = cap["meta"]
    instr = model if model is not None else _meta_str(meta, "instruction", where, "wgmma")
    arch = _meta_str(meta, "arch", where, "sm90")
    fa_, fb_ = _meta_str(meta, "a_format", where), _meta_str(meta, "b_format", where)
    nd = 2 if kind == "chain" else 3
    shape = "(M, K)" if kind == "chain" else "(batches, M, 32)"
    a = _need(cap, "a", where, np.uint8, nd, f"A's FP8 codes {shape}")
    b = _need(cap, "b", where, np.uint8, nd, "B's FP8 codes " + ("(K, N)" if kind == "chain" else "(batches, 32, N)"))
    c = _need(cap, "c", where, np.float32, nd, "the accumulator input C")
    keys = sorted(k for k in cap if k == "d" or k.startswith("d_"))
    if not keys:
        raise CaptureError(f"{where}: capture has no 'd' (the hardware outputs)")
    jobs = []
    for key in keys:
        hw = _need(cap, key, where, np.float32, nd, "hardware outputs")
        if kind == "chain":
            promote = None
            if key != "d":
                tail = key[len("d_") :]
                num = tail[len("promote") :] if tail.startswith("promote") else ""
                if not num.isdigit() or int(num) <= 0 or int(num) % K_INSTR:
                    raise CaptureError(
                        f"{where}: unknown output {key!r} (chained captures hold 'd' and 'd_promote<N>', "
                        f"N a positive multiple of {K_INSTR})"
                    )
                promote = int(num)
            run = functools.partial(
                matmul, a, b, c, a_format=fa_, b_format=fb_, instruction=instr, arch=arch, promote_every=promote
            )
        else:
            if key != "d":
                raise CaptureError(f"{where}: unknown output {key!r} (single-instruction captures hold one 'd')")
            run = functools.partial(mma, a, b, c, a_format=fa_, b_format=fb_, instruction=instr, arch=arch)
        jobs.append((key, run, hw))
    return jobs, meta


def _probe_jobs(cap: dict, where: str, model: AccumulatorModel | str | None):
    meta = cap["meta"]
    jobs = []
    for i, m in enumerate(meta):
        for key in ("name", "instruction", "a_format", "b_format"):
            _meta_str(m, key, where + f" (probe {i})")
        A = _need(cap, f"A{i}", where, np.uint8, 2, "probe A codes (T, 32)")
        B = _need(cap, f"B{i}", where, np.uint8, 2, "probe B codes (T, 32)")
        C = _need(cap, f"C{i}", where, np.float32, 1, "probe accumulator inputs (T,)")
        D = _need(cap, f"D{i}", where, np.float32, 1, "probe hardware outputs (T,)")
        if not (A.shape[0] == B.shape[0] == C.shape[0] == D.shape[0]) or A.shape[1] != K_INSTR or B.shape[1] != K_INSTR:
            raise CaptureError(
                f"{where}: probe {i} ({m['name']}): shapes A {A.shape}, B {B.shape}, C {C.shape}, D {D.shape} "
                f"do not fit (T, 32), (T, 32), (T,), (T,)"
            )
        instr = model if model is not None else m["instruction"]

        def run(A=A, B=B, C=C, m=m, instr=instr):
            d = mma(
                A[:, None, :],
                B[:, :, None],
                C[:, None, None],
                a_format=m["a_format"],
                b_format=m["b_format"],
                instruction=instr,
            )
            return d[:, 0, 0]

        jobs.append((f"D{i} {m['name']} {m['a_format']}x{m['b_format']}", run, D))
    ins = sorted({m["instruction"] for m in meta})
    pairs = sorted({f"{m['a_format']}x{m['b_format']}" for m in meta})
    summary = {"kind": "probes", "instruction": ",".join(ins), "formats": pairs, "probes": len(meta)}
    return jobs, summary
