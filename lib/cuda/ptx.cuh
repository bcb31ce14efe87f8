// ptx.cuh — the inline-PTX wrappers the kernels share (sm_80 and up): shared-memory addresses,
// cp.async copies, and the f16 m16n8k16 tensor-core MMA. One definition each, so the kernels that
// stage tiles (attention_cuda.cu, kernels/a16_*.cuh, kernels/w8a8.cu) agree on them.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace ptq::cuda::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared, bypassing L1; bytes = 0 writes 16 zero bytes (and reads nothing).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
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

}  // namespace ptq::cuda::ptx
