"""The pool of large output buffers: a buffer is handed out again only once nothing refers to it."""

import numpy as np

import fp8sim
from fp8sim import _buffers


def _addr(a):
    return a.__array_interface__["data"][0]


def test_live_arrays_and_views_keep_their_buffer():
    _buffers.clear()
    shape = (2048, 4096)  # 8 MiB: pooled
    a = _buffers.empty(shape, np.uint8)
    b = _buffers.empty(shape, np.uint8)
    assert not np.shares_memory(a, b)
    view = a[1::3]
    del a
    c = _buffers.empty(shape, np.uint8)  # a's buffer is still referenced through view
    assert not np.shares_memory(c, view) and not np.shares_memory(c, b)
    base = _addr(view.base if view.base is not None else view)
    del view
    d = _buffers.empty(shape, np.uint8)  # now it is free: reused
    assert _addr(d) == base
    assert not np.shares_memory(d, b) and not np.shares_memory(d, c)


def test_small_arrays_pool_limit_and_switch():
    _buffers.clear()
    small = _buffers.empty((16, 16), np.float32)
    assert small.shape == (16, 16) and small.dtype == np.float32 and not _buffers._pool
    held = [_buffers.empty((1 << 22,), np.uint8) for _ in range(_buffers.MAX_BUFFERS + 2)]
    assert len(_buffers._pool) == _buffers.MAX_BUFFERS  # the oldest are dropped, the arrays stay valid
    for h in held:
        h[:] = 7
    assert all((h == 7).all() for h in held)
    _buffers.enabled = False
    try:
        _buffers.clear()
        assert _buffers.empty((1 << 23,), np.uint8).size == 1 << 23 and not _buffers._pool
    finally:
        _buffers.enabled = True


def test_quantize_results_do_not_share_codes():
    _buffers.clear()
    x = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    q1 = fp8sim.quantize(x, "e4m3", "1x128")
    q2 = fp8sim.quantize(-x, "e4m3", "1x128")
    assert not np.shares_memory(q1.codes, q2.codes)
    assert np.array_equal(q1.dequantize(), -q2.dequantize())
    keep = q1.codes.copy()
    del q2
    q3 = fp8sim.quantize(2 * x, "e4m3", "1x128")  # may reuse q2's buffer, never q1's
    assert np.array_equal(q1.codes, keep) and not np.shares_memory(q1.codes, q3.codes)
