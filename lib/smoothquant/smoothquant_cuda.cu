// smoothquant_cuda.cu — SmoothQuant's alpha search on the GPU (smoothquant_cuda.h).
// Reference: smoothed_errors in smoothquant.cpp (fp32 on the host).
//
// Contract, per call: X [M, K] (the subsampled unsmoothed input), ws the Linears fed by one norm
// ([N_i, K] each, stacked into W [N, K]), their column maxima w_absmax (the caller's, so that each
// alpha's factors s are formed on the host by the reference's own function), the activation mode
// and a list of alphas (negative: no smoothing, i.e. s = 1). Once: W and X uploaded, y = X·Wᵀ in
// fp32 (cuBLAS SGEMM, no TF32). Per alpha:
//   x codes  q_x[m, k] = clamp(rint((X[m, k] * (1/s_k)) / s_x[m]), -128, 127), s_x = row absmax / 127
//            (per tensor: the absmax of all of X / s, or the given static scale); !(s_x > 0) -> 1
//   w codes  q_w[n, k] = clamp(rint((W[n, k] * s_k) / s_w[n]), -128, 127), s_w = 2 absmax / 255
//            (ptqkit's symmetric 8-bit grid; an all-zero row takes absmax 1)
//   error    sum_{m, n} ((Σ_k q_x q_w) · s_x[m] · s_w[n] - y[m, n])^2 / M, the sums int32 (cuBLAS's
//            int8 GEMM: exact for K < 2^17), the squares summed in fp64, rows then in a fixed order.
// Every code equals the host's (the same float operations, each rounded once: __fmul_rn keeps the
// compiler from fusing them); the host rounds each product in fp32 and forms X·Wᵀ with Eigen, so
// the errors agree with it to ~1e-4 relative (tests/test_smoothquant_cuda.cpp). cuBLAS's int8 GEMM
// wants dimensions in multiples of 4: the codes are zero-padded (M, N to 4, K to 16).
// Memory: X, W, y in fp32, the int32 sums [M, N], the codes: ~1.6 GB for a 4,096-row search of
// Llama-3-8B's gate, up (N = 28,672, K = 4,096).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "cuda/blas.h"
#include "cuda/runtime.h"
#include "smoothquant/smoothquant_cuda.h"

namespace ptq::cuda {

namespace {
constexpr int kThreads = 256;
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The block's maximum of v (v >= 0), in every thread.
__device__ float block_max(float v) {
  __shared__ float sh[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
  __syncthreads();
  float m = sh[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, sh[w]);
  __syncthreads();
  return m;
}

// rowmax[m] = max_k |X[m, k] * inv_s[k]|, a block a row.
__global__ void row_absmax_kernel(const float* X, int64_t K, const float* inv_s, float* rowmax) {
  const float* x = X + blockIdx.x * K;
  float m = 0.0f;
  for (int64_t k = threadIdx.x; k < K; k += kThreads) m = fmaxf(m, fabsf(__fmul_rn(x[k], inv_s[k])));
  m = block_max(m);
  if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

// Per tensor: *scale = max_m rowmax[m] / 127 (one block).
__global__ void tensor_scale_kernel(const float* rowmax, int64_t M, float* scale) {
  float m = 0.0f;
  for (int64_t r = threadIdx.x; r < M; r += kThreads) m = fmaxf(m, rowmax[r]);
  m = block_max(m);
  if (threadIdx.x == 0) *scale = m / 127.0f;
}

// The activation codes of row blockIdx.x (as quantize_rows on the host): scale rowmax / 127 per
// token, or *tensor_scale; !(s > 0) -> 1.
__global__ void quantize_x_kernel(const float* X, int64_t K, int64_t Kp, const float* inv_s, const float* rowmax, const float* tensor_scale,
                                  int8_t* q, float* sx) {
  const int64_t r = blockIdx.x;
  float s = tensor_scale ? *tensor_scale : rowmax[r] / 127.0f;
  if (!(s > 0.0f)) s = 1.0f;
  const float* x = X + r * K;
  for (int64_t k = threadIdx.x; k < K; k += kThreads)
    q[r * Kp + k] = int8_t(fminf(127.0f, fmaxf(-128.0f, rintf(__fdiv_rn(__fmul_rn(x[k], inv_s[k]), s)))));
  if (threadIdx.x == 0) sx[r] = s;
}

// The weight codes of row blockIdx.x of W·diag(s) on ptqkit's symmetric 8-bit grid (find_grid and
// quantize_code on the host: scale = (max - min) / 255 with min = -max, code = rint(w / scale) + 128
// clamped to [0, 255], stored less 128).
__global__ void quantize_w_kernel(const float* W, int64_t K, int64_t Kp, const float* s, int8_t* q, float* sw) {
  const int64_t n = blockIdx.x;
  const float* w = W + n * K;
  float m = 0.0f;
  for (int64_t k = threadIdx.x; k < K; k += kThreads) m = fmaxf(m, fabsf(__fmul_rn(w[k], s[k])));
  float xmax = block_max(m), xmin = -xmax;
  if (xmax == 0.0f) { xmin = -1.0f; xmax = 1.0f; }
  float scale = __fdiv_rn(xmax - xmin, 255.0f);
  if (!(scale > 0.0f)) scale = ldexpf(1.0f, -24);
  for (int64_t k = threadIdx.x; k < K; k += kThreads) {
    const float c = fminf(255.0f, fmaxf(0.0f, __fadd_rn(rintf(__fdiv_rn(__fmul_rn(w[k], s[k]), scale)), 128.0f)));
    q[n * Kp + k] = int8_t(int(c) - 128);
  }
  if (threadIdx.x == 0) sw[n] = scale;
}

// part[m] = sum_n ((acc[m, n] · s_x[m]) · s_w[n] - y[m, n])^2 in fp64, a block a row, fixed order.
__global__ void row_error_kernel(const int32_t* acc, int64_t Np, const float* sx, const float* sw, const float* y, int64_t N, double* part) {
  __shared__ double sh[kThreads];
  const int64_t m = blockIdx.x;
  double e = 0;
  for (int64_t n = threadIdx.x; n < N; n += kThreads) {
    const float d = __fsub_rn(__fmul_rn(__fmul_rn(float(acc[m * Np + n]), sx[m]), sw[n]), y[m * N + n]);
    e += double(d) * double(d);
  }
  sh[threadIdx.x] = e;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[m] = sh[0];
}

// *out = sum_m part[m] / M (one block, fixed order).
__global__ void mean_kernel(const double* part, int64_t M, double* out) {
  __shared__ double sh[kThreads];
  double e = 0;
  for (int64_t r = threadIdx.x; r < M; r += kThreads) e += part[r];
  sh[threadIdx.x] = e;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = sh[0] / double(M);
}
}  // namespace

std::vector<double> smoothed_errors(const MatF& X, const VecF& act_absmax, const VecF& w_absmax, const std::vector<const MatF*>& ws,
                                    const ActQuant& act, const std::vector<double>& alphas) {
  const int64_t M = X.rows(), K = X.cols();
  int64_t N = 0;
  for (const MatF* W : ws) {
    if (W->cols() != K) fail(Errc::usage, "", "smoothed_errors", "a Linear's input width differs from the activations'");
    N += W->rows();
  }
  if (M == 0 || N == 0 || alphas.empty()) return std::vector<double>(alphas.size(), 0.0);
  if (K >= (int64_t(1) << 17)) fail(Errc::usage, "", "smoothed_errors", "K must be below 2^17 for int32 sums, not " + std::to_string(K));
  const int64_t Mp = round_up(M, 4), Np = round_up(N, 4), Kp = round_up(K, 16);

  DeviceBuffer<float> dX(size_t(M * K), "SmoothQuant search: activations"), dW(size_t(N * K), "SmoothQuant search: weights");
  copy_to_device(dX.get(), X.data(), size_t(M * K) * 4);
  int64_t off = 0;
  for (const MatF* W : ws) {
    copy_to_device(dW.get() + off * K, W->data(), size_t(W->size()) * 4);
    off += W->rows();
  }
  // y = X·Wᵀ: row-major y [M, N] is column-major yᵀ = W · Xᵀ.
  DeviceBuffer<float> dy(size_t(M * N), "SmoothQuant search: float outputs");
  const float one = 1.0f, zero = 0.0f;
  PTQ_CUBLAS(cublasGemmEx(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, dW.get(), CUDA_R_32F, int(K), dX.get(),
                          CUDA_R_32F, int(K), &zero, dy.get(), CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
  DeviceBuffer<int8_t> qx(size_t(Mp * Kp), "SmoothQuant search: activation codes"), qw(size_t(Np * Kp), "SmoothQuant search: weight codes");
  fill_bytes(qx.get(), 0, qx.size());
  fill_bytes(qw.get(), 0, qw.size());
  DeviceBuffer<int32_t> acc(size_t(Mp * Np), "SmoothQuant search: int32 sums");
  DeviceBuffer<float> ds(size_t(K), "s"), dinv(size_t(K), "1/s"), rowmax(size_t(M), "row absmax"), sx(size_t(M), "s_x"), sw(size_t(N), "s_w"),
      tscale(1, "tensor scale");
  DeviceBuffer<double> part(size_t(M), "row errors"), derr(alphas.size(), "errors");
  const bool per_tensor = act.mode == ActQuant::per_tensor;
  const int32_t ione = 1, izero = 0;
  for (size_t a = 0; a < alphas.size(); ++a) {
    VecF s = alphas[a] < 0 ? VecF::Ones(K) : smoothing_factors_from(act_absmax, w_absmax, alphas[a]);
    const VecF inv = s.cwiseInverse();   // as the host's X * s.cwiseInverse().asDiagonal()
    copy_to_device(ds.get(), s.data(), size_t(K) * 4);
    copy_to_device(dinv.get(), inv.data(), size_t(K) * 4);
    row_absmax_kernel<<<unsigned(M), kThreads>>>(dX.get(), K, dinv.get(), rowmax.get());
    PTQ_CUDA_LAUNCH("row_absmax_kernel");
    const float* tensor_scale = nullptr;
    if (per_tensor) {
      if (act.static_scale != 0) copy_to_device(tscale.get(), &act.static_scale, 4);
      else {
        tensor_scale_kernel<<<1, kThreads>>>(rowmax.get(), M, tscale.get());
        PTQ_CUDA_LAUNCH("tensor_scale_kernel");
      }
      tensor_scale = tscale.get();
    }
    quantize_x_kernel<<<unsigned(M), kThreads>>>(dX.get(), K, Kp, dinv.get(), rowmax.get(), tensor_scale, qx.get(), sx.get());
    PTQ_CUDA_LAUNCH("quantize_x_kernel");
    quantize_w_kernel<<<unsigned(N), kThreads>>>(dW.get(), K, Kp, ds.get(), qw.get(), sw.get());
    PTQ_CUDA_LAUNCH("quantize_w_kernel");
    PTQ_CUBLAS(cublasGemmEx(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(Np), int(Mp), int(Kp), &ione, qw.get(), CUDA_R_8I, int(Kp), qx.get(),
                            CUDA_R_8I, int(Kp), &izero, acc.get(), CUDA_R_32I, int(Np), CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
    row_error_kernel<<<unsigned(M), kThreads>>>(acc.get(), Np, sx.get(), sw.get(), dy.get(), N, part.get());
    PTQ_CUDA_LAUNCH("row_error_kernel");
    mean_kernel<<<1, kThreads>>>(part.get(), M, derr.get() + a);
    PTQ_CUDA_LAUNCH("mean_kernel");
  }
  std::vector<double> e(alphas.size());
  copy_to_host(e.data(), derr.get(), e.size() * 8);
  return e;
}

}  // namespace ptq::cuda
