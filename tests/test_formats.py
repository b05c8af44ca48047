"""The format catalogue: properties and the value of every code."""

import gfloat
import ml_dtypes
import numpy as np
import pytest

import fp8sim
from fp8sim.formats import NanStyle

from .gfloat_bridge import gfloat_format

SMALL = [f for f in fp8sim.CATALOGUE.values() if f.bits <= 16]

# Values fixed by the specifications (OCP 8-bit FP v1.0, OCP MX v1.0, IEEE 754),
# not by our code.
SPEC_MAX = {
    "e4m3": 448.0,
    "e5m2": 57344.0,
    "e4m3fnuz": 240.0,
    "e5m2fnuz": 57344.0,
    "e8m0": 2.0**127,
    "e2m1": 6.0,
    "e2m3": 7.5,
    "e3m2": 28.0,
    "e3m4": 15.5,
    "bf16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).max),
    "fp16": 65504.0,
    "fp32": float(np.finfo(np.float32).max),
    "tf32": (2 - 2.0**-10) * 2.0**127,
    "e5m6": (2 - 2.0**-6) * 2.0**15,
}


@pytest.mark.parametrize("fmt", fp8sim.CATALOGUE.values(), ids=str)
def test_max_matches_spec(fmt):
    assert fmt.max == SPEC_MAX[fmt.name]


@pytest.mark.parametrize("fmt", [f for f in fp8sim.CATALOGUE.values() if f.ml_dtype is not None], ids=str)
def test_properties_mirror_finfo(fmt):
    fi = ml_dtypes.finfo(fmt.ml_dtype)
    assert fmt.bits == fi.bits
    assert fmt.max == float(fi.max)
    assert fmt.min_normal == float(fi.smallest_normal)
    assert fmt.min_subnormal == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)
    assert fmt.mbits == fi.nmant
    assert fmt.emax == fi.maxexp - 1


def test_expected_ml_dtypes():
    assert fp8sim.E4M3.ml_dtype is ml_dtypes.float8_e4m3fn
    assert fp8sim.E5M2.ml_dtype is ml_dtypes.float8_e5m2
    assert fp8sim.E4M3FNUZ.ml_dtype is ml_dtypes.float8_e4m3fnuz
    assert fp8sim.E8M0.ml_dtype is ml_dtypes.float8_e8m0fnu
    assert fp8sim.E2M1.ml_dtype is ml_dtypes.float4_e2m1fn
    assert fp8sim.BF16.ml_dtype is ml_dtypes.bfloat16
    assert fp8sim.E5M6.ml_dtype is None and fp8sim.TF32.ml_dtype is None


@pytest.mark.parametrize("fmt", SMALL, ids=str)
def test_every_code_decodes_like_gfloat(fmt):
    codes = np.arange(fmt.num_codes, dtype=fmt.code_dtype)
    ours = fp8sim.decode(codes, fmt).astype(np.float64)
    ref = gfloat.decode_ndarray(gfloat_format(fmt), codes.astype(np.int64)).astype(np.float64)
    same = (ours == ref) & (np.signbit(ours) == np.signbit(ref))
    same |= np.isnan(ours) & np.isnan(ref)
    assert same.all(), codes[~same][:10]


@pytest.mark.parametrize("fmt", [f for f in SMALL if f.ml_dtype is not None], ids=str)
def test_every_code_decodes_like_ml_dtypes(fmt):
    codes = np.arange(fmt.num_codes, dtype=fmt.code_dtype)
    ours = fp8sim.decode(codes, fmt)
    ref = codes.view(fmt.ml_dtype).astype(np.float64) if np.dtype(fmt.ml_dtype).itemsize == codes.itemsize else None
    assert ref is not None
    same = ((ours == ref) & (np.signbit(ours) == np.signbit(ref))) | (np.isnan(ours) & np.isnan(ref))
    assert same.all()


def test_wide_codes_decode_like_float32():
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)
    ref = bits.view(np.float32)
    ours = fp8sim.decode(bits, "fp32")
    assert (((ours == ref) & (np.signbit(ours) == np.signbit(ref))) | (np.isnan(ours) & np.isnan(ref))).all()
    # tf32 is float32 with the 13 low mantissa bits dropped
    t = (bits >> 13).astype(np.uint32)
    ref = (t << 13).view(np.float32)
    ours = fp8sim.decode(t, "tf32")
    assert (((ours == ref) & (np.signbit(ours) == np.signbit(ref))) | (np.isnan(ours) & np.isnan(ref))).all()


def test_special_codes():
    assert fp8sim.E4M3.nan_code == 0x7F and fp8sim.E4M3.inf_code is None
    assert fp8sim.E5M2.inf_code == 0x7C
    assert np.isnan(fp8sim.decode(np.array([0x80], np.uint8), "e4m3fnuz"))[0]
    assert np.isnan(fp8sim.decode(np.array([0xFF], np.uint8), "e8m0"))[0]
    assert fp8sim.decode(np.array([0x00], np.uint8), "e8m0")[0] == 2.0**-127
    assert fp8sim.decode(np.array([0x7E, 0xFE], np.uint8), "e4m3").tolist() == [448.0, -448.0]
    assert fp8sim.E2M1.nan_code is None


def test_lookup_and_errors():
    assert fp8sim.format("E4M3") is fp8sim.E4M3
    assert fp8sim.format("float8_e4m3fn") is fp8sim.E4M3
    assert fp8sim.format(fp8sim.E5M2) is fp8sim.E5M2
    with pytest.raises(ValueError, match="known formats: e4m3, e5m2"):
        fp8sim.format("e4m4")
    with pytest.raises(TypeError):
        fp8sim.format(3)


def test_custom_format_and_validation():
    f = fp8sim.Format("e6m1", 6, 1, 31, inf=True, nan=NanStyle.IEEE)
    assert f.bits == 8 and f.max == 1.5 * 2.0**31
    assert fp8sim.round(np.array([3.1e9]), f)[0] == 1.5 * 2.0**31  # 3.22e9 is the midpoint -> even
    with pytest.raises(ValueError):
        fp8sim.Format("bad", 0, 3, 7)
    with pytest.raises(ValueError):
        fp8sim.Format("bad", 4, 3, 7, inf=True, nan=NanStyle.OCP)
    with pytest.raises(ValueError):
        fp8sim.Format("bad", 4, 3, 7, signed=False, nan=NanStyle.FNUZ)


def test_format_fields_are_validated():
    """Issue #18 item 12: a fractional bias, bools for bit counts, 64-bit formats (codes are int64 in the
    kernel) and values outside float64 were accepted and gave wrong formats."""
    for args, kw, err, msg in [
        (("x", 4, 3, 7.5), {}, TypeError, "bias must be an int"),
        (("x", True, 3, 7), {}, TypeError, "ebits must be an int"),
        (("x", 4, 3.0, 7), {}, TypeError, "mbits must be an int"),
        (("x", 4, 3, 7), {"signed": 1}, TypeError, "signed must be a bool"),
        (("x", 4, 3, 7), {"inf": "yes", "nan": NanStyle.IEEE}, TypeError, "inf must be a bool"),
        (("x", 4, 3, 7), {"nan": "nans"}, ValueError, "unknown nan style 'nans'; known: ieee, ocp, fnuz, none"),
        (("x", 11, 52, 1023), {"inf": True}, ValueError, "at most 63 bits, got 64"),
        (("x", 4, 3, 1500), {}, ValueError, "float64 holds"),
        (("x", 4, 3, -1500), {}, ValueError, "float64 holds"),
        (("x", 12, 3, 7), {}, ValueError, "ebits must be an int in 1..11"),
        ((3, 4, 3, 7), {}, TypeError, "name"),
    ]:
        with pytest.raises(err, match=msg):
            fp8sim.Format(*args, **kw)
    f = fp8sim.Format("e4m3", np.int64(4), np.int32(3), np.int64(7), signed=np.bool_(True), nan=NanStyle.OCP)
    assert type(f.ebits) is int and type(f.bias) is int and f.signed is True and f == fp8sim.E4M3
    # the limits themselves are accepted: 63 bits, float64's largest and smallest values
    assert fp8sim.Format("u63", 11, 52, 1023, signed=False, inf=True).max == np.finfo(np.float64).max
    assert fp8sim.Format("x", 11, 51, 1023, inf=True).min_subnormal == 2.0**-1073
