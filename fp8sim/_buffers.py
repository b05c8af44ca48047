"""Reuse of large output buffers (a small caching allocator).

A fresh 64 MiB array costs the operating system about as much as the
quantization that fills it: every page is faulted in and zeroed on first
touch, and unmapped when the array dies.  Loops that quantize tensors of the
same shape again and again (training emulation, error sweeps, benchmarks)
pay that on every call.  :func:`empty` keeps a few large buffers and hands
one out again once nothing outside this module refers to it any more: the
returned array, and every view of it, hold a reference, so a buffer is only
reused after the caller has dropped all of them.  To the caller it is a new
uninitialized array, as from :func:`numpy.empty`.

The pool holds at most :data:`MAX_BUFFERS` buffers of :data:`MIN_BYTES` or
more, :data:`MAX_BYTES` in all (the least recently used is dropped first).
``FP8SIM_BUFFER_POOL=0`` in the environment turns it off; :func:`clear`
releases what it holds.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

__all__ = ["MAX_BUFFERS", "MAX_BYTES", "MIN_BYTES", "clear", "empty", "enabled"]

MIN_BYTES = 4 << 20  # smaller arrays come cheaply from the allocator's heap
MAX_BUFFERS = 4
MAX_BYTES = 1 << 30

enabled = os.environ.get("FP8SIM_BUFFER_POOL", "1") != "0"
_pool: list[np.ndarray] = []  # flat uint8 buffers, most recently used last
_lock = threading.Lock()


def _refs(pool: list, k: int) -> int:
    return sys.getrefcount(pool[k])


# _refs of a buffer that only the pool list refers to (measured, since the count that getrefcount
# reports for its own argument differs between Python versions)
_IDLE_REFS = _refs([np.empty(1)], 0)


def empty(shape, dtype) -> np.ndarray:
    """An uninitialized array like ``np.empty(shape, dtype)``, from the pool when it is large."""
    dtype = np.dtype(dtype)
    shape = tuple(int(n) for n in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if not enabled or nbytes < MIN_BYTES:
        return np.empty(shape, dtype=dtype)
    with _lock:
        for k in range(len(_pool)):
            if _pool[k].nbytes == nbytes and _refs(_pool, k) == _IDLE_REFS:
                _pool.append(_pool.pop(k))
                return _pool[-1].view(dtype).reshape(shape)
        buf = np.empty(nbytes, dtype=np.uint8)
        _pool.append(buf)
        while len(_pool) > MAX_BUFFERS or sum(b.nbytes for b in _pool) > MAX_BYTES:
            _pool.pop(0)
        return buf.view(dtype).reshape(shape)


def clear() -> None:
    """Release every pooled buffer (arrays still in use stay valid: they keep their memory)."""
    with _lock:
        _pool.clear()
