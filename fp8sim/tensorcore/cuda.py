"""The CUDA-core twin of :func:`fp8sim.tensorcore.fast.wgmma_gemm`, launched through CuPy (``backend="cupy"``).

The same arithmetic as ``wgmma_gemm``, bit for bit, on any NVIDIA GPU (the kernel, in
:mod:`._cuda_source`, never uses the tensor-core instructions it models).  :func:`device_wgmma_gemm`
takes and returns CuPy device arrays; :func:`cupy_wgmma_gemm` is the host-array wrapper that
``fp8sim.gemm(..., backend="cupy")`` used before device inputs existed.  :data:`last_kernel_seconds`
holds the kernel time of the last launch (CUDA events).

Two tile shapes: 128 x 128 outputs per CTA (8 x 8 per thread) where the output has enough tiles to
fill the GPU, else 32 x 32; a GEMM with few tiles and several promotion intervals runs its intervals
in parallel (each interval's partial starts from zero, so this is exact) and promotes them in a
second kernel in the same fp32 order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._cuda_source import CUDA_SOURCE, KERNEL_NAMES, TILES
from .fast import code_tables
from .kernels import cuda_operands

__all__ = [
    "device_wgmma_gemm",
    "cupy_wgmma_gemm",
    "compile_kernels",
    "last_kernel_seconds",
    "CUDA_SOURCE",
    "KERNEL_NAMES",
]

_ETA = np.float32(1.0 + 2.0**-20)
_NEG = -10000  # the tables' exponent of a zero, NaN or inf code
_module: Any = None
_tables: dict = {}
_sms: dict = {}  # multiprocessors per device
last_kernel_seconds = float("nan")  # kernel time of the last launch (CUDA events)


def compile_kernels(options: tuple[str, ...] = ("-std=c++17",)):
    """(Re)build the kernels with NVRTC ``options`` and use them from now on; returns the CuPy module.
    For timing probes (``gpu/probe_kernel_variants.py``): ``-DUNROLL1=N`` / ``-DUNROLL2=N`` keep the
    bits, ``-DFP8SIM_SKIP_PASS1`` / ``-DFP8SIM_SKIP_PASS2`` drop a pass and give wrong results."""
    import cupy as cp

    global _module
    _module = cp.RawModule(code=CUDA_SOURCE, options=tuple(options), name_expressions=tuple(KERNEL_NAMES.values()))
    return _module


def _kernels():
    import cupy as cp

    global _module
    if _module is None:
        _module = cp.RawModule(
            code=CUDA_SOURCE, options=("-std=c++17",), name_expressions=tuple(KERNEL_NAMES.values()) + ()
        )
    return _module


def _device_tables(fa, fb, F: int):
    """Per code (value bits, exponent) as uint32 pairs: A's value times ``1 + 2**-20`` and exponent
    ``+ 127 + 23 - F``; B's as they are; NEG for zero, NaN and inf codes."""
    import cupy as cp

    key = (fa.name, fb.name, F, cp.cuda.runtime.getDevice())
    if key not in _tables:
        va, ea, _ = code_tables(fa)
        vb, eb, _ = code_tables(fb)
        with np.errstate(invalid="ignore"):
            va_n = (va * _ETA).astype(np.float32)  # exact: FP8 values have at most 4 significant bits
        ea_b = np.where(ea == _NEG, _NEG, ea.astype(np.int32) + 127 + 23 - F)
        ta = np.stack([va_n.view(np.uint32), ea_b.astype(np.int32).view(np.uint32)], axis=1)
        tb = np.stack([vb.view(np.uint32), eb.astype(np.int32).view(np.uint32)], axis=1)
        _tables[key] = (cp.asarray(np.ascontiguousarray(ta)), cp.asarray(np.ascontiguousarray(tb)))
    return _tables[key]


def _smem(tm: int, tn: int) -> int:
    """Shared memory of the kernel: the two decode tables and two group buffers."""
    bm, bn = 16 * tm, 16 * tn
    return 4096 + 2 * (32 * (bm + 4) * 8 + 32 * bn * 6 + 8 * (bm + bn))


def device_wgmma_gemm(
    A, B, fa, fb, sa, sb, kscale: int, promote: int, mode: int, F: int, keep_bits: int, *, b_layout="kn", sms=None
):
    """The scaled FP8 GEMM of :func:`fp8sim.tensorcore.fast.wgmma_gemm` on CuPy device arrays.

    ``A (M, Kp)`` uint8 codes, ``B (Kp, N)`` (``b_layout="kn"``) or ``(N, Kp)`` (``"nk"``, the layout
    the kernel reads), Kp a multiple of 32; ``sa (M, nks)`` and ``sb (nks, N)`` float32 scales.
    Returns a CuPy float32 ``(M, N)`` array."""
    import cupy as cp

    A = cp.ascontiguousarray(A, dtype=cp.uint8)
    Bt = cp.ascontiguousarray(B.T if b_layout == "kn" else B, dtype=cp.uint8)
    sa = cp.ascontiguousarray(sa, dtype=cp.float32)
    sb = cp.ascontiguousarray(sb, dtype=cp.float32)
    M, Kp = A.shape
    N = Bt.shape[0]
    if Kp % 32 or Bt.shape[1] != Kp:
        raise ValueError(
            f"device_wgmma_gemm: codes of shapes {A.shape} and {B.shape} ({b_layout}): K must agree and be a multiple of 32"
        )
    out_frac = 23 - ((~keep_bits) & 0x7FFFFF).bit_length()  # the fraction bits the keep mask leaves
    why = cuda_operands(fa, fb, F, out_frac)
    if why is not None:
        raise NotImplementedError(f"device_wgmma_gemm: {why}")
    ta, tb = _device_tables(fa, fb, F)
    mod = _kernels()
    if sms is None:
        dev = cp.cuda.runtime.getDevice()
        if dev not in _sms:
            _sms[dev] = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrMultiProcessorCount, dev)
        sms = _sms[dev]
    big = -(-M // 128) * -(-N // 128)
    tile = "large" if big >= sms else "small"
    tm, tn = TILES[tile]
    bm, bn = 16 * tm, 16 * tn
    tiles = -(-M // bm) * -(-N // bn)
    nint = -(-Kp // promote) if promote > 0 else 1
    chunks = 1
    if promote > 0 and nint > 1 and tiles < 2 * sms:
        chunks = min(nint, -(-4 * sms // tiles))
    per = -(-nint // chunks) * promote if chunks > 1 else Kp
    chunks = -(-Kp // per)
    kern = mod.get_function(KERNEL_NAMES[tile])
    smem = _smem(tm, tn)
    kern.max_dynamic_shared_size_bytes = smem
    out = cp.empty((M, N), cp.float32)
    part = cp.empty((nint, M, N), cp.float32) if chunks > 1 else None
    i32 = np.int32
    args = (
        A, Bt, ta, tb, sa, sb, out,
        i32(M), i32(N), i32(Kp), i32(sa.shape[1]), i32(kscale), i32(promote), i32(mode), i32(F),
        np.uint32(keep_bits & 0xFFFFFFFF), i32(per), part if part is not None else np.uint64(0),
    )  # fmt: skip
    global last_kernel_seconds
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    kern((-(-N // bn), -(-M // bm), chunks), (16, 16), args, shared_mem=smem)
    if part is not None:
        red = mod.get_function("emu_promote")
        red(
            (-(-N // 128), M),
            (128,),
            (
                part,
                sa,
                sb,
                out,
                i32(M),
                i32(N),
                i32(Kp),
                i32(nint),
                i32(promote),
                i32(sa.shape[1]),
                i32(kscale),
                i32(mode),
            ),
        )
    e1.record()
    e1.synchronize()
    last_kernel_seconds = cp.cuda.get_elapsed_time(e0, e1) / 1e3
    return out


def cupy_wgmma_gemm(a_codes, b_codes, fa, fb, sa, sb, kscale, promote, mode, F, keep_bits):
    """Host-array wrapper of :func:`device_wgmma_gemm` (same arguments as ``wgmma_gemm``, codes instead of
    tables); returns a NumPy float32 (M, N) array."""
    import cupy as cp

    y = device_wgmma_gemm(
        cp.asarray(np.ascontiguousarray(a_codes)),
        cp.asarray(np.ascontiguousarray(b_codes)),
        fa,
        fb,
        cp.asarray(np.ascontiguousarray(sa, np.float32)),
        cp.asarray(np.ascontiguousarray(sb, np.float32)),
        kscale,
        promote,
        mode,
        F,
        keep_bits,
    )
    return cp.asnumpy(y)
