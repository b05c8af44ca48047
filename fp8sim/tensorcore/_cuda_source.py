"""CUDA C++ source of the CUDA-core emulation of the fused wgmma accumulator (see :mod:`.cuda`).

One kernel template, ``emu_fused_gemm<TM, TN>``: a CTA of 16 x 16 threads computes a
``16*TM x 16*TN`` tile of outputs, each thread a ``TM x TN`` block.  Per 32-product group (one MMA
instruction) the codes of the A and B tiles are decoded once into shared memory (two buffers: the
next group's codes are fetched and decoded while this one is computed, one barrier per group), then

1. **largest exponent** ``pm = max(exponent of C, max_k(ea + eb))``, kept directly as the exponent
   field of the bias ``M`` below (A's table exponents carry ``127 + 23 - F``): one
   ``__viaddmax_s16x2`` (a fused add-and-max on two int16 lanes; native on sm_90, emulated on older
   GPUs) per pair of outputs and k;
2. **the truncated sum** ``sum_k trunc(a_k b_k / u)`` with ``u = 2**(pm - F)``, one ``fmaf_rz`` per
   product.  The accumulator starts at ``M = 1.5 * 2**23 * u``, so every partial sum lies in one
   binade whose spacing is ``u``: rounding toward zero of ``S + p`` (positive) adds ``floor(p / u)``.
   Truncation toward zero of a negative addend is ``floor + 1`` unless it is an integer, so A's values
   are stored times ``1 + 2**-20``: ``trunc(q) = floor(q * (1 + 2**-20)) + [q < 0]`` for every addend
   ``q = a b / u`` here (|q| < 2**(F+2) with F <= 18, and a non-integer q has at most ma + mb <= 18
   fraction bits, so the nudge moves no q across an integer and moves every negative integer just
   below itself).  The ``[q < 0]`` terms are a popcount of the sign masks of the tile's rows and
   columns, taken off ``M``'s bit pattern (its spacing is ``u``; an infinite or NaN sum stays so).
   C is an addend like the products: ``fmaf_rz(c, 1 + 2**-20, M + u [c < 0])`` (C has at most 20
   significant bits and is never -0).
3. the group's result ``S - (M - u * #negatives)`` (exact), truncated to the output's fraction bits
   (``keep`` mask); promotion every ``promote`` elements as in
   :func:`fp8sim.tensorcore.fast.wgmma_gemm`.

Every operation is exact or explicitly rounded (``__fmaf_rz``, ``__fmaf_rn``, ``__fadd_rn``,
``__fmul_rn``), so no compiler contraction changes a bit.  The tensor-core instructions it models are
never used.  The identity in 2. was found for this kernel; tests/test_cuda_kernel.py checks the
kernel bit for bit against the CPU kernel over the whole code space.
"""

from __future__ import annotations

__all__ = ["CUDA_SOURCE", "KERNEL_NAMES", "TILES"]

#: (TM, TN) per thread -> CTA tile (16*TM) x (16*TN)
TILES = {"large": (8, 8), "small": (2, 2)}

KERNEL_NAMES = {k: f"emu_fused_gemm<{tm}, {tn}>" for k, (tm, tn) in TILES.items()}

CUDA_SOURCE = r"""
#define NEG (-10000)
// the bit pattern of M = 1.5 * 2^(e - 127) from the exponent field e in lane `hi` of a packed pair
#define MBITS(pair, hi) ((hi) ? ((((pair) << 7) & 0xFF800000u) + 0x400000u) : (((pair) << 23) + 0x400000u))
#ifndef UNROLL1
#define UNROLL1 8
#endif
#ifndef UNROLL2
#define UNROLL2 8
#endif

__device__ __forceinline__ unsigned int addmax2(unsigned int a, unsigned int b, unsigned int c)
{
#if defined(FP8SIM_NO_DPX)
    int lo = max((int)(short)(a & 0xFFFF) + (int)(short)(b & 0xFFFF), (int)(short)(c & 0xFFFF));
    int hi = max((int)(short)(a >> 16) + (int)(short)(b >> 16), (int)(short)(c >> 16));
    return (unsigned int)(lo & 0xFFFF) | ((unsigned int)hi << 16);
#else
    return __viaddmax_s16x2(a, b, c);
#endif
}

// row / column of a thread's r-th element: two halves of the tile, TM/2 consecutive rows in each
template <int T> __device__ __forceinline__ int sub(int t, int r)
{
    if constexpr (T == 2) return t * 2 + r;  // two neighbours
    else return (r < T / 2) ? t * (T / 2) + r : 8 * T + t * (T / 2) + (r - T / 2);
}

// a thread's T values of one k row of a shared tile (vector loads where T == 8)
template <int T, typename V> __device__ __forceinline__ void load_t(V (&d)[T], const V* row, int t)
{
    if constexpr (T == 8 && sizeof(V) == 4) {
        const uint4 x = *(const uint4*)(row + t * 4), y = *(const uint4*)(row + 64 + t * 4);
        const unsigned int w[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
        for (int r = 0; r < 8; ++r) d[r] = *(const V*)&w[r];
    } else {
#pragma unroll
        for (int r = 0; r < T; ++r) d[r] = row[sub<T>(t, r)];
    }
}

// the T/2 int16 pairs of a thread's T columns of one k row of Be
template <int T> __device__ __forceinline__ void load_pairs(unsigned int (&d)[T / 2], const short* row, int t)
{
    if constexpr (T == 8) {
        const uint2 x = *(const uint2*)(row + t * 4), y = *(const uint2*)(row + 64 + t * 4);
        d[0] = x.x; d[1] = x.y; d[2] = y.x; d[3] = y.y;
    } else {
#pragma unroll
        for (int q = 0; q < T / 2; ++q) d[q] = *(const unsigned int*)(row + sub<T>(t, 2 * q));
    }
}

// decode one group's 32 codes of an A row (or a B column) into a shared buffer
template <int LD, bool IS_A>
__device__ __forceinline__ void decode_group(const uint4 w0, const uint4 w1, const uint2* __restrict__ tab,
                                             float* __restrict__ V, void* __restrict__ E,
                                             unsigned int* __restrict__ masks, int m, int nmask)
{
    const unsigned int w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    unsigned int sg = 0, nz = 0;
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        const uint2 t = tab[(w[k >> 2] >> (8 * (k & 3))) & 0xFF];
        V[k * LD + m] = __uint_as_float(t.x);
        if constexpr (IS_A) ((unsigned int*)E)[k * LD + m] = (t.y & 0xFFFFu) | (t.y << 16);
        else ((short*)E)[k * LD + m] = (short)t.y;
        sg |= (t.x >> 31) << k;
        nz |= (unsigned int)((t.x & 0x7FFFFFFFu) != 0u) << k;
    }
    masks[m] = sg;
    masks[nmask + m] = nz;
}

template <int TM, int TN>
__global__ void __launch_bounds__(256, 1)
emu_fused_gemm(const unsigned char* __restrict__ A, const unsigned char* __restrict__ Bt,
               const uint2* __restrict__ ta, const uint2* __restrict__ tb,
               const float* __restrict__ sa, const float* __restrict__ sb, float* __restrict__ out,
               int M, int N, int Kp, int nks, int kscale, int promote, int mode, int F, unsigned int keep,
               int k_chunk, float* __restrict__ part)
{
    // A (M, Kp) and Bt (N, Kp): codes, K contiguous.  ta / tb: per code (value bits, exponent); A's value
    // times 1 + 2^-20 and its exponent + 127 + 23 - F (so that ea + eb is the exponent field of the
    // accumulator's bias M when it is the largest), NEG for zero / NaN / inf codes.
    constexpr int BM = 16 * TM, BN = 16 * TN, BMP = BM + 4;
    constexpr int BUF = 32 * BMP * 8 + 32 * BN * 6 + 8 * (BM + BN);  // bytes of one buffer
    extern __shared__ __align__(16) unsigned char smem[];
    uint2* tab_a = (uint2*)smem;
    uint2* tab_b = tab_a + 256;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
    tab_a[tid] = ta[tid];
    tab_b[tid] = tb[tid];
    const int i0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const float ONE_ETA = 1.00000095367431640625f;  // 1 + 2^-20
    const unsigned int CBIAS = (unsigned int)(23 - F) * 0x10001u;  // C's exponent field, biased as the sums

    // the decoding threads: an A row (threads 0..BM-1) or a B column (threads 128..128+BN-1)
    const bool dec_a = tid < BM, dec_b = tid >= 128 && tid - 128 < BN;
    const int dm = dec_a ? tid : tid - 128;
    const unsigned char* src = nullptr;
    if (dec_a && i0 + dm < M) src = A + (size_t)(i0 + dm) * Kp;
    if (dec_b && n0 + dm < N) src = Bt + (size_t)(n0 + dm) * Kp;

#define BUFP(b) (smem + 4096 + (b) * BUF)
#define AV(b) ((float*)BUFP(b))
#define AE(b) ((unsigned int*)(BUFP(b) + 32 * BMP * 4))
#define BV(b) ((float*)(BUFP(b) + 32 * BMP * 8))
#define BE(b) ((short*)(BUFP(b) + 32 * BMP * 8 + 32 * BN * 4))
#define AMK(b) ((unsigned int*)(BUFP(b) + 32 * BMP * 8 + 32 * BN * 6))
#define BMK(b) (AMK(b) + 2 * BM)
    auto decode = [&](int b, uint4 w0, uint4 w1) {
        if (dec_a) decode_group<BMP, true>(w0, w1, tab_a, AV(b), AE(b), AMK(b), dm, BM);
        else if (dec_b) decode_group<BN, false>(w0, w1, tab_b, BV(b), BE(b), BMK(b), dm, BN);
    };
    auto fetch = [&](int k0, uint4& w0, uint4& w1) {
        w0 = make_uint4(0, 0, 0, 0);
        w1 = w0;
        if (src != nullptr) { w0 = ((const uint4*)(src + k0))[0]; w1 = ((const uint4*)(src + k0))[1]; }
    };

    float acc[TM][TN], tot[TM][TN];
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) { acc[r][c] = 0.0f; tot[r][c] = 0.0f; }
    int cnt = 0;
    const int k_begin = blockIdx.z * k_chunk, k_end = min(Kp, k_begin + k_chunk);
    {
        uint4 w0, w1;
        fetch(k_begin, w0, w1);
        __syncthreads();  // the tables
        decode(0, w0, w1);
        __syncthreads();
    }
    int cur = 0;
    for (int k0 = k_begin; k0 < k_end; k0 += 32) {
        const bool more = k0 + 32 < k_end;
        uint4 nw0, nw1;
        if (more) fetch(k0 + 32, nw0, nw1);  // the next group's codes, in flight during this one
        const float* Av = AV(cur);
        const unsigned int* Ae = AE(cur);
        const float* Bv = BV(cur);
        const short* Be = BE(cur);
        // ---- 1. largest exponent per output, as M's exponent field: C's (+ 23 - F), then the sums
        unsigned int pm[TM][TN / 2];
#pragma unroll
        for (int r = 0; r < TM; ++r)
#pragma unroll
            for (int q = 0; q < TN / 2; ++q)
                pm[r][q] = (((__float_as_uint(acc[r][2 * q]) >> 23) & 0xFFu) |
                            ((__float_as_uint(acc[r][2 * q + 1]) >> 7) & 0xFF0000u)) + CBIAS;
#if !defined(FP8SIM_SKIP_PASS1)
#pragma unroll UNROLL1
        for (int k = 0; k < 32; ++k) {
            unsigned int ea[TM], eb[TN / 2];
            load_t<TM>(ea, Ae + k * BMP, ty);
            load_pairs<TN>(eb, Be + k * BN, tx);
#pragma unroll
            for (int r = 0; r < TM; ++r)
#pragma unroll
                for (int q = 0; q < TN / 2; ++q) pm[r][q] = addmax2(ea[r], eb[q], pm[r][q]);
        }
#endif
        // ---- 2. the biased accumulators: C first (M + u when C < 0: C is never -0), then the products
        float S[TM][TN];
#pragma unroll
        for (int r = 0; r < TM; ++r)
#pragma unroll
            for (int c = 0; c < TN; ++c) {
                const unsigned int cb = __float_as_uint(acc[r][c]);
                const unsigned int mb = MBITS(pm[r][c >> 1], c & 1) + (cb >> 31);
                S[r][c] = __fmaf_rz(acc[r][c], ONE_ETA, __uint_as_float(mb));
            }
#if !defined(FP8SIM_SKIP_PASS2)
#pragma unroll UNROLL2
        for (int k = 0; k < 32; ++k) {
            float a[TM], b[TN];
            load_t<TM>(a, Av + k * BMP, ty);
            load_t<TN>(b, Bv + k * BN, tx);
#pragma unroll
            for (int r = 0; r < TM; ++r)
#pragma unroll
                for (int c = 0; c < TN; ++c) S[r][c] = __fmaf_rz(a[r], b[c], S[r][c]);
        }
#endif
        if (more) decode(cur ^ 1, nw0, nw1);
        // ---- 3. the group's result: S - (M - u * #negative products), exact, truncated to the output
        const unsigned int* Am = AMK(cur);
        const unsigned int* Bm = BMK(cur);
        unsigned int bsg[TN], bnz[TN];
#pragma unroll
        for (int c = 0; c < TN; ++c) { bsg[c] = Bm[sub<TN>(tx, c)]; bnz[c] = Bm[BN + sub<TN>(tx, c)]; }
#pragma unroll
        for (int r = 0; r < TM; ++r) {
            const int ri = sub<TM>(ty, r);
            const unsigned int asg = Am[ri], anz = Am[BM + ri];
#pragma unroll
            for (int c = 0; c < TN; ++c) {
                const unsigned int negs = (asg ^ bsg[c]) & anz & bnz[c];
                const unsigned int mb = MBITS(pm[r][c >> 1], c & 1) - (unsigned int)__popc(negs);
                const float v = __fsub_rn(S[r][c], __uint_as_float(mb));
                acc[r][c] = __uint_as_float(__float_as_uint(v) & keep);
            }
        }
        cnt += 32;
        if (promote > 0 && (cnt == promote || !more)) {
            const int kb = k0 / kscale;
            float* dst = part != nullptr ? part + (size_t)(k0 / promote) * M * N : nullptr;
#pragma unroll
            for (int r = 0; r < TM; ++r)
#pragma unroll
                for (int c = 0; c < TN; ++c) {
                    const int i = i0 + sub<TM>(ty, r), n = n0 + sub<TN>(tx, c);
                    if (dst != nullptr) {
                        if (i < M && n < N) dst[(size_t)i * N + n] = acc[r][c];
                    } else if (i < M && n < N) {
                        const float s = __fmul_rn(sa[(size_t)i * nks + kb], sb[(size_t)kb * N + n]);
                        if (mode == 0) tot[r][c] = __fmaf_rn(s, acc[r][c], tot[r][c]);
                        else if (mode == 1) tot[r][c] = __fadd_rn(tot[r][c], __fmul_rn(s, acc[r][c]));
                        else tot[r][c] = __fadd_rn(tot[r][c], acc[r][c]);
                    }
                    acc[r][c] = 0.0f;
                }
            cnt = 0;
        }
        __syncthreads();
        cur ^= 1;
    }
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) {
            const int i = i0 + sub<TM>(ty, r), n = n0 + sub<TN>(tx, c);
            if (i < M && n < N && part == nullptr) {
                float v = promote > 0 ? tot[r][c] : acc[r][c];
                if (mode == 2) v = __fmul_rn(__fmul_rn(sa[(size_t)i * nks], sb[n]), v);
                out[(size_t)i * N + n] = v;
            }
        }
}

// The promotions of a GEMM whose promotion intervals ran in parallel (``part``: one fp32 partial per
// interval, [nint][M][N]): the same fp32 sequence as the one-pass kernel.
extern "C" __global__ void emu_promote(const float* __restrict__ part, const float* __restrict__ sa,
                                       const float* __restrict__ sb, float* __restrict__ out, int M, int N,
                                       int Kp, int nint, int promote, int nks, int kscale, int mode)
{
    const int n = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (n >= N || i >= M) return;
    float tot = 0.0f;
    for (int t = 0; t < nint; ++t) {
        const float a = part[((size_t)t * M + i) * N + n];
        const int kb = (min((t + 1) * promote, Kp) - 32) / kscale;  // its last group's block, as in emu_fused_gemm
        const float s = __fmul_rn(sa[(size_t)i * nks + kb], sb[(size_t)kb * N + n]);
        if (mode == 0) tot = __fmaf_rn(s, a, tot);
        else if (mode == 1) tot = __fadd_rn(tot, __fmul_rn(s, a));
        else tot = __fadd_rn(tot, a);
    }
    if (mode == 2) tot = __fmul_rn(__fmul_rn(sa[(size_t)i * nks], sb[n]), tot);
    out[(size_t)i * N + n] = tot;
}
"""
