"""The worked example "adding a granularity", through public API only: one class and its
registration (``fp8sim.scaling.register_granularity``), then quantization and a recipe's GEMM with
it.  The new granularity, ``kbN``, cuts every row into blocks of N consecutive elements along the
last axis (along K) with fp32 scales: the same blocks as the built-in ``Group(N)`` / ``"gN"``,
written independently, so the built-in path is the reference."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

import fp8sim
from fp8sim.scaling import Granularity, Group, quantize, register_granularity


@dataclass(frozen=True)
class KBlocks(Granularity):
    """Blocks of ``size`` elements along the last axis (``axis=-1``) or along the rows (``axis=-2``)."""

    size: int = 64
    axis: int = -1

    @property
    def name(self) -> str:
        return f"kb{self.size}" + ("" if self.axis == -1 else "@rows")

    def block_shape(self, shape) -> tuple:
        blk = [1] * len(shape)
        blk[self.axis] = min(self.size, int(shape[self.axis]))
        return tuple(blk)

    def transposed(self) -> Granularity:
        return replace(self, axis=-2 if self.axis == -1 else -1)


@pytest.fixture(scope="module", autouse=True)
def _registered():
    register_granularity("kbN", lambda m: KBlocks(int(m[1])), pattern=r"^kb(\d+)$")


def test_name_is_registered():
    g = fp8sim.granularity("kb64")
    assert g == KBlocks(64)
    assert "kbN" in fp8sim.scaling.granularity_names()
    with pytest.raises(ValueError):
        register_granularity("g32", lambda: KBlocks(32))  # built-in names stay the built-ins'


def test_defaults_from_the_base_class():
    g = KBlocks(64)
    assert g.k_block() == 64  # blocks along K: the GEMM applies one scale per 64 of K
    assert g.transposed() == KBlocks(64, axis=-2)
    assert not g.same_when_transposed
    assert not g.stateful and not g.two_level and g.mma_block_scale is None
    assert g.device_quantizable
    assert g.scale_shape((3, 200)) == (3, 4)


@pytest.mark.parametrize("shape", [(8, 256), (5, 200), (2, 3, 130)])
def test_quantize_matches_the_builtin_group(shape):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    q = quantize(x, "e4m3", "kb64")
    ref = quantize(x, "e4m3", Group(64))
    assert q.granularity == KBlocks(64)
    assert q.scales.shape == ref.scales.shape
    np.testing.assert_array_equal(q.codes, ref.codes)
    np.testing.assert_array_equal(q.scales, ref.scales)
    np.testing.assert_array_equal(q.dequantize(), ref.dequantize())


def test_quantize_along_rows_matches_the_builtin_group_on_axis_0():
    x = (np.random.default_rng(2).standard_normal((200, 24)) * 5).astype(np.float32)
    q = quantize(x, "e5m2", KBlocks(64, axis=-2))
    ref = quantize(x, "e5m2", Group(64, axis=0))
    np.testing.assert_array_equal(q.codes, ref.codes)
    np.testing.assert_array_equal(q.scales, ref.scales)


@pytest.mark.parametrize("K", [256, 192])
def test_gemm_with_the_new_granularity(K):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, K)) * 2).astype(np.float32)
    w = (rng.standard_normal((K, 24)) * 0.5).astype(np.float32)
    base = fp8sim.recipe("deepseek-v3")
    fields = dict(
        x_format="e4m3",
        w_format="e4m3",
        scale_format="fp32",
        accumulator=base.accumulator,
        promote_every=64,  # (scales applied at promotion: the interval divides the K block)
        output_format="fp32",
    )
    new = fp8sim.Recipe("kb64-test", x_granularity="kb64", w_granularity="kb64", **fields)
    ref = fp8sim.Recipe("g64-test", x_granularity="g64", w_granularity="g64", **fields)
    y = fp8sim.gemm(x, w, new)
    np.testing.assert_array_equal(y, fp8sim.gemm(x, w, ref))

    # and against float64 products of the dequantized operands (x's blocks along K, w's along K too)
    qx = quantize(x, "e4m3", "kb64")
    qw = quantize(w, "e4m3", KBlocks(64, axis=-2))
    exact = qx.dequantize().astype(np.float64) @ qw.dequantize().astype(np.float64)
    np.testing.assert_allclose(y, exact, rtol=1e-3, atol=1e-3 * np.abs(exact).max())


def test_delayed_scaling_is_a_frozen_value_with_its_history_in_a_state():
    from dataclasses import FrozenInstanceError

    from fp8sim.scaling import AmaxHistory, DelayedScaling

    g = DelayedScaling(3)
    with pytest.raises(FrozenInstanceError):
        g.algo = "most_recent"  # type: ignore[misc]
    x = np.array([[1.0, -2.0], [0.5, 0.25]], dtype=np.float32)
    q1 = quantize(x, "e4m3", g)  # empty history: scale 1.0, then amax 2.0 recorded
    assert q1.scales.item() == 1.0
    assert isinstance(g.state, AmaxHistory) and list(g.amax_history) == [2.0, 0.0, 0.0]
    q2 = quantize(3 * x, "e4m3", g)  # scale from the history's amax 2.0: 2 / 448 in float32
    assert q2.scales.item() == np.float32(2.0 / 448)
    assert list(g.amax_history) == [6.0, 2.0, 0.0]
    shared = DelayedScaling(3, algo="most_recent", state=g.state)  # another config over one history
    assert shared.history_amax() == 6.0 and g.history_amax() == 6.0
    assert shared != g and fp8sim.granularity(g) is g
