// grid.cuh — the device twin of lib/quant/quantizer.cpp's grids: the integer-zero grid (minmax,
// find_grid's MSE clipping search, quantize_code) and llama.cpp's (find_grid without the search,
// round_super_block, quantize_code / dequantize_code of every GridForm): the same fp32 operations in
// the same order, so a grid and its codes are the host's to the bit. Used by the GPTQ solve and RTN
// (gptq/gptq_cuda.cu) and AWQ's search (smoothquant/awq_cuda.cu). Kernels: a warp per (group, row)
// or per row; a thread per (super-block, row).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/dtype.h"

namespace ptq::cuda {
namespace {

// A 16-bit dtype's code (round_scale's dt, for QuantSpec::scale_dtype): 1 f16, 2 bf16, 0 fp32.
inline int dtype_code(DType t) { return t == DType::F16 ? 1 : t == DType::BF16 ? 2 : 0; }

struct Grid {
  float scale;
  int zero;
  float min = 0.0f;   // llama.cpp's grids with a min (Q4_1, Q5_1, Q4_K, Q5_K): w = scale q + min
};
__device__ float round_scale(float x, int dt) {
  if (dt == 1) return __half2float(__float2half_rn(x));
  if (dt == 2) return __bfloat162float(__float2bfloat16_rn(x));
  return x;
}
__device__ Grid minmax_grid(float xmin, float xmax, int maxq, bool sym, int dt) {   // = lib/quant/quantizer.cpp minmax
  xmin = fminf(xmin, 0.0f);
  xmax = fmaxf(xmax, 0.0f);
  if (sym) {
    xmax = fmaxf(-xmin, xmax);
    xmin = -xmax;
  }
  if (xmin == 0.0f && xmax == 0.0f) { xmin = -1.0f; xmax = 1.0f; }
  float scale = round_scale((xmax - xmin) / float(maxq), dt);
  if (!(scale > 0.0f)) scale = round_scale(5.9604644775390625e-08f, dt);
  int zero = sym ? (maxq + 1) / 2 : int(rintf(-xmin / scale));
  return {scale, min(max(zero, 0), maxq)};
}
// x clamped to [-m, m]: find_grid's limit (AWQ's clipping) applied to a range's ends.
__device__ __forceinline__ float clamp_to_limit(float x, float m) { return fminf(fmaxf(x, -m), m); }
__device__ __forceinline__ int quant(float x, Grid g, int maxq) {
  const float q = rintf(x / g.scale) + float(g.zero);
  return int(fminf(fmaxf(q, 0.0f), float(maxq)));
}
// quantize_code's and dequantize_code's twins for a grid of any form (the host's GridParams, from
// static_grids: llama.cpp's grids are formed there): with_min, (x - min) / scale rounded; a zero
// scale (a K form's sub-block whose scale rounded to 0) gives the host's code, 0 or the zero point.
// The operations are spelled out (no contraction) as the host evaluates them.
__device__ __forceinline__ int quant_form(float x, Grid g, int maxq, bool with_min) {
  if (g.scale == 0.0f) return with_min ? 0 : g.zero;
  const float q = with_min ? rintf(__fdiv_rn(__fsub_rn(x, g.min), g.scale)) : __fadd_rn(rintf(__fdiv_rn(x, g.scale)), float(g.zero));
  return int(fminf(fmaxf(q, 0.0f), float(maxq)));
}
__device__ __forceinline__ float dequant_form(int q, Grid g, bool with_min) {
  return with_min ? __fadd_rn(__fmul_rn(g.scale, float(q)), g.min) : __fmul_rn(g.scale, float(q - g.zero));
}
__device__ __forceinline__ float warp_min(float v) { for (int o = 16; o; o >>= 1) v = fminf(v, __shfl_xor_sync(~0u, v, o)); return v; }
__device__ __forceinline__ float warp_max(float v) { for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, o)); return v; }
__device__ __forceinline__ double warp_sum(double v) { for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o); return v; }

// The reference's clipping search: shrink [lo, hi] by p = 1 - k/100, k < 80, keep the grid with the
// least sum |q - x|^2.4 (err: the warp-wide sum for a grid).
template <class Err>
__device__ Grid clip_search(float lo, float hi, Grid best, int maxq, bool sym, int dt, Err err) {
  double best_err = err(best);
  for (int k = 1; k < 80; ++k) {
    const float p = 1.0f - float(k) / 100.0f;
    const Grid g = minmax_grid(p * lo, p * hi, maxq, sym, dt);
    const double e = err(g);
    if (e < best_err) { best_err = e; best = g; }
  }
  return best;
}
__device__ __forceinline__ double clip_error(float v, Grid g, int maxq) {
  return pow(fabs(double(g.scale * float(quant(v, g, maxq) - g.zero)) - double(v)), 2.4);
}

// The grid of values v[0..n) spread over the warp (`have` says which of a lane's values count),
// with the reference's clipping search when mse; `limit` (AWQ's clipping, find_grid's): the grid of
// the values clamped to [-limit, limit] (+inf: none). (lo and hi start at 0, which the grid takes
// in anyway, so clamping them is clamping the values' min and max, as find_grid does.)
template <int K>
__device__ Grid warp_grid(const float (&v)[K], const bool (&have)[K], int maxq, bool sym, bool mse, int dt, float limit = INFINITY) {
  float lo = 0.0f, hi = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (have[k]) { lo = fminf(lo, v[k]); hi = fmaxf(hi, v[k]); }
  lo = warp_min(lo);
  hi = warp_max(hi);
  if (limit < INFINITY) {
    lo = clamp_to_limit(lo, limit);
    hi = clamp_to_limit(hi, limit);
  }
  const Grid best = minmax_grid(lo, hi, maxq, sym, dt);
  if (!mse) return best;
  return clip_search(lo, hi, best, maxq, sym, dt, [&](Grid g) {
    double e = 0;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (have[k]) e += clip_error(v[k], g, maxq);
    return warp_sum(e);
  });
}

// Static groups: the grid of each (group, row) from the unpermuted weights; a warp per pair.
// limits [groups * rows] (k = g * rows + r, null: none): AWQ's clipping limits (static_grids').
__global__ void static_grid_kernel(const float* W, int64_t rows, int64_t cols, int64_t gs, int64_t groups, int maxq, bool sym, bool mse, int dt,
                                   const float* limits, float* scale, int* zero) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;   // k = g * rows + r
  const int lane = threadIdx.x % 32;
  if (k >= groups * rows) return;
  const int64_t g = k / rows, r = k % rows, c0 = g * gs, n = min(gs, cols - c0);
  float v[4];
  bool have[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) {   // groups of up to 128 columns
    const int64_t j = t * 32 + lane;
    have[t] = j < n;
    v[t] = have[t] ? W[r * cols + c0 + j] : 0.0f;
  }
  const Grid gr = warp_grid(v, have, maxq, sym, mse, dt, limits ? limits[k] : INFINITY);
  if (lane == 0) { scale[k] = gr.scale; zero[k] = gr.zero; }
}

// Per-row grids over a whole row (one group per row): a warp per row.
__global__ void row_grid_kernel(const float* W, int64_t rows, int64_t cols, int maxq, bool sym, bool mse, int dt, float* scale, int* zero) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  // Strided over the row in chunks of 32 x 8 values, reduced into one grid: min/max first.
  float lo = 0, hi = 0;
  for (int64_t c = lane; c < cols; c += 32) { lo = fminf(lo, W[r * cols + c]); hi = fmaxf(hi, W[r * cols + c]); }
  lo = warp_min(lo);
  hi = warp_max(hi);
  Grid best = minmax_grid(lo, hi, maxq, sym, dt);
  if (mse)
    best = clip_search(lo, hi, best, maxq, sym, dt, [&](Grid g) {
      double e = 0;
      for (int64_t c = lane; c < cols; c += 32) e += clip_error(W[r * cols + c], g, maxq);
      return warp_sum(e);
    });
  if (lane == 0) { scale[r] = best.scale; zero[r] = best.zero; }
}

// llama.cpp's grids (quantizer.cpp's minmax of a GridForm other than integer_zero, then
// round_super_block), spelled as the host evaluates them: std::min / std::max as their comparisons
// (the first of equal values kept, so a zero's sign is the host's), no contraction. form:
// GridForm's value (1 f16_min, 2 k_min, 3 k_sym).
__device__ __forceinline__ float host_min(float a, float b) { return b < a ? b : a; }   // std::min(a, b)
__device__ __forceinline__ float host_max(float a, float b) { return a < b ? b : a; }   // std::max(a, b)
__device__ Grid form_minmax(float xmin, float xmax, int form, int maxq) {
  if (form == 1) {   // Q4_1, Q5_1: min and scale as f16
    const float m = round_scale(xmin, 1);
    return {round_scale(__fdiv_rn(host_max(__fsub_rn(xmax, m), 0.0f), float(maxq)), 1), 0, m};
  }
  if (form == 2) {   // a K sub-block with a min (min <= 0), rounded per super-block after
    xmin = host_min(xmin, 0.0f);
    return {__fdiv_rn(host_max(__fsub_rn(xmax, xmin), 0.0f), float(maxq)), 0, xmin};
  }
  const float m = -xmin >= xmax ? xmin : xmax;   // Q6_K: the value of largest magnitude on code 0
  return {__fdiv_rn(-m, 32.0f), 32, 0.0f};
}
// The first minimum and maximum over the warp of (value, column) pairs: find_grid's sequential
// std::min / std::max, whose result among equal values is the one of the lowest column.
__device__ __forceinline__ void warp_first_min_max(float& lo, int& clo, float& hi, int& chi) {
  for (int o = 16; o; o >>= 1) {
    const float l2 = __shfl_xor_sync(~0u, lo, o), h2 = __shfl_xor_sync(~0u, hi, o);
    const int cl2 = __shfl_xor_sync(~0u, clo, o), ch2 = __shfl_xor_sync(~0u, chi, o);
    if (l2 < lo || (l2 == lo && cl2 < clo)) { lo = l2; clo = cl2; }
    if (h2 > hi || (h2 == hi && ch2 < chi)) { hi = h2; chi = ch2; }
  }
}
// Each (group, row)'s grid of a form from W [rows, cols] (groups of gs <= 128 columns, a warp a
// pair, k = g * rows + r), before any super-block rounding: find_grid without the MSE search.
// limits [groups * rows] or null: AWQ's clipping (the range's ends clamped to [-limit, limit]).
__global__ void form_grid_kernel(const float* W, int64_t rows, int64_t cols, int64_t gs, int64_t groups, int form, int maxq, const float* limits,
                                 float* scale, int* zero, float* mins) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (k >= groups * rows) return;
  const int64_t g = k / rows, r = k % rows, c0 = g * gs, n = min(gs, cols - c0);
  float lo = W[r * cols + c0], hi = lo;   // column 0 of the group: what every lane starts from
  int clo = 0, chi = 0;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int j = t * 32 + lane;
    if (j >= n) break;
    const float v = W[r * cols + c0 + j];
    if (v < lo) { lo = v; clo = j; }
    if (v > hi) { hi = v; chi = j; }
  }
  warp_first_min_max(lo, clo, hi, chi);
  if (limits) {   // std::min(std::max(x, -limit), limit)
    const float m = limits[k];
    lo = host_min(host_max(lo, -m), m);
    hi = host_min(host_max(hi, -m), m);
  }
  if (lane != 0) return;
  const Grid gr = form_minmax(lo, hi, form, maxq);
  scale[k] = gr.scale;
  zero[k] = gr.zero;
  if (mins) mins[k] = gr.min;
}
// round_super_block of every (super-block b, row r), a thread each: its n groups (g = b n + j) take
// the nearest multiple of d (and dmin) of the largest over the levels, d and dmin as f16.
// form 2 (k_min: 63 levels, scale and min) or 3 (k_sym: 127 signed levels, scale only).
__global__ void super_block_kernel(int64_t rows, int64_t supers, int n, int form, float* scale, float* mins, float* super_d, float* super_dmin) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;   // k = b * rows + r
  if (k >= supers * rows) return;
  const int64_t b = k / rows, r = k % rows;
  const float levels = form == 2 ? 63.0f : 127.0f;
  float max_scale = 0.0f, max_m = 0.0f;
  for (int j = 0; j < n; ++j) {
    const int64_t i = (b * n + j) * rows + r;
    max_scale = host_max(max_scale, fabsf(scale[i]));
    if (form == 2) max_m = host_max(max_m, -mins[i]);
  }
  const float d = round_scale(__fdiv_rn(max_scale, levels), 1), dmin = form == 2 ? round_scale(__fdiv_rn(max_m, levels), 1) : 0.0f;
  for (int j = 0; j < n; ++j) {
    const int64_t i = (b * n + j) * rows + r;
    const float sc = d > 0.0f ? host_min(host_max(rintf(__fdiv_rn(scale[i], d)), -levels - 1.0f), levels) : 0.0f;
    scale[i] = __fmul_rn(d, sc);
    if (form == 2) {
      const float mc = dmin > 0.0f ? host_min(host_max(rintf(__fdiv_rn(-mins[i], dmin)), 0.0f), levels) : 0.0f;
      mins[i] = -__fmul_rn(dmin, mc);
    }
  }
  super_d[k] = d;
  if (super_dmin) super_dmin[k] = dmin;
}

}  // namespace
}  // namespace ptq::cuda
