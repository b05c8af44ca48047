// fp8sim hardware oracle: single-instruction and chained FP8 tensor-core kernels
// for sm_90a (Hopper), plus the FP8 conversion instructions.
//
// Build: nvcc -cubin -gencode=arch=compute_90a,code=sm_90a tc.cu -o tc.cubin
// (wgmma needs the "a" target; a plain sm_90 pass rejects it).
//
// Conventions shared with gpu/kernels.py
//   A  : uint8 codes, row-major (M, K)       -- K contiguous ("K-major")
//   Bt : uint8 codes, row-major (N, K)       -- B transposed, K contiguous
//   C,D: float32 row-major (M, N)
// Batched single-instruction kernels take one instance per CTA (blockIdx.x).

#include <cstdint>
#include <cuda_fp16.h>

// ---------------------------------------------------------------- wgmma helpers
#include "sm90_common.cuh"  // tile_off, make_desc: the no-swizzle K-major layout

__device__ __forceinline__ void fence_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit_wait() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// Copy a (rows x 32) K-tile starting at column k0 of a row-major (rows x ldk)
// matrix into the core-matrix layout.  All 128 threads take part.
__device__ __forceinline__ void load_tile(uint8_t* s, const uint8_t* g, int rows, int ldk, int k0) {
    for (int i = threadIdx.x; i < rows * 32; i += blockDim.x) {
        int r = i >> 5, k = i & 31;
        s[tile_off(r, k)] = g[(size_t)r * ldk + k0 + k];
    }
}

#define WGMMA_F32(AT, BT)                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"                           \
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32." #AT "." #BT              \
                 " {%0,%1,%2,%3}, %4, %5, p, 1, 1;\n}\n"                               \
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)                              \
                 : "l"(da), "l"(db), "r"(scale_d))

#define WGMMA_F16(AT, BT)                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"                           \
                 "wgmma.mma_async.sync.aligned.m64n8k32.f16." #AT "." #BT              \
                 " {%0,%1}, %2, %3, p, 1, 1;\n}\n"                                     \
                 : "+r"(h0), "+r"(h1)                                                  \
                 : "l"(da), "l"(db), "r"(scale_d))

// The same instruction for 16-bit and tf32 operands: a row of 32 bytes is K = 16 (bf16, fp16) or
// K = 8 (tf32) elements, so the tiles, their layout and the descriptors are those of FP8's K = 32.
// bf16/f16 take the transpose immediates (0: K-major); tf32 has none.
#define WGMMA_F32_K16(T)                                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"                           \
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32." #T "." #T                 \
                 " {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n}\n"                         \
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)                              \
                 : "l"(da), "l"(db), "r"(scale_d))
#define WGMMA_F32_TF32()                                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"                           \
                 "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32"                  \
                 " {%0,%1,%2,%3}, %4, %5, p, 1, 1;\n}\n"                               \
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)                              \
                 : "l"(da), "l"(db), "r"(scale_d))
#define WGMMA_F16_K16()                                                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"                           \
                 "wgmma.mma_async.sync.aligned.m64n8k16.f16.f16.f16"                   \
                 " {%0,%1}, %2, %3, p, 1, 1, 0, 0;\n}\n"                               \
                 : "+r"(h0), "+r"(h1)                                                  \
                 : "l"(da), "l"(db), "r"(scale_d))

// ------------------------------------------------ wgmma m64n8k32, f32 accumulate
// One instance per CTA: A (64x32 bytes), Bt (8x32 bytes), C/D (64x8).
#define DEF_WGMMA_F32(AT, BT) DEF_WGMMA_F32_AS(wgmma_f32_##AT##_##BT, WGMMA_F32(AT, BT))
#define DEF_WGMMA_F32_AS(NAME, MMA)                                                    \
extern "C" __global__ void __launch_bounds__(128)                                      \
NAME(const uint8_t* __restrict__ A, const uint8_t* __restrict__ Bt,                    \
                      const float* __restrict__ C, float* __restrict__ D,              \
                      int lbo, int sbo) {                                              \
    __shared__ __align__(256) uint8_t sA[64 * 32];                                     \
    __shared__ __align__(256) uint8_t sB[8 * 32];                                      \
    const size_t inst = blockIdx.x;                                                    \
    load_tile(sA, A + inst * 64 * 32, 64, 32, 0);                                      \
    load_tile(sB, Bt + inst * 8 * 32, 8, 32, 0);                                       \
    fence_async_smem();                                                                \
    __syncthreads();                                                                   \
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3; \
    const int r0 = 16 * w + g, r1 = r0 + 8, cc = 2 * t;                               \
    const float* Ci = C + inst * 64 * 8;                                               \
    float d0 = Ci[r0 * 8 + cc], d1 = Ci[r0 * 8 + cc + 1];                              \
    float d2 = Ci[r1 * 8 + cc], d3 = Ci[r1 * 8 + cc + 1];                              \
    uint64_t da = make_desc(sA, lbo, sbo), db = make_desc(sB, lbo, sbo);               \
    int scale_d = 1;                                                                   \
    wg_fence();                                                                        \
    MMA;                                                                               \
    wg_commit_wait();                                                                  \
    float* Di = D + inst * 64 * 8;                                                     \
    Di[r0 * 8 + cc] = d0; Di[r0 * 8 + cc + 1] = d1;                                    \
    Di[r1 * 8 + cc] = d2; Di[r1 * 8 + cc + 1] = d3;                                    \
}

// ------------------------------------------------ wgmma m64n8k32, f16 accumulate
// C/D are float16 bit patterns (uint16) row-major (64x8).
#define DEF_WGMMA_F16(AT, BT) DEF_WGMMA_F16_AS(wgmma_f16_##AT##_##BT, WGMMA_F16(AT, BT))
#define DEF_WGMMA_F16_AS(NAME, MMA)                                                    \
extern "C" __global__ void __launch_bounds__(128)                                      \
NAME(const uint8_t* __restrict__ A, const uint8_t* __restrict__ Bt,                    \
                      const uint16_t* __restrict__ C, uint16_t* __restrict__ D,        \
                      int lbo, int sbo) {                                              \
    __shared__ __align__(256) uint8_t sA[64 * 32];                                     \
    __shared__ __align__(256) uint8_t sB[8 * 32];                                      \
    const size_t inst = blockIdx.x;                                                    \
    load_tile(sA, A + inst * 64 * 32, 64, 32, 0);                                      \
    load_tile(sB, Bt + inst * 8 * 32, 8, 32, 0);                                       \
    fence_async_smem();                                                                \
    __syncthreads();                                                                   \
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3; \
    const int r0 = 16 * w + g, r1 = r0 + 8, cc = 2 * t;                               \
    const uint16_t* Ci = C + inst * 64 * 8;                                            \
    uint32_t h0 = (uint32_t)Ci[r0 * 8 + cc] | ((uint32_t)Ci[r0 * 8 + cc + 1] << 16);   \
    uint32_t h1 = (uint32_t)Ci[r1 * 8 + cc] | ((uint32_t)Ci[r1 * 8 + cc + 1] << 16);   \
    uint64_t da = make_desc(sA, lbo, sbo), db = make_desc(sB, lbo, sbo);               \
    int scale_d = 1;                                                                   \
    wg_fence();                                                                        \
    MMA;                                                                               \
    wg_commit_wait();                                                                  \
    uint16_t* Di = D + inst * 64 * 8;                                                  \
    Di[r0 * 8 + cc] = (uint16_t)(h0 & 0xFFFF); Di[r0 * 8 + cc + 1] = (uint16_t)(h0 >> 16); \
    Di[r1 * 8 + cc] = (uint16_t)(h1 & 0xFFFF); Di[r1 * 8 + cc + 1] = (uint16_t)(h1 >> 16); \
}

// ------------------------------------- chained wgmma along K (f32 accumulate)
// A (M x K), Bt (N x K), C/D (M x N), M % 64 == 0, N % 8 == 0, K % 32 == 0.
// grid = (N/8, M/64).  The accumulator stays in registers across the K loop.
// promote > 0: every `promote` instructions the tensor-core partial is added
// into a separate fp32 register accumulator (plain fp32 add, as DeepGEMM and
// CUTLASS's GmmaFP8Accumulation do) and restarted from zero; the remainder is
// added at the end.  promote == 0: C is the initial accumulator, no promotion.
#define DEF_WGMMA_CHAIN(AT, BT)                                                        \
extern "C" __global__ void __launch_bounds__(128)                                      \
wgmma_chain_##AT##_##BT(const uint8_t* __restrict__ A, const uint8_t* __restrict__ Bt,\
                        const float* __restrict__ C, float* __restrict__ D,            \
                        int M, int N, int K, int promote, int lbo, int sbo) {          \
    __shared__ __align__(256) uint8_t sA[64 * 32];                                     \
    __shared__ __align__(256) uint8_t sB[8 * 32];                                      \
    const int n0 = blockIdx.x * 8, m0 = blockIdx.y * 64;                               \
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3; \
    const int r0 = m0 + 16 * w + g, r1 = r0 + 8, c0 = n0 + 2 * t;                      \
    float a0 = C[(size_t)r0 * N + c0], a1 = C[(size_t)r0 * N + c0 + 1];                \
    float a2 = C[(size_t)r1 * N + c0], a3 = C[(size_t)r1 * N + c0 + 1];                \
    float d0, d1, d2, d3;                                                              \
    if (promote > 0) { d0 = d1 = d2 = d3 = 0.0f; }                                     \
    else { d0 = a0; d1 = a1; d2 = a2; d3 = a3; }                                       \
    uint64_t da = make_desc(sA, lbo, sbo), db = make_desc(sB, lbo, sbo);               \
    const int scale_d = 1;                                                             \
    int cnt = 0;                                                                       \
    for (int k0 = 0; k0 < K; k0 += 32) {                                               \
        __syncthreads();                                                               \
        load_tile(sA, A + (size_t)m0 * K, 64, K, k0);                                  \
        load_tile(sB, Bt + (size_t)n0 * K, 8, K, k0);                                  \
        fence_async_smem();                                                            \
        __syncthreads();                                                               \
        wg_fence();                                                                    \
        WGMMA_F32(AT, BT);                                                             \
        wg_commit_wait();                                                              \
        if (promote > 0 && ++cnt == promote) {                                         \
            a0 = __fadd_rn(a0, d0); a1 = __fadd_rn(a1, d1);                            \
            a2 = __fadd_rn(a2, d2); a3 = __fadd_rn(a3, d3);                            \
            d0 = d1 = d2 = d3 = 0.0f; cnt = 0;                                         \
        }                                                                              \
    }                                                                                  \
    if (promote > 0) {                                                                 \
        if (cnt > 0) {                                                                 \
            a0 = __fadd_rn(a0, d0); a1 = __fadd_rn(a1, d1);                            \
            a2 = __fadd_rn(a2, d2); a3 = __fadd_rn(a3, d3);                            \
        }                                                                              \
        d0 = a0; d1 = a1; d2 = a2; d3 = a3;                                            \
    }                                                                                  \
    D[(size_t)r0 * N + c0] = d0; D[(size_t)r0 * N + c0 + 1] = d1;                      \
    D[(size_t)r1 * N + c0] = d2; D[(size_t)r1 * N + c0 + 1] = d3;                      \
}

// ------------------------------------------- mma.sync m16n8k32 (f32 accumulate)
// One instance per warp: A (16x32 bytes), Bt (8x32 bytes), C/D (16x8).  blockDim = 32*wpb.
// The bf16/fp16 m16n8k16 and tf32 m16n8k8 forms hold the same bytes in the same registers (a
// register is 4 FP8, 2 bf16/fp16 or 1 tf32 element along K), so only the instruction changes.
#define DEF_MMA(AT, BT) DEF_MMA_AS(mma_f32_##AT##_##BT, "m16n8k32.row.col.f32." #AT "." #BT ".f32")
#define DEF_MMA_AS(NAME, SHAPE_TYPES)                                                  \
extern "C" __global__ void NAME(const uint8_t* __restrict__ A,                         \
        const uint8_t* __restrict__ Bt, const float* __restrict__ C,                  \
        float* __restrict__ D, int n_inst) {                                           \
    const int inst = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);              \
    if (inst >= n_inst) return;                                                        \
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;                    \
    const uint8_t* Ai = A + (size_t)inst * 16 * 32;                                    \
    const uint8_t* Bi = Bt + (size_t)inst * 8 * 32;                                    \
    const float* Ci = C + (size_t)inst * 16 * 8;                                       \
    uint32_t a0 = *(const uint32_t*)(Ai + g * 32 + 4 * t);                             \
    uint32_t a1 = *(const uint32_t*)(Ai + (g + 8) * 32 + 4 * t);                       \
    uint32_t a2 = *(const uint32_t*)(Ai + g * 32 + 16 + 4 * t);                        \
    uint32_t a3 = *(const uint32_t*)(Ai + (g + 8) * 32 + 16 + 4 * t);                  \
    uint32_t b0 = *(const uint32_t*)(Bi + g * 32 + 4 * t);                             \
    uint32_t b1 = *(const uint32_t*)(Bi + g * 32 + 16 + 4 * t);                        \
    float d0 = Ci[g * 8 + 2 * t], d1 = Ci[g * 8 + 2 * t + 1];                          \
    float d2 = Ci[(g + 8) * 8 + 2 * t], d3 = Ci[(g + 8) * 8 + 2 * t + 1];              \
    asm volatile("mma.sync.aligned." SHAPE_TYPES " "                                   \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"             \
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)                              \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));              \
    float* Di = D + (size_t)inst * 16 * 8;                                             \
    Di[g * 8 + 2 * t] = d0; Di[g * 8 + 2 * t + 1] = d1;                                \
    Di[(g + 8) * 8 + 2 * t] = d2; Di[(g + 8) * 8 + 2 * t + 1] = d3;                    \
}

#define DEF_ALL(AT, BT) DEF_WGMMA_F32(AT, BT) DEF_WGMMA_F16(AT, BT) DEF_WGMMA_CHAIN(AT, BT) DEF_MMA(AT, BT)
DEF_ALL(e4m3, e4m3)
DEF_ALL(e4m3, e5m2)
DEF_ALL(e5m2, e4m3)
DEF_ALL(e5m2, e5m2)

// bf16 / fp16 (K = 16) and tf32 (K = 8) wgmma and mma.sync: A, Bt and C/D as for the FP8 forms above (the
// operands' codes as bytes, little-endian; tf32 as the fp32 bit pattern with the low 13 bits 0)
DEF_WGMMA_F32_AS(wgmma_f32_bf16, WGMMA_F32_K16(bf16))
DEF_WGMMA_F32_AS(wgmma_f32_f16, WGMMA_F32_K16(f16))
DEF_WGMMA_F32_AS(wgmma_f32_tf32, WGMMA_F32_TF32())
DEF_WGMMA_F16_AS(wgmma_f16_f16, WGMMA_F16_K16())
DEF_MMA_AS(mma_f32_bf16, "m16n8k16.row.col.f32.bf16.bf16.f32")
DEF_MMA_AS(mma_f32_f16, "m16n8k16.row.col.f32.f16.f16.f32")
DEF_MMA_AS(mma_f32_tf32, "m16n8k8.row.col.f32.tf32.tf32.f32")

// mma.sync m16n8k16 with an f16 accumulator: C/D as fp16 bit patterns (uint16), (16x8)
extern "C" __global__ void mma_f16_f16(const uint8_t* __restrict__ A, const uint8_t* __restrict__ Bt,
                                       const uint16_t* __restrict__ C, uint16_t* __restrict__ D, int n_inst) {
    const int inst = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (inst >= n_inst) return;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint8_t* Ai = A + (size_t)inst * 16 * 32;
    const uint8_t* Bi = Bt + (size_t)inst * 8 * 32;
    const uint16_t* Ci = C + (size_t)inst * 16 * 8;
    uint32_t a0 = *(const uint32_t*)(Ai + g * 32 + 4 * t);
    uint32_t a1 = *(const uint32_t*)(Ai + (g + 8) * 32 + 4 * t);
    uint32_t a2 = *(const uint32_t*)(Ai + g * 32 + 16 + 4 * t);
    uint32_t a3 = *(const uint32_t*)(Ai + (g + 8) * 32 + 16 + 4 * t);
    uint32_t b0 = *(const uint32_t*)(Bi + g * 32 + 4 * t);
    uint32_t b1 = *(const uint32_t*)(Bi + g * 32 + 16 + 4 * t);
    uint32_t h0 = (uint32_t)Ci[g * 8 + 2 * t] | ((uint32_t)Ci[g * 8 + 2 * t + 1] << 16);
    uint32_t h1 = (uint32_t)Ci[(g + 8) * 8 + 2 * t] | ((uint32_t)Ci[(g + 8) * 8 + 2 * t + 1] << 16);
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};\n"
                 : "+r"(h0), "+r"(h1)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    uint16_t* Di = D + (size_t)inst * 16 * 8;
    Di[g * 8 + 2 * t] = (uint16_t)(h0 & 0xFFFF); Di[g * 8 + 2 * t + 1] = (uint16_t)(h0 >> 16);
    Di[(g + 8) * 8 + 2 * t] = (uint16_t)(h1 & 0xFFFF); Di[(g + 8) * 8 + 2 * t + 1] = (uint16_t)(h1 >> 16);
}

// ------------------------------------------------------------- FP8 conversions
// Input float32 bit patterns start + 2*i and start + 2*i + 1 are converted by one
// cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 (the only forms ptxas accepts: the
// non-satfinite forms are rejected).  out[2*i] = cvt(start+2i),
// out[2*i+1] = cvt(start+2i+1).
#define DEF_CVT(FMT)                                                                   \
extern "C" __global__ void cvt_satfinite_##FMT(uint16_t* __restrict__ out,            \
                                                unsigned int start, long long n_pairs) { \
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;                    \
    if (i >= n_pairs) return;                                                          \
    unsigned int b0 = start + (unsigned int)(2 * i);                                   \
    float x0 = __uint_as_float(b0), x1 = __uint_as_float(b0 + 1u);                     \
    uint16_t r;                                                                        \
    asm("cvt.rn.satfinite." #FMT "x2.f32 %0, %1, %2;" : "=h"(r) : "f"(x1), "f"(x0));   \
    out[i] = r;                                                                        \
}
DEF_CVT(e4m3)
DEF_CVT(e5m2)
