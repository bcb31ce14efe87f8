// a16_split_k.cuh — the deterministic split-K finish of the A16 kernels that split K across CTAs
// (a16_shared_x.cuh, a16_wgmma.cu). Contract: a grid of (row groups in x, Sk K slices in y); the
// CTA of slice z has written its fp32 partial of rows R0 .. R0 + rows - 1 (all M activation rows)
// to part [Sk][M][N]; sum_split_k, called by every thread of every CTA, lets the CTA that arrives
// last at its row group (an arrival counter per group, left at zero by that CTA for the next launch
// in stream order) add the Sk partials in slice order and write y [M, N] (f16, or fp32 + beta y).
// The order of the sum does not depend on which CTA finishes first: the same bytes on every run.
// U: quads (4 rows) per thread and step, each with 4 slices' loads in flight (4 U float4 registers:
// kernels with few registers otherwise take U = 1, so that the sum does not set their occupancy).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/runtime.h"

namespace ptq::cuda::a16 {

template <int U = 4>
__device__ __forceinline__ void sum_split_k(const float* part, int* arrivals, int R0, int rows, int M, int N, __half* yh, float* yf, float beta) {
  __shared__ int last;
  __threadfence();   // this CTA's partial is visible device-wide before its arrival counts
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(arrivals + blockIdx.x, 1) == int(gridDim.y) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The sum: 4 rows per thread and step (16-byte loads when N % 4 == 0); the loads of 4 slices of
  // U such quads (4 U in flight per thread) are issued before their adds, which run in slice order.
  const int Sk = int(gridDim.y), quads = rows / 4 * M;
  const bool vec = N % 4 == 0;
  for (int o0 = threadIdx.x; o0 < quads; o0 += U * blockDim.x) {
    float4 v[U];
    const float* src[U];
    int lim[U];   // valid rows of each quad (0: none)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const int o = o0 + u * blockDim.x, R = R0 + 4 * (o % (rows / 4)), n = o / (rows / 4);
      lim[u] = o < quads && R < N ? min(4, N - R) : 0;
      src[u] = part + int64_t(n) * N + R;
    }
    for (int z0 = 0; z0 < Sk; z0 += 4) {
      float4 w[4][U];
#pragma unroll
      for (int dz = 0; dz < 4; ++dz)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const float* p = src[u] + int64_t(z0 + dz) * M * N;   // L2, not a stale L1
          float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          if (z0 + dz < Sk && lim[u]) {
            if (vec) t = __ldcg(reinterpret_cast<const float4*>(p));
            else {
              t.x = __ldcg(p);
              if (lim[u] > 1) t.y = __ldcg(p + 1);
              if (lim[u] > 2) t.z = __ldcg(p + 2);
              if (lim[u] > 3) t.w = __ldcg(p + 3);
            }
          }
          w[dz][u] = t;
        }
#pragma unroll
      for (int dz = 0; dz < 4; ++dz)   // slice order (slices past Sk add zeros: exact)
#pragma unroll
        for (int u = 0; u < U; ++u) v[u].x += w[dz][u].x, v[u].y += w[dz][u].y, v[u].z += w[dz][u].z, v[u].w += w[dz][u].w;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int o = o0 + u * blockDim.x, R = R0 + 4 * (o % (rows / 4)), n = o / (rows / 4);
      const float vv[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (e >= lim[u]) break;
        const int64_t i = int64_t(n) * N + R + e;
        if (yf) yf[i] = vv[e] + (beta != 0.0f ? beta * yf[i] : 0.0f);
        else yh[i] = __float2half_rn(vv[e]);
      }
    }
  }
  if (threadIdx.x == 0) arrivals[blockIdx.x] = 0;   // ready for the next launch (stream order)
}

// The arrival counters of the split-K reduction: zeroed once, each left at zero by its last CTA.
inline int* arrival_counters(int64_t n) {
  static std::mutex mu;
  static DeviceBuffer<int> buf;
  std::lock_guard<std::mutex> lock(mu);
  if (int64_t(buf.size()) < n) {
    buf = DeviceBuffer<int>(size_t(std::max<int64_t>(n, 4096)), "A16 split-K arrival counters");
    PTQ_CUDA(cudaMemset(buf.get(), 0, buf.size() * sizeof(int)));
  }
  return buf.get();
}

}  // namespace ptq::cuda::a16
