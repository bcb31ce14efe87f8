// nll_cuda.cu — per-row NLL from device logits (contract in eval/nll_cuda.h). One block of 256
// threads per scored row: the fp32 max (exact), then Σ exp(x − max) in fp64, both reduced in shared
// memory in a fixed tree order (the same bytes on every run). Reads the row twice (the second pass
// mostly from L2): at 32,000 vocabulary entries 256 KB per row.
#include "eval/nll_cuda.h"

#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "cuda/runtime.h"

namespace ptq::cuda {

namespace {
constexpr int kThreads = 256;

template <class T, class Op>
__device__ T block_reduce(T v, T* sh, Op op) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) sh[threadIdx.x] = op(sh[threadIdx.x], sh[threadIdx.x + w]);
    __syncthreads();
  }
  const T r = sh[0];
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kThreads) nll_kernel(const float* __restrict__ logits, const int32_t* __restrict__ targets, int T, int64_t V,
                                                       double* __restrict__ nll) {
  __shared__ double sh[kThreads];
  const int64_t k = blockIdx.x, s = k / (T - 1), t = k % (T - 1);
  const float* x = logits + (s * T + t) * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += kThreads) m = fmaxf(m, x[v]);
  const double mx = block_reduce<double>(double(m), sh, [](double a, double b) { return fmax(a, b); });
  double sum = 0;
  for (int64_t v = threadIdx.x; v < V; v += kThreads) sum += exp(double(x[v]) - mx);
  sum = block_reduce<double>(sum, sh, [](double a, double b) { return a + b; });
  if (threadIdx.x == 0) nll[k] = mx + log(sum) - double(x[targets[k]]);
}
}  // namespace

std::vector<double> nll_rows(const float* logits, const std::vector<int32_t>& tokens, int S, int T, int64_t V) {
  const int64_t rows = int64_t(S) * (T - 1);
  if (rows <= 0) return {};
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  for (int64_t k = 0; k < rows; ++k) {
    const int32_t tok = tokens[size_t(k / (T - 1) * T + k % (T - 1) + 1)];
    if (tok < 0 || tok >= V) fail(Errc::input, "", "tokens", "token id " + std::to_string(tok) + " outside the vocabulary of " + std::to_string(V));
    targets[size_t(k)] = tok;
  }
  DeviceBuffer<int32_t> dt(targets.size(), "NLL targets");
  DeviceBuffer<double> dn(static_cast<size_t>(rows), "NLL per row");
  copy_to_device(dt.get(), targets.data(), targets.size() * 4);
  nll_kernel<<<unsigned(rows), kThreads>>>(logits, dt.get(), T, V, dn.get());
  PTQ_CUDA_LAUNCH("nll_kernel");
  std::vector<double> out(static_cast<size_t>(rows));
  copy_to_host(out.data(), dn.get(), out.size() * 8);
  return out;
}

}  // namespace ptq::cuda
