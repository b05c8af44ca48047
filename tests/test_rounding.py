"""Rounding and encoding, bit for bit against independent implementations."""

import gfloat
import ml_dtypes
import numpy as np
import pytest

import fp8sim
from fp8sim.rounding import sr_random_bits

from .gfloat_bridge import gfloat_format
from .reference import round_reference

ML_FORMATS = [f for f in fp8sim.CATALOGUE.values() if f.ml_dtype is not None and f.bits <= 16]
SMALL = [f for f in fp8sim.CATALOGUE.values() if f.bits <= 16]
DET_MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto"]


def same_bits(a, b):
    """Equal values with equal sign of zero, or both NaN."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


def midpoints(fmt):
    """float32 midpoints between neighbouring finite values, and one float32 ulp either side."""
    t = fp8sim.decode_table(fmt).astype(np.float64)
    v = np.unique(t[np.isfinite(t)])
    v = np.append(v, [v[-1] + 2.0 ** (fmt.emax - fmt.mbits)])  # the overflow midpoint too
    if fmt.signed:
        v = np.unique(np.concatenate([v, -v]))
    m = ((v[1:] + v[:-1]) / 2).astype(np.float32)
    assert (m.astype(np.float64) == (v[1:] + v[:-1]) / 2).all()  # exact in float32
    return np.concatenate([m, np.nextafter(m, np.float32(np.inf)), np.nextafter(m, np.float32(-np.inf))])


def float32_inputs(fmt, n_random=200_000, seed=0):
    rng = np.random.default_rng(seed)
    all16 = np.arange(2**16, dtype=np.uint32)
    parts = [
        (all16 << 16).view(np.float32),  # every bf16 pattern
        all16.astype(np.uint16).view(np.float16).astype(np.float32),  # every fp16 pattern
        midpoints(fmt),
        rng.integers(0, 2**32, n_random, dtype=np.uint64).astype(np.uint32).view(np.float32),
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32),
    ]
    return np.concatenate(parts)


@pytest.mark.parametrize("fmt", ML_FORMATS, ids=str)
def test_rne_equals_ml_dtypes(fmt):
    x = float32_inputs(fmt)
    if fmt.nan.value == "none":
        x = x[~np.isnan(x)]
    if fmt.name == "e8m0":
        # ml_dtypes rounds float32 subnormals wrongly to e8m0 (8e-39 -> 2**-126 although
        # it is below the midpoint 1.5 * 2**-127): those inputs are checked against the
        # reference in test_all_modes_equal_reference instead.
        x = x[~((np.abs(x) < np.float32(2.0**-126)) & (x != 0))]
        # With no mantissa bits, "ties to even" is ambiguous: ml_dtypes rounds E8M0 ties
        # (1.5 * 2**k) up; we and gfloat pick the even code.  Ties are left to the
        # gfloat and reference tests.
        m, e = np.frexp(x.astype(np.float64))
        x = x[np.abs(m) != 0.75]
    with np.errstate(all="ignore"):
        ref = x.astype(fmt.ml_dtype)
    codes = fp8sim.encode(x, fmt)
    vals = fp8sim.round(x, fmt)
    assert vals.dtype == np.float32
    refv = ref.astype(np.float64)
    assert same_bits(vals, refv).all(), x[~same_bits(vals, refv)][:8]
    # codes bit for bit, except NaN payload/sign, which ml_dtypes copies from the input
    notnan = ~np.isnan(refv)
    assert (codes[notnan] == ref.view(fmt.code_dtype)[notnan]).all()
    assert np.isnan(fp8sim.decode(codes[~notnan], fmt)).all()


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("mode", DET_MODES)
@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_all_modes_equal_reference(fmt, mode, saturate):
    x = float32_inputs(fmt, n_random=50_000, seed=1)
    want = round_reference(x.astype(np.float64), fmt, fp8sim.decode_table(fmt), mode, saturate)
    got = fp8sim.round(x, fmt, mode, saturate=saturate)
    ok = same_bits(got, want)
    assert ok.all(), (x[~ok][:5], got[~ok][:5], want[~ok][:5])
    got64 = fp8sim.round(x.astype(np.float64), fmt, mode, saturate=saturate)
    assert same_bits(got64, want).all()


@pytest.mark.parametrize("mode", ["rne", "rna", "rtz", "rup", "rdn"])
@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_modes_equal_gfloat(fmt, mode):
    gm = {
        "rne": gfloat.RoundMode.TiesToEven,
        "rna": gfloat.RoundMode.TiesToAway,
        "rtz": gfloat.RoundMode.TowardZero,
        "rup": gfloat.RoundMode.TowardPositive,
        "rdn": gfloat.RoundMode.TowardNegative,
    }[mode]
    x = float32_inputs(fmt, n_random=20_000, seed=2).astype(np.float64)
    x = x[np.isfinite(x)]
    if not fmt.signed:
        x = x[x >= fmt.min_subnormal]  # gfloat rounds below E8M0's smallest value to non-E8M0 values
    sat = fmt.nan.value == "none"  # gfloat raises instead of saturating there; we saturate (OCP MX)
    with np.errstate(all="ignore"):
        want = gfloat.round_ndarray(gfloat_format(fmt), x, gm, sat=sat)
    got = fp8sim.round(x, fmt, mode)
    assert same_bits(got, want).all()


@pytest.mark.parametrize("sr_bits", [8, 13, 16, 23])
@pytest.mark.parametrize("fmt", [fp8sim.E4M3, fp8sim.E5M2, fp8sim.E2M1, fp8sim.BF16], ids=str)
def test_sr_equals_gfloat_with_the_same_random_bits(fmt, sr_bits):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(50_000) * 4.0 ** rng.integers(-6, 6, 50_000)).astype(np.float32)
    x = np.clip(x, -fmt.max, fmt.max)
    rnd = (sr_random_bits(7, x.size) >> np.uint64(64 - sr_bits)).astype(np.int64)
    want = gfloat.round_ndarray(
        gfloat_format(fmt),
        x.astype(np.float64),
        gfloat.RoundMode.StochasticFastest,
        sat=True,
        srbits=rnd,
        srnumbits=sr_bits,
    )
    got = fp8sim.round(x, fmt, "sr", seed=7, sr_bits=sr_bits, saturate=True)
    assert same_bits(got, want).all()


def test_float64_is_rounded_once():
    # ml_dtypes before 0.7 goes through float32 and gets -448 here
    x = np.array([-431.99999999999994, 431.99999999999994, 232.0 + 2**-40, 0.0146484375 - 2**-59])
    assert fp8sim.round(x, "e4m3").tolist() == [-416.0, 416.0, 240.0, 0.013671875]
    rng = np.random.default_rng(4)
    for fmt in [fp8sim.E4M3, fp8sim.E5M2, fp8sim.BF16, fp8sim.FP16]:
        m = midpoints(fmt).astype(np.float64)
        x = np.concatenate([m, m + m * 2.0**-40, m - m * 2.0**-40, rng.standard_normal(10_000)])
        for mode in DET_MODES:
            want = round_reference(x, fmt, fp8sim.decode_table(fmt), mode)
            assert same_bits(fp8sim.round(x, fmt, mode), want).all()


def test_fp32_and_tf32_from_float64():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(100_000) * 10.0 ** rng.integers(-45, 39, 100_000)
    with np.errstate(over="ignore"):
        assert same_bits(fp8sim.round(x, "fp32"), x.astype(np.float32)).all()
    for mode, gm in [("rne", gfloat.RoundMode.TiesToEven), ("rtz", gfloat.RoundMode.TowardZero)]:
        want = gfloat.round_ndarray(gfloat_format(fp8sim.TF32), x, gm)
        assert same_bits(fp8sim.round(x, "tf32", mode), want).all()
    codes = fp8sim.encode(x.astype(np.float32), "fp32")
    assert codes.dtype == np.uint32 and (codes == x.astype(np.float32).view(np.uint32)).all()
    assert fp8sim.encode(np.float32(1.0), "tf32") == 0x3F800000 >> 13


def test_overflow_rules():
    big = np.array([500.0, -500.0, 1e30, -1e30, np.inf, -np.inf])
    r = {m: fp8sim.round(big, "e5m2", m).tolist() for m in DET_MODES}
    assert r["rne"][:4] == [512.0, -512.0, np.inf, -np.inf]
    assert r["rtz"][2:] == [57344.0, -57344.0, np.inf, -np.inf]
    assert r["rup"][2:4] == [np.inf, -57344.0] and r["rdn"][2:4] == [57344.0, -np.inf]
    assert r["rto"][2:4] == [57344.0, -57344.0]
    sat = fp8sim.round(big, "e5m2", saturate=True).tolist()
    assert sat == [512.0, -512.0, 57344.0, -57344.0, 57344.0, -57344.0]
    e4 = fp8sim.round(np.array([464.0, 464.01, 1e9, np.inf]), "e4m3")
    assert e4[0] == 448.0 and np.isnan(e4[1:]).all()
    assert fp8sim.encode(np.array([1e9, -np.inf]), "e4m3", saturate=True).tolist() == [0x7E, 0xFE]
    # formats with neither inf nor NaN always saturate (OCP MX)
    assert fp8sim.round(np.array([100.0, -np.inf]), "e2m1").tolist() == [6.0, -6.0]


def test_signed_zero_and_nan():
    z = fp8sim.round(np.array([-0.0, 0.0, -1e-30, np.nan, -np.nan]), "e4m3")
    assert np.signbit(z[0]) and not np.signbit(z[1]) and np.signbit(z[2]) and np.isnan(z[3:]).all()
    assert fp8sim.encode(np.array([-0.0, -1e-30]), "e4m3").tolist() == [0x80, 0x80]
    # fnuz has no -0: 0x80 is its NaN
    assert fp8sim.encode(np.array([-0.0, -1e-30, np.nan]), "e4m3fnuz").tolist() == [0, 0, 0x80]
    # 3 is the tie between 2 (code 128, even) and 4 (code 129)
    e8 = fp8sim.round(np.array([0.0, -1.0, 1e-45, 3.0, 2.0**127 * 1.6]), "e8m0")
    assert np.isnan(e8[:2]).all() and e8[2] == 2.0**-127 and e8[3] == 2.0 and np.isnan(e8[4])


def test_flush_subnormals():
    x = np.array([2.0**-9, 2.0**-7, 2.0**-6, -(2.0**-8), 0.0155])
    y = fp8sim.round(x, "e4m3", flush_subnormals=True)
    assert y.tolist()[:3] == [0.0, 0.0, 2.0**-6] and np.signbit(y[3]) and y[3] == 0 and y[4] == 2.0**-6


def test_codes_view_as_ml_dtypes():
    x = np.linspace(-10, 10, 101).astype(np.float32)
    c = fp8sim.encode(x, "e4m3")
    assert (c.view(ml_dtypes.float8_e4m3fn).astype(np.float32) == fp8sim.round(x, "e4m3")).all()
    assert (fp8sim.decode(c.view(ml_dtypes.float8_e4m3fn), "e4m3") == fp8sim.decode(c, "e4m3")).all()


def test_e5m6_against_reference():
    x = float32_inputs(fp8sim.E5M6, n_random=20_000).astype(np.float64)
    for mode in DET_MODES:
        want = round_reference(x, fp8sim.E5M6, fp8sim.decode_table(fp8sim.E5M6), mode)
        assert same_bits(fp8sim.round(x, "e5m6", mode), want).all()
    assert fp8sim.encode(np.float32(1.0), "e5m6").dtype == np.uint16


@pytest.mark.parametrize("mode", DET_MODES)
@pytest.mark.parametrize("fmt", [f for f in SMALL if f.mbits <= 6], ids=str)
def test_memoized_float32_path_equals_kernel(fmt, mode):
    """Large float32 arrays go through a 2 x 65536 table of the kernel's results
    (only the top 16 bits and 'are the low 16 bits zero' matter for mbits <= 6);
    it must equal the float64 kernel on inputs whose low 16 bits are 0, 1,
    0x8000, 0xFFFF or random, for every top-16-bit pattern."""
    rng = np.random.default_rng(6)
    top = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    lows = [0, 1, 0x7FFF, 0x8000, 0xFFFF]
    bits = np.concatenate(
        [top | np.uint32(lo) for lo in lows] + [top | rng.integers(0, 1 << 16, top.size, dtype=np.uint32)]
    )
    x = bits.view(np.float32)
    for sat in (False, True):
        got = fp8sim.round(x, fmt, mode, saturate=sat)  # memoized path (size >= 2**16)
        want = fp8sim.round(x.astype(np.float64), fmt, mode, saturate=sat)  # kernel
        assert same_bits(got, want).all()
        if fmt.nan.value != "none":
            assert np.array_equal(
                fp8sim.encode(x, fmt, mode, saturate=sat), fp8sim.encode(x.astype(np.float64), fmt, mode, saturate=sat)
            )


def test_unsigned_format_without_nan_rejects_negative_input():
    """Issue #18 item 12: encode(-1.0) gave code 255 in a 7-bit unsigned format without NaN."""
    u7 = fp8sim.Format("u7", 4, 3, 7, signed=False, nan=fp8sim.NanStyle.NONE)
    for func in (fp8sim.round, fp8sim.encode):
        with pytest.raises(ValueError, match="unsigned and has no NaN"):
            func(np.array([1.0, -1.0]), u7)
        with pytest.raises(ValueError, match="unsigned and has no NaN"):
            func(np.array([-np.inf], np.float32), u7)
    assert fp8sim.encode(np.array([-0.0, 0.0, 1.0, 3e9]), u7).tolist() == [0, 0, 0x38, 0x7F]  # 1 = 0111.000
    # with a NaN code, negative inputs give it (as E8M0 does); codes stay inside the format's width
    u7n = fp8sim.Format("u7n", 4, 3, 7, signed=False, nan=fp8sim.NanStyle.OCP)
    assert fp8sim.encode(np.array([-1.0, np.nan]), u7n).tolist() == [0x7F, 0x7F]


def test_decode_takes_codes_in_either_byte_order():
    """Codes read from a big-endian file (``>u2``) are the same codes: decoded as such, checked
    against ml_dtypes' own view of the native codes."""
    import ml_dtypes

    native = np.arange(0, 1 << 16, 7, dtype=np.uint16)
    big = native.astype(">u2")
    assert big.tobytes() != native.tobytes()  # really another byte order
    got = fp8sim.decode(big, "bf16")
    want = native.view(ml_dtypes.bfloat16).astype(np.float32)
    nan = np.isnan(want)
    assert nan.any() and np.array_equal(np.isnan(got), nan)  # NaN payloads aside (decode gives one NaN)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    with pytest.raises(TypeError, match="must be uint16"):
        fp8sim.decode(native.astype(">u4"), "bf16")  # another width stays an error
