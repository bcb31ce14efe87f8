// f16_gemv.h — f16 Linears at decode-sized M through the A16 tensor-core kernel (kernels/a16_mma.cuh
// with F16RowFormat, a16_formats.cuh): the weights read in place, as stored ([N, K] row-major),
// launched with programmatic dependent launch like the packed formats' kernels (cuBLAS's kernels
// cannot wait under it, so a decode step of cuBLAS GEMVs pays each one's ramp). cuBLAS elsewhere.
// The reference is an fp64 product of the same f16 operands (tests/test_kernels_cuda.cpp).
#pragma once
#include <cstdint>

namespace ptq::cuda {

// The kernel serves M rows of an [N, K] layer: 1 <= M <= f16_mma_max_rows() (8, where it measured
// faster than cuBLAS on the Llama-7B decode: docs/lab/2026-11-24-decode-h200.md, run 45;
// PTQKIT_F16_MMA_MAX overrides, 0 turns it off) and K % 64 == 0.
int f16_mma_max_rows();
bool f16_mma_serves(int64_t M, int64_t K);

// y [M, N] fp32 = x [M, K] · Wᵀ + beta · y (beta 0: y only written), x and W f16 on the device,
// fp32 accumulation: the kernel where it serves (or where force_mma, for M <= 64 and K % 64 == 0:
// tests), else cuBLAS. Asynchronous on the thread's current stream.
void f16_linear_f32(const void* W, const void* x, int64_t M, int64_t N, int64_t K, float* y, float beta, bool force_mma = false);

}  // namespace ptq::cuda
