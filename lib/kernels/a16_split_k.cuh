// a16_split_k.cuh — the deterministic split-K finish of the A16 kernels that split K across CTAs
// (a16_shared_x.cuh, a16_wgmma.cu). Contract: a grid of (row groups in x, Sk K slices in y); the
// CTA of slice z has written its fp32 partial of rows R0 .. R0 + rows - 1 (all M activation rows)
// to part [Sk][M][N]; sum_split_k, called by every thread of every CTA, lets the CTA that arrives
// last at its row group (an arrival counter per group, left at zero by that CTA for the next launch
// in stream order) add the Sk partials in slice order and write y [M, N] (f16, or fp32 + beta y).
// The order of the sum does not depend on which CTA finishes first: the same bytes on every run.
// U: quads (4 rows) per thread and step, each with 4 slices' loads in flight (4 U float4 registers:
// kernels with few registers otherwise take U = 1, so that the sum does not set their occupancy).
// The wgmma loop at 32 rows, whose ring holds W8 to two CTAs an SM (up to 128 registers), takes 2
// for 8-bit codes (96 registers: decode W8A16 at batch 32 +0.5-0.6% on llama2-7b and llama3-8b
// against 1, the kernels alone within 1%, lab run 330); at 4 it took 148, one CTA an SM, and ran
// W8 4096 x 11008 and 4096 x 14336 4-6% slower and llama3-8b's decode 7% slower (run 328).
// kRowSs: a split norm's writer (a16_path.h, A16RowNorm: row_ss, out, out_perm) in the same pass,
// for rows % 16 == 0 and N % 16 == 0 (the caller's): besides fp32 y, out = f16(y w / 16) in both
// column orders, and each token's sum of squares of each 16 rows of y, a fixed shuffle tree over
// the 4 lanes of consecutive quads (thread o holds quad o % (rows / 4) of token o / (rows / 4), so
// a lane's 3 neighbours in its aligned group of 4 hold the rest of its 16 rows; the loop's bound,
// quads = rows / 4 x M, is a multiple of 32 and thus warp-uniform).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cuda/runtime.h"
#include "kernels/a16_path.h"

namespace ptq::cuda::a16 {

// A split norm's writer, one quad: token n's rows R .. R + 3 of X (x, fp32; w the norm's weights
// of those rows) -> the reader's x = f16(X w / 16) into out and, when set, out_perm (column pairs
// stay side by side in that order). Returns the quad's sum of squares, its four in order; the
// caller adds its group's 4 quads by a shuffle tree. Serves sum_split_k below and the streamed
// wgmma form's epilogue (a16_wgmma.cu, kRowSs).
__device__ __forceinline__ float write_split_quad(const A16RowNorm& norm, int n, int N, int R, const float (&x)[4], float4 w) {
  const __half2 lo = __floats2half2_rn(x[0] * w.x * kSplitNormScale, x[1] * w.y * kSplitNormScale);
  const __half2 hi = __floats2half2_rn(x[2] * w.z * kSplitNormScale, x[3] * w.w * kSplitNormScale);
  const int64_t row = int64_t(n) * N;
  *reinterpret_cast<__half2*>(static_cast<__half*>(norm.out) + row + R) = lo;
  *reinterpret_cast<__half2*>(static_cast<__half*>(norm.out) + row + R + 2) = hi;
  if (norm.out_perm) {
    *reinterpret_cast<__half2*>(static_cast<__half*>(norm.out_perm) + row + a16_wgmma_x_col(R)) = lo;
    *reinterpret_cast<__half2*>(static_cast<__half*>(norm.out_perm) + row + a16_wgmma_x_col(R + 2)) = hi;
  }
  return ((x[0] * x[0] + x[1] * x[1]) + x[2] * x[2]) + x[3] * x[3];
}

// y's quad: token n's rows R .. R + lim - 1 of y [M, N] from v, f16, or fp32 + beta y (v then
// holds y, which the split norm's writer reads). A whole quad at an aligned address goes as one
// 8-byte (f16) or 16-byte (fp32) access, else element by element; the same arithmetic either way.
// Every split-K sum's store: sum_split_k below, and a16_wgmma.cu's two sums over a cluster.
__device__ __forceinline__ void store_quad(float (&v)[4], int lim, int n, int N, int R, __half* yh, float* yf, float beta) {
  const int64_t i = int64_t(n) * N + R;
  if (lim == 4 && (reinterpret_cast<uintptr_t>(yf ? static_cast<void*>(yf + i) : static_cast<void*>(yh + i)) & (yf ? 15 : 7)) == 0) {
    if (yf) {
      float4 y = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (beta != 0.0f) y = *reinterpret_cast<const float4*>(yf + i);
      v[0] = v[0] + (beta != 0.0f ? beta * y.x : 0.0f);
      v[1] = v[1] + (beta != 0.0f ? beta * y.y : 0.0f);
      v[2] = v[2] + (beta != 0.0f ? beta * y.z : 0.0f);
      v[3] = v[3] + (beta != 0.0f ? beta * y.w : 0.0f);
      *reinterpret_cast<float4*>(yf + i) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      const __half2 lo = __floats2half2_rn(v[0], v[1]), hi = __floats2half2_rn(v[2], v[3]);
      uint2 u;
      __builtin_memcpy(&u.x, &lo, 4);
      __builtin_memcpy(&u.y, &hi, 4);
      *reinterpret_cast<uint2*>(yh + i) = u;
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (e >= lim) break;
    if (yf) yf[i + e] = v[e] = v[e] + (beta != 0.0f ? beta * yf[i + e] : 0.0f);
    else yh[i + e] = __float2half_rn(v[e]);
  }
}

template <int U = 4, bool kRowSs = false>
__device__ __forceinline__ void sum_split_k(const float* part, int* arrivals, int R0, int rows, int M, int N, __half* yh, float* yf, float beta,
                                            const A16RowNorm& norm = {}) {
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
    float4 wn[kRowSs ? U : 1];   // kRowSs: the norm's weights of each quad, loaded beside the partials
    if constexpr (kRowSs)
#pragma unroll
      for (int u = 0; u < U; ++u) wn[u] = lim[u] ? __ldg(reinterpret_cast<const float4*>(norm.w + R0 + 4 * ((o0 + u * blockDim.x) % (rows / 4)))) : float4{};
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
      float vv[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
      store_quad(vv, lim[u], n, N, R, yh, yf, beta);
      if constexpr (kRowSs) {   // vv: y (fp32, after beta y); lim[u] is 0 or 4
        float sq = lim[u] ? write_split_quad(norm, n, N, R, vv, wn[u]) : 0.0f;
        sq += __shfl_xor_sync(0xffffffffu, sq, 1);
        sq += __shfl_xor_sync(0xffffffffu, sq, 2);
        if (lim[u] && (o & 3) == 0) norm.row_ss[int64_t(n) * (N / 16) + R / 16] = sq;
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
