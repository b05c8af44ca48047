"""Tensor-core models beyond Hopper (fp8sim.tensorcore.archs / scaled_mma), bit for bit.

The reference is MMA-Sim (Xie et al., arXiv 2511.10909; the ``mmasim`` package, which needs torch),
validated by its authors on the GPUs: for every row of the instruction table and every operand
format pair, random tiles (codes over the whole code space, C over many magnitudes with zeros,
subnormals, inf and NaN, block scales over their range) must agree with it in every output's bit
pattern.  Crafted cases check the datapath facts with expected values derived by hand from the
published parameters (alignment width, truncation, the exponent of zero addends, overflow, -0, NaN).
The sm90 part compares MMA-Sim's Hopper models with the H200 captures in tests/data.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

import fp8sim.tensorcore as tc
from fp8sim.formats import format as fmt_of
from fp8sim.tensorcore import archs

DATA = os.path.join(os.path.dirname(__file__), "data")

E4M3_ONE = 0x38  # 1.0
E2M1 = {0.0: 0, 0.5: 1, 1.0: 2, 1.5: 3, 2.0: 4, 3.0: 5, 4.0: 6, 6.0: 7}


def code(x: float, name: str = "e4m3") -> int:
    """The code of x in an 8-bit format (x exactly representable)."""
    dt = fmt_of(name).ml_dtype
    assert float(dt(x)) == x, (x, name)
    return int(np.array([x], np.float32).astype(dt).view(np.uint8)[0])


def e4m3(x: float) -> int:
    return code(x, "e4m3")


def bits(d: np.ndarray) -> np.ndarray:
    return d.view(np.uint16 if d.dtype == np.float16 else np.uint32)


# ------------------------------------------------------------------ crafted cases (no reference needed)
def one_dot(av, bv, c, *, arch, instruction, a_format="e4m3", b_format="e4m3", out_format="f32", **kw):
    """D of one output: a (1, K) codes, b (K, 1) codes."""
    a = np.array([av], np.uint8)
    b = np.array(bv, np.uint8).reshape(-1, 1)
    cc = np.array([[c]], np.float16 if out_format == "f16" else np.float32)
    return tc.mma(a, b, cc, a_format=a_format, b_format=b_format, instruction=instruction, arch=arch,
                  out_format=out_format, **kw)[0, 0]  # fmt: skip


@pytest.mark.parametrize(("arch", "instruction", "F"), [("sm100", "tcgen05.mma", 25), ("sm120", "mma.sync", 25),
                                                        ("sm90", "wgmma", 13), ("sm89", "mma.sync", 13)])  # fmt: skip
def test_cancellation_keeps_f_bits_below_the_largest_exponent(arch, instruction, F):
    # products +2^16, -2^16 and 2^(16 - t): the small one survives the alignment iff t <= F
    for t in range(10, 28):
        if 16 - t < -18:
            continue
        e1 = max(16 - t - 8, -9)
        small = (e4m3(2.0**e1), e4m3(2.0 ** (16 - t - e1)))
        av = [e4m3(256.0), e4m3(-256.0), small[0]] + [0] * 29
        bv = [e4m3(256.0), e4m3(256.0), small[1]] + [0] * 29
        d = one_dot(av, bv, 0.0, arch=arch, instruction=instruction)
        assert d == (2.0 ** (16 - t) if t <= F else 0.0), (t, d)


def test_alignment_boundary_against_c_on_blackwell():
    # C = 1 and eight products 2^-25 (kept: F = 25) or 2^-26 (cut): the exact sums are 1 + 2^-22 and
    # 1 + 2^-23, both fp32 numbers, so only the alignment can lose the second
    kw = dict(a_format="e5m2", b_format="e5m2")
    for e, want in ((-25, 1.0 + 2.0**-22), (-26, 1.0)):
        av = [code(2.0**-13, "e5m2")] * 8 + [0] * 24
        bv = [code(2.0 ** (e + 13), "e5m2")] * 8 + [0] * 24
        assert one_dot(av, bv, 1.0, arch="sm100", instruction="tcgen05.mma", **kw) == np.float32(want)
        # Hopper keeps 13 bits: both are lost, and C comes back truncated to 13 bits (1.0)
        assert one_dot(av, bv, 1.0, arch="sm90", instruction="wgmma", **kw) == 1.0


def test_overflow_is_inf_and_minus_zero_is_plus_zero_and_nan_is_canonical():
    # UE8M0 scales 2^127 on both sides: 448 * 448 * 2^254 overflows fp32; RZ rounding, yet inf
    av = [e4m3(448.0)] + [0] * 31
    sa = np.array([[254]], np.uint8)
    kw = dict(arch="sm100", instruction="tcgen05.mma", a_scale=sa, b_scale=sa)
    assert one_dot(av, av, 0.0, **kw) == np.inf
    assert one_dot([e4m3(-448.0)] + [0] * 31, av, 0.0, **kw) == -np.inf
    # 2^127 * 2^-127 = 1: scales fold into the exponent exactly
    assert one_dot([E4M3_ONE] + [0] * 31, [E4M3_ONE] + [0] * 31, 0.0, arch="sm100", instruction="tcgen05.mma",
                   a_scale=np.array([[254]], np.uint8), b_scale=np.array([[0]], np.uint8)) == 1.0  # fmt: skip
    # -0: zero products with C = -0, and 1 - 1 with C = -0, give +0
    for av_, bv_ in (([0] * 32, [0] * 32), ([E4M3_ONE, e4m3(-1.0)] + [0] * 30, [E4M3_ONE] * 2 + [0] * 30)):
        d = one_dot(av_, bv_, -0.0, arch="sm100", instruction="tcgen05.mma")
        assert d == 0 and bits(np.array([d]))[0] == 0
    # a NaN scale (0xff) gives the canonical NaN
    d = one_dot(av, av, 1.0, arch="sm100", instruction="tcgen05.mma", a_scale=np.array([[255]], np.uint8),
                b_scale=np.array([[127]], np.uint8))  # fmt: skip
    assert int(bits(np.array([d], np.float32))[0]) == 0x7FFFFFFF


def test_fp16_accumulator_zero_exponent_floor():
    # fp16 products 2^-25 and 2^-48 into an f16 accumulator (MMA-Sim: zeros take the exponent -21).
    # The alignment exponent is max(-25, -21) = -21, so 2^-48 is below its 25 bits and lost; the
    # sum 2^-25 is half of fp16's smallest subnormal: a tie, rounded to even = +0.  Without the
    # floor (aligned at -25) 2^-48 would be kept and the sum rounded up to 2^-24.
    def f16(x):
        return int(np.array([x], np.float16).view(np.uint16)[0])

    a = np.array([[f16(2.0**-12), f16(2.0**-24)] + [0] * 14], np.uint16)
    b = np.array([f16(2.0**-13), f16(2.0**-24)] + [0] * 14, np.uint16).reshape(-1, 1)
    c = np.zeros((1, 1), np.float16)
    d = tc.mma(a, b, c, a_format="fp16", b_format="fp16", instruction="tcgen05.mma", arch="sm100", out_format="f16")
    assert d.dtype == np.float16 and d[0, 0] == 0
    free = tc.AccumulatorModel(**{**archs.rows_for("sm100", "tcgen05.mma")[0].model.summary(), "zero_exponent": None,
                                  "out_rounding": "rne", "out_frac_bits": 10, "output": "f16", "instr_k": 16,
                                  "block": 16, "nan_bits": 0x7FFFE000, "overflow": "ieee"})  # fmt: skip
    d2 = tc.mma(a, b, c, a_format="fp16", b_format="fp16", instruction=free, out_format="f16")
    assert d2[0, 0] == np.float16(2.0**-24)


def test_nvfp4_groups_are_exact_and_take_the_scale_exponent():
    # 16 products 6 * 6 = 36 sum exactly to 576 in one group; with UE4M3 scales 1.0 the result is
    # exact.  A group that cancels exactly still sets the alignment exponent (it is no zero addend).
    K = 64
    a = np.zeros((1, K), np.uint8)
    b = np.zeros((K, 1), np.uint8)
    a[0, :16] = E2M1[6.0]
    b[:16, 0] = E2M1[6.0]
    one = 0x38  # ue4m3 1.0
    sa = np.full((1, 4), one, np.uint8)
    sb = np.full((4, 1), one, np.uint8)
    kw = dict(a_format="e2m1", b_format="e2m1", instruction="tcgen05.mma", arch="sm100", a_scale=sa, b_scale=sb,
              scale_format="ue4m3")  # fmt: skip
    assert tc.mma(a, b, np.zeros((1, 1), np.float32), **kw)[0, 0] == 576.0
    # C = 2^-20 survives 35 bits below 2^0 (the group's scale exponent) but not 2^-40
    assert tc.mma(a, b, np.full((1, 1), 2.0**-20, np.float32), **kw)[0, 0] == np.float32(576.0 + 2.0**-20)
    # group 2: +1 -1 (cancels to 0, still exponent 0): C = 2^-36 is cut (36 > 35 bits below 2^0)
    a2 = np.zeros((1, K), np.uint8)
    b2 = np.zeros((K, 1), np.uint8)
    a2[0, 16], a2[0, 17] = E2M1[1.0], E2M1[1.0] | 8  # +1, -1
    b2[16, 0], b2[17, 0] = E2M1[1.0], E2M1[1.0]
    assert tc.mma(a2, b2, np.full((1, 1), 2.0**-36, np.float32), **kw)[0, 0] == 0.0
    # all-zero groups take e_zero = -139 instead: C = 2^-36 alone is kept
    assert tc.mma(np.zeros((1, K), np.uint8), b2, np.full((1, 1), 2.0**-36, np.float32), **kw)[0, 0] == 2.0**-36


def test_cdna3_interleaved_lanes_and_round_down():
    # even lane: 2^10 and -2^(10-30); odd lane: nothing.  The even lane keeps 24 bits below 2^10,
    # so -2^-20 is cut to 0 (truncation of the magnitude) ...
    def fnuz(x):
        return int(np.array([x], np.float32).astype(fmt_of("e4m3fnuz").ml_dtype).view(np.uint8)[0])

    a = [fnuz(32.0), 0, fnuz(-(2.0**-10))] + [0] * 29
    b = [fnuz(32.0), 0, fnuz(2.0**-10)] + [0] * 29
    kw = dict(arch="cdna3", instruction="mfma", a_format="e4m3fnuz", b_format="e4m3fnuz")
    assert one_dot(a, b, 0.0, **kw) == 1024.0
    # ... but in the odd lane it is its own sum, and adding the lanes truncates toward -inf:
    # 1024 - 2^-20 cut toward -inf to 24 bits below 2^10 is 1024 - 2^-14 (an fp32 number; toward
    # zero it would be 1024)
    a = [fnuz(32.0), fnuz(-(2.0**-10))] + [0] * 30
    b = [fnuz(32.0), fnuz(2.0**-10)] + [0] * 30
    assert one_dot(a, b, 0.0, **kw) == np.float32(1024.0 - 2.0**-14)


def test_bad_operands_are_named():
    a = np.zeros((2, 32), np.uint8)
    b = np.zeros((32, 2), np.uint8)
    c = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match=r"codes of e2m1 .* must be < 16"):
        tc.mma(a + 16, b, c, a_format="e2m1", b_format="e2m1", instruction="tcgen05.mma", arch="sm100")
    with pytest.raises(ValueError, match="does not take e2m1 x e2m1, K=32, out_format='f32', scales ue4m3 per 16"):
        tc.mma(a, b, c, a_format="e2m1", b_format="e2m1", instruction="tcgen05.mma", arch="sm100",
               a_scale=np.zeros((2, 2), np.uint8), b_scale=np.zeros((2, 2), np.uint8), scale_format="ue4m3")  # fmt: skip
    with pytest.raises(ValueError, match="a_scale must have shape"):
        tc.mma(a, b, c, a_format="e4m3", b_format="e4m3", instruction="tcgen05.mma", arch="sm100",
               a_scale=np.zeros((2, 3), np.uint8), b_scale=np.zeros((3, 2), np.uint8))  # fmt: skip
    with pytest.raises(ValueError, match="scale codes of ue4m3 must be < 128"):
        tc.mma(np.zeros((2, 64), np.uint8), np.zeros((64, 2), np.uint8), c, a_format="e2m1", b_format="e2m1",
               instruction="tcgen05.mma", arch="sm100", a_scale=np.full((2, 4), 200, np.uint8),
               b_scale=np.zeros((4, 2), np.uint8), scale_format="ue4m3")  # fmt: skip


def test_models_listing_names_every_row_with_its_evidence():
    text = archs.models_listing()
    for r in archs.ROWS:
        assert any(r.key in line and r.arch in line and r.evidence in line for line in text.splitlines()), r.key
    assert "wgmma " in text and archs.EVIDENCE_H200 in text and archs.EVIDENCE_MMASIM in text


def test_matmul_chains_instructions_and_promotes():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 64, (8, 128)).astype(np.uint8)
    b = rng.integers(0, 64, (128, 8)).astype(np.uint8)
    kw = dict(a_format="e3m2", b_format="e2m3", instruction="tcgen05.mma", arch="sm100")
    c = np.zeros((8, 8), np.float32)
    d = c
    for k in range(0, 128, 32):
        d = tc.mma(a[:, k : k + 32], b[k : k + 32], d, **kw)
    assert (bits(tc.matmul(a, b, **kw)) == bits(d)).all()
    tot = np.zeros((8, 8), np.float32)
    for k in range(0, 128, 64):
        part = tc.matmul(a[:, k : k + 64], b[k : k + 64], **kw)
        tot = (tot + part).astype(np.float32)
    assert (bits(tc.matmul(a, b, promote_every=64, **kw)) == bits(tot)).all()


def test_bf16_kernel_agrees_with_the_wide_module():
    # two implementations of the H200 BF16 model: fp8sim.tensorcore.wide and the general kernel
    from fp8sim.tensorcore.wide import MODEL_WGMMA_BF16, bf16_matmul

    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    xb = (x.view(np.uint32) >> 16).astype(np.uint16)
    wb = (w.view(np.uint32) >> 16).astype(np.uint16)
    ref = bf16_matmul(xb, wb, MODEL_WGMMA_BF16)
    got = tc.matmul(xb, wb, a_format="bf16", b_format="bf16", instruction="wgmma", arch="sm90")
    assert (bits(got) == bits(ref)).all()


# ------------------------------------------------------------------ MMA-Sim, the reference
mmasim = None


def _mmasim():
    global mmasim
    if mmasim is None:
        mmasim = pytest.importorskip("mmasim")
    return mmasim


_PTX = {"fp16": "f16", "bf16": "bf16", "tf32": "tf32"}
_AMD = {"e4m3fnuz": "fp8", "e5m2fnuz": "bf8"}


def _torch(codes, fmt: str, packed: bool, axis: int):
    import torch

    dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e4m3fnuz": torch.float8_e4m3fnuz,
          "e5m2fnuz": torch.float8_e5m2fnuz}  # fmt: skip
    codes = np.ascontiguousarray(codes)
    if fmt in dt:
        return torch.from_numpy(codes).view(dt[fmt])
    if fmt in ("bf16", "fp16"):
        return torch.from_numpy(codes.view(np.int16)).view(torch.bfloat16 if fmt == "bf16" else torch.float16)
    if fmt == "tf32":  # fp32 values of the tf32 codes (MMA-Sim truncates fp32 to tf32)
        return torch.from_numpy((codes.astype(np.uint32) << 13).view(np.float32).copy())
    if fmt == "e2m1" and packed:  # two per byte, the first element in the high nibble
        x = np.moveaxis(codes, axis, -1)
        return torch.from_numpy(np.ascontiguousarray(np.moveaxis((x[..., 0::2] << 4) | x[..., 1::2], -1, axis)))
    if fmt == "e2m1":  # kind::f8f6f4 holds FP4 in bits 5:2 of its byte
        return torch.from_numpy(codes << 2)
    return torch.from_numpy(codes)  # FP6 in bits 5:0


def _ref_op(row: archs.Row, fa: str, fb: str, K: int, sfmt, block):
    ms = _mmasim()
    from mmasim import nv_ptx

    pa, pb, out = _PTX.get(fa, fa), _PTX.get(fb, fb), row.out
    if row.arch == "cdna3":
        from mmasim.amd import MFMA

        return MFMA("CDNA3", f"f32_{'16x16x32' if K == 32 else '32x32x16'}_{_AMD[fa]}_{_AMD[fb]}")
    name = {"sm89": "Ada Lovelace", "sm90": "Hopper", "sm100": "Blackwell", "sm120": "RTX Blackwell"}[row.arch]
    if row.instruction == "wgmma":
        return nv_ptx.WGMMA(name, f"m64n8k{K}.{out}.{pa}.{pb}")
    if row.instruction == "tcgen05.mma":
        if sfmt is None:
            return nv_ptx.TCGen05MMA(name, f"m128n8k{K}.kind::{row.kind}.{out}.{pa}.{pb}")
        return nv_ptx.TCGen05MMABlockScale(name, f"m128n8k{K}.kind::{row.kind}.block{block}.f32.{pa}.{pb}.{sfmt}")
    if sfmt is not None:
        return nv_ptx.MMABlockScale(name, f"m16n8k{K}.kind::{row.kind}.block{block}.f32.{pa}.{pb}.f32.{sfmt}")
    if row.kind == "f8f6f4":
        return nv_ptx.MMA(name, f"m16n8k{K}.kind::f8f6f4.{out}.{pa}.{pb}.{out}")
    del ms
    return nv_ptx.MMA(name, f"m16n8k{K}.{out}.{pa}.{pb}.{out}")


def reference(row: archs.Row, fa, fb, a, b, c, sa=None, sb=None, sfmt=None) -> np.ndarray:
    """MMA-Sim's D (bit patterns) for one instruction of ``row``."""
    import torch

    K = a.shape[1]
    block = None if sa is None else K // sa.shape[1]
    op = _ref_op(row, fa, fb, K, sfmt, block)
    packed = sa is not None and K == 64
    args = [_torch(a, fa, packed, 1), _torch(b, fb, packed, 0), torch.from_numpy(np.ascontiguousarray(c))]
    if sa is not None:
        st = torch.float8_e8m0fnu if sfmt == "ue8m0" else torch.float8_e4m3fn
        args += [torch.from_numpy(np.ascontiguousarray(s)).view(st) for s in (sa, sb)]
    d = op(*args)
    return d.view(torch.int16).numpy().view(np.uint16) if d.dtype == torch.float16 else d.numpy().view(np.uint32)


def _codes(rng, f, shape):
    return rng.integers(0, f.num_codes, shape).astype(f.code_dtype)


def random_case(rng, row: archs.Row, fa: str, fb: str, K: int, scale, M: int, N: int, finite_c: bool = False):
    """Random codes over the whole code space, C over many magnitudes (zeros, subnormals, inf, NaN),
    scales over their range (half of the tiles near 1, so that products neither all overflow nor
    all underflow)."""
    a = _codes(rng, fmt_of(fa), (M, K))
    b = _codes(rng, fmt_of(fb), (K, N))
    m = rng.uniform(1, 2, (M, N)) * np.exp2(rng.integers(-40, 40, (M, N)).astype(float)) * rng.choice([-1, 1], (M, N))
    r = rng.random((M, N))
    m[r < 0.1] = 0.0
    m[(r >= 0.1) & (r < 0.15)] *= 2.0**-100  # fp32 subnormals / fp16 zeros
    if not finite_c:
        m[(r >= 0.15) & (r < 0.16)] = np.inf
        m[(r >= 0.16) & (r < 0.17)] = -np.inf
        m[(r >= 0.17) & (r < 0.18)] = np.nan
    with np.errstate(over="ignore"):
        c = m.astype(np.float16 if row.out == "f16" else np.float32)
    sa = sb = sname = None
    if scale is not None:
        sfmt, block = scale
        sname = "ue8m0" if sfmt == "e8m0" else sfmt
        sf = archs.scale_format(sname)
        sa = _codes(rng, sf, (M, K // block))
        sb = _codes(rng, sf, (K // block, N))
        if sname == "ue8m0" and rng.random() < 0.5:
            sa = rng.integers(112, 142, sa.shape).astype(np.uint8)
            sb = rng.integers(112, 142, sb.shape).astype(np.uint8)
    return a, b, c, sa, sb, sname


def cases(rows=archs.ROWS):
    for row in rows:
        for K in row.ks:
            for fa in row.formats:
                for fb in row.formats:
                    if row.same_format and fa != fb:
                        continue
                    for scale in row.scales or (None,):
                        yield row, fa, fb, K, scale


def _id(case):
    row, fa, fb, K, scale = case
    return f"{row.arch}-{row.key}-{fa}x{fb}-k{K}" + ("" if scale is None else f"-{scale[0]}/{scale[1]}")


#: rows whose reference differs from fp8sim on purpose (docs/accelerators.md): MMA-Sim's CDNA3 MFMA
#: drops a non-finite accumulator when the products' largest exponent is at least 25
DIFFERENT = {("cdna3", "mfma")}


def compare(case, M, N, seed, finite_c=False):
    row, fa, fb, K, scale = case
    rng = np.random.default_rng(seed)
    a, b, c, sa, sb, sname = random_case(rng, row, fa, fb, K, scale, M, N, finite_c)
    d = tc.mma(a, b, c, a_format=fa, b_format=fb, instruction=row.instruction, arch=row.arch, out_format=row.out,
               a_scale=sa, b_scale=sb, scale_format=sname)  # fmt: skip
    return int((bits(d) != reference(row, fa, fb, a, b, c, sa, sb, sname)).sum()), d.size


SAME = [
    cs
    for cs in cases()
    if (cs[0].arch, cs[0].key) not in DIFFERENT and not (cs[0].arch == "sm90" and cs[0].key == "mma.sync")
]


@pytest.mark.parametrize("case", SAME, ids=_id)
def test_equal_to_mmasim_on_random_tiles(case):
    _mmasim()
    mism, n = compare(case, 16, 8, seed=hash(_id(case)) % 2**32)
    assert mism == 0, f"{mism} of {n} outputs differ"


@pytest.mark.slow
@pytest.mark.parametrize("row", [r for r in archs.ROWS if (r.arch, r.key) not in DIFFERENT and not
                                 (r.arch == "sm90" and r.key == "mma.sync")], ids=lambda r: f"{r.arch}-{r.key}")  # fmt: skip
def test_equal_to_mmasim_1e5_outputs_per_instruction(row):
    _mmasim()
    cs = list(cases([row]))
    per = -(-100_000 // len(cs))
    N = 64
    M = -(-per // N)
    total = mism = 0
    for i, case in enumerate(cs):
        m, n = compare(case, M, N, seed=1000 + i)
        mism += m
        total += n
    assert total >= 100_000 and mism == 0, f"{mism} of {total} outputs differ"


#: the default suite's sample and the slow check's (at least 10^5 outputs per instruction)
SIZES = [1024, pytest.param(100_000, marks=pytest.mark.slow)]


def _tile(outputs: int, parts: int) -> tuple[int, int]:
    """(M, N) of each of ``parts`` tiles that together hold at least ``outputs`` outputs."""
    per = -(-outputs // parts)
    N = 16 if per <= 1024 else 64
    return -(-per // N), N


@pytest.mark.parametrize("outputs", SIZES)
def test_cdna3_equal_to_mmasim_with_finite_accumulators(outputs):
    # no NaN codes and finite C: equal; the documented difference needs a non-finite accumulator
    _mmasim()
    cs = list(cases([r for r in archs.ROWS if r.arch == "cdna3"]))
    M, N = _tile(outputs, len(cs))
    total = 0
    for i, case in enumerate(cs):
        row, fa, fb, K, scale = case
        rng = np.random.default_rng(7 + i)
        a, b, c, *_ = random_case(rng, row, fa, fb, K, None, M, N, finite_c=True)
        a[a == 0x80] = 0
        b[b == 0x80] = 0
        d = tc.mma(a, b, c, a_format=fa, b_format=fb, instruction="mfma", arch="cdna3")
        assert (bits(d) == reference(row, fa, fb, a, b, c)).all(), _id(case)
        total += d.size
    assert total >= outputs


def _cdna3_dropped(a, b, c, fa, fb):
    """Where MMA-Sim drops a non-finite accumulator: entering a 16-product step of the MFMA (the
    chain's C, then the partial result after each 16 products), inf/NaN while that step's largest
    product exponent is >= 25 (MMA-Sim gives inf/NaN the exponent -1, below its 24 + 1-bit window)."""
    _, ea = _exp_table(fa)
    _, eb = _exp_table(fb)
    acc = c
    dropped = np.zeros(c.shape, bool)
    for s in range(0, a.shape[1], 16):
        e = (ea[a[:, s : s + 16]][:, :, None] + eb[b[s : s + 16]][None]).max(axis=1)
        dropped |= ~np.isfinite(acc) & (e >= 25)
        acc = tc.mma(a[:, : s + 16], b[: s + 16], c, a_format=fa, b_format=fb, instruction="mfma", arch="cdna3")
    return dropped


@pytest.mark.parametrize("outputs", SIZES)
def test_cdna3_difference_is_only_the_dropped_nonfinite_accumulator(outputs):
    # the whole code space and non-finite C: where fp8sim and MMA-Sim differ, fp8sim has inf/NaN
    # (IEEE propagation) and MMA-Sim a finite value, and MMA-Sim dropped the accumulator
    _mmasim()
    cs = list(cases([r for r in archs.ROWS if r.arch == "cdna3"]))
    M, N = _tile(outputs, len(cs))
    total = ndiff = 0
    for i, case in enumerate(cs):
        row, fa, fb, K, _ = case
        rng = np.random.default_rng(8 + i)
        a, b, c, *_ = random_case(rng, row, fa, fb, K, None, M, N)
        d = tc.mma(a, b, c, a_format=fa, b_format=fb, instruction="mfma", arch="cdna3")
        ref = reference(row, fa, fb, a, b, c)
        diff = bits(d) != ref
        assert not np.isfinite(d[diff]).any() and np.isfinite(ref[diff].view(np.float32)).all(), _id(case)
        assert (diff <= _cdna3_dropped(a, b, c, fa, fb)).all(), _id(case)
        if fa != "e5m2fnuz" or fb != "e5m2fnuz":  # products below 2^23: MMA-Sim never drops C
            assert not diff.any(), _id(case)
        total += d.size
        ndiff += int(diff.sum())
    assert total >= outputs and ndiff > 0


def _exp_table(name):
    from fp8sim.tensorcore.scaled_mma import decode_operand

    f = fmt_of(name)
    return decode_operand(np.arange(f.num_codes, dtype=f.code_dtype), f)


# ------------------------------------------------------------------ sm90: MMA-Sim's Hopper models vs the H200
def test_mmasim_hopper_wgmma_equals_the_h200_captures():
    torch = pytest.importorskip("torch")
    _mmasim()
    from mmasim.nv_ptx import WGMMA

    dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    files = sorted(glob.glob(os.path.join(DATA, "wgmma*_*x*_normal.npz")))
    files += sorted(glob.glob(os.path.join(DATA, "wgmma*_*x*_special.npz")))
    assert len(files) == 16
    for f in files:
        z = np.load(f)
        json.loads(str(z["meta"]))
        instr, pair = os.path.basename(f).split("_")[:2]
        fa, fb = pair.split("x")
        f16 = instr == "wgmma.f16"
        op = WGMMA("Hopper", f"m64n8k32.{'f16' if f16 else 'f32'}.{fa}.{fb}")
        for t in range(z["a"].shape[0]):
            cc = torch.from_numpy(z["c"][t])
            dd = op(torch.from_numpy(z["a"][t]).view(dt[fa]), torch.from_numpy(z["b"][t]).view(dt[fb]),
                    cc.half() if f16 else cc).float().numpy()  # fmt: skip
            got = np.where(np.isnan(dd), np.float32(np.nan), dd).view(np.uint32).copy()
            got[np.isnan(dd)] = 0x7FFFE000 if f16 else 0x7FFFFFFF
            assert (got == z["d"][t].view(np.uint32)).all(), (f, t)
