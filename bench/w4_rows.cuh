// w4_rows.cuh — the one-row 4-bit GEMV of bench/ on its own "rows" layout, shared by gemv_probe
// (one launch a Linear, under PDL) and chain_probe (a decode step's Linears in one persistent
// kernel). Probes, not ptqkit kernels.
//
// Layout. y [N] = W [N, K] · x [K] (x f16), W 4-bit asymmetric with groups of 128 along K:
// w = (q - z) s, s f16, z in 0..15; N a multiple of 32, K of 128. Rows in blocks of 32, one lane a
// row; a group is 4 chunks of 32 columns; codes uint4 [row block][group][chunk][lane], so a warp's
// load is 512 contiguous bytes and a (row block, group) unit 2,048. Word j of a lane's uint4 holds
// columns 8j .. 8j + 7 of its chunk as nibbles (0, 2, 4, 6, 1, 3, 5, 7) at bits 0, 4, ..., 28, so
// that `(w & 0x000F000F) | 0x64006400` is the half2 (1024 + q_col0, 1024 + q_col1) and the other
// three masks give columns 2-3, 4-5, 6-7. Metadata uint32 [row block][group][lane] = half2
// (s, -(1024 + z)): 4 bytes a row and group, as ptqkit's fragment order holds them.
// Numerics: (q - z) exactly in f16; a word's 8 products summed in f16, then in fp32 across the
// group, scaled by s in fp32, fp32 across groups.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/pdl.cuh"
#include "cuda/ptx.cuh"

#include "bench_timing.cuh"   // CK

namespace bench {

// The column of a word's nibble i (bits 4i .. 4i + 3) within its 8 columns.
constexpr int kRowsColOfNibble[8] = {0, 2, 4, 6, 1, 3, 5, 7};

__device__ __forceinline__ uint32_t lop(uint32_t w, uint32_t mask) { return ptq::cuda::ptx::and_or(w, mask, 0x64006400u); }   // (w & mask) | 0x64006400
__device__ __forceinline__ __half2 h2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// One word's 8 codes (q - z) · x, in f16: columns 0-1, 2-3, 4-5, 6-7 against the 4 half2 of xv.
__device__ __forceinline__ float word_dot(uint32_t w, const uint4& xv, __half2 zlo, __half2 zhi) {
  const __half2 sixteenth = __float2half2_rn(1.0f / 16.0f);
  const uint32_t w8 = w >> 8;
  const __half2 a = __hadd2(h2(lop(w, 0x000F000Fu)), zlo);
  const __half2 b = __hfma2(h2(lop(w, 0x00F000F0u)), sixteenth, zhi);
  const __half2 c = __hadd2(h2(lop(w8, 0x000F000Fu)), zlo);
  const __half2 d = __hfma2(h2(lop(w8, 0x00F000F0u)), sixteenth, zhi);
  __half2 p = __hmul2(a, h2(xv.x));
  p = __hfma2(b, h2(xv.y), p);
  p = __hfma2(c, h2(xv.z), p);
  p = __hfma2(d, h2(xv.w), p);
  const float2 f = __half22float2(p);
  return f.x + f.y;
}

// zlo = -(1024 + z), zhi = -(64 + z) from a row's metadata (s, -(1024 + z)); ga + the sum over
// one chunk (a lane's uint4: 32 columns) of (q - z) · x, x its 32 values (4 uint4 of f16).
__device__ __forceinline__ void zero_points(__half2 mh, __half2& zlo, __half2& zhi) {
  zlo = __half2half2(__high2half(mh));
  zhi = __hadd2(zlo, __float2half2_rn(960.0f));   // -(64 + z)
}
__device__ __forceinline__ float chunk_dot(const uint4& q, const uint4* xw, __half2 zlo, __half2 zhi, float ga) {
  const uint32_t wd[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) ga += word_dot(wd[j], xw[j], zlo, zhi);
  return ga;
}
// acc + s · sum over a lane's group (its 4 uint4 of codes q, metadata m = (s, -(1024 + z))) of
// (q - z) · x, x the group's 128 values (16 uint4 of f16, the same for every lane).
__device__ __forceinline__ float group_dot(const uint4 (&q)[4], uint32_t m, const uint4* xw, float acc) {
  const __half2 mh = h2(m);
  __half2 zlo, zhi;
  zero_points(mh, zlo, zhi);
  float ga = 0.0f;
#pragma unroll
  for (int c = 0; c < 4; ++c) ga = chunk_dot(q[c], xw + c * 4, zlo, zhi, ga);
  return fmaf(ga, __low2float(mh), acc);
}

// Random codes and metadata: s in [0.5, 1.5] / sqrt(21 K) (so that y has about unit RMS for x of
// unit RMS: (q - z) of uniform q, z has variance 2 · 255 / 12), z in 0..15.
__device__ __forceinline__ uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}
__global__ void fill_rows(uint32_t* codes, uint32_t* meta, int64_t n_words, int64_t n_meta, uint64_t seed, float s_scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words; i += int64_t(gridDim.x) * blockDim.x) codes[i] = mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_meta; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t r = mix((seed + 7) * 0xbf58476d1ce4e5b9ull + uint64_t(i));
    const __half2 v = __halves2half2(__float2half_rn(s_scale * (0.5f + float(r & 0xffff) / 65535.0f)), __float2half_rn(-(1024.0f + float(r >> 28))));
    meta[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// The fragment layout of chain_probe's tensor-core consumers: the same units (a row block's group,
// 2,048 bytes of codes as uint4 [k][lane], then the metadata by row), but uint4 k of lane (gq, c)
// (gq = lane / 4, c = lane % 4) holds the mma.m16n8k16 A fragments of row tile k / 2 (rows
// 16 (k / 2) .. + 15) at the group's k16 steps 4 (k % 2) + j (word j): nibble i of a word is row
// gq + 8 (i % 2), column 2c + i / 4 + 8 ((i / 2) % 2) of its k16 step, so that (w & 0x000F000F) |
// 0x64006400 is a0 (row gq, columns 2c, 2c + 1), mask 0x00F000F0 a1 (row gq + 8, in units of 16), and
// the same masks of w >> 8 a2 and a3 (columns 2c + 8, 2c + 9).
enum class W4Layout { rows, frag };
// Row (within the row block) and column (within the group) of nibble i of word j of uint4 k of lane l.
inline void w4_row_col(W4Layout layout, int k, int l, int j, int i, int& row, int& col) {
  if (layout == W4Layout::rows) {
    row = l, col = k * 32 + j * 8 + kRowsColOfNibble[i];
  } else {
    row = 16 * (k / 2) + l / 4 + 8 * (i % 2);
    col = 16 * (4 * (k % 2) + j) + 2 * (l % 4) + i / 4 + 8 * ((i / 2) % 2);
  }
}

// The fp64 reference: y [N] = W [N, K] · x from a layer's device codes and metadata (either layout).
inline std::vector<double> rows_gemv_ref(const uint4* d_codes, const uint32_t* d_meta, int N, int K, const std::vector<double>& x,
                                         W4Layout layout = W4Layout::rows) {
  const int G = K / 128, RB = N / 32;
  const size_t U = size_t(RB) * G;
  std::vector<uint32_t> codes(U * 512), meta(U * 32);
  CK(cudaMemcpy(codes.data(), d_codes, codes.size() * 4, cudaMemcpyDeviceToHost));   // a failed copy stops the probe
  CK(cudaMemcpy(meta.data(), d_meta, meta.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<double> y(static_cast<size_t>(N), 0.0);
  for (int rb = 0; rb < RB; ++rb)
    for (int g = 0; g < G; ++g) {
      const size_t u = size_t(rb) * G + size_t(g);
      double t[32] = {}, z[32];
      for (int r = 0; r < 32; ++r) z[r] = -double(__half2float(__ushort_as_half(uint16_t(meta[u * 32 + size_t(r)] >> 16)))) - 1024.0;
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l)
          for (int j = 0; j < 4; ++j) {
            const uint32_t w = codes[u * 512 + (size_t(k) * 32 + size_t(l)) * 4 + size_t(j)];
            for (int i = 0; i < 8; ++i) {
              int row = 0, col = 0;
              w4_row_col(layout, k, l, j, i, row, col);
              t[row] += (double((w >> (4 * i)) & 15) - z[row]) * x[size_t(g * 128 + col)];
            }
          }
      for (int r = 0; r < 32; ++r) y[size_t(rb) * 32 + size_t(r)] += double(__half2float(__ushort_as_half(uint16_t(meta[u * 32 + size_t(r)] & 0xffff)))) * t[r];
    }
  return y;
}
// Norm-wise relative error of y against the reference r (1 where r is missing).
template <class T>
double rel_error(const std::vector<T>& y, const std::vector<double>& r) {
  if (r.size() != y.size()) return 1.0;
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < r.size(); ++i) e2 += (double(y[i]) - r[i]) * (double(y[i]) - r[i]), r2 += r[i] * r[i];
  return std::sqrt(e2 / r2);
}

// The residual-stream accumulator of bench/fuse_probe.cu: fp32 values added as signed 32.32 fixed
// point in int64 (integer adds commute, so the sum's bytes do not depend on the order the adds land).
constexpr double kFixOne = 4294967296.0;   // 2^32
__device__ __forceinline__ long long to_fixed(float v) { return __double2ll_rn(double(v) * kFixOne); }
__device__ __forceinline__ float from_fixed(long long a) { return float(double(a) * (1.0 / kFixOne)); }

// A split's arrival, after the CTA's partial sums are written: thread 0 counts the CTA with an
// acquire-release atomic after a barrier (its release covers the partials, ordered before it by
// the barrier); true in every thread of the last of the S CTAs, which resets the counter.
__device__ bool arrived_last(int* counter, int S) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    int before;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(counter) : "memory");
    last = before == S - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  return last;
}

// gemv_w4: y in f16, N a multiple of 32. CTA (split, row block) takes groups [split * gps, ...);
// warp w of W its groups w, w + W, ...; each lane 4 uint4 (one group: 64 bytes) a batch, the first
// batch issued before the PDL wait; with kDB the next batch is issued before this one's math
// (twice the registers). x: each warp copies its group's 256 bytes into its own shared memory
// after the wait (no CTA barrier); with XT = long long x is the fixed-point accumulator above,
// each lane converting 4 values. Splits: each CTA's row sums go to fp32 partials, and the last
// CTA of a row block to arrive (an acq_rel atomic) adds them in split order (deterministic).
template <int kThreads, int kMinBlocks, bool kDB, class XT = __half>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gemv_w4(const uint4* __restrict__ codes, const uint32_t* __restrict__ meta, const XT* x, float* part, int* arrivals, __half* y, int N, int G, int S,
            int gps) {
  constexpr int W = kThreads / 32;
  __shared__ __align__(16) __half xs[W][128];
  __shared__ float red[W][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, s = blockIdx.x, rb = blockIdx.y;
  const int g1 = min(G, (s + 1) * gps);
  int g = s * gps + warp;
  auto load = [&](int gg, uint4 (&q)[4], uint32_t& m) {
    const uint4* p = codes + (size_t(rb) * G + gg) * 128 + lane;
#pragma unroll
    for (int c = 0; c < 4; ++c) q[c] = __ldcs(p + c * 32);
    m = __ldcs(meta + (size_t(rb) * G + gg) * 32 + lane);
  };
  uint4 q[4], qn[4];
  uint32_t m = 0, mn = 0;
  if (g < g1) load(g, q, m);
  ptq::cuda::pdl::wait_prior_grid();
  ptq::cuda::pdl::allow_dependents();
  float acc = 0.0f;
  uint4* xw = reinterpret_cast<uint4*>(xs[warp]);
  while (g < g1) {
    if constexpr (sizeof(XT) == 8) {
      const longlong2* a = reinterpret_cast<const longlong2*>(x + size_t(g) * 128) + 2 * lane;
      const longlong2 a0 = __ldcg(a), a1 = __ldcg(a + 1);
      xs[warp][4 * lane] = __float2half_rn(from_fixed(a0.x));
      xs[warp][4 * lane + 1] = __float2half_rn(from_fixed(a0.y));
      xs[warp][4 * lane + 2] = __float2half_rn(from_fixed(a1.x));
      xs[warp][4 * lane + 3] = __float2half_rn(from_fixed(a1.y));
    } else if (lane < 16) {
      xw[lane] = __ldcg(reinterpret_cast<const uint4*>(x + size_t(g) * 128) + lane);
    }
    if constexpr (kDB)
      if (g + W < g1) load(g + W, qn, mn);
    __syncwarp();
    acc = group_dot(q, m, xw, acc);
    __syncwarp();
    g += W;
    if constexpr (kDB) {
#pragma unroll
      for (int c = 0; c < 4; ++c) q[c] = qn[c];
      m = mn;
    } else if (g < g1) {
      load(g, q, m);
    }
  }
  red[warp][lane] = acc;
  __syncthreads();
  if (warp == 0) {
    float r = 0.0f;
#pragma unroll 4
    for (int w = 0; w < W; ++w) r += red[w][lane];
    const int row = rb * 32 + lane;
    if (S == 1) y[row] = __float2half_rn(r);
    else part[size_t(s) * N + row] = r;
  }
  if (S == 1 || !arrived_last(arrivals + rb, S)) return;
  if (warp == 0) {
    const int row = rb * 32 + lane;
    float r = 0.0f;
    for (int z = 0; z < S; ++z) r += __ldcg(part + size_t(z) * N + row);
    y[row] = __float2half_rn(r);
  }
}

}  // namespace bench
