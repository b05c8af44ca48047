"""CuPy launchers for the FP8 tensor-core and conversion kernels in kernels/tc.cu.

The module is built once per process: with ``nvcc`` into a cubin for
``sm_90a`` (``-gencode=arch=compute_90a,code=sm_90a``; a plain sm_90 build
rejects wgmma) under ``gpu/kernels/build/``, falling back to CuPy's NVRTC
with ``-arch=sm_90a`` when nvcc is missing.

All functions take and return NumPy arrays:

* :func:`wgmma` -- batched single ``wgmma.mma_async.m64n8k32`` instructions
  (f32 or f16 accumulator), one instance per CTA;
* :func:`mma_sync` -- batched single ``mma.sync.m16n8k32`` instructions;
* :func:`wgmma_chain` -- a tile loop along K with the accumulator in
  registers, optionally promoted into an fp32 accumulator every P instructions;
* :func:`cvt_sweep` -- ``cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32`` over all 2**32
  float32 bit patterns, returned run-length encoded.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np

try:
    import cupy as cp
except Exception:  # pragma: no cover - CuPy is optional
    cp = None

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "kernels", "tc.cu")
BUILD = os.path.join(HERE, "kernels", "build")
FORMATS = ("e4m3", "e5m2")

_module = None
_desc = None  # (lbo, sbo) that the hardware reads correctly


def available() -> bool:
    """True when CuPy imports and sees a CUDA device."""
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _require():
    if cp is None:
        raise RuntimeError("gpu.launch needs CuPy (pip install cupy-cuda12x or cupy-cuda13x) and an NVIDIA GPU")


KDIR = os.path.join(HERE, "kernels")


def build_cubin(src: str, name: str, force: bool = False) -> str:
    """Compile ``src`` (a .cu in gpu/kernels) to BUILD/name for sm_90a with nvcc; '' if no nvcc.

    Rebuilt when the source or a shared header in gpu/kernels is newer than the cubin."""
    nvcc = shutil.which("nvcc") or (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
    if not os.path.exists(nvcc):
        return ""
    os.makedirs(BUILD, exist_ok=True)
    out = os.path.join(BUILD, name)
    newest = max(
        os.path.getmtime(p) for p in [src] + [os.path.join(KDIR, f) for f in os.listdir(KDIR) if f.endswith(".cuh")]
    )
    if force or not os.path.exists(out) or os.path.getmtime(out) < newest:
        subprocess.run(
            [nvcc, "-cubin", "-O3", "-gencode=arch=compute_90a,code=sm_90a", f"-I{KDIR}", src, "-o", out], check=True
        )
    return out


def load_module(src: str, name: str):
    """A CuPy RawModule of ``src``: the nvcc cubin, or NVRTC when nvcc is missing or fails."""
    _require()
    path = ""
    try:
        path = build_cubin(src, name)
    except Exception as e:  # pragma: no cover
        print(f"[gpu.launch] nvcc build of {os.path.basename(src)} failed ({e}); trying NVRTC")
    if path:
        return cp.RawModule(path=path)
    with open(src) as f:
        code = f.read()
    return cp.RawModule(code=code, options=("-arch=sm_90a", "-std=c++17", f"-I{KDIR}"))


def build(force: bool = False) -> str:
    """Compile tc.cu to a cubin with nvcc; returns the cubin path ('' if no nvcc)."""
    return build_cubin(SRC, "tc_sm90a.cubin", force)


def module():
    """The loaded CuPy RawModule of tc.cu (built on first use)."""
    global _module
    if _module is None:
        _module = load_module(SRC, "tc_sm90a.cubin")
    return _module


def fn(name: str):
    return module().get_function(name)


def device_info() -> dict:
    """GPU name, compute capability, driver and runtime versions, CuPy version."""
    _require()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    info = {
        "gpu": name,
        "compute_capability": f"{props['major']}.{props['minor']}",
        "driver_version": cp.cuda.runtime.driverGetVersion(),
        "runtime_version": cp.cuda.runtime.runtimeGetVersion(),
        "cupy": cp.__version__,
    }
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        info["driver"] = out.stdout.strip().splitlines()[0]
    except Exception:
        pass
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=20)
        info["nvcc"] = out.stdout.strip().splitlines()[-1]
    except Exception:
        pass
    return info


def _fmt(name) -> str:
    n = str(getattr(name, "name", name)).lower()
    n = {"e4m3fn": "e4m3", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}.get(n, n)
    if n not in FORMATS:
        raise ValueError(f"format must be 'e4m3' or 'e5m2', got {name!r}")
    return n


# ------------------------------------------------------------------ wgmma
def _wgmma_raw(a, bt, c, name, acc, lbo, sbo):
    T = a.shape[0]
    da = cp.asarray(np.ascontiguousarray(a))
    db = cp.asarray(np.ascontiguousarray(bt))
    if acc == "f32":
        dc = cp.asarray(np.ascontiguousarray(c, dtype=np.float32))
        dd = cp.empty_like(dc)
    else:
        dc = cp.asarray(np.ascontiguousarray(np.asarray(c, np.float16).view(np.uint16)))
        dd = cp.empty_like(dc)
    fn(name)((T,), (128,), (da, db, dc, dd, np.int32(lbo), np.int32(sbo)))
    out = cp.asnumpy(dd)
    if acc == "f16":
        out = out.view(np.float16).astype(np.float32)
    return out


def descriptor_fields() -> tuple[int, int]:
    """Find which (LBO, SBO) descriptor values make wgmma read our layout.

    Runs a product with distinct, exactly representable entries and checks it
    against the exact result; the NOTES say which one the H200 needed."""
    global _desc
    if _desc is not None:
        return _desc
    import ml_dtypes

    rng = np.random.default_rng(1)
    av = rng.integers(-3, 4, size=(1, 64, 32)).astype(np.float32)
    bv = rng.integers(-3, 4, size=(1, 32, 8)).astype(np.float32)
    a = av.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    b = bv.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    c = np.zeros((1, 64, 8), np.float32)
    ref = (av.astype(np.float64) @ bv.astype(np.float64)).astype(np.float32)
    for lbo, sbo in ((128, 256), (256, 128)):
        d = _wgmma_raw(a, np.swapaxes(b, -1, -2), c, "wgmma_f32_e4m3_e4m3", "f32", lbo, sbo)
        if np.array_equal(d, ref):
            _desc = (lbo, sbo)
            return _desc
    raise RuntimeError("wgmma sanity check failed for both descriptor conventions")


def wgmma(a, b, c, a_format="e4m3", b_format="e4m3", acc: str = "f32") -> np.ndarray:
    """Batched single wgmma m64n8k32: a (T, 64, 32) uint8, b (T, 32, 8) uint8, c (T, 64, 8).

    ``acc="f16"`` uses the f16-accumulator form (C rounded to fp16 first)."""
    a = np.asarray(a, np.uint8)
    b = np.asarray(b, np.uint8)
    if a.ndim == 2:
        a, b, c = a[None], b[None], np.asarray(c)[None]
    assert a.shape[1:] == (64, 32) and b.shape[1:] == (32, 8), (a.shape, b.shape)
    lbo, sbo = descriptor_fields()
    name = f"wgmma_{acc}_{_fmt(a_format)}_{_fmt(b_format)}"
    return _wgmma_raw(a, np.swapaxes(b, -1, -2), c, name, acc, lbo, sbo)


#: the 16-bit and tf32 wgmma forms: format -> (kernel suffix, K, code dtype)
WIDE = {"bf16": ("bf16", 16, np.uint16), "fp16": ("f16", 16, np.uint16), "tf32": ("tf32", 8, np.uint32)}


def _wide_bytes(a, b, c, fmt: str, acc: str, rows: int, what: str):
    """(A bytes (T, rows, 32), B^T bytes (T, 8, 32), C (T, rows, 8), kernel suffix) of bf16/fp16/tf32
    codes (a (T, rows, K), b (T, K, 8); 2-D for one tile): a row of 32 bytes is K elements."""
    if fmt not in WIDE or (acc == "f16" and fmt != "fp16") or acc not in ("f32", "f16"):
        raise ValueError(f"no {what} form for {fmt!r} with a {acc!r} accumulator")
    suffix, K, dt = WIDE[fmt]
    a = np.asarray(a, dt)
    b = np.asarray(b, dt)
    if a.ndim == 2:
        a, b, c = a[None], b[None], np.asarray(c)[None]
    assert a.shape[1:] == (rows, K) and b.shape[1:] == (K, 8), (a.shape, b.shape)
    if fmt == "tf32":  # the fp32 bit pattern: the code in the top 19 bits
        a, b = a << np.uint32(13), b << np.uint32(13)
    T = a.shape[0]
    ab = np.ascontiguousarray(a).view(np.uint8).reshape(T, rows, 32)
    bb = np.ascontiguousarray(np.swapaxes(b, -1, -2)).view(np.uint8).reshape(T, 8, 32)
    return ab, bb, c, suffix


def wgmma_wide(a, b, c, fmt: str, acc: str = "f32") -> np.ndarray:
    """Batched single wgmma m64n8k16 (bf16, fp16) or m64n8k8 (tf32): a (T, 64, K) and b (T, K, 8)
    codes as fp8sim holds them (uint16; tf32: its 19-bit code in uint32), c (T, 64, 8).

    ``acc="f16"`` (fp16 operands only) uses the f16-accumulator form (C rounded to fp16 first).
    Returns D as float32 (T, 64, 8)."""
    ab, bb, c, suffix = _wide_bytes(a, b, c, fmt, acc, 64, "wgmma")
    lbo, sbo = descriptor_fields()
    return _wgmma_raw(ab, bb, c, f"wgmma_{acc}_{suffix}", acc, lbo, sbo)


def wgmma_chain(a, b, c=None, a_format="e4m3", b_format="e4m3", promote_every=None) -> np.ndarray:
    """Tile loop of wgmma m64n8k32 along K: a (M, K), b (K, N), c (M, N) float32.

    ``promote_every`` (K elements, multiple of 32) adds the tensor-core partial
    into an fp32 register accumulator (initialised with C) every that many
    elements and restarts it from zero."""
    a = np.ascontiguousarray(a, np.uint8)
    b = np.asarray(b, np.uint8)
    M, K = a.shape
    N = b.shape[1]
    assert M % 64 == 0 and N % 8 == 0 and K % 32 == 0, (M, N, K)
    P = 0 if promote_every is None else int(promote_every) // 32
    if c is None:
        c = np.zeros((M, N), np.float32)
    lbo, sbo = descriptor_fields()
    da = cp.asarray(a)
    db = cp.asarray(np.ascontiguousarray(b.T))
    dc = cp.asarray(np.ascontiguousarray(c, np.float32))
    dd = cp.empty_like(dc)
    fn(f"wgmma_chain_{_fmt(a_format)}_{_fmt(b_format)}")(
        (N // 8, M // 64),
        (128,),
        (da, db, dc, dd, np.int32(M), np.int32(N), np.int32(K), np.int32(P), np.int32(lbo), np.int32(sbo)),
    )
    return cp.asnumpy(dd)


# --------------------------------------------------------------- mma.sync
def mma_sync(a, b, c, a_format="e4m3", b_format="e4m3") -> np.ndarray:
    """Batched single mma.sync m16n8k32: a (T, 16, 32), b (T, 32, 8), c (T, 16, 8) float32."""
    a = np.ascontiguousarray(a, np.uint8)
    b = np.asarray(b, np.uint8)
    if a.ndim == 2:
        a, b, c = a[None], b[None], np.asarray(c)[None]
    T = a.shape[0]
    assert a.shape[1:] == (16, 32) and b.shape[1:] == (32, 8), (a.shape, b.shape)
    da = cp.asarray(a)
    db = cp.asarray(np.ascontiguousarray(np.swapaxes(b, -1, -2)))
    dc = cp.asarray(np.ascontiguousarray(c, np.float32))
    dd = cp.empty_like(dc)
    wpb = 4
    fn(f"mma_f32_{_fmt(a_format)}_{_fmt(b_format)}")(
        ((T + wpb - 1) // wpb,), (32 * wpb,), (da, db, dc, dd, np.int32(T))
    )
    return cp.asnumpy(dd)


def mma_sync_wide(a, b, c, fmt: str, acc: str = "f32") -> np.ndarray:
    """Batched single mma.sync m16n8k16 (bf16, fp16) or m16n8k8 (tf32): a (T, 16, K), b (T, K, 8)
    codes as :func:`wgmma_wide` takes them, c (T, 16, 8); ``acc="f16"`` for fp16 with an f16
    accumulator.  Returns D as float32 (T, 16, 8)."""
    ab, bb, c, suffix = _wide_bytes(a, b, c, fmt, acc, 16, "mma.sync")
    T = ab.shape[0]
    da, db = cp.asarray(ab), cp.asarray(bb)
    if acc == "f32":
        dc = cp.asarray(np.ascontiguousarray(c, np.float32))
    else:
        dc = cp.asarray(np.ascontiguousarray(np.asarray(c, np.float16).view(np.uint16)))
    dd = cp.empty_like(dc)
    wpb = 4
    fn(f"mma_{acc}_{suffix}")(((T + wpb - 1) // wpb,), (32 * wpb,), (da, db, dc, dd, np.int32(T)))
    out = cp.asnumpy(dd)
    return out.view(np.float16).astype(np.float32) if acc == "f16" else out


# ------------------------------------------------------------- dispatcher
SHAPES = {"wgmma": (64, 8), "wgmma.f16": (64, 8), "mma.sync": (16, 8)}


def run(instruction: str, a, b, c, a_format, b_format) -> np.ndarray:
    """Run native-shape instances of ``instruction`` (see SHAPES)."""
    if instruction == "wgmma":
        return wgmma(a, b, c, a_format, b_format, "f32")
    if instruction == "wgmma.f16":
        return wgmma(a, b, c, a_format, b_format, "f16")
    if instruction == "mma.sync":
        return mma_sync(a, b, c, a_format, b_format)
    raise ValueError(f"unknown instruction {instruction!r}")


# ------------------------------------------------------------------ cvt
def cvt_sweep(fmt: str, chunk_log2: int = 30):
    """cvt.rn.satfinite.<fmt>x2.f32 over all 2**32 float32 bit patterns.

    Returns (starts, codes): run-length encoding, ``starts`` (uint32, sorted,
    starts[0] == 0) are the bit patterns where the output code changes and
    ``codes`` (uint8) the code from there on."""
    _require()
    f = fn(f"cvt_satfinite_{_fmt(fmt)}")
    n = 1 << chunk_log2
    starts, codes = [], []
    prev = None
    out = cp.empty(n // 2, dtype=cp.uint16)
    for ci in range(1 << (32 - chunk_log2)):
        start = ci * n
        npairs = n // 2
        f(((npairs + 255) // 256,), (256,), (out, np.uint32(start), np.int64(npairs)))
        o8 = out.view(cp.uint8)
        ch = cp.flatnonzero(o8[1:] != o8[:-1]) + 1
        idx = cp.asnumpy(ch).astype(np.uint64) + start
        first = int(o8[0].get())
        if prev is None or first != prev:
            starts.append(np.array([start], np.uint64))
            codes.append(np.array([first], np.uint8))
        starts.append(idx)
        codes.append(cp.asnumpy(o8[ch]))
        prev = int(o8[-1].get())
    return np.concatenate(starts).astype(np.uint32), np.concatenate(codes).astype(np.uint8)


def rle_expand(starts, codes, lo: int, hi: int) -> np.ndarray:
    """Codes for bit patterns lo..hi-1 from a run-length encoding."""
    x = np.arange(lo, hi, dtype=np.uint64)
    idx = np.searchsorted(starts.astype(np.uint64), x, side="right") - 1
    return codes[idx]
