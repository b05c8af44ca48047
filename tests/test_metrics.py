"""Error metrics, checked against direct formulas on small hand-made arrays."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fp8sim
from fp8sim import metrics as M


def test_basic_values():
    r = np.array([3.0, 4.0, 0.0, -1.0])
    a = np.array([3.0, 4.5, 0.0, -1.5])
    assert M.rel_frobenius_error(r, a) == pytest.approx(math.sqrt(0.25 + 0.25) / math.sqrt(26.0))
    assert M.sqnr_db(r, a) == pytest.approx(10 * math.log10(26.0 / 0.5))
    assert M.max_rel_error(r, a) == pytest.approx(0.5)
    assert M.fraction_underflow(np.array([1.0, 2.0, 0.0, 3.0]), np.array([0.0, 2.0, 0.0, 0.0])) == 0.5


def test_exact_and_zero_cases():
    r = np.array([1.0, -2.0])
    assert M.sqnr_db(r, r) == math.inf
    assert M.rel_frobenius_error(r, r) == 0.0
    assert M.max_rel_error(r, r) == 0.0
    z = np.zeros(3)
    assert M.rel_frobenius_error(z, z) == 0.0
    assert M.rel_frobenius_error(z, np.ones(3)) == math.inf
    assert M.sqnr_db(z, np.ones(3)) == -math.inf
    assert M.max_rel_error(z, np.array([0.0, 1.0, 0.0])) == math.inf


def test_nan_handling():
    r = np.array([1.0, np.nan, 2.0])
    a = np.array([1.0, 5.0, 2.5])
    assert M.sqnr_db(r, a) == pytest.approx(10 * math.log10(5.0 / 0.25))
    assert math.isnan(M.sqnr_db(r, a, nan="propagate"))
    assert math.isnan(M.rel_frobenius_error(r, a, nan="propagate"))
    with pytest.raises(ValueError, match="omit"):
        M.sqnr_db(r, a, nan="drop")


def test_infinities():
    r = np.array([np.inf, 1.0])
    assert M.sqnr_db(r, r) == math.inf  # equal infinities: no error
    assert M.rel_frobenius_error(np.array([1.0, 2.0]), np.array([np.inf, 2.0])) == math.inf


def test_dtypes_and_shapes():
    r = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = r.astype(ml_dtypes.bfloat16)
    assert M.sqnr_db(r, a) == math.inf
    with pytest.raises(ValueError, match="shape"):
        M.sqnr_db(r, r.T)
    with pytest.raises(TypeError):
        M.sqnr_db(r, np.array([["a"] * 3] * 2))


@settings(max_examples=50)
@given(
    hnp.arrays(
        np.float64, st.integers(1, 50), elements=st.floats(-1e6, 1e6).filter(lambda v: v == 0 or abs(v) > 1e-100)
    ),
    st.floats(1e-3, 1.0),
)
def test_sqnr_matches_rel_frobenius(r, noise):
    a = r * (1 + noise)
    if not np.any(r):
        return
    rf = M.rel_frobenius_error(r, a)
    assert rf == pytest.approx(noise, rel=1e-9)
    assert M.sqnr_db(r, a) == pytest.approx(-20 * math.log10(rf), rel=1e-9)


def test_saturation_subnormal_and_block_stats():
    x = np.array([[1.0, 2.0, 3.0, 5e-5], [10.0, 20.0, 30.0, 40.0]], np.float32)
    # per tensor with a chosen amax of 3: everything above 3 clips
    q = fp8sim.quantize(x, "e4m3", "tensor", amax=3.0)
    assert M.fraction_saturated(x, q) == 4 / 8
    # 5e-5 / (3/448) = 0.0075 -> e4m3 subnormal 4 * 2**-9 (below 2**-6)
    assert M.fraction_subnormal(q) == 1 / 8
    s = M.summary(x, q)
    assert s["fraction_saturated"] == 0.5 and s["fraction_subnormal"] == 1 / 8
    q = fp8sim.quantize(x, "e4m3", "row")
    b = M.block_stats(x, q)
    assert b["n"].tolist() == [[4], [4]]
    assert b["amax"].ravel().tolist() == [3.0, 40.0]
    d = q.dequantize(np.float64)
    for i in range(2):
        ref = M.sqnr_db(x[i].astype(np.float64), d[i])
        assert b["sqnr_db"][i, 0] == pytest.approx(ref)
        assert b["max_abs_error"][i, 0] == pytest.approx(np.abs(d[i] - x[i]).max())
    assert (b["n_saturated"] == 0).all()
    with pytest.raises(TypeError):
        M.fraction_subnormal(x)
