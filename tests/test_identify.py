"""fp8sim.identify: recovering the recipe of synthetic and captured library outputs, the first
diverging output of a planted change, bad inputs, and the ``fp8sim identify`` command."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fp8sim
from fp8sim.cli import main
from fp8sim.gemms.engine import k_slices
from fp8sim.gemms.identification import bit_match
from tests import capture_sets as lc

M, N = 32, 48


def codes(rng, shape, fmt="e4m3"):
    return fp8sim.encode(rng.standard_normal(shape), fmt).astype(np.uint8)


def scales(rng, kind, K):
    nkb, nnb = -(-K // 128), -(-N // 128)
    if kind == "tensor":
        return np.float32(rng.uniform(0.01, 3)), np.float32(rng.uniform(0.01, 3))
    if kind == "row":
        return rng.uniform(0.01, 3, (M, 1)).astype(np.float32), rng.uniform(0.01, 3, (1, N)).astype(np.float32)
    return rng.uniform(0.01, 3, (M, nkb)).astype(np.float32), rng.uniform(0.01, 3, (nkb, nnb)).astype(np.float32)


def reproduces(a, b, sa, sb, r, y, **kw):
    got = fp8sim.scaled_gemm(a, b, sa, sb, r, **kw)
    return bool(bit_match(got.astype(np.float32), np.asarray(y, np.float32)).all())


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(["tensor", "row", "block"]),
    K=st.sampled_from([256, 768, 1024, 2048]),
    split_k=st.integers(1, 6),
    order=st.sampled_from(["sequential", "reverse", "pairwise"]),
    epi=st.sampled_from(["alpha", "b-then-a", "a-then-b"]),
    prom=st.sampled_from([None, 64, 128]),
    app=st.sampled_from(["fma", "mul-add"]),
    out=st.sampled_from(["bf16", "fp32"]),
    seed=st.integers(0, 2**16),
)
def test_recovers_synthetic_recipes(kind, K, split_k, order, epi, prom, app, out, seed):
    rng = np.random.default_rng(seed)
    a, b = codes(rng, (M, K)), codes(rng, (K, N))
    sa, sb = scales(rng, kind, K)
    if kind == "block":
        truth = fp8sim.recipe("cublaslt-block").with_(promote_every=prom or 128, scale_application=app)
    else:
        truth = fp8sim.recipe("cublaslt-tensor-fast").with_(promote_every=prom, epilogue_scale=epi)
    truth = truth.with_(split_k=split_k, split_order=order, output_format=out)
    y = fp8sim.scaled_gemm(a, b, sa, sb, truth)
    res = fp8sim.identify(a, b, y, a_scale=sa, b_scale=sb)
    assert res.match_rate == 1.0 and res.mismatches == 0
    assert reproduces(a, b, sa, sb, res.recipe, y)
    assert "bit-identical" in res.explain()
    slices = k_slices(K, split_k, truth.split_granule)
    as_promotion = all(k1 - k0 == 128 for k0, k1 in slices)  # = promote_every 128 without split-K
    if len(slices) > 1 and prom is None and kind != "block" and out == "fp32" and not as_promotion:
        r = res.recipe  # identifiable on N(0, 1) data
        assert k_slices(K, r.split_k, r.split_granule) == k_slices(K, split_k, truth.split_granule)
        assert r.promote_every is None and r.accumulator == "wgmma" and r.output_format == "fp32"


def test_split_k_and_scale_order_recovered():
    rng = np.random.default_rng(7)
    K = 2048
    a, b = codes(rng, (M, K)), codes(rng, (K, N))
    sa, sb = scales(rng, "row", K)
    truth = fp8sim.recipe("cublaslt-row-fast").with_(split_k=4, split_order="pairwise", output_format="fp32")
    y = fp8sim.scaled_gemm(a, b, sa, sb, truth)
    res = fp8sim.identify(a, b, y, a_scale=sa, b_scale=sb)
    r = res.recipe
    assert res.match_rate == 1.0
    assert (r.split_k, r.epilogue_scale, r.promote_every, r.output_format) == (4, "b-then-a", None, "fp32")
    rows = [t for t in res.table if t["match_rate"] is not None]
    assert rows and rows[0]["match_rate"] == 1.0 and all(0 <= t["sample_match_rate"] <= 1 for t in res.table)


def test_planted_bit_flip_is_explained():
    rng = np.random.default_rng(3)
    K = 512
    a, b = codes(rng, (M, K)), codes(rng, (K, N))
    sa, sb = scales(rng, "tensor", K)
    truth = fp8sim.recipe("cublaslt-tensor").with_(output_format="fp32")
    y = fp8sim.scaled_gemm(a, b, sa, sb, truth)
    i, j = 5, 17
    bad = y.copy()
    bad[i, j] = (bad[i, j : j + 1].view(np.uint32) ^ np.uint32(1)).view(np.float32)[0]
    res = fp8sim.identify(a, b, bad, a_scale=sa, b_scale=sb)
    assert res.match_rate == pytest.approx(1 - 1 / y.size)
    assert reproduces(a, b, sa, sb, res.recipe, y)
    text = res.explain()
    want = f"0x{int(bad[i, j : j + 1].view(np.uint32)[0]):08x}"
    got = f"0x{int(y[i, j : j + 1].view(np.uint32)[0]):08x}"
    assert f"[{i}, {j}]" in text and want in text and got in text
    d = res.diagnosis()
    assert (d["row"], d["col"], d["y_bits"], d["model_bits"]) == (i, j, want, got)
    assert ("no single step" in text) == (not d["changes"])


def test_bf16_typed_output_and_nk_layout():
    rng = np.random.default_rng(11)
    K = 512
    a, w = codes(rng, (M, K)), codes(rng, (N, K))
    truth = fp8sim.recipe("cublaslt-tensor-fast")
    y = fp8sim.scaled_gemm(a, w, None, None, truth, layout="nk")
    res = fp8sim.identify(a, w, y.astype(ml_dtypes.bfloat16), layout="nk")
    assert res.match_rate == 1.0 and res.recipe.output_format == "bf16"
    assert all(t["output_format"] == "bf16" for t in res.table)
    assert reproduces(a, w, None, None, res.recipe, y, layout="nk")


# ---------------------------------------------------------------- real captures (H200)
@pytest.fixture(scope="module")
def captures():
    groups, _meta = lc.load()
    return groups


def test_capture_cublaslt_row_fast(captures):
    d = captures["mid256_normal_e4m3xe4m3"]
    y = lc.captured(d, "y/cublaslt_row_fast_f32".removeprefix("y/"))
    res = fp8sim.identify(d["a"], d["w"], y, a_scale=d["sa_row"], b_scale=d["sb_row"], layout="nk")
    r = res.recipe
    assert res.match_rate == 1.0
    assert (r.epilogue_scale, r.promote_every, r.output_format) == ("b-then-a", None, "fp32")


def test_capture_cublaslt_tensor_fast_split_k(captures):
    d = captures["skinny64_normal_e4m3xe4m3"]
    y = lc.captured(d, "cublaslt_tensor_fast_f32")
    res = fp8sim.identify(d["a"], d["w"], y, a_scale=d["sa_tensor"], b_scale=d["sb_tensor"], layout="nk")
    assert res.match_rate == 1.0 and res.recipe.split_k == 6


# ---------------------------------------------------------------- bad inputs
def test_bad_inputs():
    rng = np.random.default_rng(0)
    a, b = codes(rng, (4, 64)), codes(rng, (64, 8))
    y = fp8sim.scaled_gemm(a, b, None, None, "cublaslt-tensor-fast")
    with pytest.raises(ValueError, match="shape"):
        fp8sim.identify(a, b, y[:, :4])
    with pytest.raises(ValueError, match="inner dimensions"):
        fp8sim.identify(a, b[:32], y)
    with pytest.raises(TypeError, match="float32"):
        fp8sim.identify(a, b, y.astype(np.float64))
    with pytest.raises(TypeError, match="float32"):
        fp8sim.identify(a, b, (y.view(np.uint32) >> 16).astype(np.uint16))
    with pytest.raises(TypeError, match="FP8 codes"):
        fp8sim.identify(a.astype(np.float32), b, y)
    with pytest.raises(ValueError, match="layout"):
        fp8sim.identify(a, b, y, layout="tn")
    with pytest.raises(ValueError, match="empty"):
        fp8sim.identify(a[:0], b, y[:0])
    with pytest.raises(ValueError, match="a_scale"):
        fp8sim.identify(a, b, y, a_scale=np.ones((3, 1), np.float32))


def test_nan_scale_gives_nan_not_an_error():
    rng = np.random.default_rng(1)
    a, b = codes(rng, (4, 64)), codes(rng, (64, 8))
    sa = np.array([[1.0], [np.nan], [2.0], [0.5]], np.float32)
    y = fp8sim.scaled_gemm(a, b, sa, np.float32(1.5), "cublaslt-row-fast")
    assert np.isnan(y[1]).all()
    res = fp8sim.identify(a, b, y, a_scale=sa, b_scale=np.float32(1.5))
    assert res.match_rate == 1.0


# ---------------------------------------------------------------- the command
def _run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_identify(tmp_path, capsys):
    rng = np.random.default_rng(5)
    K = 512
    a, w = codes(rng, (16, K)), codes(rng, (24, K))
    sa, sb = rng.uniform(0.1, 2, (16, 1)).astype(np.float32), rng.uniform(0.1, 2, (1, 24)).astype(np.float32)
    truth = fp8sim.recipe("cublaslt-row-fast").with_(split_k=2, output_format="fp32")
    y = fp8sim.scaled_gemm(a, w, sa, sb, truth, layout="nk")
    f = tmp_path / "mine.npz"
    np.savez(f, a=a, b=w, layout="nk", a_scale=sa, b_scale=sb, y=y)
    code, out, _ = _run(capsys, "identify", str(f))
    assert code == 0 and "best recipe" in out and "100.0000 %" in out and "split_k=2" in out
    code, out, _ = _run(capsys, "identify", str(f), "--json")
    d = json.loads(out)
    assert code == 0 and d["match_rate"] == 1.0 and d["recipe"]["split_k"] == 2 and len(d["top"]) == 5
    assert d["recipe"]["epilogue_scale"] == "b-then-a" and "bit-identical" in d["explain"]
    code, _, err = _run(capsys, "identify", str(tmp_path / "none.npz"))
    assert code == 2 and "no such file" in err
    g = tmp_path / "bad.npz"
    np.savez(g, a=a, b=w)
    code, _, err = _run(capsys, "identify", str(g))
    assert code == 1 and "missing" in err and "y" in err
    np.savez(g, a=a, b=w, y=y)  # layout kn: inner dimensions differ
    code, _, err = _run(capsys, "identify", str(g))
    assert code == 1 and "inner dimensions" in err
