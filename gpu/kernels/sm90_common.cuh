// Shared device helpers of fp8sim's sm_90a kernels (tc.cu, gemm.cu).
//
// Byte offset of element (row r, k) inside a (rows x 32) K-major operand tile in
// shared memory, no swizzle: core matrices of 8 rows x 16 bytes,
//   (r / 8) * 256 + (k / 16) * 128 + (r % 8) * 16 + (k % 16),
// and the wgmma shared-memory matrix descriptor for it.  LBO = 128 and SBO = 256
// are the fields the H200 reads correctly (gpu/NOTES.md, run 1); they stay kernel
// arguments so that gpu.kernels.descriptor_fields() can re-check them.
#pragma once
#include <cstdint>

__device__ __forceinline__ int tile_off(int r, int k) {
    return (r >> 3) * 256 + (k >> 4) * 128 + (r & 7) * 16 + (k & 15);
}

__device__ __forceinline__ uint64_t make_desc(const void* p, int lbo, int sbo) {
    uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    uint64_t d = 0;
    d |= (uint64_t)((addr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo & 0x3FFFF) >> 4) << 16;
    d |= (uint64_t)((sbo & 0x3FFFF) >> 4) << 32;
    return d;  // base offset 0, layout type 0 (no swizzle)
}
