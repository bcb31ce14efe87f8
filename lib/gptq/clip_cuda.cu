// clip_cuda.cu — AWQ's clipping search on the GPU (clip_cuda.h). Reference: output_clip_limits in
// clip.cpp.
//
// Contract: W [rows, cols] fp32 (uploaded), H = scale · sum (fp64, symmetric, device), groups of
// gs ≤ 128 columns on the integer grid. clip_kernel: a CTA per (group, 64 rows), H_gg narrowed to
// fp32 into shared memory (gs² · 4 bytes), a warp per row in turn, lane l holding columns l, l + 32,
// l + 64, l + 96 of the group. For each step k = 0 … kClipSteps − 1: the limit clip_limit(k, max |w|),
// the grid of the clamped values (grid.cuh's minmax_grid on the clamped min and max, as find_grid),
// e = Q(w) − w (each product and difference rounded on its own), (e·H_gg)_c = Σ_c' e_c' H_c'c in
// fp32 (c' ascending, e_c' broadcast from its lane), cost = Σ_c (e·H_gg)_c e_c in fp64 (the warp's
// tree); the least cost, ties to the earlier (wider) k. Output: a limit per (group, row), +inf for
// k = 0, and each CTA's count of clipped groups.
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "cuda/runtime.h"
#include "gptq/clip_cuda.h"
#include "quant/grid.cuh"

namespace ptq::cuda {

namespace {
constexpr int kWarps = 8, kRowsPerCta = 64;

__global__ void clip_kernel(const float* W, int64_t rows, int64_t cols, int64_t gs, const double* Hsum, double hscale, int maxq, bool sym, int dt,
                            float* limits, int* clipped) {
  extern __shared__ float Hg[];   // [n][n]
  const int64_t g = blockIdx.x, c0 = g * gs, n = min(gs, cols - c0);
  for (int64_t i = threadIdx.x; i < n * n; i += blockDim.x) Hg[i] = float(hscale * Hsum[(c0 + i / n) * cols + c0 + i % n]);
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int count = 0;
  for (int64_t r = blockIdx.y * int64_t(kRowsPerCta) + warp; r < min(rows, (blockIdx.y + 1) * int64_t(kRowsPerCta)); r += kWarps) {
    float w[4];
    bool have[4];
    float amax = 0.0f, lo = INFINITY, hi = -INFINITY;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int64_t j = t * 32 + lane;
      have[t] = j < n;
      w[t] = have[t] ? W[r * cols + c0 + j] : 0.0f;
      if (have[t]) { amax = fmaxf(amax, fabsf(w[t])); lo = fminf(lo, w[t]); hi = fmaxf(hi, w[t]); }
    }
    amax = warp_max(amax);
    lo = warp_min(lo);
    hi = warp_max(hi);
    double best = 0;
    int best_k = 0;
    float best_m = INFINITY;
    for (int k = 0; k < kClipSteps; ++k) {
      // clip_limit(k, amax): the step's factor in fp64, rounded, times amax (k = 0: amax itself,
      // whose clamp leaves lo and hi as they are)
      const float m = __fmul_rn(float(1.0 - double(k) / kClipGrid), amax);
      const float xmin = clamp_to_limit(lo, m), xmax = clamp_to_limit(hi, m);
      const Grid gr = minmax_grid(xmin, xmax, maxq, sym, dt);
      float e[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) e[t] = have[t] ? __fsub_rn(__fmul_rn(gr.scale, float(quant(w[t], gr, maxq) - gr.zero)), w[t]) : 0.0f;
      float eh[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int u = 0; u < 4; ++u)   // row c = 32 u + j of H_gg (e[u] indexed statically: no local memory)
        for (int j = 0; j < 32 && 32 * u + j < n; ++j) {
          const int64_t c = 32 * u + j;
          const float ec = __shfl_sync(~0u, e[u], j);
#pragma unroll
          for (int t = 0; t < 4; ++t)
            if (have[t]) eh[t] = fmaf(ec, Hg[c * n + t * 32 + lane], eh[t]);
        }
      double cost = 0;
#pragma unroll
      for (int t = 0; t < 4; ++t) cost += double(eh[t]) * double(e[t]);
      cost = warp_sum(cost);
      if (k == 0 || cost < best) { best = cost; best_k = k; best_m = k > 0 ? m : INFINITY; }
    }
    if (lane == 0) {
      limits[g * rows + r] = best_m;
      count += best_k > 0;
    }
  }
  if (lane == 0 && count) atomicAdd(clipped, count);   // an integer count: the same in any order
}
}  // namespace

bool clip_supported(const QuantSpec& s) {
  return s.form == GridForm::integer_zero && !s.mse && s.group_size > 0 && s.group_size <= 128 && s.bits >= 2 && s.bits <= 8;
}

ClipSearch output_clip_limits(const MatF& W, HessianRef H, const QuantSpec& s) {
  DeviceBuffer<float> dW(size_t(W.size()), "clipping search: weights");
  copy_to_device(dW.get(), W.data(), size_t(W.size()) * 4);
  return output_clip_limits(dW.get(), W.rows(), W.cols(), H, s);
}

ClipSearch output_clip_limits(const float* W, int64_t rows, int64_t cols, HessianRef H, const QuantSpec& s) {
  if (!clip_supported(s)) fail(Errc::usage, "", "quantization.awq.clip", "the GPU's clipping search takes integer grids in groups of at most 128 columns");
  const int64_t gs = s.group_size, groups = (cols + gs - 1) / gs;
  ClipSearch out;
  out.groups = groups * rows;
  out.limits.assign(size_t(groups * rows), std::numeric_limits<float>::infinity());
  if (rows == 0 || cols == 0) return out;
  DeviceBuffer<float> dL(size_t(groups * rows), "clipping search: limits");
  DeviceBuffer<int> dC(1, "clipping search: count");
  const int zero = 0;
  copy_to_device(dC.get(), &zero, 4);
  const size_t smem = size_t(gs * gs) * 4;
  PTQ_CUDA(cudaFuncSetAttribute(clip_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned(groups), unsigned((rows + kRowsPerCta - 1) / kRowsPerCta));
  clip_kernel<<<grid, kWarps * 32, smem, static_cast<cudaStream_t>(current_stream())>>>(W, rows, cols, gs, H.sum, H.scale, s.maxq(), s.sym,
                                                                                         dtype_code(s.scale_dtype), dL.get(), dC.get());
  PTQ_CUDA_LAUNCH("clip_kernel");
  copy_to_host(out.limits.data(), dL.get(), out.limits.size() * 4);
  int clipped = 0;
  copy_to_host(&clipped, dC.get(), 4);
  out.clipped = clipped;
  return out;
}

}  // namespace ptq::cuda
