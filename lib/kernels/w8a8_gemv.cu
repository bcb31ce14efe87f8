// w8a8_gemv.cu — the W8A8 product for decode-sized M (1..32 rows): int8 weights streamed once,
// int8 activations from shared memory, dp4a.
//
// Contract. Operands (device): x [M, K] int8 row-major with per-row scales sx [M] fp32; w [N, K]
// int8 row-major (the Linear's weight as stored) with per-row scales sw [N] fp32; y [M, N] fp32.
// y = sx[m] · sw[n] · Σ_k x[m, k] · w[n, k] + beta · y (beta 0: y is only written). The sum is
// exact in int32 as in w8a8.cu (K < 2^17); the epilogue forms float(acc) · sx[m] · sw[n] in fp32,
// the same expression as w8a8.cu's and ref_gemm_w8a8's. Accepted: 1 <= M <= 16 with K a multiple
// of 16 (any sm, dp4a: sm_61+), and up to 32 rows with K % 64 == 0 (int8 mma.sync: sm_80+, the
// form below that takes M >= 3 there); x and w 16-byte aligned. On sm_90 from kW8A8WgmmaFromM rows
// w8a8_gemv hands the call to the wgmma form (w8a8_wgmma_gemv.cu: copy-engine ring, int8 wgmma;
// K a multiple of 16 up to 32 rows), which measured faster there (w8a8.h).
// Math: a CTA of 8 warps owns 32 rows of w (4 per warp); K is walked in tiles of 2 KiB: the CTA
// stages x[:, tile] in shared memory, then each lane loads its 4 16-byte pieces of each of its
// warp's 4 rows (16 loads in flight), and each x piece read from shared memory serves the 4 rows
// (4 dp4a per piece per activation row) into M x 4 int32 accumulators; a warp reduction at the end.
// Each weight byte is read once from HBM: at M = 1 the kernel is bound by w's bytes. From 3 rows
// (K % 64 == 0) the int8 mma.sync form below, its next batch of weights in flight while a batch's
// MMAs run (run 55: W8A8 decode batch 8 +7.5%).
// Launch: programmatic dependent launch (cuda/pdl.cuh), as the quantizer before it: each warp
// issues its first weights, then waits for the kernel before; x, sx and y are read after the wait,
// and never through __ldg (an earlier kernel wrote them). Measured: docs/lab (decode, run 38).
// The reference is ref_gemm_w8a8 (lib/kernels/reference.h).
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "cuda/pdl.cuh"
#include "cuda/ptx.cuh"
#include "cuda/runtime.h"
#include "kernels/w8a8.h"

namespace ptq::cuda {

namespace {
constexpr int kWarps = 8, kRowsPerWarp = 4, kTile = 2048, kMaxM = 16, kUnroll = kTile / 16 / 32;   // a tile: 4 pieces per lane
constexpr int kMmaFromM = 3;   // measured: docs/lab/2026-11-24-decode-h200.md (run 23)
bool tensor_cores() { return compute_capability() >= 80; }   // int8 mma.sync: sm_80 and up

// The two GEMV forms below share their arithmetic: per x piece (16 codes) of activation row m, 4
// dp4a into each weight row's sum; at the end each warp's lane sums added by shuffles and scaled.
// xp(m): the piece of row m from shared memory.
template <int kRows, int kM, class XPiece>
__device__ __forceinline__ void dp4a_piece(int (&acc)[kRows][kM], const int4 (&wv)[kRows], XPiece&& xp) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const int4 xv = xp(m);   // one x piece serves the warp's rows
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      int a = acc[r][m];
      a = __dp4a(wv[r].x, xv.x, a);
      a = __dp4a(wv[r].y, xv.y, a);
      a = __dp4a(wv[r].z, xv.z, a);
      a = __dp4a(wv[r].w, xv.w, a);
      acc[r][m] = a;
    }
  }
}
// y[m, n0 + r] = sx[m] · sw[n] · (the warp's sum) + beta · y, lane 0 writing.
template <int kRows, int kM>
__device__ __forceinline__ void store_rows(int (&acc)[kRows][kM], int n0, int lane, const float* sx, const float* sw, int N, float* y, float beta) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int n = n0 + r;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      int a = acc[r][m];
      for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0 && n < N) {
        const float v = float(a) * __ldcg(sx + m) * sw[n];   // sx: written by the kernel before (not the non-coherent path)
        float* out = y + size_t(m) * N + n;
        *out = beta == 0.0f ? v : v + beta * *out;
      }
    }
  }
}

// kM: the activation rows, a template parameter so that the accumulators stay in registers.
template <int kM>
__global__ void __launch_bounds__(kWarps * 32) w8a8_gemv_kernel(const int8_t* __restrict__ x, const float* __restrict__ sx, const int8_t* __restrict__ w,
                                                                const float* __restrict__ sw, int N, int K, float* y, float beta) {
  __shared__ __align__(16) int8_t xs[kM * kTile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + warp) * kRowsPerWarp;
  pdl::allow_dependents();   // launched with PDL: the next kernel may be scheduled as this one's CTAs exit
  int acc[kRowsPerWarp][kM];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < kM; ++m) acc[r][m] = 0;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    const int tk = min(kTile, K - k0);   // a multiple of 16
    // The tile's weights first (16 loads in flight per lane), then x staged while they arrive.
    int4 wv[kUnroll][kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = lane + 32 * u;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        wv[u][r] = (c < tk / 16 && n0 + r < N) ? __ldg(reinterpret_cast<const int4*>(w + size_t(n0 + r) * K + k0) + c) : make_int4(0, 0, 0, 0);
    }
    if (k0 == 0) pdl::wait_prior_grid();   // the first tile's weights are in flight; x, sx and y come from earlier kernels
    __syncthreads();   // the previous tile's x is no longer read
    for (int i = threadIdx.x; i < kM * (tk / 16); i += blockDim.x) {
      const int m = i / (tk / 16), c = i % (tk / 16);
      reinterpret_cast<int4*>(xs + m * kTile)[c] = __ldcg(reinterpret_cast<const int4*>(x + size_t(m) * K + k0) + c);   // through L2: written by the kernel before
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = lane + 32 * u;
      if (c >= tk / 16) break;
      dp4a_piece(acc, wv[u], [&](int m) { return reinterpret_cast<const int4*>(xs + m * kTile)[c]; });
    }
  }
  store_rows(acc, n0, lane, sx, sw, N, y, beta);
}

// One or two activation rows with K <= kRowMaxK (the decode at batch 1): the whole of x staged in
// shared memory once, after the wait (no staging or barrier per tile), kRowRows rows of w per warp
// (1: 8 a CTA, four times the CTAs of the kernel above), and the weights in two register sets:
// the next 2 KiB tile's loads are in flight while this tile's sums run. The same sums in the same
// order per row as the kernel above (4 dp4a per piece, lane pieces summed by the same shuffle), so
// the same outputs. Run 45: 4096x4096 at one row 11.7 -> 10.0 us (single launch, cold L2).
constexpr int kRowMaxK = 16384;
template <int kM, int kRowRows>
__global__ void __launch_bounds__(kWarps * 32) w8a8_gemv_row_kernel(const int8_t* __restrict__ x, const float* __restrict__ sx, const int8_t* __restrict__ w,
                                                                    const float* __restrict__ sw, int N, int K, float* y, float beta) {
  __shared__ __align__(16) int8_t xs[kM * kRowMaxK];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + warp) * kRowRows;
  pdl::allow_dependents();
  int acc[kRowRows][kM];
#pragma unroll
  for (int r = 0; r < kRowRows; ++r)
#pragma unroll
    for (int m = 0; m < kM; ++m) acc[r][m] = 0;
  using Tile = int4[kUnroll][kRowRows];
  auto load = [&](int k0, Tile& wv) {
    const int tk = min(kTile, K - k0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = lane + 32 * u;
#pragma unroll
      for (int r = 0; r < kRowRows; ++r)
        wv[u][r] = (c < tk / 16 && n0 + r < N) ? __ldcs(reinterpret_cast<const int4*>(w + size_t(n0 + r) * K + k0) + c) : make_int4(0, 0, 0, 0);
    }
  };
  auto use = [&](int k0, const Tile& wv) {
    const int tk = min(kTile, K - k0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = lane + 32 * u;
      if (c >= tk / 16) break;
      dp4a_piece(acc, wv[u], [&](int m) { return reinterpret_cast<const int4*>(xs + m * kRowMaxK + k0)[c]; });
    }
  };
  Tile w0, w1;
  load(0, w0);
  pdl::wait_prior_grid();   // the first tile's weights are in flight; x, sx and y come from earlier kernels
  for (int i = threadIdx.x; i < kM * (K / 16); i += blockDim.x) {
    const int m = i / (K / 16), c = i % (K / 16);
    reinterpret_cast<int4*>(xs + m * kRowMaxK)[c] = __ldcg(reinterpret_cast<const int4*>(x + size_t(m) * K) + c);   // through L2: written by the kernel before
  }
  __syncthreads();
  for (int k0 = 0; k0 < K; k0 += 2 * kTile) {
    if (k0 + kTile < K) load(k0 + kTile, w1);
    use(k0, w0);
    if (k0 + kTile >= K) break;
    if (k0 + 2 * kTile < K) load(k0 + 2 * kTile, w0);
    use(k0 + kTile, w1);
  }
  store_rows(acc, n0, lane, sx, sw, N, y, beta);
}

// The tensor-core form (int8 mma.sync m16n8k32) for M = 3..32 where K % 64 == 0: a CTA owns 16
// rows of w (32 at 5..8 rows: kRT = 2, each warp both tiles) and splits K over its 8 warps (warp v
// takes the 64-byte chunks v, v + 8, ...). The weights are the MMA's A operand (16 rows) and the
// activation rows its B operand (kNT tiles of 8 tokens), so the weight bytes still stream once
// while the products run on tensor cores. The sum over K does not care in which order the k's are
// paired, so each lane loads 16 contiguous bytes of rows g and g + 8 of w and of token rows g
// (+ 8t) of x at the same offset 16·(lane % 4) of a chunk, and feeds bytes 0..7 to one MMA and
// 8..15 to the next: A and B see the same permutation of k, and every load is a 16-byte vector.
// int32 sums (exact), then the 8 warps' partial sums added in shared memory in warp order, and the
// epilogue of the GEMV above.
// A warp walks its chunks in batches of kMmaUnroll held in two register sets: the next batch's
// weights (and, up to 16 rows, its x pieces) are in flight while this batch's MMAs run (run 55:
// decode batch 8 +7.5%, batch 32 +1.5% against one batch loaded, then used). Batches of 4 chunks,
// but 2 at 9..16 rows (kMmaUnrollFor): there 4 took 162 registers (one CTA of 256 threads an SM) and
// 2 takes 90, and the 16-row product ran 1.18-1.41x cuBLAS bf16 against 1.42-1.64x (lab run 133);
// at 1..8 rows (one row tile) and 17..32 rows 2 was slower (decode batch 8 -3.1%, batch 32 -4.6%).
constexpr int kMmaWarps = 8;
template <int kNT>
constexpr int kMmaUnrollFor = kNT == 2 ? 2 : 4;
// kRT: row tiles of 16 a CTA, each warp all of them (the x pieces shared).
template <int kNT, int kMmaUnroll = kMmaUnrollFor<kNT>, int kRT = 1>
__global__ void __launch_bounds__(kMmaWarps * 32) w8a8_mma_kernel(const int8_t* __restrict__ x, const float* __restrict__ sx, const int8_t* __restrict__ w,
                                                                  const float* __restrict__ sw, int M, int N, int K, float* y, float beta) {
  __shared__ int red[kMmaWarps][kRT * kNT][4][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int n0 = blockIdx.x * 16 * kRT;
  const int8_t* wr[kRT][2];
#pragma unroll
  for (int r = 0; r < kRT; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) wr[r][h] = w + size_t(min(n0 + 16 * r + 8 * h + g, N - 1)) * K + 16 * tq;   // rows past N read row N - 1 (never written)
  const int8_t* xr[kNT];
  bool xin[kNT];
#pragma unroll
  for (int t = 0; t < kNT; ++t) {
    xin[t] = 8 * t + g < M;
    xr[t] = x + size_t(min(8 * t + g, M - 1)) * K + 16 * tq;
  }
  int acc[kRT][kNT][4];
#pragma unroll
  for (int r = 0; r < kRT; ++r)
#pragma unroll
    for (int t = 0; t < kNT; ++t) acc[r][t][0] = acc[r][t][1] = acc[r][t][2] = acc[r][t][3] = 0;
  const int chunks = K / 64;
  pdl::allow_dependents();   // launched with PDL (as the GEMV above)
  constexpr bool kX = kNT <= 2;   // x pieces in the register sets too: up to 16 rows (run 60: without them 16 rows ran 1.4-1.6x slower)
  struct Batch {
    uint4 a[kRT][2][kMmaUnroll], b[kX ? kMmaUnroll : 1][kX ? kNT : 1];
  };
  auto load_w = [&](int c0, Batch& B) {
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int c = c0 + u * kMmaWarps;
#pragma unroll
      for (int r = 0; r < kRT; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) B.a[r][h][u] = c < chunks ? __ldcs(reinterpret_cast<const uint4*>(wr[r][h] + 64 * c)) : make_uint4(0, 0, 0, 0);
    }
  };
  auto x_piece = [&](int t, int c) {   // x: through L2, not __ldg (PDL)
    return xin[t] && c < chunks ? __ldcg(reinterpret_cast<const uint4*>(xr[t] + 64 * c)) : make_uint4(0, 0, 0, 0);
  };
  auto load_x = [&](int c0, Batch& B) {   // after the wait only
    if constexpr (kX) {
#pragma unroll
      for (int u = 0; u < kMmaUnroll; ++u)
#pragma unroll
        for (int t = 0; t < kNT; ++t) B.b[u][t] = x_piece(t, c0 + u * kMmaWarps);
    }
  };
  auto use = [&](int c0, const Batch& B) {
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int c = c0 + u * kMmaWarps;
      if (c >= chunks) break;
#pragma unroll
      for (int t = 0; t < kNT; ++t) {
        uint4 b;
        if constexpr (kX) b = B.b[u][t];
        else b = x_piece(t, c);
#pragma unroll
        for (int r = 0; r < kRT; ++r) {
          const uint4 &lo = B.a[r][0][u], &hi = B.a[r][1][u];
          const uint32_t A0[4] = {lo.x, hi.x, lo.y, hi.y}, A1[4] = {lo.z, hi.z, lo.w, hi.w};
          ptx::mma_m16n8k32_s8(acc[r][t], A0, b.x, b.y);
          ptx::mma_m16n8k32_s8(acc[r][t], A1, b.z, b.w);
        }
      }
    }
  };
  constexpr int kStep = kMmaWarps * kMmaUnroll;
  Batch p, q;
  load_w(warp, p);
  pdl::wait_prior_grid();   // the first weights are in flight; x (and y) come from the kernel before. Every warp waits, one with no chunks too
  load_x(warp, p);
  for (int c0 = warp; c0 < chunks; c0 += 2 * kStep) {
    if (c0 + kStep < chunks) load_w(c0 + kStep, q), load_x(c0 + kStep, q);
    use(c0, p);
    if (c0 + kStep >= chunks) break;
    if (c0 + 2 * kStep < chunks) load_w(c0 + 2 * kStep, p), load_x(c0 + 2 * kStep, p);
    use(c0 + kStep, q);
  }
#pragma unroll
  for (int r = 0; r < kRT; ++r)
#pragma unroll
    for (int t = 0; t < kNT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp][r * kNT + t][e][lane] = acc[r][t][e];
  __syncthreads();
  // Thread i of the CTA finishes element (r, t, e, lane) = i of the kRT * kNT * 4 * 32 (int32 sums: any order, the same bytes).
  for (int i = threadIdx.x; i < kRT * kNT * 4 * 32; i += blockDim.x) {
    const int rt = i / 128, r = rt / kNT, t = rt % kNT, e = i / 32 % 4, l = i % 32;
    int a = 0;
    for (int v = 0; v < kMmaWarps; ++v) a += red[v][rt][e][l];
    const int n = n0 + 16 * r + l / 4 + (e >= 2 ? 8 : 0), m = 8 * t + 2 * (l % 4) + (e & 1);   // c0, c1: row g; c2, c3: row g + 8
    if (n < N && m < M) {
      const float v = float(a) * __ldcg(sx + m) * sw[n];
      float* out = y + size_t(m) * N + n;
      *out = beta == 0.0f ? v : v + beta * *out;
    }
  }
}

template <int kNT>
void launch_mma(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta) {
  if ((M + 7) / 8 != kNT) {
    if constexpr (kNT > 1) launch_mma<kNT - 1>(x, sx, w, sw, M, N, K, y, beta);
    return;
  }
  // 5..8 rows: two row tiles a warp (32 rows a CTA) sharing each x piece, batches of 2 chunks (114
  // registers): decode batch 8 +2.6% on llama2-7b (lab run 141: 2,567 / 2,572 tok/s against 2,505 /
  // 2,504; single launches within ±2% of the one-tile form). At 3..4 rows the one-tile form was as
  // fast or faster, and 4 K slices a CTA slower in either form. PTQKIT_W8A8_MMA_RT=1 or 2 forces
  // one form (sweeps).
  if constexpr (kNT == 1) {
    static const int rt = env_int("PTQKIT_W8A8_MMA_RT", 0);
    if (rt == 2 || (rt == 0 && M >= 5)) {
      launch_pdl("w8a8_mma_kernel", true, -1, w8a8_mma_kernel<1, 2, 2>, dim3(unsigned((N + 31) / 32)), dim3(kMmaWarps * 32), 0, x, sx, w, sw, int(M),
                 int(N), int(K), y, beta);
      return;
    }
  }
  launch_pdl("w8a8_mma_kernel", true, -1, w8a8_mma_kernel<kNT>, dim3(unsigned((N + 15) / 16)), dim3(kMmaWarps * 32), 0, x, sx, w, sw, int(M),
             int(N), int(K), y, beta);
}

template <int kM>
void launch_gemv(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta) {
  if (M != kM) {
    if constexpr (kM > 1) launch_gemv<kM - 1>(x, sx, w, sw, M, N, K, y, beta);
    return;
  }
  static const bool row = env_switch("PTQKIT_W8A8_ROW", true);   // 0: the tiled kernel (benchmarks)
  if constexpr (kM <= 2)
    if (row && K <= kRowMaxK) {
      // Weight rows a warp: 1 (run 46, llama2-7b decode batch 1: 414.0 tok/s against 391.2 with 2
      // and 351.3 with 4); PTQKIT_W8A8_ROW_ROWS=2 or 4 for sweeps.
      static const int rows = env_int("PTQKIT_W8A8_ROW_ROWS", 1);
      const int64_t per_cta = kWarps * rows;
      launch_pdl("w8a8_gemv_row_kernel", true, -1, rows == 1 ? w8a8_gemv_row_kernel<kM, 1> : rows == 4 ? w8a8_gemv_row_kernel<kM, 4> : w8a8_gemv_row_kernel<kM, 2>,
                 dim3(unsigned((N + per_cta - 1) / per_cta)), dim3(kWarps * 32), 0, x, sx, w, sw, int(N), int(K), y, beta);
      return;
    }
  const int64_t per_cta = kWarps * kRowsPerWarp;
  launch_pdl("w8a8_gemv_kernel", true, -1, w8a8_gemv_kernel<kM>, dim3(unsigned((N + per_cta - 1) / per_cta)), dim3(kWarps * 32), 0, x, sx, w,
             sw, int(N), int(K), y, beta);
}
}  // namespace

bool w8a8_wgmma_takes(int64_t M, int64_t K) {
  static const int from = env_int("PTQKIT_W8A8_WG_FROM", int(kW8A8WgmmaFromM));   // the first M the wgmma product takes (sweeps; 0: never)
  static const int last = env_int("PTQKIT_W8A8_WG_MAXM", int(kW8A8WgmmaMaxM));     // and the last (sweeps: past it the GEMM)
  return from > 0 && M >= from && M <= last && w8a8_wgmma_gemv_serves(M, K);
}

void w8a8_gemv(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta, bool wgmma) {
  if (wgmma && w8a8_wgmma_takes(M, K)) return w8a8_wgmma_gemv(x, sx, w, sw, M, N, K, y, beta);
  if (M < 1 || M > kW8A8GemvMaxM) fail(Errc::usage, "", "w8a8_gemv", "takes 1.." + std::to_string(kW8A8GemvMaxM) + " rows, not " + std::to_string(M));
  if (M > kMaxM && !w8a8_gemv_serves(M, K))
    fail(Errc::usage, "", "w8a8_gemv", std::to_string(M) + " rows need K % 64 == 0 and tensor cores (sm_80+); K is " + std::to_string(K));
  if (K % 16 || K >= (int64_t(1) << 17)) fail(Errc::usage, "", "w8a8_gemv", "K must be a multiple of 16 below 2^17, not " + std::to_string(K));
  static const int mma_from = env_int("PTQKIT_W8A8_MMA_FROM", kMmaFromM);   // the first M the tensor-core form takes (0: never)
  if ((M > kMaxM || (mma_from > 0 && M >= mma_from)) && K % 64 == 0 && tensor_cores()) return launch_mma<4>(x, sx, w, sw, M, N, K, y, beta);
  launch_gemv<kMaxM>(x, sx, w, sw, M, N, K, y, beta);
}

bool w8a8_gemv_serves(int64_t M, int64_t K) { return M >= 1 && (M <= kMaxM || (M <= kW8A8GemvMaxM && K % 64 == 0 && tensor_cores())); }

// Past 32 rows the wgmma product takes only layers whose 128-row groups fit one wave at a CTA an SM
// (its ring holds one there); on larger ones the wgmma GEMM, whose 256-row tiles fill the SMs in
// one, is faster. Measured on the H200 (docs/lab/2026-11-24-decode-h200.md, run 461), stream µs
// product / GEMM at 64 and 128 rows: 4096x4096 9.9 / 25.5 and 12.6 / 27.1, 14336x4096 (112 groups)
// 23.5 / 29.0 and 29.6 / 30.8, but 22016x4096 (172) 40.8 / 32.6 and 51.9 / 35.4, 28672x4096 45.0 /
// 38.7 and 56.4 / 41.8.
bool w8a8_takes_gemv(int64_t M, int64_t N, int64_t K) {
  if (M > kW8A8GemvMaxM) return w8a8_wgmma_takes(M, K) && (N + 127) / 128 <= sm_count();
  return w8a8_wgmma_takes(M, K) || w8a8_gemv_serves(M, K);
}

}  // namespace ptq::cuda
