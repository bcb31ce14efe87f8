// ptx.cuh — the inline-PTX wrappers the kernels share (sm_80 and up): shared-memory addresses and
// loads, cp.async copies, and the f16 m16n8k16 tensor-core MMA; and for the sm_90a kernels (w8a8.cu,
// a16_wgmma.cu) the wgmma fences and the shared-memory matrix descriptor. One definition each, so
// the kernels that stage tiles (attention_cuda.cu, kernels/a16_*, kernels/w8a8.cu) agree on them.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace ptq::cuda::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared, bypassing L1; bytes = 0 writes 16 zero bytes (and reads nothing).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
// 4 or 8 bytes global -> shared through L1 (cp.async.cg takes 16 only); 4: bytes = 0 writes zeros.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// c (fp32, 4 per lane) += a (16 x 16 f16, row) · b (16 x 8 f16, col), the PTX fragment layouts.
__device__ __forceinline__ void mma_m16n8k16_f16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (a & b) | c in one LOP3. Written as C, (w & mask) | magic with both constants immediates takes two:
// a SASS LOP3 holds one immediate (the A16 dequantization).
// d = a · b + c over int8 (m16n8k32, row.col, int32 accumulation), in place in c.
__device__ __forceinline__ void mma_m16n8k32_s8(int* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));   // 0xEA = (0xF0 & 0xCC) | 0xAA
  return d;
}
// The bytes of {b, a} picked by sel (PTX prmt, default mode).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Loads from shared memory by a 32-bit shared address (no generic-to-shared conversion: one LDS
// with the offset as an immediate). Volatile, with a memory clobber: never moved across the
// barrier that orders the copies it reads.
__device__ __forceinline__ uint4 ld_shared_u4(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ uint2 ld_shared_u2(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a) : "memory");
  return v;
}

// Shared-memory writes of the generic proxy (st.shared, cp.async) made visible to the async proxy
// that wgmma and the bulk copies read through.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// A barrier of kCount threads (a multiple of 32) on named barrier id (1..15; 0 is
// __syncthreads'), e.g. one warpgroup's.
template <int kCount>
__device__ __forceinline__ void named_barrier(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kCount) : "memory"); }

// sm_90a only (wgmma): a shared-memory matrix descriptor for a K-major tile in the 128-byte swizzle
// (rows of 128 bytes, 8-row groups 1024 bytes apart, the tile 1024-byte aligned; advancing the
// start by 32 bytes steps K by 32 bytes), and the fences of the asynchronous wgmma.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t saddr) {
  return uint64_t((saddr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
// The descriptor of the tile bytes further on (a multiple of 16 that stays inside shared memory):
// the start address field (bits 0..13, the address / 16) plus bytes / 16, no carry out of it, so
// smem_desc_sw128(saddr + bytes) in one add where the K steps of a tile advance (32 bytes each).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of the accumulators d (fp32 or int32) across the
// asynchronous wgmma region: an empty asm that "changes" each register.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_regs(int (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

}  // namespace ptq::cuda::ptx
