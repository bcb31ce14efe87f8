// f16_gemv.cu — contract in f16_gemv.h. y = x · Wᵀ with W f16 [N, K] row-major as stored, x f16,
// y fp32 (+ beta y): a16::run_mma with F16RowFormat (the identity dequantization; each lane loads
// 16 columns of two rows per k-step in place), k-steps unscaled; cuBLAS GemmEx (fp32 compute)
// where the kernel does not serve. Roofline at M = 1: 2 N K bytes of W (4096 x 4096: 33.6 MB,
// 8 us at the H200's ~4.2 TB/s copy rate), the same bytes cuBLAS reads.
#include "kernels/f16_gemv.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "cuda/blas.h"
#include "cuda/runtime.h"
#include "kernels/a16_dispatch.cuh"

namespace ptq::cuda {

int f16_mma_max_rows() {
  static const int n = env_int("PTQKIT_F16_MMA_MAX", 8);   // run 45: batch 1 264.4 tok/s against cuBLAS 236.6, batch 8 1,852 against 1,702; batch 32 3,820 against 5,688
  return n;
}

bool f16_mma_serves(int64_t M, int64_t K) { return M >= 1 && M <= f16_mma_max_rows() && M <= kA16MmaMaxM && K % 64 == 0; }

void f16_linear_f32(const void* W, const void* x, int64_t M, int64_t N, int64_t K, float* y, float beta, bool force_mma) {
  if (M < 1) return;
  if (force_mma && (M > kA16MmaMaxM || K % 64))
    fail(Errc::usage, "", "f16_linear_f32", "the f16 mma kernel takes M <= 64 and K % 64 == 0, got M = " + std::to_string(M) + ", K = " + std::to_string(K));
  if (force_mma || f16_mma_serves(M, K)) {
    const a16::F16RowFormat fmt{static_cast<const uint32_t*>(W), int(N), int(K)};
    a16::run_mma(fmt, false, static_cast<const uint4*>(W), static_cast<const __half*>(x), nullptr, y, beta, M, N, K);
    return;
  }
  const float one = 1.0f;
  PTQ_CUBLAS(cublasGemmEx(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, W, CUDA_R_16F, int(K), x, CUDA_R_16F, int(K), &beta, y,
                          CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace ptq::cuda
