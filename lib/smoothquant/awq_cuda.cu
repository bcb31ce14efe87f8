// awq_cuda.cu — AWQ's search error on the GPU (awq_cuda.h). Reference: output_sq_error in awq.cpp.
//
// Contract, per call: X [M, K] (the group's calibration rows, unscaled), dW [N, K] (the Linears'
// quantization error at one candidate's scales, stacked). For chunks of at most kChunk rows of dW:
// Y_c = X · dW_cᵀ (cuBLAS SGEMM, CUBLAS_COMPUTE_32F_PEDANTIC: fp32 products, no TF32), then
// part[c][m] = Σ_n Y_c[m, n]² in fp64 (a block a row of X, a fixed tree). Returned: Σ_c Σ_m part / M
// summed on the host in order. Memory: X, one chunk of dW and Y_c [M, kChunk] in fp32.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "core/error.h"
#include "cuda/blas.h"
#include "cuda/runtime.h"
#include "smoothquant/awq_cuda.h"

namespace ptq::cuda {

namespace {
constexpr int kThreads = 256;
constexpr int64_t kChunk = 8192;

// part[m] = Σ_n Y[m, n]² (Y row-major [M, N]), fp64, one block a row.
__global__ void row_sq_kernel(const float* Y, int64_t N, double* part) {
  __shared__ double sh[kThreads];
  const int64_t m = blockIdx.x;
  double e = 0;
  for (int64_t n = threadIdx.x; n < N; n += kThreads) {
    const double y = Y[m * N + n];
    e += y * y;
  }
  sh[threadIdx.x] = e;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[m] = sh[0];
}
}  // namespace

double output_sq_error(const MatF& X, const MatF& dW) {
  const int64_t M = X.rows(), K = X.cols(), N = dW.rows();
  if (dW.cols() != K) fail(Errc::usage, "", "output_sq_error", "the weights' input width differs from the activations'");
  if (M == 0 || N == 0) return 0.0;
  const int64_t C = std::min(kChunk, N);
  DeviceBuffer<float> dX(size_t(M * K), "AWQ search: activations"), dD(size_t(C * K), "AWQ search: weight errors"),
      dY(size_t(M * C), "AWQ search: output errors");
  DeviceBuffer<double> part(size_t(M), "AWQ search: row sums");
  copy_to_device(dX.get(), X.data(), size_t(M * K) * 4);
  std::vector<double> rows(static_cast<size_t>(M));
  double sum = 0;
  const float one = 1.0f, zero = 0.0f;
  for (int64_t n0 = 0; n0 < N; n0 += C) {
    const int64_t n = std::min(C, N - n0);
    copy_to_device(dD.get(), dW.data() + n0 * K, size_t(n * K) * 4);
    // Y [M, n] row-major is column-major Yᵀ = dW_c · Xᵀ.
    PTQ_CUBLAS(cublasGemmEx(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(M), int(K), &one, dD.get(), CUDA_R_32F, int(K), dX.get(),
                            CUDA_R_32F, int(K), &zero, dY.get(), CUDA_R_32F, int(n), CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    row_sq_kernel<<<unsigned(M), kThreads>>>(dY.get(), n, part.get());
    PTQ_CUDA_LAUNCH("row_sq_kernel");
    copy_to_host(rows.data(), part.get(), size_t(M) * 8);
    for (double r : rows) sum += r;
  }
  return sum / double(M);
}

}  // namespace ptq::cuda
