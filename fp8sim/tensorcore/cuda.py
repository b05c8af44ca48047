"""The CUDA-core twin of :func:`fp8sim.tensorcore.fast.wgmma_gemm`, launched through CuPy (``backend="cupy"``).

The same arithmetic as ``wgmma_gemm``, one output element per thread.  Every operation is exact or an
explicitly rounded intrinsic (no FMA contraction can change it: the products feed ``truncf``, and the
promotion FMA is written out), so the bits equal the CPU path.  :data:`last_kernel_seconds` holds the
kernel time of the last launch (CUDA events).
"""

from __future__ import annotations

import numpy as np

from .fast import code_tables

__all__ = ["CUDA_SOURCE", "cupy_wgmma_gemm", "last_kernel_seconds"]

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
