// loss_cuda.cu — the layer-wise output error sum(E H E^T) / 2, E = W - Wq, on the GPU (gptq_cuda.h).
// Reference: lib/gptq/gptq.cpp output_error (fp64 on the host); output_errors matches it to fp64
// rounding, output_error_tf32 to ~1e-4 (TF32 products). Both are memory-light: rows in chunks.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/blas.h"
#include "gptq/gptq_cuda.h"

namespace ptq::cuda {

namespace {
cublasHandle_t blas() { return blas_handle(); }
int blocks(int64_t n, int t = 256) { return int((n + t - 1) / t); }

// e = fp64(a - b), the difference taken in fp32.
__global__ void diff_widen_kernel(const float* a, const float* b, int64_t n, double* e) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) e[i] = double(a[i] - b[i]);
}
__global__ void diff_kernel(const float* a, const float* b, int64_t n, float* e) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) e[i] = a[i] - b[i];
}
__global__ void narrow_scaled_kernel(const double* x, int64_t n, double scale, float* y) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = float(scale * x[i]);
}
// acc[r] += sum_j E[r, j] G[r, j] for j < nc (E row stride lde, G rows of nc), fp64; a warp per row.
__global__ void block_row_dot_kernel(const float* E, int64_t lde, const float* G, int64_t nc, int64_t rows, double* acc) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  double s = 0;
  for (int64_t j = lane; j < nc; j += 32) s += double(E[r * lde + j]) * double(G[r * nc + j]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) acc[r] += s;
}
// partial[block] = sum over the block's rows of dot(G[r], E[r]) (deterministic: fixed order).
__global__ void row_dot_kernel(const double* G, const double* E, int64_t rows, int64_t n, double* partial) {
  __shared__ double sh[256];
  double s = 0;
  const int64_t r = blockIdx.x;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += G[r * n + j] * E[r * n + j];
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[r] = sh[0];
}

}  // namespace

std::pair<double, double> output_errors(const float* W, const float* Wq, const float* Wr, int64_t rows, int64_t cols, HessianRef H) {
  const double* dH = H.sum;
  const double hscale = H.scale;
  // 1024 rows at a time: E = W - Wq in fp32 (as lib/gptq's output_error forms it), widened to
  // fp64, G = E H by DGEMM, then the row dots; the device needs ~0.2 GB whatever the layer.
  constexpr int64_t kRows = 1024;
  const int64_t rc = std::min(kRows, rows);
  DeviceBuffer<double> E64(size_t(rc * cols), "output error: W - Wq (fp64 rows)"), G(size_t(rc * cols), "output error: (W - Wq) H (rows)"),
      part(size_t(2 * rows), "output error: sums");
  const double zero = 0.0;
  for (int k = 0; k < (Wr ? 2 : 1); ++k) {
    const float* B = k == 0 ? Wq : Wr;
    for (int64_t r0 = 0; r0 < rows; r0 += rc) {
      const int64_t nr = std::min(rc, rows - r0);
      diff_widen_kernel<<<blocks(nr * cols), 256>>>(W + r0 * cols, B + r0 * cols, nr * cols, E64.get());
      PTQ_CUDA_LAUNCH("diff_widen_kernel");
      // row-major G = E H (H symmetric): column-major G^T = H E^T
      PTQ_CUBLAS(cublasDgemm(blas(), CUBLAS_OP_N, CUBLAS_OP_N, int(cols), int(nr), int(cols), &hscale, dH, int(cols), E64.get(), int(cols), &zero,
                             G.get(), int(cols)));
      row_dot_kernel<<<unsigned(nr), 256>>>(G.get(), E64.get(), nr, cols, part.get() + k * rows + r0);
      PTQ_CUDA_LAUNCH("row_dot_kernel");
    }
  }
  std::vector<double> p(static_cast<size_t>(2 * rows));
  PTQ_CUDA(cudaMemcpy(p.data(), part.get(), size_t(Wr ? 2 : 1) * size_t(rows) * 8, cudaMemcpyDeviceToHost));
  double a = 0, b = 0;
  for (int64_t r = 0; r < rows; ++r) a += p[size_t(r)];
  for (int64_t r = 0; Wr && r < rows; ++r) b += p[size_t(rows + r)];
  return {a / 2.0, Wr ? b / 2.0 : a / 2.0};
}

double output_error_tf32(const float* W, const float* Wq, int64_t rows, int64_t cols, HessianRef H) {
  const double* dH = H.sum;
  const double hscale = H.scale;
  // Rows of E = W - Wq (fp32) in chunks of kRows, H in blocks of kCols of its rows (symmetric:
  // = columns) narrowed to fp32; G = E H_blk^T on TF32 tensor cores (fp32 accumulation), then
  // sum over the block of E (.) G per row in fp64, in a fixed order.
  constexpr int64_t kRows = 2048, kCols = 2048;
  const int64_t rc = std::min(kRows, rows), cb = std::min(kCols, cols);
  DeviceBuffer<float> E(size_t(rc * cols), "output error: W - Wq (fp32 rows)"), Hb(size_t(cb * cols), "output error: H (fp32 block)"),
      G(size_t(rc * cb), "output error: (W - Wq) H (block)");
  DeviceBuffer<double> part(size_t(rows), "output error: sums");
  PTQ_CUDA(cudaMemset(part.get(), 0, size_t(rows) * 8));
  const float one = 1.0f, zero = 0.0f;
  for (int64_t r0 = 0; r0 < rows; r0 += rc) {
    const int64_t nr = std::min(rc, rows - r0);
    diff_kernel<<<blocks(nr * cols), 256>>>(W + r0 * cols, Wq + r0 * cols, nr * cols, E.get());
    PTQ_CUDA_LAUNCH("diff_kernel");
    for (int64_t c0 = 0; c0 < cols; c0 += cb) {
      const int64_t nc = std::min(cb, cols - c0);
      narrow_scaled_kernel<<<blocks(nc * cols), 256>>>(dH + c0 * cols, nc * cols, hscale, Hb.get());
      PTQ_CUDA_LAUNCH("narrow_scaled_kernel");
      // column-major G^T [nc, nr] = Hb (row-major [nc, cols])^T^T . E^T
      PTQ_CUBLAS(cublasGemmEx(blas(), CUBLAS_OP_T, CUBLAS_OP_N, int(nc), int(nr), int(cols), &one, Hb.get(), CUDA_R_32F, int(cols), E.get(),
                              CUDA_R_32F, int(cols), &zero, G.get(), CUDA_R_32F, int(nc), CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
      block_row_dot_kernel<<<blocks(nr * 32), 256>>>(E.get() + c0, cols, G.get(), nc, nr, part.get() + r0);
      PTQ_CUDA_LAUNCH("block_row_dot_kernel");
    }
  }
  std::vector<double> p(static_cast<size_t>(rows));
  PTQ_CUDA(cudaMemcpy(p.data(), part.get(), size_t(rows) * 8, cudaMemcpyDeviceToHost));
  double a = 0;
  for (double v : p) a += v;
  return a / 2.0;
}

std::pair<double, double> output_errors(const MatF& W, const MatF& Wq, const MatF* Wr, HessianRef H) {
  const int64_t rows = W.rows(), cols = W.cols(), n = rows * cols;
  DeviceBuffer<float> d(size_t(Wr ? 3 : 2) * size_t(n), "output error: W, Wq, Wr");
  copy_to_device(d.get(), W.data(), size_t(n) * 4);
  copy_to_device(d.get() + n, Wq.data(), size_t(n) * 4);
  if (Wr) copy_to_device(d.get() + 2 * n, Wr->data(), size_t(n) * 4);
  return output_errors(d.get(), d.get() + n, Wr ? d.get() + 2 * n : nullptr, rows, cols, H);
}

}  // namespace ptq::cuda
