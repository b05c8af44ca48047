// fp8sim hardware oracle: scaled FP8 GEMM with wgmma and promotion (DeepSeek-V3 recipe)
// for sm_90a.  Correctness first: no TMA, no pipelining, no swizzle.
//
// Build: nvcc -cubin -O3 -gencode=arch=compute_90a,code=sm_90a gemm.cu -o gemm.cubin
//
// Layouts (shared with gpu/gemm.py)
//   A  : uint8 E4M3 codes, row-major (M, Kp)   (K contiguous)
//   Bt : uint8 E4M3 codes, row-major (N, Kp)   (B transposed, K contiguous)
//   sa : float32 (M, nks)   dequantization scale of A per row and K block of `kscale` elements
//   sb : float32 (nks, N)   dequantization scale of B per K block, expanded over the columns
//   D  : float32 (M, N); Dbf: bf16 bit patterns (M, N) = cvt.rn.bf16.f32(D)
//   M % 64 == 0, N % 32 == 0, Kp % 32 == 0 (the host pads with zero codes).
//
// One CTA (one warpgroup, 128 threads) computes a 64 x 32 tile of D with four
// wgmma.mma_async.m64n8k32.f32.e4m3.e4m3 per K step of 32 (the instruction
// whose accumulator fp8sim models; validated on the H200 in docs/tensorcore.md).
//
// promote > 0 (instructions): every `promote` K steps the tensor-core partial is
// promoted into an fp32 register accumulator on the CUDA cores exactly as
// DeepGEMM's sm90 FP8 kernel does it,
//     float s = sa * sb;                  // FMUL (rounded)
//     final   = fmaf(s, partial, final);  // `final += s * partial`, contracted to FFMA by nvcc
// and the partial restarts from zero (scale-d = 0 is not used: the registers are zeroed).
// promote == 0: no promotion; the accumulator runs over all of K and the scale is
// applied once at the end: D = (sa[:, 0] * sb[0, :]) * acc (two FMULs).

#include <cstdint>
#include <cuda_bf16.h>

#include "sm90_common.cuh"

// rows x 32-byte K slice starting at k0 of a row-major (rows x ldk) matrix -> core-matrix layout,
// 4 bytes per thread and step (ldk % 4 == 0, k0 % 32 == 0)
__device__ __forceinline__ void load_tile32(uint8_t* s, const uint8_t* g, int rows, int ldk, int k0) {
    for (int i = threadIdx.x; i < rows * 8; i += blockDim.x) {
        int r = i >> 3, k = (i & 7) * 4;
        *reinterpret_cast<uint32_t*>(s + tile_off(r, k)) =
            *reinterpret_cast<const uint32_t*>(g + (size_t)r * ldk + k0 + k);
    }
}

#define WGMMA_N8(D0, D1, D2, D3, DA, DB)                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"                           \
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3"                 \
                 " {%0,%1,%2,%3}, %4, %5, p, 1, 1;\n}\n"                               \
                 : "+f"(D0), "+f"(D1), "+f"(D2), "+f"(D3)                              \
                 : "l"(DA), "l"(DB), "r"(1))

extern "C" __global__ void __launch_bounds__(128)
fp8_gemm_e4m3(const uint8_t* __restrict__ A, const uint8_t* __restrict__ Bt,
              const float* __restrict__ sa, const float* __restrict__ sb,
              float* __restrict__ D, uint16_t* __restrict__ Dbf,
              int M, int N, int Kp, int nks, int kscale, int promote, int lbo, int sbo) {
    __shared__ __align__(256) uint8_t sA[64 * 32];
    __shared__ __align__(256) uint8_t sB[32 * 32];
    const int n0 = blockIdx.x * 32, m0 = blockIdx.y * 64;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = m0 + 16 * w + g, r1 = r0 + 8;
    float d[4][4], f[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) { d[j][q] = 0.0f; f[j][q] = 0.0f; }
    const uint64_t da = make_desc(sA, lbo, sbo);
    uint64_t db[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) db[j] = make_desc(sB + 256 * j, lbo, sbo);
    int cnt = 0;
    for (int k0 = 0; k0 < Kp; k0 += 32) {
        __syncthreads();
        load_tile32(sA, A + (size_t)m0 * Kp, 64, Kp, k0);
        load_tile32(sB, Bt + (size_t)n0 * Kp, 32, Kp, k0);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int j = 0; j < 4; ++j) WGMMA_N8(d[j][0], d[j][1], d[j][2], d[j][3], da, db[j]);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (promote > 0 && (++cnt == promote || k0 + 32 >= Kp)) {
            const int kb = k0 / kscale;
            const float sa0 = sa[(size_t)r0 * nks + kb], sa1 = sa[(size_t)r1 * nks + kb];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int c = n0 + 8 * j + 2 * t;
                const float sb0 = sb[(size_t)kb * N + c], sb1 = sb[(size_t)kb * N + c + 1];
                f[j][0] = __fmaf_rn(__fmul_rn(sa0, sb0), d[j][0], f[j][0]);
                f[j][1] = __fmaf_rn(__fmul_rn(sa0, sb1), d[j][1], f[j][1]);
                f[j][2] = __fmaf_rn(__fmul_rn(sa1, sb0), d[j][2], f[j][2]);
                f[j][3] = __fmaf_rn(__fmul_rn(sa1, sb1), d[j][3], f[j][3]);
                d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
            }
            cnt = 0;
        }
    }
    const float sa0 = sa[(size_t)r0 * nks], sa1 = sa[(size_t)r1 * nks];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c = n0 + 8 * j + 2 * t;
        float o[4];
        if (promote > 0) {
            o[0] = f[j][0]; o[1] = f[j][1]; o[2] = f[j][2]; o[3] = f[j][3];
        } else {
            const float sb0 = sb[c], sb1 = sb[c + 1];
            o[0] = __fmul_rn(__fmul_rn(sa0, sb0), d[j][0]);
            o[1] = __fmul_rn(__fmul_rn(sa0, sb1), d[j][1]);
            o[2] = __fmul_rn(__fmul_rn(sa1, sb0), d[j][2]);
            o[3] = __fmul_rn(__fmul_rn(sa1, sb1), d[j][3]);
        }
        const size_t i00 = (size_t)r0 * N + c, i10 = (size_t)r1 * N + c;
        D[i00] = o[0]; D[i00 + 1] = o[1]; D[i10] = o[2]; D[i10 + 1] = o[3];
        Dbf[i00] = __bfloat16_as_ushort(__float2bfloat16_rn(o[0]));
        Dbf[i00 + 1] = __bfloat16_as_ushort(__float2bfloat16_rn(o[1]));
        Dbf[i10] = __bfloat16_as_ushort(__float2bfloat16_rn(o[2]));
        Dbf[i10 + 1] = __bfloat16_as_ushort(__float2bfloat16_rn(o[3]));
    }
}
