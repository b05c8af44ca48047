"""The fast path of the kernels beyond Hopper (float32 products, int32 sums) against MMA-Sim.

tests/test_arch_models.py draws codes over the whole code space, so nearly every block there
holds an inf/NaN code and takes the float64 path.  Here the codes are finite (and the scales not
NaN), the tiles span several kernel tasks (more rows and columns than a task's), and every
output must equal MMA-Sim's bit for bit; the two paths must also agree with each other.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import fp8sim.tensorcore as tc
from fp8sim.formats import format as fmt_of
from fp8sim.tensorcore import archs
from fp8sim.tensorcore._mma_tiles import COLUMNS_PER_TASK, MB, NB
from fp8sim.tensorcore.scaled_mma import decode_operand

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_arch_models as T  # noqa: E402  (its random cases and its MMA-Sim reference)


def _finite(x, name):
    v, _ = decode_operand(x, fmt_of(name))
    x[~np.isfinite(v)] = 0
    return x


def _one_pair_per_row():
    seen = set()
    for case in T.SAME:
        row, fa, fb, K, scale = case
        if (row.arch, row.key, K, scale) in seen or (row.arch == "sm90" and row.key in ("wgmma", "wgmma.f16")):
            continue
        seen.add((row.arch, row.key, K, scale))
        yield case


@pytest.mark.parametrize("case", list(_one_pair_per_row()), ids=T._id)
def test_fast_path_equals_mmasim_on_finite_tiles(case):
    T._mmasim()
    row, fa, fb, K, scale = case
    rng = np.random.default_rng(abs(hash(T._id(case))) % 2**32)
    a, b, c, sa, sb, sname = T.random_case(rng, row, fa, fb, K, scale, MB + 4, NB + 44, finite_c=True)
    a, b = _finite(a, fa), _finite(b, fb)
    if sa is not None:
        nan = 255 if sname == "ue8m0" else 127
        sa[sa == nan] = 1
        sb[sb == nan] = 1
    d = tc.mma(a, b, c, a_format=fa, b_format=fb, instruction=row.instruction, arch=row.arch, out_format=row.out,
               a_scale=sa, b_scale=sb, scale_format=sname)  # fmt: skip
    ref = T.reference(row, fa, fb, a, b, c, sa, sb, sname)
    assert int((T.bits(d) != ref).sum()) == 0


@pytest.mark.parametrize(("fa", "arch", "instr", "out"), [("e4m3", "sm100", "tcgen05.mma", "f32"),
                                                      ("e2m3", "sm100", "tcgen05.mma", "f16"),
                                                      ("fp16", "sm100", "tcgen05.mma", "f32"),
                                                      ("e5m2fnuz", "cdna3", "mfma", "f32")])  # fmt: skip
def test_fast_and_float64_paths_agree(monkeypatch, fa, arch, instr, out):
    # the same finite operands on the fast path and, with the format check forced off, on the
    # float64 path: two derivations of every output (the module docstrings prove each exact)
    from fp8sim.tensorcore import scaled_mma

    f = fmt_of(fa)
    rng = np.random.default_rng(6)
    if f.bits == 16:
        a = rng.standard_normal((40, 128)).astype(np.float16).view(np.uint16)
        b = rng.standard_normal((128, 600)).astype(np.float16).view(np.uint16)
    else:
        a = _finite(rng.integers(0, f.num_codes, (40, 128)).astype(np.uint8), fa)
        b = _finite(rng.integers(0, f.num_codes, (128, 600)).astype(np.uint8), fa)
    c = (rng.standard_normal((40, 600)) * 2.0 ** rng.integers(-20, 20, (40, 600))).astype(np.float32)
    if out == "f16":
        c = np.clip(c, -6e4, 6e4).astype(np.float16)
    kw = dict(a_format=fa, b_format=fa, instruction=instr, arch=arch, out_format=out)
    fast = tc.matmul(a, b, c, **kw)
    fast_p = tc.matmul(a, b, c, promote_every=64, **kw) if out == "f32" else fast
    monkeypatch.setattr(scaled_mma, "_narrow", lambda fmt: False)
    slow = tc.matmul(a, b, c, **kw)
    slow_p = tc.matmul(a, b, c, promote_every=64, **kw) if out == "f32" else slow
    assert (T.bits(fast) == T.bits(slow)).all() and (T.bits(fast_p) == T.bits(slow_p)).all()


# ------------------------------------------------------------------ decoding, rounding, and a second implementation
def test_operand_decoding_equals_the_format_decoder(monkeypatch):
    # the kernels' one-pass decoding (per-code tables, tf32/fp32 from the bits) against
    # fp8sim.rounding.decode and the nominal exponents from frexp, every tf32/bf16/fp16 code; then
    # tf32 once more through the path of wide formats not laid out as float32 (decode_operand)
    from fp8sim.rounding import decode
    from fp8sim.tensorcore import scaled_mma
    from fp8sim.tensorcore._mma_decode import outside

    rng = np.random.default_rng(3)
    for name, codes in (("tf32", np.arange(1 << 19, dtype=np.uint32)), ("bf16", np.arange(1 << 16, dtype=np.uint16)),
                        ("fp16", np.arange(1 << 16, dtype=np.uint16)),
                        ("fp32", rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32))):  # fmt: skip
        f = fmt_of(name)
        if name == "fp32":  # and its subnormals, zeros, infs and NaNs
            codes[:6] = [0, 1, 0x007FFFFF, 0x80000001, 0x7F800000, 0xFFC00001]
        for side, L in (("a", 32), ("b", 16)):
            x = codes.reshape(-1, 64) if side == "a" else codes.reshape(64, -1)
            want = np.asarray(decode(x, f), np.float64)
            fin = np.isfinite(want) & (want != 0)
            true_e = np.frexp(np.abs(np.where(fin, want, 1.0)))[1] - 1
            bad = outside(want)
            if side == "a":
                spec_want = bad.reshape(bad.shape[0], -1, L).any(axis=2)
            else:
                spec_want = bad.reshape(-1, L, bad.shape[1]).any(axis=1)
                nb = COLUMNS_PER_TASK
                spec_want = np.stack([spec_want[:, n : n + nb].any(axis=1) for n in range(0, x.shape[1], nb)], 1)
            for sub, e_want in (("clamp", np.maximum(true_e, f.emin)), ("normalize", true_e)):
                v, e, spec = scaled_mma._decoded(x, f, sub, L, side)
                assert np.array_equal(v.astype(np.float64), want, equal_nan=True), (name, sub, side)
                assert np.array_equal(e[fin], e_want[fin]) and (e[~fin] == -10000).all(), (name, sub, side)
                assert np.array_equal(spec, spec_want), (name, sub, side)
                if name == "tf32":
                    with monkeypatch.context() as mp:
                        mp.setattr(scaled_mma, "_float32_shift", lambda fmt: -1)
                        v2, e2, spec2 = scaled_mma._decoded(x, f, sub, L, side)
                    assert np.array_equal(v2, v, equal_nan=True) and (e2 == e).all() and (spec2 == spec).all()


def _mx_dot(a_val, b_val, xa, xb, c=0.0):
    """One kind::mxf8f6f4 output: the e4m3 products a_val[k] * b_val[k] with UE8M0 scales 2**xa and 2**xb."""
    a = np.array([[T.code(v) for v in a_val] + [0] * (32 - len(a_val))], np.uint8)
    b = np.array([T.code(v) for v in b_val] + [0] * (32 - len(b_val)), np.uint8).reshape(-1, 1)
    return tc.mma(a, b, np.array([[c]], np.float32), a_format="e4m3", b_format="e4m3", instruction="tcgen05.mma",
                  arch="sm100", a_scale=np.array([[xa + 127]], np.uint8), b_scale=np.array([[xb + 127]], np.uint8),
                  scale_format="ue8m0")[0, 0]  # fmt: skip


def test_fp32_truncation_below_the_normal_range_and_at_overflow():
    # MMA-Sim's Blackwell datapath (25 bits below the largest exponent, at least e_zero = -133; RZ to
    # fp32; an overflow is inf), by hand: 1.875 * 1.875 = 3.515625 = 3 + 33/64
    tiny = np.float32(2.0**-149)
    # at 2^-149 (C = 0 sets the exponent -133: 25 bits reach 2^-158) the sum truncates to 3 units
    assert _mx_dot([1.875], [1.875], -127, -22) == 3 * tiny
    assert _mx_dot([-1.875], [1.875], -127, -22) == -3 * tiny
    # at 2^-150: 1.7578125 units, truncated to 1; at 2^-151: below one unit, +0 (not -0)
    assert _mx_dot([1.875], [1.875], -127, -23) == tiny
    d = _mx_dot([-1.875], [1.875], -127, -24)
    assert d == 0 and np.signbit(d) == np.False_
    # C = 2^-126 (exponent -126: units 2^-151) plus 3.515625 * 2^-150 = 7.03125 units: cut to 7 units,
    # 2^-126 + 1.75 * 2^-149, truncated to fp32: 2^-126 + 2^-149
    assert _mx_dot([1.875], [1.875], -127, -23, c=2.0**-126) == np.float32(2.0**-126) + tiny
    # overflow: 448 * 448 = 1.53125 * 2^17; times 2^110 a finite fp32 number, times 2^111 inf (not FLT_MAX)
    assert _mx_dot([448.0], [448.0], 127, -17) == np.float32(448.0 * 448.0 * 2.0**110)
    assert _mx_dot([448.0], [448.0], 127, -16) == np.inf
    assert _mx_dot([-448.0], [448.0], 127, -16) == -np.inf
    # just below 2^128: 1.875 * 1.875 * 2^126 = 1.7578125 * 2^127 is an fp32 number; two of them
    # (3.515625 * 2^127 >= 2^128) overflow
    assert _mx_dot([1.875], [1.875], 127, -1) == np.float32(1.7578125 * 2.0**127)
    assert _mx_dot([1.875, 1.875], [1.875, 1.875], 127, -1) == np.inf


def _custom_models():
    """Fused models the sm90 bit-level kernel also computes (K = 32 per instruction, no e_zero,
    IEEE overflow): every alignment and output rounding, widths from 0 to 30 bits, both outputs."""
    from dataclasses import replace

    base = archs.rows_for("sm90", "wgmma")[0].model
    out = []
    for i, (F, rd, outr, p, blk) in enumerate([(0, "rz", "rz", 23, 32), (5, "rd", "rne", 23, 8), (13, "rz", "ru", 13, 16),
                                               (13, "rd", "rd", 4, 1), (25, "rz", "rz", 23, 32), (25, "rd", "rne", 13, 4),
                                               (27, "rz", "ru", 23, 16), (30, "rz", "rd", 23, 32), (24, "rd", "rz", 0, 2)]):  # fmt: skip
        m = replace(base, name=f"custom {i}", frac_bits=F, align_rounding=rd, out_rounding=outr, out_frac_bits=p,
                    block=blk, validated=False)  # fmt: skip
        out.append(m)
    out.append(replace(base, name="custom f16", output="f16", out_frac_bits=10, out_rounding="rne", frac_bits=25,
                       nan_bits=0x7FFFE000, validated=False))  # fmt: skip
    out.append(replace(base, name="custom f16 rz", output="f16", out_frac_bits=7, out_rounding="rz", frac_bits=13,
                       block=16, nan_bits=0x7FFFE000, validated=False))  # fmt: skip
    return out


@pytest.mark.parametrize("model", _custom_models(), ids=lambda m: m.name)
def test_general_kernels_equal_the_bit_level_kernel(model):
    # the same model on the kernels of scaled_mma and, marked validated, on the sm90 bit-level kernel
    # (fp8sim.tensorcore._bitexact, a second implementation): every output bit for bit, on finite codes
    # (the fast path) and on the whole code space (the float64 path), C over many magnitudes, with and
    # without promotion
    from dataclasses import replace

    rng = np.random.default_rng(11)
    bit_level = replace(model, validated=True)
    row = archs.rows_for("sm90", "wgmma")[0]
    for fa, fb in (("e4m3", "e5m2"), ("e5m2", "e5m2")):
        for finite in (True, False):
            a, b, c, *_ = T.random_case(rng, row, fa, fb, 96, None, 2 * MB + 4, NB + 44, finite_c=finite)
            if finite:
                a, b = _finite(a, fa), _finite(b, fb)
            if model.output == "f16":
                c = np.clip(c, -6e4, 6e4).astype(np.float16).astype(np.float32)
            for promote in (None, 64) if model.output == "f32" else (None,):
                kw = dict(a_format=fa, b_format=fb, promote_every=promote)
                d = tc.matmul(a, b, c, instruction=model, **kw)
                ref = tc.matmul(a, b, c, instruction=bit_level, **kw)
                assert int((T.bits(d) != T.bits(ref)).sum()) == 0, (fa, fb, finite, promote)


@pytest.mark.parametrize("variant", [dict(), dict(block=32, instr_k=32), dict(frac_bits=30), dict(sum_frac_bits=20)],
                         ids=["preset", "block32", "F30", "F2-20"])  # fmt: skip
def test_cdna3_integer_lanes_and_float64_path_agree(monkeypatch, variant):
    # the CDNA3 kernel's int32 lanes (cuts toward -inf as arithmetic shifts) against its float64 path,
    # on models around the preset (F = 30 leaves the int32 lanes: both runs take the float64 path)
    from dataclasses import replace

    from fp8sim.tensorcore import scaled_mma

    model = replace(next(r for r in archs.ROWS if r.arch == "cdna3").model, **variant)
    rng = np.random.default_rng(12)
    for fa in ("e4m3fnuz", "e5m2fnuz"):
        a = _finite(rng.integers(0, 256, (40, 128)).astype(np.uint8), fa)
        b = _finite(rng.integers(0, 256, (128, 600)).astype(np.uint8), fa)
        c = (rng.standard_normal((40, 600)) * 2.0 ** rng.integers(-130, 60, (40, 600))).astype(np.float32)
        outs = []
        for narrow in (True, False):
            if not narrow:
                monkeypatch.setattr(scaled_mma, "_narrow", lambda fmt: False)
            kw = dict(a_format=fa, b_format=fa, instruction=model)
            outs.append((tc.matmul(a, b, c, **kw), tc.matmul(a, b, c, promote_every=64, **kw)))
        assert all((T.bits(x) == T.bits(y)).all() for x, y in zip(*outs)), fa


def test_floor_alignment_of_products_far_below_the_largest_exponent():
    # align_rounding="rd" cuts every addend toward -inf: a negative product far below the block's
    # largest exponent still takes one unit off.  C = 1.5 * 2^127 with F = 0 bits: units of 2^127, C
    # cut to 1 unit, the product -2^-18 to -1 unit: the sum is 0 (+0).  With F = 5: C is 48 units of
    # 2^122, the product -1: 47 * 2^122.
    from dataclasses import replace

    from fp8sim.tensorcore import scaled_mma

    base = archs.rows_for("sm90", "wgmma")[0].model
    a = np.zeros((1, 32), np.uint8)
    b = np.zeros((32, 1), np.uint8)
    a[0, 0], b[0, 0] = T.code(-(2.0**-9)), T.code(2.0**-9)
    c = np.full((1, 1), 1.5 * 2.0**127, np.float32)
    for F, want in ((0, 0.0), (5, 47 * 2.0**122)):
        m = replace(base, name=f"rd F={F}", frac_bits=F, align_rounding="rd", validated=False)
        d = tc.matmul(a, b, c, a_format="e4m3", b_format="e4m3", instruction=m)
        assert d[0, 0] == np.float32(want) and not np.signbit(d[0, 0]), (F, d)
        assert T.bits(d) == T.bits(tc.matmul(a, b, c, a_format="e4m3", b_format="e4m3",
                                             instruction=replace(m, validated=True)))  # fmt: skip
    # the same far below C on the fast path of fp16 (products down to 2^-48) and of scaled e4m3,
    # against the float64 path: many outputs, C up to 2^127, tiny products of both signs
    rng = np.random.default_rng(13)
    mx = next(r for r in archs.ROWS if r.key == "tcgen05.mma.kind::mxf8f6f4").model
    for name, model, scales in (("fp16", replace(mx, name="rd16", align_rounding="rd", frac_bits=3, block=16,
                                                 instr_k=16), None),
                                ("e4m3", replace(mx, name="rd8", align_rounding="rd", frac_bits=9), "ue8m0")):  # fmt: skip
        if name == "fp16":
            x = rng.standard_normal((2, 24, 64)) * 2.0 ** rng.integers(-24, -10, (2, 24, 64))
            a, b = (x[0].astype(np.float16).view(np.uint16), x[1].T.copy().astype(np.float16).view(np.uint16))
            kw = {}
        else:
            a = _finite(rng.integers(0, 256, (24, 64)).astype(np.uint8), name)
            b = _finite(rng.integers(0, 256, (64, 24)).astype(np.uint8), name)
            kw = dict(a_scale=rng.integers(0, 40, (24, 2)).astype(np.uint8),
                      b_scale=rng.integers(0, 40, (2, 24)).astype(np.uint8), scale_format=scales)  # fmt: skip
        c = rng.uniform(1, 2, (24, 24)) * 2.0 ** rng.integers(90, 128, (24, 24)) * rng.choice([-1, 1], (24, 24))
        c = c.astype(np.float32)
        fast = tc.matmul(a, b, c, a_format=name, b_format=name, instruction=model, **kw)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(scaled_mma, "_narrow", lambda fmt: False)
            slow = tc.matmul(a, b, c, a_format=name, b_format=name, instruction=model, **kw)
        assert (T.bits(fast) == T.bits(slow)).all() and (fast != c).any(), name
