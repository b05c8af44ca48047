"""Fast bit-exact numba kernel for scaled FP8 GEMMs on the wgmma accumulator model.

This is a re-formulation of :func:`fp8sim.tensorcore.matmul` for the fused
(``kind="fused"``, ``block=32``, ``c_mode="fused"``, ``align_rounding="rz"``,
``product_exponent="nominal"``, ``out_rounding="rz"``, ``output="f32"``)
models -- the sm90 ``"wgmma"`` preset -- that vectorizes over N.  It
relies on three exact identities:

* a product of two FP8 values is exact in float32, and so is its product with
  a power of two ``2**(F - E)`` (no underflow for FP8 products);
* ``trunc(p * 2**(F - E))`` is the addend truncated (toward zero, i.e. the
  magnitude) to ``F`` fraction bits below the largest exponent ``E``: an
  integer below ``2**15`` for ``F = 13``; the sum of 33 of them is exact in
  float32 (below ``2**24``), in any order;
* truncating a normal float32 to ``f`` fraction bits toward zero is masking
  the low ``23 - f`` bits of its pattern.

The largest exponent ``E`` uses the *nominal* exponents (``ea + eb`` from the
per-code tables, subnormals clamped to the format's emin), kept as float32
exponent-field bit patterns so that the max is an integer max.  Promotion
adds the tensor-core partial into an fp32 accumulator with a correctly
rounded fused multiply-add (LLVM ``llvm.fma.f32``) or a separately rounded
multiply and add; see :func:`wgmma_gemm`.

The equality with :func:`fp8sim.tensorcore.matmul` (the model validated
against the H200) is tested bit for bit in tests/test_gemm.py.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

# scale application modes at promotion / epilogue
SCALE_FMA = 0  # tot = fma(sa*sb, partial, tot)        (DeepGEMM's += compiled with contraction)
SCALE_MUL_ADD = 1  # tot = tot + fp32(sa*sb * partial)      (no contraction)
SCALE_EPILOGUE = 2  # tot = tot + partial at promotion; out = fp32(sa*sb * tot) at the end

_NEG16 = -10000  # exponent of a zero/special code: never the max (int16)


@intrinsic
def fma32(typingctx, a, b, c):
    """Correctly rounded float32 fused multiply-add (LLVM llvm.fma.f32)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args)

    return sig, codegen


@njit(cache=True)
def fma32_array(a, b, c, out):
    for i in range(a.size):
        out[i] = fma32(a[i], b[i], c[i])


@njit(cache=True, inline="always")
def _promote(tot, acc, s, mode):
    if mode == SCALE_FMA:
        return fma32(s, acc, tot)
    if mode == SCALE_MUL_ADD:
        return np.float32(tot + np.float32(s * acc))
    return np.float32(tot + acc)


@njit(cache=True)
def _pass1(pm, ber, ea):
    for n in range(pm.size):
        pm[n] = max(pm[n], np.int16(ber[n] + ea))


@njit(cache=True)
def _pass2(S, bvr, va, scf):
    for n in range(S.size):
        S[n] += np.trunc((va * bvr[n]) * scf[n])


@njit(cache=True)
def _row_instr(accr, accb, aerow, avrow, askrow, be, bv, k0, n0, n1, pm, sci, invi, scf, invf, S, F, one, keep_bits):
    nn = n1 - n0
    for n in range(nn):
        eb = (accb[n] >> 23) & 0xFF
        pm[n] = np.int16(eb - 127) if eb != 0 else np.int16(_NEG16)
    for k in range(k0, k0 + 32):
        ea = aerow[k]
        if ea == _NEG16:
            continue
        _pass1(pm[:nn], be[k, n0:n1], ea)
    for n in range(nn):
        p = np.int32(pm[n])
        ok = p > -1000
        sci[n] = ((127 + F - p) << 23) if ok else one
        invi[n] = ((127 - F + p) << 23) if ok else one
    for n in range(nn):
        S[n] = np.float32(0.0) + np.trunc(accr[n] * scf[n])
    for k in range(k0, k0 + 32):
        if askrow[k]:
            continue
        _pass2(S[:nn], bv[k, n0:n1], avrow[k], scf[:nn])
    for n in range(nn):
        accr[n] = S[n] * invf[n]
    for n in range(nn):
        accb[n] = accb[n] & keep_bits


@njit(cache=True, parallel=True)
def wgmma_gemm(av, ae, bv, be, sa, sb, kscale, promote, mode, F, keep_bits, a_skip, out):
    """Scaled FP8 GEMM on the fused wgmma accumulator model.

    av, ae : (M, Kp) float32 value / int16 nominal exponent (``_NEG16`` for zero, inf and NaN
             codes) of A's codes
    bv, be : (Kp, N) the same for B (K outer, N contiguous)
    sa     : (M, nks) float32 A scales per K scale block of ``kscale`` elements
    sb     : (nks, N) float32 B scales per K scale block, expanded over N
    promote: promotion interval in K elements (multiple of 32); 0 = never (one chain over K)
    mode   : SCALE_FMA / SCALE_MUL_ADD (scales applied at promotion, needs kscale % promote == 0)
             or SCALE_EPILOGUE (plain fp32 add at promotion, scale sa[:, 0] * sb[0] at the end)
    F      : fraction bits kept below the largest exponent; keep_bits: int32 mask of the kept
             result bits (truncation to the output's fraction bits)
    a_skip : (M, Kp) bool, True where the A product is zero for every column (zero code, no
             special B values), so that the k step can be skipped
    out    : (M, N) float32
    """
    M, Kp = av.shape
    N = bv.shape[1]
    MB = 32
    NB = 512
    nmt = (M + MB - 1) // MB
    nnt = (N + NB - 1) // NB
    one = np.int32(127 << 23)
    for t in prange(nmt * nnt):
        mt = t // nnt
        nt = t % nnt
        i0 = mt * MB
        i1 = min(M, i0 + MB)
        n0 = nt * NB
        n1 = min(N, n0 + NB)
        nn = n1 - n0
        accb2 = np.zeros((MB, NB), np.int32)
        acc = accb2.view(np.float32)
        tot = np.zeros((MB, NB), np.float32)
        pm = np.empty(NB, np.int16)
        sci = np.empty(NB, np.int32)
        invi = np.empty(NB, np.int32)
        S = np.empty(NB, np.float32)
        scf = sci.view(np.float32)
        invf = invi.view(np.float32)
        cnt = 0
        for k0 in range(0, Kp, 32):
            for ii in range(i1 - i0):
                i = i0 + ii
                _row_instr(
                    acc[ii],
                    accb2[ii],
                    ae[i],
                    av[i],
                    a_skip[i],
                    be,
                    bv,
                    k0,
                    n0,
                    n1,
                    pm,
                    sci,
                    invi,
                    scf,
                    invf,
                    S,
                    F,
                    one,
                    keep_bits,
                )
            cnt += 32
            last = k0 + 32 >= Kp
            if promote > 0 and (cnt == promote or last):
                kb = k0 // kscale
                for ii in range(i1 - i0):
                    i = i0 + ii
                    s_a = sa[i, kb]
                    totr = tot[ii]
                    accr = acc[ii]
                    sbr = sb[kb]
                    for n in range(nn):
                        s = np.float32(s_a * sbr[n0 + n])
                        totr[n] = _promote(totr[n], accr[n], s, mode)
                        accr[n] = 0.0
                cnt = 0
        for ii in range(i1 - i0):
            i = i0 + ii
            res = tot[ii] if promote > 0 else acc[ii]
            s_a = sa[i, 0]
            sbr = sb[0]
            for n in range(nn):
                r = res[n]
                if mode == SCALE_EPILOGUE:
                    r = np.float32(np.float32(s_a * sbr[n0 + n]) * r)
                out[i, n0 + n] = r


def code_tables(fmt, subnormal_exponent: str = "clamp"):
    """(value float32[256], nominal exponent bits int32[256], special bool[256]) for an FP8 format."""
    from .tensorcore import _code_table

    cls, sign, sig, exp, vals = _code_table(fmt, subnormal_exponent)
    v = vals.astype(np.float32)
    e = np.where(cls == 1, exp, _NEG16).astype(np.int16)
    return v, e, cls >= 2


# --------------------------------------------------------------------------- CuPy (CUDA cores)
# The same arithmetic as wgmma_gemm, one output element per thread, for backend="cupy".
# Every operation is exact or an explicitly rounded intrinsic (no FMA contraction can change it:
# the products feed truncf, and the promotion FMA is written out), so the bits equal the CPU path.
CUDA_SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256)
emu_wgmma_gemm(const unsigned char* __restrict__ A, const unsigned char* __restrict__ B,
               const float* __restrict__ tva, const int* __restrict__ tea,
               const float* __restrict__ tvb, const int* __restrict__ teb,
               const float* __restrict__ sa, const float* __restrict__ sb, float* __restrict__ out,
               int M, int N, int Kp, int nks, int kscale, int promote, int mode, int F, int keep)
{
    __shared__ float va_s[256], vb_s[256];
    __shared__ int ea_s[256], eb_s[256];
    __shared__ unsigned char As[32][33];
    __shared__ unsigned char Bs[32][33];
    const int tid = threadIdx.y * 16 + threadIdx.x;
    va_s[tid] = tva[tid]; vb_s[tid] = tvb[tid]; ea_s[tid] = tea[tid]; eb_s[tid] = teb[tid];
    const int NEG = -10000;
    // each thread: 2 x 2 outputs of a 32 x 32 tile
    const int i0 = blockIdx.y * 32, n0 = blockIdx.x * 32;
    float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}}, tot[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    int cnt = 0;
    for (int k0 = 0; k0 < Kp; k0 += 32) {
        __syncthreads();
        for (int q = tid; q < 32 * 32; q += 256) {
            int r = q >> 5, c = q & 31;
            As[r][c] = (i0 + r < M) ? A[(size_t)(i0 + r) * Kp + k0 + c] : 0;
            Bs[r][c] = (n0 + c < N) ? B[(size_t)(k0 + r) * N + n0 + c] : 0;
        }
        __syncthreads();
#pragma unroll
        for (int a = 0; a < 2; ++a) {
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const int ri = threadIdx.y + 16 * a, cj = threadIdx.x + 16 * b;
                float c = acc[a][b];
                int eb = (__float_as_int(c) >> 23) & 0xFF;
                int pm = eb ? eb - 127 : NEG;
                for (int k = 0; k < 32; ++k) {
                    int e1 = ea_s[As[ri][k]];
                    if (e1 == NEG) continue;
                    pm = max(pm, e1 + eb_s[Bs[k][cj]]);
                }
                const bool ok = pm > -1000;
                const float sc = ok ? __int_as_float((127 + F - pm) << 23) : 1.0f;
                const float inv = ok ? __int_as_float((127 - F + pm) << 23) : 1.0f;
                float S = 0.0f + truncf(__fmul_rn(c, sc));
                for (int k = 0; k < 32; ++k)
                    S = __fadd_rn(S, truncf(__fmul_rn(__fmul_rn(va_s[As[ri][k]], vb_s[Bs[k][cj]]), sc)));
                acc[a][b] = __int_as_float(__float_as_int(__fmul_rn(S, inv)) & keep);
            }
        }
        cnt += 32;
        if (promote > 0 && (cnt == promote || k0 + 32 >= Kp)) {
            const int kb = k0 / kscale;
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int b = 0; b < 2; ++b) {
                    const int i = i0 + threadIdx.y + 16 * a, n = n0 + threadIdx.x + 16 * b;
                    if (i < M && n < N) {
                        const float s = __fmul_rn(sa[(size_t)i * nks + kb], sb[(size_t)kb * N + n]);
                        if (mode == 0) tot[a][b] = __fmaf_rn(s, acc[a][b], tot[a][b]);
                        else if (mode == 1) tot[a][b] = __fadd_rn(tot[a][b], __fmul_rn(s, acc[a][b]));
                        else tot[a][b] = __fadd_rn(tot[a][b], acc[a][b]);
                    }
                    acc[a][b] = 0.0f;
                }
            cnt = 0;
        }
    }
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            const int i = i0 + threadIdx.y + 16 * a, n = n0 + threadIdx.x + 16 * b;
            if (i < M && n < N) {
                float r = promote > 0 ? tot[a][b] : acc[a][b];
                if (mode == 2) r = __fmul_rn(__fmul_rn(sa[(size_t)i * nks], sb[n]), r);
                out[(size_t)i * N + n] = r;
            }
        }
}
"""

_cupy_kernel = None
last_kernel_seconds = float("nan")  # kernel time of the last cupy_wgmma_gemm call (CUDA events)


def cupy_wgmma_gemm(a_codes, b_codes, fa, fb, sa, sb, kscale, promote, mode, F, keep_bits):
    """CuPy launcher of the CUDA-core emulation (same arguments as wgmma_gemm, codes instead of tables).

    Returns a NumPy float32 (M, N) array."""
    import cupy as cp

    global _cupy_kernel
    if _cupy_kernel is None:
        _cupy_kernel = cp.RawModule(code=CUDA_SOURCE, options=("-std=c++17",)).get_function("emu_wgmma_gemm")
    va, ea, _ = code_tables(fa)
    vb, eb, _ = code_tables(fb)
    M, Kp = a_codes.shape
    N = b_codes.shape[1]
    dA, dB = cp.asarray(np.ascontiguousarray(a_codes)), cp.asarray(np.ascontiguousarray(b_codes))
    tv = [cp.asarray(t) for t in (va, ea.astype(np.int32), vb, eb.astype(np.int32))]
    dsa, dsb = cp.asarray(np.ascontiguousarray(sa, np.float32)), cp.asarray(np.ascontiguousarray(sb, np.float32))
    out = cp.empty((M, N), cp.float32)
    grid = ((N + 31) // 32, (M + 31) // 32)
    global last_kernel_seconds
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    _cupy_kernel(
        grid,
        (16, 16),
        (
            dA,
            dB,
            tv[0],
            tv[1],
            tv[2],
            tv[3],
            dsa,
            dsb,
            out,
            np.int32(M),
            np.int32(N),
            np.int32(Kp),
            np.int32(sa.shape[1]),
            np.int32(kscale),
            np.int32(promote),
            np.int32(mode),
            np.int32(F),
            np.int32(keep_bits),
        ),
    )
    e1.record()
    e1.synchronize()
    last_kernel_seconds = cp.cuda.get_elapsed_time(e0, e1) / 1e3
    return cp.asnumpy(out)
