"""Training emulation: backward passes against finite differences (fp64), the quantization axes of
the three GEMMs, the stability instruments under injected faults, reproducibility, the CLI."""

import json
from dataclasses import replace

import numpy as np
import pytest

import fp8sim
from fp8sim.scaling import Tile
from fp8sim.training import linear as L
from fp8sim.training.data import Batches, make_corpus
from fp8sim.training.instruments import DriftMonitor, DynamicClipper, ElasticRestart
from fp8sim.training.model import (
    MLP,
    Attention,
    Context,
    Embedding,
    LayerNorm,
    ModelConfig,
    RMSNorm,
    TransformerLM,
    cross_entropy,
    precision_for,
)
from fp8sim.training.optim import AdamW, lr_schedule
from fp8sim.training.train import Fault, TrainConfig, relative_loss_error, train_one

TINY = TrainConfig(
    model=ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context=16),
    batch=4,
    corpus_tokens=20000,
    warmup=3,
    checkpoint_interval=4,
    eval_batches=1,
)


# ------------------------------------------------------------------ finite differences (fp64)
def _ctx64():
    return Context(precision_for("fp64"))


def _fd_check(f, arrays, grads, rng, n=8, h=1e-6, tol=1e-6):
    """Central differences of the scalar f() with respect to n random entries of each array."""
    for a, g in zip(arrays, grads):
        for _ in range(n):
            i = tuple(rng.integers(0, s) for s in a.shape)
            old = a[i]
            a[i] = old + h
            fp = f()
            a[i] = old - h
            fm = f()
            a[i] = old
            fd = (fp - fm) / (2 * h)
            assert abs(fd - g[i]) <= tol * max(1.0, abs(fd)), (i, fd, g[i])


def _check_layer_fd(layer, x, forward, backward, params, rng):
    ctx = _ctx64()
    y = forward(x, ctx)
    R = rng.standard_normal(y.shape)
    for p in params:
        p.grad[...] = 0
    dx = backward(R, ctx)

    def f():
        return float(np.sum(forward(x, ctx) * R))

    arrays = [p.value for p in params] + ([x] if dx is not None else [])
    grads = [p.grad.copy() for p in params] + ([dx] if dx is not None else [])
    _fd_check(f, arrays, grads, rng)


@pytest.mark.parametrize("kind", ["linear", "rmsnorm", "layernorm", "attention", "mlp"])
def test_layer_backward_matches_finite_differences(kind):
    rng = np.random.default_rng(1)
    if kind == "linear":
        layer = L.Linear.create("lin", "mlp_up", 6, 5, rng, 0.5, np.float64)
        x = rng.standard_normal((7, 6))
    elif kind == "rmsnorm":
        layer = RMSNorm.create("n", 6, np.float64)
        layer.weight.value[...] = rng.standard_normal(6)
        x = rng.standard_normal((2, 3, 6))
    elif kind == "layernorm":
        layer = LayerNorm.create("n", 6, np.float64)
        layer.weight.value[...] = rng.standard_normal(6)
        layer.bias.value[...] = rng.standard_normal(6)
        x = rng.standard_normal((2, 3, 6))
    elif kind == "attention":
        layer = Attention.create("a", 8, 2, rng, 0.5, 0.5, np.float64)
        x = rng.standard_normal((2, 5, 8))
    else:
        layer = MLP.create("m", 6, 10, rng, 0.5, 0.5, np.float64)
        x = rng.standard_normal((2, 3, 6))
    _check_layer_fd(layer, x, layer.forward, layer.backward, layer.params(), rng)


def test_embedding_and_cross_entropy_gradients():
    rng = np.random.default_rng(2)
    emb = Embedding.create(9, 4, 6, rng, 1.0, np.float64)
    tok = rng.integers(0, 9, (3, 6))
    tok[0, :3] = 4  # a repeated token: gradients must accumulate
    _check_layer_fd(emb, tok, emb.forward, emb.backward, emb.params(), rng)
    logits = rng.standard_normal((5, 7))
    t = rng.integers(0, 7, 5)
    loss, g = cross_entropy(logits, t)
    # independent value: -mean log softmax
    ref = -np.mean(np.log(np.exp(logits[np.arange(5), t]) / np.exp(logits).sum(1)))
    assert loss == pytest.approx(ref, rel=1e-12)
    _fd_check(lambda: cross_entropy(logits, t)[0], [logits], [g], rng)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_whole_model_backward_matches_finite_differences(norm):
    rng = np.random.default_rng(3)
    cfg = ModelConfig(vocab=11, d_model=8, n_layers=2, n_heads=2, d_ff=12, context=5, norm=norm, init_std=0.3)
    m = TransformerLM(cfg, seed=1, dtype=np.float64)
    for p in m.params():
        p.value += rng.standard_normal(p.value.shape) * 0.1
    x, y = rng.integers(0, 11, (2, 5)), rng.integers(0, 11, (2, 5))
    ctx = _ctx64()
    m.loss_and_grads(x, y, ctx)
    params = m.params()
    _fd_check(lambda: m.loss(x, y, ctx), [p.value for p in params], [p.grad.copy() for p in params], rng, n=3)


# ------------------------------------------------------------------ quantization axes
def _deq(a, fmt, g):
    return fp8sim.quantize(np.ascontiguousarray(a), fmt, g).dequantize(np.float64)


def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def _outlier_tokens(rng, T, d):
    # token magnitudes spread over 6 decades: a per-token (1x128 along K) scale fits each token,
    # a scale shared along the tokens (Wgrad's K) does not
    return (rng.standard_normal((T, d)) * 10.0 ** rng.uniform(-3, 3, (T, 1))).astype(np.float32)


def test_fprop_dgrad_wgrad_quantization_axes_deepseek():
    rng = np.random.default_rng(4)
    T, din, dout = 256, 256, 128
    lin = L.Linear.create("lin", "mlp_up", din, dout, rng, 0.05)
    ctx = Context(precision_for("deepseek-v3"), "fast")  # fp32 partials: the bounds below assume them
    X = _outlier_tokens(rng, T, din)
    dY = _outlier_tokens(rng, T, dout) * 1e-4
    Y = lin.forward(X, ctx)
    dX = lin.backward(dY, ctx)
    W = lin.weight.value
    qx, qw, lay = lin.last_operands["fprop"]
    assert lay == "kn" and qx.shape == (T, din) and qx.block_shape == (1, 128) and qx.scales.shape == (T, 2)
    assert qw.shape == (din, dout) and qw.block_shape == (128, 128)
    qdy, qwt, lay = lin.last_operands["dgrad"]
    assert qdy.shape == (T, dout) and qdy.block_shape == (1, 128)
    assert qwt is qw and lay == "nk"  # W^T shares W's 128x128 scales
    qxt, qdyt, lay = lin.last_operands["wgrad"]
    assert qxt.shape == (din, T) and qxt.block_shape == (1, 128) and qxt.scales.shape == (din, 2)
    assert qdyt.shape == (T, dout) and qdyt.block_shape == (128, 1) and qdyt.scales.shape == (2, dout)
    # values: independent references (quantize + float64 products)
    Yref = _deq(X, "e4m3", "1x128") @ _deq(W, "e4m3", "128x128")
    assert _rel(Y, Yref) < 1e-2  # bf16 output
    dXref = _deq(dY, "e4m3", "1x128") @ _deq(W, "e4m3", "128x128").T
    assert _rel(dX, dXref) < 1e-2
    dWref = _deq(X.T, "e4m3", "1x128") @ _deq(dY, "e4m3", Tile(128, 1))
    dW = lin.weight.grad
    assert _rel(dW, dWref) < 1e-5  # fp32 output, fp32 partials
    # the wrong orientation (reusing Fprop's per-token quantization of X) is far off
    dWwrong = _deq(X, "e4m3", "1x128").T @ _deq(dY, "e4m3", "1x128")
    assert _rel(dWwrong, dWref) > 1e-3
    assert _rel(dW, dWwrong) > 1e-3


def test_wgrad_fails_if_fprop_quantization_of_x_is_reused(monkeypatch):
    """Make Wgrad reuse the Fprop quantization of X (the bug this guards against): the reference check
    of the previous test must then fail."""
    rng = np.random.default_rng(5)
    T, din, dout = 256, 128, 128
    X = _outlier_tokens(rng, T, din)
    dY = rng.standard_normal((T, dout)).astype(np.float32)
    dWref = _deq(X.T, "e4m3", "1x128") @ _deq(dY, "e4m3", Tile(128, 1))

    def run():
        lin = L.Linear.create("lin", "mlp_up", din, dout, np.random.default_rng(0), 0.05)
        ctx = Context(precision_for("deepseek-v3"), "fast")  # fp32 partials, as the 1e-5 bound assumes
        lin.forward(X, ctx)
        lin.backward(dY, ctx)
        return lin.weight.grad

    assert _rel(run(), dWref) < 1e-5
    orig = L.quantize_operand

    def buggy(a, fmt, g, k_axis, **kw):
        if a.shape == (din, T) and k_axis == 1:
            # X^T for Wgrad: reuse the FP8 values of Fprop's per-token quantization of X (only rescaled
            # along the tokens, as a GEMM with one scale per K block must)
            fprop_values = orig(np.ascontiguousarray(a.T), fmt, g, 1, **kw).dequantize(np.float32)
            return orig(np.ascontiguousarray(fprop_values.T), fmt, g, 1, **kw)
        return orig(a, fmt, g, k_axis, **kw)

    monkeypatch.setattr(L, "quantize_operand", buggy)
    assert _rel(run(), dWref) > 1e-3


def test_te_hybrid_gradients_in_e5m2_and_mx_weights_requantized():
    rng = np.random.default_rng(6)
    X = rng.standard_normal((64, 128)).astype(np.float32)
    dY = rng.standard_normal((64, 96)).astype(np.float32)
    lin = L.Linear.create("lin", "mlp_up", 128, 96, rng, 0.05)
    ctx = Context(precision_for("te-hybrid"))
    lin.forward(X, ctx)
    lin.backward(dY, ctx)
    assert lin.last_operands["fprop"][0].format.name == "e4m3"
    assert lin.last_operands["dgrad"][0].format.name == "e5m2"
    assert lin.last_operands["wgrad"][0].format.name == "e4m3" and lin.last_operands["wgrad"][1].format.name == "e5m2"
    assert lin.last_operands["fprop"][0].scales.size == 1  # per tensor
    # MXFP8: blocks run along K, so W (K = d_in) and W^T (K = d_out) need separate quantizations
    lin = L.Linear.create("lin", "mlp_up", 128, 96, rng, 0.05)
    ctx = Context(precision_for("mxfp8"))
    lin.forward(X, ctx)
    lin.backward(dY, ctx)
    qw = lin.last_operands["fprop"][1]
    qwt = lin.last_operands["dgrad"][1]
    assert qw.block_shape == (32, 1) and qwt.shape == (96, 128) and qwt.block_shape == (32, 1)


def test_matmul_is_fp8sim_gemm_and_exact_on_small_integers():
    """Training's GEMM is fp8sim.gemm itself (no fallback): on a product whose FP8 result is exact (small
    integers, every scale block's amax 7, so the fp32 scales are 7 / 448 = 2**-6 and the codes 64 * x)
    it gives the exact product, rounded once to bf16, with every fidelity and layout."""
    rng = np.random.default_rng(0)
    x = rng.integers(-7, 8, (4, 64)).astype(np.float32)
    w = rng.integers(-7, 8, (64, 8)).astype(np.float32)
    x[:, 0] = w[0, 0] = 7
    qx = L.quantize_operand(x, "e4m3", "1x128", 1)
    qw = L.quantize_operand(w, "e4m3", "128x128", 0)
    exact = fp8sim.round(x.astype(np.float64) @ w.astype(np.float64), "bf16").astype(np.float32)
    qwt = L.quantize_operand(np.ascontiguousarray(w.T), "e4m3", "128x128", 1)
    for y in (
        fp8sim.gemm(qx, qw, "deepseek-v3"),
        fp8sim.gemm(qx, qw, "deepseek-v3", fidelity="fast"),
        fp8sim.gemm(qx, qwt, "deepseek-v3", layout="nk"),
        L.matmul(qx, qw, "deepseek-v3", "fprop"),
        L.matmul(x, w, "deepseek-v3", "fprop"),
        L.matmul(qx, qwt, "deepseek-v3", "fprop", layout="nk"),
    ):
        assert y.shape == (4, 8) and np.array_equal(y, exact)


def test_matmul_close_to_the_dequantized_product():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    w = rng.standard_normal((256, 8)).astype(np.float32)
    y = L.matmul(x, w, "deepseek-v3", "fprop")
    assert np.array_equal(y, fp8sim.gemm(x, w, "deepseek-v3"))
    ref = _deq(x, "e4m3", "1x128") @ _deq(w, "e4m3", "128x128")
    assert _rel(y, ref) < 5e-3


# ------------------------------------------------------------------ optimizer
def test_adamw_bf16_moments():
    p = L.Param("w", np.array([1.0, -2.0, 0.5], np.float32))
    p.grad[...] = [0.1234567, -3.3333333, 1e-4]
    opt = AdamW([p], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt.step()
    g = p.grad.astype(np.float64)
    m = fp8sim.round((0.1 * g).astype(np.float32), "bf16")
    v = fp8sim.round((0.05 * g * g).astype(np.float32), "bf16")
    assert np.array_equal(opt.m["w"], m) and np.array_equal(opt.v["w"], v)
    assert np.array_equal(fp8sim.round(opt.v["w"], "bf16"), opt.v["w"])
    upd = (m / 0.1) / (np.sqrt(v / 0.05) + 1e-8) + 0.1 * np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(p.value, np.array([1.0, -2.0, 0.5]) - 0.01 * upd, rtol=1e-6)


# ------------------------------------------------------------------ instruments (unit)
def test_drift_monitor_band():
    mon = DriftMonitor(window=20, min_history=5, band_factor=8.0)
    rec = L.Record
    for s in range(10):
        assert mon.update(s, {"a:x": rec(1.0 + 0.1 * (s % 3), 0.3, 100)}) == []
    ev = mon.update(10, {"a:x": rec(1e6, 0.3, 100)})
    assert [(e.step, e.data["tensor"], e.data["stat"]) for e in ev] == [(10, "a:x", "amax")]
    assert mon.update(11, {"a:x": rec(1.1, 0.3, 100)}) == []  # the outlier did not widen the band
    ev = mon.update(12, {"a:x": rec(1.0, 0.3, 100, 0, 60, True)})  # 60 % underflow
    assert [e.data["stat"] for e in ev] == ["frac_underflow"]
    assert len(mon.series["a:x"]["amax"]) == 13


def test_dynamic_clipper_threshold_adapts():
    clip = DynamicClipper(z=3.0, window=20, min_history=5)
    ps = [L.Param("w", np.zeros(4, np.float32))]
    rng = np.random.default_rng(0)
    for s in range(30):
        ps[0].grad[...] = 0
        ps[0].grad[0] = 1.0 + 0.05 * rng.standard_normal()
        assert clip.clip(s, ps) == 1.0
    thr = clip.threshold()
    assert 1.0 < thr < 1.5
    ps[0].grad[...] = 0
    ps[0].grad[0] = 1000.0
    f = clip.clip(30, ps)
    assert f == pytest.approx(thr / 1000.0) and np.linalg.norm(ps[0].grad) == pytest.approx(thr, rel=1e-6)
    assert clip.events[-1].kind == "clip" and clip.threshold() < 1.6  # the spike did not raise the threshold


def test_elastic_restart_unit(tmp_path):
    for directory in (None, str(tmp_path)):
        er = ElasticRestart(interval=5, patience=3, lr_cut=0.5, directory=directory)
        er.maybe_checkpoint(5, {"model": {"w": np.arange(3.0)}, "step": 5})
        assert er.observe(6, False) is None and er.observe(7, False) is None
        step, payload = er.observe(8, False)
        assert step == 5 and np.array_equal(payload["model"]["w"], np.arange(3.0)) and er.lr_factor == 0.5
        assert [e.kind for e in er.events] == ["nonfinite"] * 3 + ["restart"]
        assert er.observe(9, True) is None and er.consecutive == 0


# ------------------------------------------------------------------ instruments with injected faults (training)
@pytest.fixture(scope="module")
def clean_run():
    return train_one("deepseek-v3", 20, seed=0, config=TINY)


def test_nan_for_three_steps_triggers_elastic_restart(clean_run, tmp_path):
    for cfg in (TINY, replace(TINY, checkpoint_dir=str(tmp_path))):
        res = train_one("deepseek-v3", 20, seed=0, config=cfg, faults=[Fault("nan", step=10, duration=3)])
        nonfinite = [e.step for e in res.events if e.kind == "nonfinite"]
        restarts = [e for e in res.events if e.kind == "restart"]
        assert nonfinite == [10, 11, 12] and res.nonfinite_steps == 3 and res.restarts == 1
        assert len(restarts) == 1 and restarts[0].step == 12
        assert restarts[0].data["rolled_back_to"] == 8 and restarts[0].data["lr_factor"] == 0.5
        assert np.all(np.isfinite(res.losses))
        # steps before the fault, and the replayed step 8 (rolled-back state, same batch) equal the clean run
        assert np.array_equal(res.losses[:9], clean_run.losses[:9])
        assert res.lrs[8] == pytest.approx(0.5 * lr_schedule(8, 20, TINY.lr, TINY.warmup))
        assert not np.array_equal(res.losses[9:], clean_run.losses[9:])
        assert res.iterations == 20 + 3 + 2  # steps 10-12 failed, 8-12 replayed


def test_single_nan_step_is_skipped_without_restart():
    res = train_one("bf16", 8, seed=0, config=TINY, faults=[Fault("nan", step=5)])
    assert res.nonfinite_steps == 1 and res.restarts == 0 and np.isnan(res.losses[5])
    assert np.all(np.isfinite(np.delete(res.losses, 5)))


def test_outlier_triggers_drift_warning(clean_run):
    layer = "layer0.mlp.up"
    res = train_one("deepseek-v3", 20, seed=0, config=TINY, faults=[Fault("outlier", 15, layer=layer, factor=1e6)])
    amax_warn = [
        e for e in res.events if e.kind == "drift" and e.data["tensor"] == f"{layer}:x" and e.data["stat"] == "amax"
    ]
    assert [e.step for e in amax_warn] == [15]
    assert not [e for e in clean_run.events if e.kind == "drift" and e.data["stat"] == "amax"]
    # the outlier's own 1x128 tile flushes to zero around it: underflow jumps in that step
    assert res.series[f"{layer}:x"]["frac_underflow"][15] > clean_run.series[f"{layer}:x"]["frac_underflow"][15]


def test_gradient_spike_is_clipped(clean_run):
    res = train_one("deepseek-v3", 20, seed=0, config=TINY, faults=[Fault("grad_spike", 15, factor=1e3)])
    clips = [e for e in res.events if e.kind == "clip"]
    assert [e.step for e in clips] == [15]
    assert clips[0].data["norm"] > 100 * clips[0].data["threshold"]
    assert clips[0].data["threshold"] < 3 * np.nanmax(clean_run.grad_norms[5:15])
    assert not [e for e in clean_run.events if e.kind == "clip"]


# ------------------------------------------------------------------ reproducibility, data, summary, CLI
def test_same_seed_same_losses(clean_run):
    again = train_one("deepseek-v3", 20, seed=0, config=TINY)
    assert np.array_equal(again.losses, clean_run.losses)
    other = train_one("deepseek-v3", 5, seed=1, config=TINY)
    assert not np.array_equal(other.losses, clean_run.losses[:5])
    assert clean_run.losses[-1] < clean_run.losses[0] - 0.2  # it learns


def test_corpus_and_batches_deterministic():
    a, vocab = make_corpus(5000, seed=3)
    b, _ = make_corpus(5000, seed=3)
    assert np.array_equal(a, b) and a.min() >= 0 and a.max() < vocab.size
    text = vocab.decode(a[:400])
    assert "count" in text and " | " in text  # the sentence kinds are there
    bt = Batches(a, 4, 16, seed=9)
    x, y = bt.batch_at(7)
    assert x.shape == (4, 16) and np.array_equal(x[:, 1:], y[:, :-1])
    assert np.array_equal(bt.batch_at(7)[0], x) and not np.array_equal(bt.batch_at(8)[0], x)


def test_relative_loss_error_definition():
    ref = np.full(100, 2.0)
    losses = ref.copy()
    losses[90:] = 2.01
    r = relative_loss_error(losses, ref)
    assert r["mean_abs"] == pytest.approx(0.005) and r["steps"] == [90, 100] and r["signed"] == pytest.approx(0.005)


def test_cli_train(tmp_path, capsys):
    from fp8sim.cli import main

    out = tmp_path / "t"
    code = main(
        [
            "train",
            "--recipes",
            "bf16,deepseek-v3",
            "--steps",
            "3",
            "--seed",
            "0",
            "--out",
            str(out),
            "--quiet",
            "--json",
        ]
    )
    s = json.loads(capsys.readouterr().out)
    # the default fidelity is "exact", as for fp8sim.gemm (machine-independent numbers)
    assert code == 0 and s["steps"] == 3 and s["fidelity"] == "exact"
    r = s["recipes"]["deepseek-v3"]
    for k in (
        "final_loss",
        "mean_loss",
        "rel_loss_error_vs_bf16",
        "n_saturated",
        "n_underflow",
        "nonfinite_steps",
        "wall_time_s",
        "fidelity",
    ):
        assert k in r
    assert s["recipes"]["bf16"]["rel_loss_error_vs_bf16"] is None
    assert json.loads((out / "summary.json").read_text())["recipes"].keys() == {"bf16", "deepseek-v3"}
    lines = (out / "losses.csv").read_text().splitlines()
    assert lines[0] == "step,bf16,deepseek-v3" and len(lines) == 4
    for f in ("loss_curves.png", "rel_loss_error.png", "layer_amax.png"):
        assert (out / f).stat().st_size > 1000
    assert main(["train", "--recipes", "bf16,nope", "--steps", "1", "--out", str(out)]) == 2
    # two recipes in two worker processes: the same losses, bit for bit
    argv = ["train", "--recipes", "bf16,deepseek-v3", "--steps", "3", "--quiet", "--out", str(tmp_path / "j2")]
    assert main(argv + ["--jobs", "2"]) == 0
    assert (tmp_path / "j2" / "losses.csv").read_text() == (out / "losses.csv").read_text()
    capsys.readouterr()
    assert main(argv + ["--jobs", "0", "--force"]) == 2 and "--jobs must be at least 1" in capsys.readouterr().err
    assert main(argv + ["--jobs", "2", "--backend", "torch", "--force"]) == 2
    assert "--jobs is for the numpy backend" in capsys.readouterr().err


def test_recipe_decides_which_parts_are_fp8():
    from fp8sim.training.model import FP8_PARTS

    cfg = ModelConfig(vocab=20, d_model=32, n_layers=1, n_heads=2, d_ff=64, context=8)
    m = TransformerLM(cfg, 0)
    x = np.random.default_rng(0).integers(0, 20, (2, 8))
    ctx = Context(precision_for("deepseek-v3"))
    base = m.loss_and_grads(x, x, ctx)
    # default split: the four Linear kinds in FP8, the head in BF16 (not quantized)
    assert ctx.records["layer0.mlp.up:x"].quantized and not ctx.records["head:x"].quantized
    assert ctx.recipe_for("attention").name == "bf16" and ctx.recipe_for("head").name == "bf16"
    ctx = Context(precision_for("deepseek-v3", FP8_PARTS + ("attention", "head")))
    more = m.loss_and_grads(x, x, ctx)
    assert ctx.records["head:x"].quantized and np.isfinite(more) and more != base
    assert precision_for("fp64").dtype == np.float64 and precision_for("bf16").moment_format == "bf16"
    with pytest.raises(ValueError, match="role"):
        L.matmul(np.ones((2, 2)), np.ones((2, 2)), "bf16", "forward")


# ------------------------------------------------------------------ machine independence (fidelity="exact")
def test_det_matmul_is_the_fixed_order_float64_sum():
    from fp8sim.training._detmath import det_matmul

    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 3, 5, 37)).astype(np.float32)
    b = rng.standard_normal((3, 37, 6)).astype(np.float32)  # broadcast over the first axis
    got = det_matmul(a, b)
    # independent reference: numpy elementwise float64 operations, one k at a time (each * and + rounded)
    acc = np.zeros((2, 3, 5, 6))
    for k in range(37):
        acc = acc + a[..., :, k, None].astype(np.float64) * b[None, :, k, None, :].astype(np.float64)
    assert got.dtype == np.float64 and got.shape == (2, 3, 5, 6)
    assert np.array_equal(got, acc)
    with pytest.raises(ValueError, match="inner dimensions"):
        det_matmul(a, b[:, :5])


def test_det_transcendentals_round_float64_results_once():
    from fp8sim.training._detmath import det_exp, det_log, det_tanh

    rng = np.random.default_rng(4)
    x = np.concatenate([rng.standard_normal(20000) * 8, rng.standard_normal(200) * 1e-3, [0.0, -0.0, 95.0, -110.0]])
    x32 = x.astype(np.float32)
    x64 = x32.astype(np.float64)
    with np.errstate(over="ignore"):
        assert np.array_equal(det_exp(x32), np.exp(x64).astype(np.float32))
    assert np.array_equal(det_tanh(x32), np.tanh(x64).astype(np.float32))
    pos = np.abs(x32) + np.float32(1)
    assert np.array_equal(det_log(pos), np.log(pos.astype(np.float64)).astype(np.float32))
    # float64 in, float64 out, within 4 ulp of numpy's float64 results
    for f, g, v in (
        (det_exp, np.exp, x64[:2000]),
        (det_tanh, np.tanh, x64[:2000]),
        (det_log, np.log, pos[:2000].astype(np.float64)),
    ):
        r, ref = f(v), g(np.asarray(v, np.float64))
        assert r.dtype == np.float64
        assert np.all(np.abs(r - ref) <= 4 * np.spacing(np.abs(ref)))
    # IEEE special values
    sp = np.array([np.nan, np.inf, -np.inf], np.float32)
    assert np.array_equal(det_exp(sp), [np.nan, np.inf, 0.0], equal_nan=True)
    assert np.array_equal(det_tanh(sp), [np.nan, 1.0, -1.0], equal_nan=True)
    assert np.array_equal(det_log(np.array([0.0, -1.0, np.inf], np.float32)), [-np.inf, np.nan, np.inf], equal_nan=True)
    with pytest.raises(TypeError, match="float array"):
        det_exp(np.arange(3))


_DETERMINISM_SCRIPT = """
import hashlib, json, numpy as np
from dataclasses import replace
from fp8sim.training.model import ModelConfig
from fp8sim.training.train import TrainConfig, train_one
cfg = TrainConfig(model=ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context=16), batch=4,
                  corpus_tokens=20000, warmup=2, eval_batches=1, threads=None)
out = {}
for r in ("bf16", "deepseek-v3"):
    res = train_one(r, 4, seed=0, config=cfg, fidelity="exact", keep_params=True)
    h = hashlib.sha256()
    for k in sorted(res.params):
        h.update(np.ascontiguousarray(res.params[k]).tobytes())
    out[r] = [res.losses.tobytes().hex(), float(res.val_loss).hex(), h.hexdigest()]
print(json.dumps(out))
"""


def test_exact_training_is_bit_identical_across_thread_counts():
    """fidelity="exact" must not depend on BLAS or numba thread counts (nor, by construction, on the
    CPU's BLAS kernels or SIMD transcendentals): losses and final weights bit for bit."""
    import os
    import subprocess
    import sys

    outs = []
    for n in ("1", "2"):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=n, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, NUMBA_NUM_THREADS=n)
        p = subprocess.run([sys.executable, "-c", _DETERMINISM_SCRIPT], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        outs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert outs[0] == outs[1]
    assert outs[0]["bf16"] != outs[0]["deepseek-v3"]  # the comparison compares something


# ------------------------------------------------------------------ figures
def _fake_results(n):
    from fp8sim.training.train import RunResult

    rng = np.random.default_rng(0)
    base = 5.0 - np.linspace(0, 2, n) + 0.01 * rng.standard_normal(n)
    out = {}
    for name, off in (("deepseek-v3", 0.0), ("per-tensor", 0.003), ("bf16", 0.0)):  # bf16 == deepseek-v3 exactly
        amax = np.linspace(1, 2, n)
        series = {"layer0.mlp.up:x": {"amax": amax}, "layer0.mlp.up:dy": {"amax": amax * 1e-3}}
        out[name] = RunResult(name, base + off, base, base, 1.0, 1.0, n, {}, [], series, 0, 0, "exact")
    return out


def _captured_figures(monkeypatch):
    import matplotlib.pyplot as plt

    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    return figs


@pytest.mark.parametrize("n", [10, 300])
def test_loss_figure_labels_and_reference_on_top(tmp_path, monkeypatch, n):
    from fp8sim.training import figures as F

    figs = _captured_figures(monkeypatch)
    F.loss_curves(str(tmp_path / "l.png"), _fake_results(n))
    F.rel_loss_error(str(tmp_path / "r.png"), _fake_results(n), 0.0025)
    F.layer_amax(str(tmp_path / "a.png"), _fake_results(n))
    loss_fig, rel_fig, amax_fig = figs
    top, bottom = loss_fig.axes
    for ax in (top, bottom, rel_fig.axes[0]):
        label = ax.get_ylabel()
        assert "last 1)" not in label and "mean of the last" not in label
        assert ("running mean of 1" in label) == (n == 300)  # 300 // 30 or 300 // 20 steps
        assert ("per step" in label) == (n == 10)
    # bf16 is drawn last, above every other recipe, and distinguishable (dashed black)
    lines = [ln for ln in top.get_lines() if not ln.get_label().startswith("_")]
    assert [ln.get_label() for ln in lines][-1] == "bf16"
    bf = lines[-1]
    assert bf.get_linestyle() == "--" and bf.get_zorder() > max(ln.get_zorder() for ln in lines[:-1])
    # the difference panel separates recipes that overlap on top: per-tensor at +0.003 / L
    diff = {ln.get_label(): ln.get_ydata() for ln in bottom.get_lines()}
    assert np.allclose(diff["deepseek-v3"], 0.0)
    assert np.all(np.asarray(diff["per-tensor"]) > 0)
    assert "%" in bottom.get_ylabel()
    # every amax panel has a y-label; legends sit right of the axes, not over the data
    assert all(ax.get_ylabel().startswith("amax") for ax in amax_fig.axes)
    for fig in (loss_fig, rel_fig, amax_fig):
        fig.canvas.draw()
        for ax in fig.axes:
            leg = ax.get_legend()
            if leg is not None:
                assert leg.get_window_extent().x0 >= ax.get_window_extent().x1


def test_cli_study_json_prints_the_numbers(tmp_path, capsys, monkeypatch):
    """``fp8sim study accumulation --json`` prints the headline errors and every row, not only file paths."""
    from fp8sim.cli import main
    from fp8sim.studies import accumulation

    row = {"part": "accumulator", "distribution": "uniform", "config": "wgmma", "K": 4096, "promote_every": 0}
    row.update(max_rel=0.0703, median_rel=0.066, rel_frobenius=0.066, n=16)
    fake = {
        "csv": str(tmp_path / "accumulation_study.csv"),
        "figures": [],
        "rows": [row],
        "headline": accumulation._headline([row], [4096]),
        "seconds": 0.1,
    }
    monkeypatch.setattr(accumulation, "run", lambda *a, **k: fake)
    assert main(["study", "accumulation", "--out", str(tmp_path), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["headline"]["uniform/no promotion"]["max_rel"] == 0.0703
    assert out["headline"]["h200"]["uniform/no promotion"]["max_rel"] == 0.0704  # the measured H200 value
    assert out["rows"] == [row]


def test_bf16_operands_from_float64_round_once():
    """1 + 2**-8 + 2**-30 is above the bf16 midpoint 1 + 2**-8, so RNE gives 1 + 2**-7; rounding via
    float32 first lands exactly on the midpoint and ties to even, 1.0 (double rounding)."""
    from fp8sim.training import linear

    a = np.array([[1 + 2**-8 + 2**-30]], dtype=np.float64)
    b = np.array([[1.0]], dtype=np.float64)
    for fidelity in ("fast", "exact"):
        y = linear.matmul(a, b, "bf16", "fprop", fidelity=fidelity)
        assert y[0, 0] == 1 + 2**-7, fidelity
