"""Scaled quantization: properties, layouts, MX against gfloat, delayed scaling, bad input."""

import functools
import math
from bisect import bisect_left
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from gfloat import compute_scale_amax, quantize_block
from gfloat.formats import format_info_mxfp4_e2m1, format_info_mxfp8_e4m3, format_info_mxfp8_e5m2
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fp8sim
from fp8sim.formats import UnknownNameError
from fp8sim.rounding import RoundMode
from fp8sim.rounding.fast8 import NO_FAST, FastParams, fast_params, rne_code32
from fp8sim.scaling import MX, DelayedScaling, Group, Tile, quantize
from fp8sim.scaling.policy import ScalePolicy, scale_policy

GRANS = ["tensor", "row", "col", "1x8", "4x8", "3x5", "g4", "mx32", Group(4, axis=0), "nvfp4"]
FMTS = ["e4m3", "e5m2"]

finite32 = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)


def arrays(max_side=20):
    shape = st.tuples(st.integers(1, max_side), st.integers(1, max_side))
    return hnp.arrays(np.float32, shape, elements=finite32)


def ulp_at(v, fmt):
    """Spacing of fmt's grid at |v| (float64 arrays)."""
    fmt = fp8sim.format(fmt)
    a = np.abs(v)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.clip(e, fmt.emin, fmt.emax)
    return 2.0 ** (e - fmt.mbits)


def blocks_of(shape, block):
    """Independent block enumeration: (scale index, slice) pairs."""
    idx = [range(-(-s // b)) for s, b in zip(shape, block)]
    for k in np.ndindex(*[len(r) for r in idx]):
        yield k, tuple(slice(i * b, min((i + 1) * b, s)) for i, b, s in zip(k, block, shape))


# ---------------------------------------------------------------- properties
@settings(max_examples=60)
@given(
    arrays(),
    st.sampled_from(["tensor", "row", "col", "1x8", "4x8", "g4"]),
    st.sampled_from(FMTS),
    st.sampled_from([("fp32", None), ("pow2", "rceil"), ("pow2", "ceil"), ("bf16", "ceil"), ("e8m0", "rceil")]),
)
def test_round_trip_within_half_ulp(x, g, fmt, policy):
    """Without overflow (scales chosen so nothing overflows), each element is within half an ulp of
    the element format, times its scale, of the input."""
    sf, sr = policy
    q = quantize(x, fmt, g, scale_format=sf, scale_rounding=sr, saturate=False)
    s = q.expanded_scales()
    d = q.dequantize(np.float64)
    xs = x.astype(np.float64) / s
    assert np.isfinite(d).all()
    f = fp8sim.format(fmt)
    # below the smallest normal the grid spacing is the subnormal spacing
    bound = 0.5 * ulp_at(xs, f) * s
    assert (np.abs(d - x) <= bound).all()
    # and the codes are RNE of x / scale exactly
    ref = fp8sim.encode(xs, fmt, "rne")
    assert np.array_equal(q.codes, ref)


@settings(max_examples=40)
@given(
    arrays(),
    st.sampled_from(["tensor", "row", "1x8", "4x8", "g4", "mx32"]),
    st.sampled_from(["floor", "ceil", "rceil", "even"]),
    st.sampled_from(["pow2", "e8m0"]),
    st.integers(-2, 2),
)
def test_power_of_two_scales_are_powers_of_two(x, g, rounding, sf, margin):
    if g == "mx32":
        sf = "e8m0"
    q = quantize(x, "e4m3", g, scale_format=sf, scale_rounding=rounding, margin=margin)
    m, e = np.frexp(q.scales.astype(np.float64))
    assert (m == 0.5).all()
    lo = -127 if sf == "e8m0" else -126
    assert ((e - 1 >= lo) & (e - 1 <= 127)).all()


@settings(max_examples=40)
@given(arrays(16), st.sampled_from(GRANS[:-1]), st.data())
def test_block_independence(x, g, data):
    """Changing the values of one block leaves every other block's codes and scales unchanged."""
    q = quantize(x, "e4m3", g)
    blocks = list(blocks_of(x.shape, q.block_shape))
    k, sl = blocks[data.draw(st.integers(0, len(blocks) - 1))]
    y = x.copy()
    y[sl] = y[sl] * np.float32(data.draw(st.sampled_from([3.0, -1e3, 1e-3, 0.0])))
    q2 = quantize(y, "e4m3", g)
    mask = np.ones(x.shape, bool)
    mask[sl] = False
    smask = np.ones(q.scales.shape, bool)
    smask[k] = False
    assert np.array_equal(q.codes[mask], q2.codes[mask])
    assert np.array_equal(q.scales[smask], q2.scales[smask])


@settings(max_examples=40)
@given(
    hnp.arrays(np.float32, st.integers(1, 300), elements=finite32),
    st.sampled_from(FMTS),
    st.sampled_from([("fp32", None), ("pow2", "floor"), ("bf16", "even")]),
)
def test_tensor_equals_1xN_covering_the_row(v, fmt, policy):
    sf, sr = policy
    x = v.reshape(1, -1)
    n = x.shape[1] + 7
    a = quantize(x, fmt, "tensor", scale_format=sf, scale_rounding=sr)
    b = quantize(x, fmt, f"1x{n}", scale_format=sf, scale_rounding=sr)
    assert np.array_equal(a.codes, b.codes)
    assert np.array_equal(a.scales, b.scales)


@pytest.mark.parametrize("g", GRANS + ["delayed"])
@pytest.mark.parametrize("sf", [None, "pow2"])
def test_zero_tensors_round_trip(g, sf):
    if sf and g in ("mx32", "nvfp4"):
        return
    x = np.zeros((7, 33), np.float32)
    x[1, 2] = -0.0
    gran = DelayedScaling() if g == "delayed" else g
    q = quantize(x, "e4m3" if g != "nvfp4" else "e2m1", gran, scale_format=sf)
    assert np.isfinite(q.scales).all() and (q.scales > 0).all()
    d = q.dequantize()
    assert np.array_equal(d, x) and np.signbit(d[1, 2])


def test_tiny_blocks_get_finite_scales():
    x = np.full((2, 64), 1e-44, np.float32)  # float32 subnormals
    for sf in ("fp32", "bf16", "pow2", "e8m0"):
        q = quantize(x, "e4m3", "1x32", scale_format=sf)
        assert np.isfinite(q.scales).all() and (q.scales > 0).all()
        assert np.isfinite(q.dequantize()).all()


# ------------------------------------------------------------- MX vs gfloat
@pytest.mark.parametrize(
    "fmt,fi", [("e4m3", format_info_mxfp8_e4m3), ("e5m2", format_info_mxfp8_e5m2), ("e2m1", format_info_mxfp4_e2m1)]
)
def test_mx_equals_gfloat(fmt, fi):
    rng = np.random.default_rng(7)
    M, N = 6, 32 * 5
    x = (rng.standard_normal((M, N)) * np.exp(rng.normal(0, 4, (M, N // 32))).repeat(32, 1)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block
    x[1, 32:64] *= 1e-30  # tiny block
    x[2, 5] = 2.0**100  # a large one
    q = quantize(x, fmt, "mx32")
    d = q.dequantize(np.float64)
    for i in range(M):
        for j in range(0, N, 32):
            blk = x[i, j : j + 32].astype(np.float64)
            ref = quantize_block(fi, blk, compute_scale_amax)
            assert np.array_equal(d[i, j : j + 32], ref), (i, j)
            assert q.scales[i, j // 32] == compute_scale_amax(fi.etype.emax, blk)
    # the E8M0 bytes are the scale exponents + 127
    assert np.array_equal(q.scale_codes, (np.log2(q.scales.astype(np.float64)) + 127).astype(np.uint8))


def test_mx_definition_floor():
    """X = 2**(floor(log2 amax) - emax_elem), computed independently from the spec."""
    x = np.array([[3.0, -448.0, 500.0, 0.1] + [0.0] * 28], np.float32)
    q = quantize(x, "e4m3", "mx32")
    assert q.scales[0, 0] == 2.0 ** (math.floor(math.log2(500.0)) - 8)  # = 1
    assert q.values()[0, 2] == 448.0 and q.values()[0, 1] == -448.0  # 500 > 448 saturates
    x2 = np.array([[480.0] + [1.0] * 31], np.float32)  # 480 / 2**0 saturates to 448
    q2 = quantize(x2, "e4m3", "mx32")
    assert q2.scales[0, 0] == 1.0 and q2.values()[0, 0] == 448.0


def test_scale_roundings_by_definition():
    """FLOOR/CEIL/RCEIL/EVEN from their definitions, on chosen amaxes (e4m3: emax 8, max 448)."""
    cases = {
        300.0: {"floor": 0, "ceil": 1, "rceil": 0, "even": 0},
        449.0: {"floor": 0, "ceil": 1, "rceil": 1, "even": 0},
        256.0: {"floor": 0, "ceil": 0, "rceil": 0, "even": 0},
        500.0: {"floor": 0, "ceil": 1, "rceil": 1, "even": 1},  # 500 rounds to 512 at 3 bits
        0.75: {"floor": -9, "ceil": -8, "rceil": -9, "even": -9},
    }
    for amax, exp in cases.items():
        x = np.array([amax, 0.0], np.float32)
        for r, e in exp.items():
            q = quantize(x, "e4m3", "tensor", scale_format="pow2", scale_rounding=r)
            assert q.scales[0] == 2.0**e, (amax, r)
            q = quantize(x, "e4m3", "tensor", scale_format="pow2", scale_rounding=r, margin=2)
            assert q.scales[0] == 2.0 ** (e + 2), (amax, r)


@pytest.mark.parametrize("sf, g", [("pow2", "1x32"), ("e8m0", "mx32"), ("bf16", "row"), ("pow2", "128x128")])
def test_scale_rounding_mode_names_are_floor_and_ceil(sf, g):
    """The RoundMode names of floor and ceil (one vocabulary with element rounding) give the same
    scales and codes, and the QuantizedTensor keeps the canonical name (its repr does not change)."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((256, 256)) * np.exp(rng.normal(0.0, 3.0, (256, 1)))).astype(np.float32)
    for canonical, names in {
        "floor": ("rdn", "RD", "down", RoundMode.RDN, " Floor "),
        "ceil": ("rup", "ru", "up", RoundMode.RUP, "CEIL"),
    }.items():
        want = quantize(x, "e4m3", g, scale_format=sf, scale_rounding=canonical)
        assert want.scale_rounding == canonical
        for name in names:
            q = quantize(x, "e4m3", g, scale_format=sf, scale_rounding=name)
            assert q.scale_rounding == canonical and repr(q) == repr(want), name
            assert np.array_equal(q.scales, want.scales) and np.array_equal(q.codes, want.codes), name
    for rule in ("rceil", "even"):  # scale rules of their own ("even" is not the mode rne here)
        assert quantize(x, "e4m3", g, scale_format=sf, scale_rounding=rule).scale_rounding == rule


def test_scale_policy_is_named():
    sf, sr, sp = scale_policy("mx32", "e4m3")
    assert (sf, sr) == ("e8m0", "floor") and isinstance(sp, ScalePolicy)
    assert sp.fmax == 448.0 and sp.emax_e == 8 and sp.mbits_e == 3 and (sp.emin_s, sp.emax_s) == (-127, 127)
    assert scale_policy("row", "e4m3", "pow2", "rdn")[:2] == ("pow2", "floor")
    assert scale_policy("row", "e4m3", "pow2", "rup")[2].rnd == int(RoundMode.RUP)
    assert scale_policy("row", "e4m3", "pow2", "rdn")[2].rnd == int(RoundMode.RDN)


def test_fast_params_and_rne_code32_equal_the_general_kernel():
    """The fast 8-bit RNE path (fp8sim.rounding.fast8) on every exact float32 value of a pattern sweep
    gives fp8sim.encode's codes (the general kernel), saturating or not; formats it cannot serve get None."""
    from numba import njit

    @njit
    def codes_of(x, fp, out):
        for i in range(x.size):
            out[i] = rne_code32(x[i], fp)

    assert isinstance(NO_FAST, FastParams) and len(FastParams._fields) == 11
    for name in ("e5m6", "e8m0", "fp16"):
        assert fast_params(fp8sim.format(name), True) is None
    x = np.arange(0, 1 << 32, 8191, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for name in ("e4m3", "e5m2", "e2m1", "e3m2", "e2m3", "e3m4"):
        f = fp8sim.format(name)
        xs = x[~np.isnan(x)] if f.nan_code is None else x
        for sat in (True, False):
            fp = fast_params(f, sat)
            assert isinstance(fp, FastParams) and fp.shift == 23 - f.mbits
            got = np.empty(xs.size, np.uint8)
            codes_of(xs, fp, got)
            want = fp8sim.encode(xs, f, "rne", saturate=sat)
            assert np.array_equal(got, want), (name, sat, int((got != want).sum()))


def test_fp32_and_bf16_scales():
    x = np.array([[3.0, -7.0, 1.0], [0.5, 0.25, 0.0]], np.float32)
    q = quantize(x, "e4m3", "row")
    assert np.array_equal(q.scales[:, 0], np.float32([7.0, 0.5]) / np.float32(448.0))
    q = quantize(x, "e4m3", "row", scale_format="bf16")
    s32 = (np.float32([7.0, 0.5]) / np.float32(448.0)).astype(np.float64)
    s = q.scales[:, 0].astype(np.float64)
    assert (s >= s32).all()
    assert np.array_equal(s, s.astype(ml_dtypes.bfloat16).astype(np.float64))


def test_nvfp4_two_level():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    q = quantize(x, "e2m1", "nvfp4")
    amax = float(np.abs(x).max())
    assert q.global_scale == np.float32(amax / (6.0 * 448.0))
    assert q.scales.shape == (4, 4)
    blk = np.abs(x).reshape(4, 4, 16).max(-1)
    expect = fp8sim.round(blk / q.global_scale / 6.0, "e4m3", saturate=True)
    assert np.array_equal(q.scales.astype(np.float64), expect)
    assert q.scale_codes.dtype == np.uint8
    ref = fp8sim.round(x / (expect.repeat(16, 1) * q.global_scale), "e2m1")
    assert np.array_equal(q.values(), ref.astype(np.float32))


# -------------------------------------------------------------- layouts
@pytest.mark.parametrize(
    "g,shape,scale_shape,block",
    [
        ("tensor", (5, 7), (1, 1), (5, 7)),
        ("row", (5, 7), (5, 1), (1, 7)),
        ("col", (5, 7), (1, 7), (5, 1)),
        ("1x128", (3, 300), (3, 3), (1, 128)),
        ("128x128", (300, 129), (3, 2), (128, 128)),
        ("128x128", (2, 3, 130, 40), (2, 3, 2, 1), (1, 1, 128, 40)),
        ("g32", (4, 70), (4, 3), (1, 32)),
        (Group(16, axis=0), (40, 3), (3, 3), (16, 1)),
        (Group(4, axis=1), (2, 10, 3), (2, 3, 3), (1, 4, 1)),
        ("mx32", (100,), (4,), (32,)),
        (MX(32, axis=-2), (64, 5), (2, 5), (32, 1)),
        ("nvfp4", (3, 33), (3, 3), (1, 16)),
        ("1x128", (200,), (2,), (128,)),
        ("col", (6,), (6,), (1,)),
        ("row", (2, 3, 4), (2, 3, 1), (1, 1, 4)),
        ("tensor", (2, 3, 4), (1, 1, 1), (2, 3, 4)),
    ],
)
def test_scale_layouts(g, shape, scale_shape, block):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 100, shape)).astype(np.float32)
    fmt = "e2m1" if g == "nvfp4" else "e4m3"
    q = quantize(x, fmt, g)
    assert q.scales.shape == scale_shape
    assert q.block_shape == block
    assert q.codes.shape == shape and q.codes.dtype == np.uint8
    # every block's amax, enumerated independently (ragged edges are their own blocks)
    fm = fp8sim.format(fmt).max
    for k, sl in blocks_of(shape, block):
        a = float(np.abs(x[sl]).max())
        assert q.amax[k] == np.float32(a)
        if g in ("tensor", "row", "col", "1x128", "128x128", "g32") or isinstance(g, Group) and not isinstance(g, MX):
            assert q.scales[k] == np.float32(a / fm)


def test_batch_dims_do_not_share_blocks():
    x = np.ones((2, 4, 8), np.float32)
    x[1] *= 100
    q = quantize(x, "e4m3", "4x8")
    assert q.scales.shape == (2, 1, 1)
    assert q.scales[0, 0, 0] * 100 == pytest.approx(q.scales[1, 0, 0], rel=1e-6)


def test_input_dtypes():
    rng = np.random.default_rng(1)
    x32 = rng.standard_normal((8, 40)).astype(np.float32)
    for x in (x32, x32.astype(np.float64), x32.astype(ml_dtypes.bfloat16)):
        q = quantize(x, "e4m3", "1x16")
        assert q.dtype == x.dtype and q.dequantize().dtype == x.dtype
        q32 = quantize(x.astype(np.float32), "e4m3", "1x16")
        assert np.array_equal(q.codes, q32.codes)
    d = fp8sim.dequantize(quantize(x32, "e5m2", "1x16"))
    assert d.shape == x32.shape


def test_stochastic_rounding_reproducible():
    x = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)
    a = quantize(x, "e4m3", "1x32", mode="sr", seed=5)
    b = quantize(x, "e4m3", "1x32", mode="sr", seed=5)
    c = quantize(x, "e4m3", "1x32", mode="sr", seed=6)
    assert np.array_equal(a.codes, b.codes) and not np.array_equal(a.codes, c.codes)
    # SR rounds to a neighbour of the exact quotient
    xs = x.astype(np.float64) / a.expanded_scales()
    lo = fp8sim.round(xs, "e4m3", "rdn")
    hi = fp8sim.round(xs, "e4m3", "rup")
    v = a.values()
    assert ((v == lo) | (v == hi)).all()


# ------------------------------------------------------------ delayed scaling
def test_delayed_scaling_uses_history_not_current_amax():
    ds = DelayedScaling(history_len=3)
    x = np.full((4, 4), 2.0, np.float32)
    q0 = quantize(x, "e4m3", ds)
    assert q0.scales.ravel()[0] == 1.0  # empty history: TE's initial scale
    assert list(ds.amax_history) == [2.0, 0.0, 0.0]
    y = np.full((4, 4), 1000.0, np.float32)
    q1 = quantize(y, "e4m3", ds)  # scale from history amax 2.0, not from 1000
    assert q1.scales.ravel()[0] == np.float32(2.0 / 448.0)
    assert (q1.values() == 448.0).all()  # saturated
    assert fp8sim.metrics.fraction_saturated(y, q1) == 1.0
    q2 = quantize(x, "e4m3", ds)
    assert q2.scales.ravel()[0] == np.float32(1000.0 / 448.0)
    for _ in range(3):
        quantize(x, "e4m3", ds)  # 1000 leaves the window of 3
    assert ds.history_amax() == 2.0
    ds2 = DelayedScaling(4, algo="most_recent", amax_history=[5.0, 9.0])
    q = quantize(x, "e4m3", ds2, scale_format="pow2", scale_rounding="rceil")
    assert q.scales.ravel()[0] == 2.0 ** math.ceil(math.log2(5.0 / 448.0))


def test_delayed_scaling_by_name_raises():
    """The name makes a fresh DelayedScaling (empty history) per call: every tensor would silently get
    scale 1.0.  quantize refuses it; the object made once keeps its history across calls."""
    x = np.full((4, 4), 2.0, np.float32)
    for name in ("delayed", "delayed8", "Delayed"):
        with pytest.raises(ValueError, match=r"create the object once \(g = fp8sim.granularity"):
            quantize(x, "e4m3", name)
    g = fp8sim.granularity("delayed")
    assert quantize(x, "e4m3", g).scales.ravel()[0] == 1.0
    assert quantize(x, "e4m3", g).scales.ravel()[0] == np.float32(2.0 / 448.0)  # from the history


def test_user_amax():
    x = np.ones((2, 8), np.float32)
    q = quantize(x, "e4m3", "row", amax=np.array([[4.0], [8.0]]))
    assert np.array_equal(q.scales[:, 0], np.float32([4.0, 8.0]) / np.float32(448.0))
    with pytest.raises(ValueError, match="broadcast"):
        quantize(x, "e4m3", "row", amax=np.ones(3))


# ------------------------------------------------------------ non-finite
def test_nan_propagates_to_its_block_only():
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    x[1, 40] = np.nan
    for g in ("1x32", "4x32", "mx32"):
        q = quantize(x, "e4m3", g)
        d = q.dequantize()
        bad = np.isnan(d)
        assert bad[1, 40]
        blk = np.zeros_like(bad)
        blk[(slice(0, 4) if g == "4x32" else slice(1, 2)), 32:64] = True
        assert np.array_equal(bad, blk)
    q = quantize(x, "e4m3", "1x32", ignore_nan=True)
    assert np.array_equal(np.isnan(q.dequantize()), np.isnan(x))
    q = quantize(x, "e2m1", "mx32")  # FP4 has no NaN: the E8M0 NaN scale carries it
    assert q.scale_codes[1, 1] == 0xFF and np.isnan(q.dequantize()[1, 32:]).all()
    with pytest.raises(ValueError, match="no NaN"):
        quantize(x, "e2m1", "mx32", ignore_nan=True)


def test_inf_saturates_or_overflows():
    x = np.array([[1.0, np.inf, -np.inf, 2.0]], np.float32)
    q = quantize(x, "e4m3", "row")
    assert q.scales[0, 0] == np.float32(2.0 / 448.0)  # inf does not enter amax
    assert list(q.values()[0]) == [224.0, 448.0, -448.0, 448.0]
    assert fp8sim.metrics.fraction_saturated(x, q) == 0.5
    q = quantize(x, "e5m2", "row", saturate=False)
    assert np.isinf(q.values()[0, 1]) and np.isinf(q.dequantize()[0, 2])


# ------------------------------------------------------------ bad input
def test_bad_input():
    x = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="known granularities.*tensor"):
        quantize(x, "e4m3", "blocky")
    with pytest.raises(ValueError, match="positive"):
        quantize(x, "e4m3", "0x128")
    with pytest.raises(ValueError, match="positive"):
        quantize(x, "e4m3", "g0")
    with pytest.raises(ValueError, match="positive"):
        Tile(-1, 4)
    with pytest.raises(TypeError):
        Tile(1.5, 4)
    with pytest.raises(ValueError, match="axis"):
        quantize(x, "e4m3", Group(4, axis=2))
    with pytest.raises(TypeError, match="axis"):
        Group(4, axis="rows")
    with pytest.raises(TypeError, match="float32, float64, float16 or bfloat16"):
        quantize(x.astype(np.int32), "e4m3", "row")
    with pytest.raises(TypeError):
        quantize(x, "e4m3", 128)
    with pytest.raises(ValueError, match="scalar"):
        quantize(np.float32(1.0), "e4m3", "tensor")
    with pytest.raises(ValueError, match="empty"):
        quantize(np.zeros((0, 4), np.float32), "e4m3", "tensor")
    with pytest.raises(UnknownNameError, match="scale_format 'fp64'.*known scale formats: fp32, bf16, pow2, e8m0"):
        quantize(x, "e4m3", "row", scale_format="fp64")
    with pytest.raises(UnknownNameError, match="known scale roundings: floor, ceil, rceil, even"):
        quantize(x, "e4m3", "row", scale_format="pow2", scale_rounding="nearest")  # a mode, not a scale rule
    with pytest.raises(UnknownNameError, match="scale_rounding 'rne'"):
        quantize(x, "e4m3", "row", scale_format="pow2", scale_rounding=RoundMode.RNE)
    with pytest.raises(ValueError, match="scale_rounding"):
        quantize(x, "e4m3", "row", scale_rounding="floor")  # fp32 scales are not rounded
    with pytest.raises(ValueError, match="E8M0"):
        quantize(x, "e4m3", "mx32", scale_format="fp32")
    with pytest.raises(TypeError, match="margin"):
        quantize(x, "e4m3", "row", margin=0.5)
    with pytest.raises(ValueError, match="rounding mode"):
        quantize(x, "e4m3", "row", mode="banker")
    with pytest.raises(ValueError, match="seed"):
        quantize(x, "e4m3", "row", mode="sr")
    with pytest.raises(ValueError, match="at most 16 bits"):  # e5m6, bf16, fp16 work (uint16 codes)
        quantize(x, "fp32", "row")
    with pytest.raises(TypeError):
        fp8sim.dequantize(x)


# ---------------------------------------------------------------------------------------------
# The float32 arithmetic path (RNE into FP8/FP6/FP4 codes in 32-bit lanes, fused with the amax) must
# give the codes of the general path, which float64 input takes: it rounds each exact quotient once
# with the bit-level kernel that the exhaustive 2**32 check validates.
def _float32_sweep(stride=4099, no_nan=False):
    x = np.arange(0, 1 << 32, stride, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return x[~np.isnan(x)] if no_nan else x


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "e3m2", "e2m3", "e3m4"])
def test_float32_fast_path_equals_general_path_on_a_bit_pattern_sweep(fmt):
    f = fp8sim.format(fmt)
    x = _float32_sweep(no_nan=f.nan_code is None)  # ~1M patterns: every binade, inf, NaN, subnormals, -0
    # amax picks the scale: 1 (exact), a non-power-of-two fp32 scale, tiny and huge scales where quotients
    # underflow or overflow float32
    for amax in (f.max, 3.0 * f.max, 5.0, 1e-30, 1e30, 3e-36):
        for sf in ("fp32", "pow2"):
            for sat in (True, False):
                a = quantize(x, fmt, "g4096", scale_format=sf, amax=amax, saturate=sat)
                b = quantize(x.astype(np.float64), fmt, "g4096", scale_format=sf, amax=amax, saturate=sat)
                assert np.array_equal(a.scales, b.scales)
                assert np.array_equal(a.codes, b.codes), (fmt, amax, sf, sat, int((a.codes != b.codes).sum()))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_float32_multiply_path_near_midpoints(fmt):
    """Elements whose quotient lies within a few float32 ulps of a midpoint of the format's grid, the
    cases where multiplying by the reciprocal instead of dividing could round the wrong way: quotients
    within 4 ulps of a midpoint must be detected (their tile is redone by division), those further away
    must round right anyway.  Checked against the float64 path with zero tolerance."""
    f = fp8sim.format(fmt)
    codes = np.arange(1, f.max_code_mag + 1)
    grid = np.sort(np.unique(fp8sim.decode(codes.astype(f.code_dtype), f).astype(np.float64)))
    grid = grid[np.isfinite(grid)]
    mids = (grid[:-1] + grid[1:]) / 2  # every midpoint, subnormal and normal range
    mids = np.concatenate([mids, [grid[-1] + (grid[-1] - grid[-2]) / 2]])  # the overflow boundary
    rng = np.random.default_rng(11)
    k = np.arange(-12, 13)
    for _ in range(12):
        amax = float(np.float32(rng.uniform(0.5, 2.0) * 10.0 ** rng.integers(-3, 4))) * f.max
        d = float(quantize(np.ones(8, np.float32), fmt, "g8", amax=amax).scales[0])
        assert d != 2.0 ** np.round(np.log2(d))  # not a power of two: the multiply path
        centre = (mids * d).astype(np.float32).view(np.int32)
        x = (centre[:, None] + k[None, :]).astype(np.int32).view(np.float32).ravel()
        x = np.concatenate([x, -x])
        a = quantize(x, fmt, "g8", amax=amax)
        b = quantize(x.astype(np.float64), fmt, "g8", amax=amax)
        assert np.array_equal(a.codes, b.codes), (fmt, d, int((a.codes != b.codes).sum()))


@pytest.mark.parametrize(
    "g, sf",
    [
        ("1x128", "fp32"),
        ("128x128", "fp32"),
        ("4x8", "fp32"),
        ("mx32", None),
        ("1x32", "pow2"),
        ("64x16", "bf16"),
        ("row", "fp32"),
        ("tensor", "fp32"),
    ],
)
def test_float32_fused_kernels_equal_general_path(g, sf):
    rng = np.random.default_rng(7)
    for shape in ((300, 700), (257, 129), (3, 5, 260)):  # ragged edges, batch dims, >= 4 block rows
        x = (rng.standard_normal(shape) * np.exp(rng.normal(0.0, 4.0, shape))).astype(np.float32)
        x.flat[::53] = 0.0
        x.flat[::59] = -0.0
        x.flat[::61] = np.inf
        x.flat[::67] = -np.inf
        for fmt in ("e4m3", "e5m2"):
            for sat in (True, False):
                a = quantize(x, fmt, g, scale_format=sf, saturate=sat)
                b = quantize(x.astype(np.float64), fmt, g, scale_format=sf, saturate=sat)
                assert np.array_equal(a.scales, b.scales) and np.array_equal(a.amax, b.amax)
                assert np.array_equal(a.codes, b.codes), (g, fmt, sat)


def test_fused_block_kernel_confines_nan_and_matches_two_pass_amax():
    x = np.random.default_rng(3).standard_normal((512, 384)).astype(np.float32)
    x[130, 200] = np.nan  # block (1, 1) of 128x128
    q = quantize(x, "e4m3", "128x128")
    assert np.isnan(q.scales[1, 1]) and np.isfinite(np.delete(q.scales.ravel(), 1 * 3 + 1)).all()
    blocks = np.abs(x).reshape(4, 128, 3, 128).max(axis=(1, 3))
    assert np.array_equal(q.amax, blocks.astype(np.float32), equal_nan=True)
    qi = quantize(x, "e4m3", "128x128", ignore_nan=True)
    assert np.isfinite(qi.scales).all() and qi.amax[1, 1] == np.nanmax(np.abs(x[128:256, 128:256]))


@pytest.mark.parametrize("g, sf, sr", [("mx32", None, None), ("g32", "pow2", "floor"), ("g32", "pow2", "ceil")])
def test_float32_mx_scales_from_the_amax_bits_equal_general_path(g, sf, sr):
    """MX tiles of float32 take amax, scale and reciprocal from integer arithmetic on the amax's bits;
    tiles whose scale leaves that range (zero, subnormal or huge amax, clamped scales, margins) take the
    general scale computation.  Both must equal the float64 path."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((64, 1024)) * np.exp(rng.normal(0.0, 30.0, (64, 1)))).astype(np.float32)
    x[0, :64] = 0.0
    x[1, :32] = 1e-40  # subnormal amax
    x[2, :32] = 3e38
    x[3, 5] = np.inf
    for margin in (-3, 0, 2):
        for fmt in ("e4m3", "e5m2", "e2m1"):
            a = quantize(x, fmt, g, scale_format=sf, scale_rounding=sr, margin=margin)
            b = quantize(x.astype(np.float64), fmt, g, scale_format=sf, scale_rounding=sr, margin=margin)
            assert np.array_equal(a.scales, b.scales) and np.array_equal(a.amax, b.amax)
            assert np.array_equal(a.codes, b.codes), (fmt, margin, sf)


@pytest.mark.parametrize("g, sf", [("1x128", None), ("1x32", None), ("128x128", None), ("32x32", "pow2")])
def test_float32_vectorized_block_scales_equal_general_path(g, sf):
    """float32 tiles measured for fp32 scales get amax, scale, reciprocal and path in loops vectorized
    across a chunk's tiles, and 128x128-style bands take their amax from a column-wise max of bit
    patterns; a chunk or block with an inf or NaN takes the per-tile path.  Margins move scales to the
    clamps (2**-126 and the float32 max).  All must equal the float64 path, which shares none of it.
    (512 rows: 128x128 has four bands, the least that takes the fused kernel.)  So must given scales."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((512, 1024)) * np.exp(rng.normal(0.0, 30.0, (512, 1)))).astype(np.float32)
    x[0, :256] = 0.0
    x[1, :32] = 1e-40  # subnormal amax
    x[2, :40] = 3e38  # the largest scales
    x[3, :40] = 448.0 * 2.0**-20  # power-of-two fp32 scales
    x[4, 5] = np.inf
    x[5, 7] = -np.inf
    x[140, 300] = np.nan
    for margin in (-126, -3, 0, 2, 127):  # (the extremes of the margin's range)
        for fmt in ("e4m3", "e5m2"):
            a = quantize(x, fmt, g, scale_format=sf, margin=margin)
            b = quantize(x.astype(np.float64), fmt, g, scale_format=sf, margin=margin)
            assert np.array_equal(a.scales, b.scales, equal_nan=True), (fmt, margin)
            assert np.array_equal(a.amax, b.amax, equal_nan=True), (fmt, margin)
            assert np.array_equal(a.codes, b.codes), (fmt, margin)
    q = quantize(x, "e4m3", g, scale_format=sf)
    assert np.isnan(q.scales).sum() == 1  # the NaN's block only
    # given scales (amax passed in) take a vectorized classification: NaN, zero, subnormal, huge and
    # power-of-two amaxes
    amax = q.amax.astype(np.float64)
    amax.flat[1::7] = 0.0
    amax.flat[2::7] = 1e-41
    amax.flat[3::7] = 3e38
    amax.flat[4::7] = 448.0 * 2.0**-20
    amax.flat[5::11] = np.nan
    for fmt in ("e4m3", "e5m2"):
        a = quantize(x, fmt, g, scale_format=sf, amax=amax)
        b = quantize(x.astype(np.float64), fmt, g, scale_format=sf, amax=amax)
        assert np.array_equal(a.scales, b.scales, equal_nan=True), fmt
        assert np.array_equal(a.codes, b.codes), fmt


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_float32_pipelined_bands_equal_general_path(threads):
    """float32 bands are split into one run of consecutive bands per thread, and each band's amax is
    folded in while the previous band is rounded; runs crossing batch boundaries, ragged last bands
    (fewer rows than the band after them) and a NaN or inf in the first rows of a run must give the
    float64 path's scales, amaxes and codes."""
    import numba

    rng = np.random.default_rng(13)
    x = (rng.standard_normal((3, 100, 70)) * np.exp(rng.normal(0.0, 6.0, (3, 100, 1)))).astype(np.float32)
    x[1, 0, 3] = np.nan
    x[2, 32, 5] = np.inf
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        for g, sf in (("32x32", None), ("16x16", "pow2"), ("64x64", "e8m0")):
            for fmt in ("e4m3", "e5m2"):
                a = quantize(x, fmt, g, scale_format=sf)
                b = quantize(x.astype(np.float64), fmt, g, scale_format=sf)
                assert np.array_equal(a.scales, b.scales, equal_nan=True), (g, fmt)
                assert np.array_equal(a.amax, b.amax, equal_nan=True), (g, fmt)
                assert np.array_equal(a.codes, b.codes), (g, fmt)
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("g", ["1x128", "128x128", "mx32", "g32"])
def test_float32_fused_kernels_with_ignore_nan_keep_nan_elements(g):
    """ignore_nan=True lets a NaN element meet a finite scale in the fast loops (the default makes its
    block's scale NaN instead): it must get the NaN code, its neighbours their usual codes."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((512, 384)).astype(np.float32)
    nan_at = (rng.integers(0, 512, 40), rng.integers(0, 384, 40))
    x[nan_at] = np.nan
    for fmt in ("e4m3", "e5m2"):
        a = quantize(x, fmt, g, ignore_nan=True)
        b = quantize(x.astype(np.float64), fmt, g, ignore_nan=True)
        assert np.isfinite(a.scales).all() and np.array_equal(a.scales, b.scales)
        assert np.array_equal(a.codes, b.codes), (g, fmt)
        assert np.array_equal(np.isnan(a.dequantize()), np.isnan(x))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_float32_fast_path_exhaustive(fmt):
    """All 2**32 float32 patterns, with a power-of-two and a non-power-of-two scale (run with -m slow)."""
    chunk = 1 << 26
    for amax in (fp8sim.format(fmt).max, 3.0 * fp8sim.format(fmt).max):
        for lo in range(0, 1 << 32, chunk):
            x = np.arange(lo, lo + chunk, dtype=np.uint64).astype(np.uint32).view(np.float32)
            a = quantize(x, fmt, "g4096", amax=amax)
            b = quantize(x.astype(np.float64), fmt, "g4096", amax=amax)
            assert np.array_equal(a.codes, b.codes), (fmt, amax, lo)


# ---------------------------------------------------------------------------------------------
# Every element is the single rounding of the EXACT quotient x / scale, in every mode: checked against
# rational arithmetic (fractions.Fraction), which shares nothing with fp8sim's float quotients.
DET_MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto"]


@functools.cache
def _grid(f):
    table = fp8sim.decode_table(f).astype(np.float64)
    mags = [Fraction(float(t)) for t in table[: f.max_code_mag + 1]]  # code magnitude i has value mags[i]
    assert mags == sorted(mags)
    return mags, mags + [mags[-1] + Fraction(2) ** (f.emax - f.mbits)]


def exact_round(v: Fraction, fmt, mode: str, saturate: bool, negative_zero: bool = False) -> float:
    """The rational ``v`` rounded to ``fmt`` by each mode's definition, with IEEE 754 overflow rules (the
    finite values come from the decode table, checked code by code against ml_dtypes and gfloat; as in
    tests/reference.py a virtual value one top-binade ulp past max stands for the next value)."""
    f = fp8sim.format(fmt)
    mags, ext = _grid(f)
    a = abs(v)
    neg = v < 0 or (v == 0 and negative_zero)  # (a Fraction has no -0)
    i = bisect_left(ext, a)  # ext[i-1] < a <= ext[i]
    if i == len(ext):
        r = len(ext) - 1  # beyond the virtual value: overflow in every mode
    elif ext[i] == a:
        r = i
    else:
        lo, hi = i - 1, i
        mid = (ext[lo] + ext[hi]) / 2
        up = {
            "rne": a > mid or (a == mid and lo % 2 == 1),
            "rna": a >= mid,
            "rtz": False,
            "rup": not neg,
            "rdn": neg,
            "rto": lo % 2 == 0,
        }[mode]
        r = hi if up else lo
    if r == len(ext) - 1:  # overflow
        to_max = saturate or f.nan is fp8sim.NanStyle.NONE or mode in ("rtz", "rto")
        to_max = to_max or (mode == "rup" and neg) or (mode == "rdn" and not neg)
        val = float(mags[-1]) if to_max else (math.inf if f.inf else math.nan)
    else:
        val = float(ext[r])
    if neg and (val != 0 or f.has_negative_zero):
        val = -val
    return val


def assert_exact_quotients(x, q, mode, saturate):
    d = [Fraction(float(s)) for s in q.expanded_scales().ravel()]
    got = q.values().astype(np.float64).ravel()
    for xv, dv, g in zip(x.astype(np.float64).ravel(), d, got):
        want = exact_round(Fraction(float(xv)) / dv, q.format, mode, saturate, math.copysign(1, xv) < 0)
        ok = (math.isnan(want) and math.isnan(g)) or (want == g and math.copysign(1, want) == math.copysign(1, g))
        assert ok, (float(xv), float(dv), mode, want, g)


def test_directed_rounding_of_tiny_float64_elements():
    """Issue #18 item 10: 5e-324 / 2.23 underflows the float64 quotient to 0, but the exact quotient is
    positive, so rounding up (and to odd) gives the smallest subnormal 2**-9 times the scale."""
    x = np.array([[1000.0, 5e-324, -5e-324]])
    for mode, want in [("rup", [2.0**-9, -0.0]), ("rto", [2.0**-9, -(2.0**-9)]), ("rdn", [0.0, -(2.0**-9)])]:
        q = quantize(x, "e4m3", "row", mode=mode)
        v = q.values().astype(np.float64)[0, 1:]
        assert v.tolist() == want and list(np.signbit(v)) == [False, True], mode
        assert q.dequantize()[0, 1] == 2.0**-9 * float(q.scales[0, 0]) or want[0] == 0.0


tiny_or_huge64 = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),  # the whole range, subnormals included
    st.floats(-1e-300, 1e-300, allow_nan=False),
    st.sampled_from([5e-324, -5e-324, 1e-310, 2.0**-1022, 1.7976931348623157e308, -1e308, 0.0, -0.0]),
)


@settings(max_examples=150)
@given(
    hnp.arrays(np.float64, st.integers(1, 12), elements=tiny_or_huge64),
    st.sampled_from(["e4m3", "e5m2", "e3m4", "e2m1", "e2m3", "e4m3fnuz"]),
    st.sampled_from(DET_MODES),
    st.booleans(),
    st.sampled_from([1.0, 3.0, 1e-30, 1e30, 7e-38, 5e37, 448.0 * 3, 1e-300, 1e300]),
)
def test_float64_elements_round_the_exact_quotient(x, fmt, mode, saturate, amax):
    f = fp8sim.format(fmt)
    q = quantize(x.reshape(1, -1), fmt, "row", mode=mode, saturate=saturate, amax=amax * f.max / 448.0)
    assert_exact_quotients(x, q, mode, saturate)


@settings(max_examples=100)
@given(
    hnp.arrays(np.float32, st.integers(1, 12), elements=st.floats(allow_nan=False, allow_infinity=False, width=32)),
    st.sampled_from(["e4m3", "e5m2", "e3m4", "e2m1", "e4m3fnuz"]),
    st.sampled_from(DET_MODES),
    st.booleans(),
    st.sampled_from([1.0, 3.0, 1e-30, 1e30, 7e-38, 5e37]),
)
def test_float32_elements_round_the_exact_quotient(x, fmt, mode, saturate, amax):
    q = quantize(x.reshape(1, -1), fmt, "row", mode=mode, saturate=saturate, amax=amax)
    assert_exact_quotients(x, q, mode, saturate)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", DET_MODES)
def test_nvfp4_elements_round_the_exact_quotient(dtype, mode):
    """NVFP4 divides by a block scale times the tensor scale (a product of up to 28 bits)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 64)) * np.exp(rng.normal(0.0, 3.0, (4, 64)))
    x[0, :3] = [5e-324, -1e-310, 1e-200]
    x = x.astype(dtype)
    q = quantize(x, "e2m1", "nvfp4", mode=mode, amax=float(np.abs(x).max()) / 3.7)
    assert_exact_quotients(x, q, mode, True)


def test_sr_of_tiny_elements_picks_a_neighbour_of_the_exact_quotient():
    x = np.array([[1000.0, 5e-324, -1e-310, 3e-7, -2.5e-3] * 40])
    q = quantize(x, "e4m3", "row", mode="sr", seed=1)
    d = Fraction(float(q.scales[0, 0]))
    for xv, g in zip(x.ravel(), q.values().astype(np.float64).ravel()):
        e = Fraction(float(xv)) / d
        assert g in (exact_round(e, "e4m3", "rdn", True), exact_round(e, "e4m3", "rup", True)), (xv, g)


# ---------------------------------------------------------------------------------------------
# dequantize rounds decode(code) * scale (exact in float64) once to the target dtype
@pytest.mark.parametrize("fmt", ["e3m4", "e2m3", "e4m3fnuz", "e4m3"])
def test_dequantize_to_bf16_rounds_once(fmt):
    """Issue #18 item 11.  Products code * scale that float32 rounds onto a bf16 midpoint (which a
    float64 -> float32 -> bf16 cast then rounds to even) are found by plain numpy, built into a tensor
    and dequantized; each must be the single RNE rounding of the exact product to bf16."""
    f = fp8sim.format(fmt)
    vals = np.unique(np.abs(fp8sim.decode_table(f).astype(np.float64)))
    vals = vals[np.isfinite(vals) & (vals > 0)]
    rng = np.random.default_rng(0)
    s = (rng.uniform(1.0, 2.0, 200_000) * 2.0 ** rng.integers(-30, 30, 200_000)).astype(np.float32)
    p = vals[None, :] * s[:, None].astype(np.float64)  # exact: <= 5 + 24 significant bits
    p32 = p.astype(np.float32)
    hard = ((p32.view(np.uint32) & 0xFFFF) == 0x8000) & (p32.astype(np.float64) != p)
    rows = np.flatnonzero(hard.any(axis=1))[:64]
    assert rows.size >= 8, rows.size  # the rare cases exist (about 7 per million products)
    x = np.concatenate([p[rows], -p[rows]], axis=1)
    amax = (np.float64(f.max) * s[rows].astype(np.float64))[:, None]  # the scale amax / max is s exactly
    q = quantize(x, fmt, "row", amax=amax)
    assert np.array_equal(q.scales[:, 0], s[rows]) and np.array_equal(q.dequantize(np.float64), x)
    got = q.dequantize(ml_dtypes.bfloat16)
    assert got.dtype == ml_dtypes.bfloat16
    want = np.array([exact_round(Fraction(float(v)), "bf16", "rne", False) for v in x.ravel()]).reshape(x.shape)
    assert np.array_equal(got.astype(np.float64), want)
    # (these products are the hard cases: rounding through float32 first gives another bf16 value;
    # ml_dtypes before 0.7 cast float64 to bfloat16 that way)
    via32 = x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    assert (via32 != want).sum() >= rows.size


@pytest.mark.parametrize("dtype,target", [(np.float16, "fp16"), (ml_dtypes.bfloat16, "bf16")])
def test_dequantize_rounds_the_exact_product_once(dtype, target):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 64)) * np.exp(rng.normal(0.0, 6.0, (16, 1)))
    q = quantize(x, "e3m4", "1x16", scale_format="fp32")
    exact = q.dequantize(np.float64)
    want = [exact_round(Fraction(float(v)), target, "rne", False, bool(np.signbit(v))) for v in exact.ravel()]
    got = q.dequantize(dtype).astype(np.float64).ravel()
    assert np.array_equal(got, np.array(want))


def test_dequantize_rejects_non_float_dtypes():
    q = quantize(np.ones((2, 4)), "e4m3", "row")
    for bad in (np.int32, np.uint8, bool, np.complex64):
        with pytest.raises(TypeError, match="dtype"):
            q.dequantize(bad)


def test_margin_is_validated():
    """Issue #18 item 12: margin=1025 wrapped the exponent field (the smallest scale instead of the
    largest) and nvfp4 with margin=2000 raised OverflowError.  The range is the one in which 2**margin is
    a normal value of the scale format."""
    x = np.array([[1.0, 2.0]])
    for g, sf, lo, hi in [
        ("row", "fp32", -126, 127),
        ("row", "pow2", -126, 127),
        ("row", "bf16", -126, 127),
        ("mx32", "e8m0", -127, 127),
        ("nvfp4", None, -126, 127),
    ]:
        fmt = "e2m1" if g == "nvfp4" else "e4m3"
        for m in (lo - 1, hi + 1, 1025, -2000, 2000):
            with pytest.raises(ValueError, match=f"margin must be an int in {lo}..{hi}"):
                quantize(x, fmt, g, scale_format=sf, margin=m)
        for m in (lo, hi):
            quantize(x, fmt, g, scale_format=sf, margin=m)
    q = quantize(np.array([[1.0, 1792.0]]), "e4m3", "row", margin=127)
    assert q.scales[0, 0] == np.float32(np.finfo(np.float32).max)  # 1792/448 * 2**127 is clamped to the largest
    q = quantize(x, "e4m3", "row", scale_format="pow2", margin=3)
    assert q.scales[0, 0] == 2.0 ** (math.ceil(math.log2(2.0 / 448.0)) + 3)


# ---------------------------------------------------------------------------------------------
# Scales from a float64 amax: the float32 scale is the single rounding of the exact ratio amax / max
def rn32_exact(v: Fraction) -> float:
    """The rational v > 0 (in float32's normal range) rounded to nearest even float32, by definition."""
    e = math.floor(math.log2(v))
    e += (Fraction(2) ** (e + 1) <= v) - (Fraction(2) ** e > v)  # exact binade despite log2's rounding
    q = v / Fraction(2) ** (e - 23)
    n = math.floor(q)
    n += (q - n > Fraction(1, 2)) or (q - n == Fraction(1, 2) and n % 2 == 1)
    return float(n * Fraction(2) ** (e - 23))


def midpoint_amaxes(fmax: float, seed: int) -> np.ndarray:
    """float64 amaxes whose ratio to fmax lies within a float64 ulp or so of a float32 midpoint, where a
    double rounding (float64 division, then float32 conversion) would show."""
    rng = np.random.default_rng(seed)
    f = (rng.uniform(1.0, 2.0, 200) * 2.0 ** rng.integers(-60, 60, 200)).astype(np.float32)
    f = (f.view(np.uint32) & ~np.uint32(1)).view(np.float32).astype(np.float64)  # even last bit
    m = f + np.spacing(f.astype(np.float32)).astype(np.float64) / 2  # the midpoint above: a float64
    centre = m * fmax
    return np.concatenate([np.nextafter(centre, np.inf), np.nextafter(centre, -np.inf), centre * (1 + 2.0**-50)])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e3m4", "e2m3"])
def test_fp32_scales_of_float64_amax_round_once(fmt):
    f = fp8sim.format(fmt)
    amax = midpoint_amaxes(f.max, 1)
    want = np.array([rn32_exact(Fraction(float(a)) / Fraction(f.max)) for a in amax])
    x = np.stack([amax, np.zeros_like(amax)], axis=1)
    for q in (quantize(x, fmt, "row"), quantize(x, fmt, "row", amax=amax[:, None])):
        assert np.array_equal(q.scales[:, 0].astype(np.float64), want)
    # bf16 scales round that float32 scale (up by default); RCEIL takes its power of two
    q = quantize(x, fmt, "row", scale_format="bf16")
    bf = [exact_round(Fraction(w), "bf16", "rup", True) for w in want]
    assert np.array_equal(q.scales[:, 0].astype(np.float64), bf)
    q = quantize(x, fmt, "row", scale_format="pow2", scale_rounding="rceil")
    p2 = [2.0 ** math.ceil(math.log2(w)) for w in want]  # log2 of a float32 is exact enough: w is no power of 2
    assert np.array_equal(q.scales[:, 0].astype(np.float64), p2)


def test_nvfp4_scales_of_float64_amax_round_once():
    for t in midpoint_amaxes(6.0 * 448.0, 2)[::7]:
        x = np.array([[t, -t / 3] + [0.0] * 14 + [t / 5] + [0.0] * 15])
        q = quantize(x, "e2m1", "nvfp4")
        g = rn32_exact(Fraction(float(t)) / 2688)
        assert q.global_scale == g
        for k, a in enumerate((t, t / 5)):  # each block scale: amax_b / (global scale * 6) rounded to E4M3
            assert q.scales[0, k] == exact_round(Fraction(float(a)) / (Fraction(g) * 6), "e4m3", "rne", True)


def test_nvfp4_block_scales_of_float64_amax_round_once():
    """Block amaxes within a float64 ulp of (an E4M3 midpoint) * global scale * 6: each block scale is
    the single RNE rounding to E4M3 of the exact amax_b / (global scale * 6)."""
    e4 = np.unique(np.abs(fp8sim.decode_table("e4m3").astype(np.float64)))
    e4 = e4[np.isfinite(e4)]
    mids = ((e4[:-1] + e4[1:]) / 2)[16:]  # normal-range midpoints (5 significant bits)
    t = 448.0 * 6 * 0.7431  # the tensor amax
    g = rn32_exact(Fraction(t) / 2688)
    for m in mids[mids * g * 6 < t]:
        c = m * g * 6  # exact: 5 + 24 + 2 bits
        for a in (np.nextafter(c, np.inf), np.nextafter(c, -np.inf)):
            x = np.zeros((1, 32))
            x[0, 0], x[0, 16] = t, a
            q = quantize(x, "e2m1", "nvfp4")
            assert q.global_scale == g
            want = exact_round(Fraction(float(a)) / (Fraction(g) * 6), "e4m3", "rne", True)
            assert q.scales[0, 1] == want, (m, a)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_delayed_scaling_rejects_nan_in_a_format_without_nan(dtype):
    """With a scale from the amax history a NaN element meets a finite scale: a format without NaN has
    no code for it (it got code 255 in the 4-bit E2M1, and dequantized to 5e-42)."""
    x = np.array([[1.0, np.nan]], dtype)
    with pytest.raises(ValueError, match="no NaN"):
        quantize(x, "e2m1", DelayedScaling(amax_history=[1.0]))
    q = quantize(x, "e4m3", DelayedScaling(amax_history=[1.0]))
    assert q.codes[0, 1] == 0x7F and np.isnan(q.dequantize()[0, 1])
