"""Hardware-in-the-loop tests: run the CUDA kernels and compare with the model.

Skipped unless CuPy imports and sees an NVIDIA GPU with wgmma (sm_90a).
"""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from fp8sim import tensorcore as tc  # noqa: E402

try:
    from gpu import launch as K  # noqa: E402

    _ok = K.available() and K.cp.cuda.Device().compute_capability == "90"
except Exception:  # pragma: no cover
    _ok = False

pytestmark = pytest.mark.skipif(not _ok, reason="needs CuPy and an sm_90 GPU")

PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]


def bits_equal(x, y):
    """Identical float32 bit patterns, NaN sign and payload included (both must be float32)."""
    assert x.dtype == np.float32 and y.dtype == np.float32, (x.dtype, y.dtype)
    return x.view(np.uint32) == y.view(np.uint32)


def test_descriptor_and_sanity():
    assert K.descriptor_fields() in ((128, 256), (256, 128))


@pytest.mark.parametrize("instruction", ["wgmma", "mma.sync", "wgmma.f16"])
@pytest.mark.parametrize("fa,fb", PAIRS)
@pytest.mark.parametrize("family", ["normal", "wide", "cancel", "subnormal", "special"])
def test_fresh_capture_matches_model(instruction, fa, fb, family):
    from gpu import capture as C

    cap = C.capture_family(K, instruction, fa, fb, family, seed=12345, info={"gpu": "test"})
    d = tc.mma(cap["a"], cap["b"], cap["c"], a_format=fa, b_format=fb, instruction=instruction)
    assert bits_equal(d, cap["d"]).all()


@pytest.mark.parametrize("promote", [None, 64, 128, 96])
def test_chain_matches_model(promote):
    rng = np.random.default_rng(7)
    from gpu import capture as C

    a, b = C.chain_inputs("normal", 64, 16, 1024, rng)
    c = rng.standard_normal((64, 16)).astype(np.float32)
    d = K.wgmma_chain(a, b, c, "e4m3", "e4m3", promote)
    ref = tc.matmul(a, b, c, a_format="e4m3", b_format="e4m3", promote_every=promote)
    assert bits_equal(d, ref).all()
