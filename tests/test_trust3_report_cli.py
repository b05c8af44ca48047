"""Issue #26 (trust, round 3): the report's texts and figures, ``fp8sim info e8m0``, negative numbers
for ``fp8sim round``, ``fp8sim sweep --help``, the real-FP8 harness's K padding, the report checker's
screenshot, and overflow warnings of the split-K slice sums."""

from __future__ import annotations

import importlib.util
import inspect
import re
import shutil
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

from fp8sim.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SHIPPED = ROOT / "fp8sim" / "captures"


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own usage errors (exit 2)
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _outputs(files) -> int:
    """The hardware outputs stored in capture files: every float32 array ``d*`` (``d``, ``d_promote128``)."""
    n = 0
    for f in files:
        with np.load(f) as z:
            n += sum(z[k].size for k in z.files if k.startswith("d"))
    return n


def _plain(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


# ------------------------------------------------------------------ the hardware-validation section
def test_tensorcore_section_names_the_checkout_set_and_counts_every_pair(tmp_path):
    from fp8sim.studies.sections import study_tensorcore

    # a source checkout in miniature: pyproject.toml, fp8sim/__init__.py and tests/data
    root = tmp_path / "checkout"
    (root / "fp8sim").mkdir(parents=True)
    (root / "fp8sim" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text("")
    data = root / "tests" / "data"
    data.mkdir(parents=True)
    picked = ["wgmma_e4m3xe4m3_normal.npz", "wgmma_e5m2xe4m3_special.npz", "mma.sync_e5m2xe5m2_normal.npz"]
    for name in picked:
        shutil.copy(DATA / name, data / name)
    shutil.copy(DATA / "cvt_sm90.npz", data / "cvt_sm90.npz")  # not a tensor-core capture: left out
    np.savez(data / "other.npz", x=np.zeros(3))  # not a capture at all: left out
    out = tmp_path / "out"
    out.mkdir()
    sec = study_tensorcore(out, False, False, {"captures": str(data), "seed": 0})
    text = _plain(sec["html"])
    n = _outputs(data / f for f in picked)
    assert f"{n:,} outputs of 3 single-instruction and chained-tile captures" in text, text
    assert "source checkout" in text and "tests/data" in text
    assert "shipped" not in text and str(tmp_path) not in sec["html"]  # no local path on the page
    assert sec["numbers"] == {"wgmma": 1.0, "mma.sync": 1.0}


def test_tensorcore_section_names_the_shipped_set(tmp_path):
    from fp8sim.studies.sections import capture_set, study_tensorcore

    assert capture_set(SHIPPED)[0] == "shipped"
    assert capture_set(DATA)[0] == "checkout"
    assert capture_set(tmp_path, "env") == (
        "folder",
        f"the folder <code>{tmp_path.name}</code> (<code>$FP8SIM_CAPTURES</code>)",
    )
    sec = study_tensorcore(tmp_path, True, False, {"captures": str(SHIPPED), "seed": 0})
    text = _plain(sec["html"])
    files = sorted(SHIPPED.glob("*.npz"))
    assert f"{_outputs(files):,} outputs of {len(files)} single-instruction" in text
    assert "compact subset shipped with fp8sim" in text and "fp8sim/captures" in text
    assert "quick run" in text


# ------------------------------------------------------------------ granularity: the 1x128 gain
def test_granularity_gain_is_the_tile_amax_mapping_onto_448_not_confinement():
    """The claim the report makes, checked on the study's own outlier-channel tensor: leaving out each
    1x128 tile's largest element, 1x128 tiles give no more SQNR than one per-tensor scale (31.7 dB
    against 31.6 at the study's 512 x 4096; less at this size), and the largest element comes back
    without FP8 rounding error."""
    from fp8sim.scaling import quantize
    from fp8sim.studies.granularity import make_tensor

    x = make_tensor("outlier_channels", (128, 1024), np.random.default_rng(0)).astype(np.float64)

    def sqnr(d, keep):
        return 10 * np.log10((x[keep] ** 2).sum() / ((x - d)[keep] ** 2).sum())

    tiles = np.abs(x).reshape(128, 8, 128)
    top = np.zeros(tiles.shape, bool)
    np.put_along_axis(top, tiles.argmax(-1)[..., None], True, -1)
    top = top.reshape(x.shape)
    d_tensor = quantize(x.astype(np.float32), "e4m3", "tensor").dequantize(np.float64)
    d_tile = quantize(x.astype(np.float32), "e4m3", "1x128").dequantize(np.float64)
    everything = np.ones(x.shape, bool)
    assert sqnr(d_tile, everything) > sqnr(d_tensor, everything) + 5  # the gain the table shows
    assert sqnr(d_tile, ~top) < sqnr(d_tensor, ~top) + 0.5  # none of it outside the tile maxima
    rel = np.abs(d_tile - x)[top] / np.abs(x[top])
    assert rel.max() < 2.0**-20  # the amax maps onto 448: only the fp32 scale's rounding remains


def test_granularity_section_text(tmp_path):
    from fp8sim.studies.sections import study_granularity

    opts = {"shape": [128, 256], "formats": ["e4m3"], "distributions": ["outlier_channels"]}
    sec = study_granularity(tmp_path, True, False, dict(opts, granularities=["tensor", "1x128"], seed=0))
    text = _plain(sec["html"])
    assert "448" in text and "amax" in text
    assert "leaving out each tile's largest element, 1x128 tiles give no more SQNR than one per-tensor scale" in text
    assert "confine it" not in text


# ------------------------------------------------------------------ rounding modes: log-uniform data
def test_mode_errors_data_is_log_uniform_with_random_signs_and_labelled_so(tmp_path, monkeypatch):
    import matplotlib.figure

    from fp8sim import plotting
    from fp8sim.studies import sections

    for text in (
        sections.mode_errors.__doc__,
        inspect.getsource(sections.study_rounding),  # (the granularity study's gradients are log-normal)
        inspect.getsource(plotting),
    ):
        assert "log-normal" not in text
    assert "log-uniform" in sections.mode_errors.__doc__
    # the figure: its title, and one legend outside both panels (it covers no bar)
    seen = {}

    def grab(fig, path, *a, **k):
        seen["fig"] = fig

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", grab)
    rows = [
        {"format": f, "mode": m, "mean_rel_error": 0.01 * (i + 1), "max_rel_error": 0.1, "rel_bias": 1e-3 * (i - 3)}
        for f in ("e4m3", "e5m2")
        for i, m in enumerate(sections.MODES)
    ]
    plotting.mode_error_figure(tmp_path / "m.png", rows)
    fig = seen["fig"]
    assert "log-uniform" in fig._suptitle.get_text() and "random signs" in fig._suptitle.get_text()
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    fig.canvas.draw()
    box = fig.legends[0].get_window_extent()
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent())


# ------------------------------------------------------------------ fp8sim info e8m0
def test_e8m0_against_the_ocp_mx_spec(capsys):
    """OCP MX v1.0, section 5.4.1: E8M0 has 8 exponent bits, bias 127, no sign, no mantissa; 0xFF is
    NaN; no zero, no infinities, no subnormals; values 2**-127 .. 2**127."""
    import fp8sim

    f = fp8sim.format("e8m0")
    assert (f.bits, f.ebits, f.mbits, f.bias, f.signed) == (8, 8, 0, 127, False)
    assert [c for c in range(256) if f.is_nan_code(c)] == [0xFF]
    assert not f.inf and not f.subnormals and not f.has_zero
    values = fp8sim.decode(np.arange(255, dtype=np.uint8), "e8m0").astype(np.float64)
    np.testing.assert_array_equal(values, 2.0 ** (np.arange(255) - 127.0))
    code, out, _ = run(capsys, "info", "e8m0")
    assert code == 0
    shown = dict(line.split(":", 1) for line in out.splitlines())
    shown = {k.strip(): v.strip() for k, v in shown.items()}
    assert shown["nan"].startswith("0xff") and "ieee" not in shown["nan"]
    assert shown["min_subnormal"].startswith("none")
    assert (shown["ebits"], shown["mbits"], shown["bias"], shown["signed"]) == ("8", "0", "127", "False")
    assert (shown["inf"], shown["subnormals"]) == ("False", "False")
    assert float(shown["max"]) == pytest.approx(2.0**127, rel=1e-5)
    assert float(shown["min_normal"]) == pytest.approx(2.0**-127, rel=1e-5)
    # the table too; the other formats keep their style names
    code, out, _ = run(capsys, "info", "--all")
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["e8m0"])
    assert "0xff" in row and "ieee" not in row and "none" in row
    code, out, _ = run(capsys, "info", "e4m3")
    assert "ocp (0x7f and 0xff only)" in out and "0.00195312" in out


# ------------------------------------------------------------------ fp8sim round: negative numbers
@pytest.mark.parametrize("value", ["-1e-9", "-1E+3", "-inf", "-Infinity", "-.5", "-5", "-2.5e-3", "-1_000.5"])
def test_round_accepts_negative_numbers(capsys, value):
    import json

    code, out, err = run(capsys, "round", "1e6", value, "--format", "e5m2", "--json")
    assert code == 0, err
    res = json.loads(out)["results"]
    got = res[1]["input"]
    assert (got == "-inf") if "inf" in value.lower() else (got == float(value))


def test_round_still_refuses_unknown_options(capsys):
    code, _, err = run(capsys, "round", "1", "-x")
    assert code == 2 and "-x" in err


# ------------------------------------------------------------------ fp8sim sweep --help
def test_sweep_help_states_each_default_once(capsys):
    code, out, _ = run(capsys, "sweep", "--help")
    text = " ".join(out.split())
    assert code == 0
    assert "(default: None)" not in text and "(default: False)" not in text
    assert text.count("one per core") == 1 and "(default: e4m3,e5m2)" in text


# ------------------------------------------------------------------ split-K slice sums: IEEE, no warnings
@pytest.mark.parametrize("order", ["sequential", "reverse", "pairwise"])
def test_combine_slices_overflows_to_inf_without_warnings(order):
    from fp8sim.gemms.engine import combine_slices

    big = np.full(3, 3e38, np.float32)
    inf = np.full(3, np.inf, np.float32)
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        over = combine_slices([big, big, big], order)
        opposite = combine_slices([inf, -inf], order)
    assert np.geterr() == before
    assert over.dtype == np.float32 and np.isposinf(over).all()
    assert np.isnan(opposite).all()


# ------------------------------------------------------------------ figures: ticks, legends, zeros
def _zero_markers(ax) -> list[float]:
    from fp8sim.plotting import ZERO_MARKER

    return sorted(float(x) for ln in ax.get_lines() if ln.get_marker() == ZERO_MARKER for x in ln.get_xdata())


def _grab_figures(monkeypatch) -> list:
    import matplotlib.figure

    figs: list = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figs.append(fig))
    return figs


def test_accelerators_figure_ticks_legend_and_zero_medians(tmp_path, monkeypatch):
    from fp8sim.studies import accumulators as acc

    ks = (128, 1024, 4096)
    rows = [
        {"distribution": d, "accumulator": lab, "K": K, "promote_every": p,
         "median_rel": 0.0 if (i and K == 128) else 1e-4 / 10**i * K / 128, "max_rel": 1e-3}
        for d in ("normal", "uniform") for i, (lab, *_) in enumerate(acc.ACCUMULATORS) for p in (0, 128) for K in ks
    ]  # fmt: skip
    figs = _grab_figures(monkeypatch)
    acc.plot(rows, tmp_path / "a.png")
    (fig,) = figs
    fig.canvas.draw()
    for ax in fig.axes:
        assert [float(t) for t in ax.get_xticks()] == list(ks)
        assert list(ax.get_xticks(minor=True)) == []
        assert [t.get_text() for t in ax.get_xticklabels()] == ["128", "1024", "4096"]
        # the zero medians of the four non-Hopper lines are drawn, at K = 128 (dodged apart)
        zx = _zero_markers(ax)
        assert len(zx) == 4 and all(100 < x < 170 for x in zx) and len(set(zx)) == 4
        assert ax.get_legend() is None and not fig.legends[0].get_window_extent().overlaps(ax.get_window_extent())
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == 7 and labels[-1].startswith("exactly 0")


def test_accumulation_figures_zero_medians_and_hidden_curves(tmp_path, monkeypatch):
    from fp8sim.studies import accumulation as st

    rows = []
    for d in ("normal", "uniform"):
        for K in (128, 256, 512):
            for i, m in enumerate(st.MODELS):
                for p in (0, 128):
                    v = 0.0 if m != "wgmma" and K < 512 else 1e-4 / (1 + i) * K / (128 + p)
                    if m == "exact":  # on top of mma.sync: the legend must say so
                        v = 0.0 if K < 512 else 1e-4 / 2 * K / (128 + p)
                    rows.append({"part": "accumulator", "distribution": d, "config": m, "K": K, "promote_every": p,
                                 "max_rel": v, "median_rel": v, "rel_frobenius": v, "n": 1})  # fmt: skip
            for r in ("deepseek-v3", "te-hybrid", "bf16"):
                v = 1e-2 if r != "bf16" else 1e-3
                rows.append({"part": "recipe", "distribution": d, "config": r, "K": K, "promote_every": 0,
                             "max_rel": v, "median_rel": v, "rel_frobenius": v * (1 + (K == 128)), "n": 1})  # fmt: skip
        for P in (32, 64, 128):
            rows.append({"part": "promotion", "distribution": d, "config": "wgmma", "K": 512, "promote_every": P,
                         "max_rel": 1e-3, "median_rel": 1e-4, "rel_frobenius": 1e-4, "n": 1})  # fmt: skip
    figs = _grab_figures(monkeypatch)
    st._figures(rows, str(tmp_path))
    median, _, recipes, _ = figs
    for ax in median.axes[:2]:
        zx = _zero_markers(ax)
        assert len(zx) == 3 * 2 * 2  # mma.sync, exact, fp32, with and without promotion, at K = 128, 256
        assert list(ax.get_xticks(minor=True)) == []
    labels = [t.get_text() for t in median.axes[-1].get_legend().get_texts()]
    assert "exact (= mma.sync)" in labels and "exact + promote 128 (= mma.sync + promote 128)" in labels
    assert labels[-1].startswith("exactly 0")
    labels = [t.get_text() for t in recipes.axes[-1].get_legend().get_texts()]
    assert labels == ["deepseek-v3", "te-hybrid (= deepseek-v3)", "bf16"]
    # a curve drawn over another one is thinner, with smaller markers
    lines = [ln for ln in recipes.axes[0].get_lines() if not ln.get_label().startswith("_")]
    assert lines[0].get_linewidth() > lines[1].get_linewidth() and lines[0].get_markersize() > lines[1].get_markersize()


# ------------------------------------------------------------------ scripts/check_report.py --screenshot
def _fake_playwright(monkeypatch, calls: list) -> None:
    class Page:
        def on(self, *a):
            pass

        def goto(self, url):
            pass

        def wait_for_load_state(self, state):
            pass

        def eval_on_selector_all(self, sel, js):
            return [{"alt": "x", "w": 10, "h": 10}] if sel == "img" else [True]

        def title(self):
            return "fp8sim report"

        def screenshot(self, **kw):
            calls.append(kw)

    class Browser:
        def new_page(self, **kw):
            return Page()

        def close(self):
            pass

    class PW:
        chromium = types.SimpleNamespace(launch=lambda **kw: Browser())

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    api = types.ModuleType("playwright.sync_api")
    api.sync_playwright = PW
    monkeypatch.setitem(sys.modules, "playwright", types.ModuleType("playwright"))
    monkeypatch.setitem(sys.modules, "playwright.sync_api", api)


def test_check_report_screenshot_full_page_or_first_screen(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("check_report", ROOT / "scripts" / "check_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    calls: list = []
    _fake_playwright(monkeypatch, calls)
    index = tmp_path / "index.html"
    index.write_text("<html></html>")
    shot = str(tmp_path / "s.png")
    assert mod.main([str(index), "--screenshot", shot, "--full-page"]) == 0
    assert mod.main([str(index), "--screenshot", shot]) == 0
    assert calls == [{"path": shot, "full_page": True}, {"path": shot, "full_page": False}]
    assert "--full-page" in mod.__doc__
    with pytest.raises(SystemExit):
        mod.main([str(index), "--full-page"])  # nothing to save


# ------------------------------------------------------------------ gpu/train_fp8.py: K padding
torch = pytest.importorskip("torch")


def _tf():
    from gpu import train_fp8

    return train_fp8


@pytest.mark.parametrize("nkb", [1, 2, 3, 4, 5, 8])
def test_pad_k_shapes_strides_values(nkb):
    tf = _tf()
    rng = np.random.default_rng(nkb)
    raw = torch.from_numpy(rng.integers(0, 0x7E, (6, nkb * 128), dtype=np.uint8))
    codes = raw.view(torch.float8_e4m3fn)
    scales = torch.from_numpy(rng.uniform(0.5, 2, (6, nkb)).astype(np.float32))
    pc, ps = tf.pad_k(codes, scales, 1)
    full = -(-nkb // 4) * 4
    assert pc.shape == (6, full * 128) and ps.shape == (6, full) and pc.dtype == codes.dtype
    assert pc.is_contiguous() and ps.is_contiguous()
    assert torch.equal(pc.view(torch.uint8)[:, : nkb * 128], raw) and not pc.view(torch.uint8)[:, nkb * 128 :].any()
    assert torch.equal(ps[:, :nkb], scales) and (ps[:, nkb:] == 1).all()
    if full == nkb:
        assert pc is codes and ps is scales
    # along dim 0 (W's N blocks, Dgrad's K): the same, transposed
    pc0, ps0 = tf.pad_k(codes.t().contiguous(), scales.t().contiguous(), 0)
    assert torch.equal(pc0.view(torch.uint8).t(), pc.view(torch.uint8)) and torch.equal(ps0.t(), ps)
    # the scale layouts the GEMMs then pass: outer-dim-major, strides aligned to 4 floats (16 bytes)
    sa = tf.outer_major(ps)
    assert sa.shape == (6, full) and sa.stride() == (1, 6)
    sb = tf.outer_major(ps0)  # (K/128, N/128) as the 128x128 operand
    assert sb.shape == (full, 6) and sb.stride() == (1, full) and full % 4 == 0
    with pytest.raises(ValueError, match="pad_k"):
        tf.pad_k(codes[:, :100], scales, 1)


def test_real_block_linear_at_d_model_384_uses_the_layouts_torch_and_cublaslt_agree_on():
    """The blockwise GEMMs of the real run at widths whose 128-blocks are not a multiple of 4
    (K = 384 in Fprop, 640 in Dgrad): every call gives torch._scaled_mm operands it accepts (torch
    2.11: scale_a (M, K/128) and scale_b (K/128, N/128), both outer-dim-major with no padding)
    and cuBLASLt reads right (K/128 a multiple of 4, where its padded and torch's plain layouts are
    one), and the layer still equals fp8sim.torch's deepseek-v3 emulation bit for bit."""
    import fp8sim.torch as ft

    tf = _tf()
    calls: list = []

    class Checked(tf.FakeEngine):
        def scaled_mm(self, a, b, sa, sb, out_dtype):
            M, K = a.shape
            N = b.shape[1]
            calls.append((M, K, N))
            assert a.is_contiguous() and b.t().is_contiguous()
            assert K % (4 * 128) == 0, f"K = {K}: not whole groups of 4 blocks"
            assert sa.shape == (M, K // 128) and sa.stride() == (1, M)
            assert sb.shape == (K // 128, N // 128) and sb.stride() == (1, K // 128)
            return super().scaled_mm(a, b, sa, sb, out_dtype)

    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.standard_normal((128, 384)).astype(np.float32))
    w = torch.from_numpy((0.05 * rng.standard_normal((640, 384))).astype(np.float32))
    gy = torch.from_numpy(rng.standard_normal((128, 640)).astype(np.float32))
    outs = []
    for which in ("real", "emu"):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = (
            tf._RealFP8.apply(xi, wi, "block", Checked())
            if which == "real"
            else ft.linear(xi, wi, recipe="deepseek-v3")
        )
        y.backward(gy)
        outs.append([t.detach().numpy().view(np.int32) for t in (y, xi.grad, wi.grad)])
    assert calls == [(128, 512, 640), (128, 1024, 384)]  # Fprop K 384 -> 512, Dgrad K 640 -> 1024
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)
