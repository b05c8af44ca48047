"""The H200 proof of fp8sim.torch (``gpu/train_fp8.py``): the recorded run, and the real run's own code.

The record (docs/evidence/torch_h200/train_fp8.json) holds the loss of every step of GPT training
runs on the H200 as float64 bits: real FP8 GEMMs (cuBLASLt blockwise or tensorwise through
``torch._scaled_mm``, the project's wgmma kernel for the blockwise Wgrad) and fp8sim.torch's CUDA-core
emulation of them.  The checks here read the losses themselves, not the record's own verdicts.
The real run quantizes with its own torch code (:func:`gpu.train_fp8.quant`); that code and its
Linear layer are checked on the CPU against fp8sim (with fp8sim's GEMMs standing in for cuBLASLt).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fp8sim.torch as ft  # noqa: E402
from fp8sim.scaling import quantize  # noqa: E402
from gpu import train_fp8 as tf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "docs" / "evidence" / "torch_h200" / "train_fp8.json"


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def losses(run: dict) -> list[str]:
    return run["loss_bits"]


def test_record_is_the_issue_run(record):
    c = record["config"]
    assert "H200" in record["device"]
    assert 4 <= c["n_layers"] <= 8 and c["context"] == 256
    assert 10e6 <= record["parameters"] <= 30e6
    assert record["steps"] >= 200
    assert record["corpus"] == "pydoc" and len(record["corpus_sha256"]) == 64


@pytest.mark.parametrize("recipe", ["block", "tensor"])
def test_emulated_losses_equal_real_ones_bit_for_bit(record, recipe):
    emu, real = record["runs"][f"emu-{recipe}/seed0"], record["runs"][f"real-{recipe}/seed0"]
    assert len(losses(emu)) == len(losses(real)) == record["steps"]
    assert losses(emu) == losses(real)
    # and the runs are not trivially equal: they differ from BF16 and from the other recipe
    assert losses(real) != losses(record["runs"]["bf16/seed0"])
    other = "tensor" if recipe == "block" else "block"
    assert losses(real) != losses(record["runs"][f"real-{other}/seed0"])
    # every GEMM of every step (16 Linear layers x Fprop, Dgrad, Wgrad) compared by its hash
    cmp = record["comparisons"][f"emu-{recipe}/seed0 vs real-{recipe}/seed0"]
    n = record["steps"] * 4 * record["config"]["n_layers"] * 3
    assert cmp["gemms_compared"] == cmp["gemms_equal"] == n and cmp["first_difference"] is None


def test_real_run_repeats_itself(record):
    """The control: everything but the GEMMs is deterministic (the same real run twice)."""
    assert losses(record["runs"]["real-block/seed0"]) == losses(record["runs"]["real-block/seed0/repeat1"])


def test_fp8_gemms_of_the_real_run_are_not_split(record):
    """cuBLASLt's FP8 kernels of one step carry no split-K (the emulation runs split_k=1); the split-K
    kernels listed are the fp32 output head's, the same in every run."""
    for kind in ("real-block", "real-tensor"):
        fp8 = [n for n in record["kernels"][kind] if n.startswith("nvjet_sm90_qq")]
        assert fp8, record["kernels"][kind]
        assert not [n for n in fp8 if "splitk" in n.lower()]
    assert "fp8_gemm_e4m3" in record["kernels"]["real-block"]  # the project's wgmma kernel: Wgrad


def test_comparison_seeds_recorded(record):
    for s in (0, 1, 2):
        for kind in ("bf16", "real-block", "real-tensor"):
            assert len(losses(record["runs"][f"{kind}/seed{s}"])) == record["steps"]


# ------------------------------------------------------------------ the real run's code, on the CPU
@pytest.mark.parametrize("block", [(1, 128), (128, 128), (256, 512)])
def test_real_run_quantization_is_fp8sims(block):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((256, 512)) * np.exp(rng.uniform(-25, 25, (256, 1)))).astype(np.float32)
    x[rng.random(x.shape) < 0.05] = 0
    x[7, :128] = 0  # an all-zero block
    x[9, :128] = np.float32(3e-41)  # subnormal float32 inputs
    g = {(1, 128): "1x128", (128, 128): "128x128", (256, 512): "tensor"}[block]
    q = quantize(x, "e4m3", g)
    codes, s = tf.quant(torch.from_numpy(x), block)
    np.testing.assert_array_equal(codes.view(torch.uint8).numpy(), q.codes)
    np.testing.assert_array_equal(s.numpy(), q.scales)


def test_rne_e4m3_ties_and_saturation():
    q = torch.tensor(
        [0.0, 1.0625, 1.1875, 448.0, 463.9, 464.0, 500.0, -(2.0**-9), -(2.0**-10), 2.0**-10 * 3], dtype=torch.float64
    )
    got = tf.rne_e4m3(q).float().tolist()
    # 1.0625 is halfway between 1 and 1.125 (even: 1); 1.1875 between 1.125 and 1.25 (even: 1.25);
    # 464 is halfway between 448 and the (non-existent) 480: saturated to 448; 2**-10 is half the
    # smallest subnormal 2**-9: to even, 0; 3 * 2**-10 rounds to 2 * 2**-9
    assert got == [0.0, 1.0, 1.25, 448.0, 448.0, 448.0, 448.0, -(2.0**-9), -0.0, 2.0**-8]


@pytest.mark.parametrize("mode,recipe", [("block", "deepseek-v3"), ("tensor", "cublaslt-tensor")])
def test_real_linear_equals_fp8sim_torch(mode, recipe):
    """The real run's Linear layer (fp8sim's library presets standing in for cuBLASLt and the wgmma
    kernel) against fp8sim.torch.linear: output, dx and dW bit for bit."""
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.standard_normal((256, 256)).astype(np.float32))
    w = torch.from_numpy((0.05 * rng.standard_normal((384, 256))).astype(np.float32))
    gy = torch.from_numpy(rng.standard_normal((256, 384)).astype(np.float32))
    outs = []
    for which in ("real", "emu"):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        if which == "real":
            y = tf._RealFP8.apply(xi, wi, mode, tf.FakeEngine())
        else:
            y = ft.linear(xi, wi, recipe=recipe)
        y.backward(gy)
        outs.append([t.detach().numpy().view(np.int32) for t in (y, xi.grad, wi.grad)])
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)
