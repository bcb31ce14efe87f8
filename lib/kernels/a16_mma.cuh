// a16_mma.cuh — the tensor-core kernel of the 16-bit-activation formats (W4A16, W8A16 in w4a16.cu;
// NF4 in nf4.cu) for M = 1..64 activation rows: y [M, N] = x [M, K] · Wᵀ, x f16, y f16 or fp32
// (+ beta y); and the dequantization of the same layout to f16 for larger M (then cuBLAS).
//
// Contract. W is re-laid out at load into "fragment order": the mma.sync.m16n8k16 A operand is 16
// rows of W (tile t) × 16 columns, x is the B operand (8 activation rows per n8 tile; M <= 8 is
// one mma per A fragment, M <= 64 up to 8). For tile t, k-step s (64 columns), lane l (g = l / 4,
// c = l % 4) and fragment f = 0..3, the lane's A fragment holds rows 16t + g and 16t + g + 8 at
// columns k0 .. k0 + 3, k0 = 64s + 16c + 4f (a0a1 row g k0 k0+1, a2a3 row g+8 k0 k0+1, a4a5 row g
// k0+2 k0+3, a6a7 row g+8 k0+2 k0+3). The mma only needs A and B to agree on K's order inside a
// k16 step, so this permutation of K is free, and it makes each lane's x a contiguous 16 columns:
// two 16-byte loads per n8 tile and k-step. Codes are stored [tiles][KS][kU4][32 lanes] uint4, so
// each warp's load of a k-step is 512 contiguous bytes; the per-(row, group) metadata is stored
// [tiles][groups][8 lanes' g] as the pair (row g, row g + 8). Rows past N and columns past K are
// zero codes with zero scales, and a lane whose 16 columns lie past K reads no x (x rows are K
// long: K must be a multiple of 16). The Format (a16_formats.cuh) supplies kU4 (uint4 per lane per
// k-step), kLoadsM8 (uint4 loads per lane per batch at M <= 8), kRollM1 (kRoll at one row),
// kPairTable (the kernel has it fill a shared lookup table first: fill_pairs, NF4), its Meta, and
// dequant<SCALED, kWide>(words, fragment) -> 4 f16x2 registers (kWide: k_step has two or more n8
// tiles; only NF4's pair table picks its lookup by it, the other formats ignore it).
// Scales: when a group holds whole k-steps (group size a multiple of 64, or one group per row),
// the fragments are dequantized unscaled ((q - z) exactly, or the NF4 value), each k-step's four
// mma sum into a fresh fp32 partial, and the partial is scaled in fp32 (kStepScale); otherwise
// (groups of 16, 32, 96 ...) each lane scales its fragments in f16, as an f16 dequantized
// matrix holds its weights. Accumulation is fp32 either way.
// Work. A warp owns RT (1 or 2) row tiles and one of S K slices, walked in batches of up to 4 uint4
// loads per lane (2 above M = 16) issued before their math (4-bit codes at 9..16 rows with RT = 2,
// and the formats with kOverlapM8 at M <= 8: the next batch issued after this one's MMAs in program order; where
// overlap_variants gives both, the planner picks that loop or the plain one); with RT = 2 the x fragments are loaded
// once for both tiles (at M = 16 x is read 4x more often than W: that halves it). At M = 1 the
// overlapped kernels (one row tile: where a warp walks more than one batch) copy each
// batch's x into shared memory by cp.async first (kStageX: one L2 round trip a batch), and for the
// formats with kRollM1 load each slot of the next batch as soon as its k-step is done (kRoll: in
// the overlapped loop's SASS at 64 registers the next batch's loads follow all of this batch's
// MMAs, lab run 255). A CTA = the S slices of its RT tiles, summed in shared memory in slice
// order (deterministic). plan() picks RT and S from the occupancy calculator with a wave model:
// one full wave of resident CTAs beats a second, partial one (measured: docs/lab/kernels.md).
// Epilogues (a16_path.h; each its own instantiation, the others' code unchanged): y, or at M = 1
// the RMSNorm of the row y by the CTA that arrives last (kFold, NF4), or up to 8 rows of a stacked
// gate, up Linear silu(gate) · up in f16 (kSilu: a CTA holds the gate's and the up's row tile of
// the same 16 rows, in one warp's two row tiles or, at one row of the quantized formats, in two
// halves of its warps). A norm split between two Linears at M = 1 (A16RowNorm row_ss, in_ss): the
// writer (SplitNorm::writer: a one-n8-tile kernel with fp32 y) also writes the sums of squares of
// each 16 rows of y and f16(y * w / 16); the reader (SplitNorm::reader) scales its sums by 16 /
// rms(y) formed from those sums. Each side is its own instantiation, so the kernels without it keep
// their code and registers (a runtime test in every one-row kernel moved ptxas's registers in 13
// of 91 GPTQ kernels: lab run 277).
// Launch: programmatic dependent launch (cuda/pdl.cuh): the kernel may start while the previous one
// in the stream runs; each warp issues its first batch of codes and metadata, then waits for that
// kernel before it reads x or writes y. A grid smaller than the GPU holds is spread (spread()): at
// most ceil(CTAs / SMs) per SM, by padding shared memory within a small carveout, so the CTAs that
// start while the previous kernel drains do not pile up on the SMs it freed first.
// Roofline at M = 1, 4096 x 4096 4-bit g128: 8.9 MB of codes and metadata -> 3.0 us at the H100's
// 3.0 TB/s copy bandwidth; cuBLAS f16 reads 33.6 MB.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "cuda/pdl.cuh"
#include "cuda/ptx.cuh"
#include "cuda/runtime.h"
#include "kernels/a16_path.h"

namespace ptq::cuda::a16 {

constexpr int kMaxSlices = 16;
// The most K slices (warps) a CTA of NT n8 tiles is compiled for: 16 up to 16 rows (registers: at
// most 128 each; W4 with two row tiles 124), else 8. 16 slices at 9..16 rows: the 4096-row layers
// keep 16 warps per SM with two row tiles; at 17..32 rows a launch bound of 512 threads measured
// slower (fewer registers, other schedules), so it stays at 256 threads there (docs/lab/kernels.md).
constexpr int max_slices(int nt) { return nt <= 2 ? kMaxSlices : kMaxSlices / 2; }

using ptx::mma_m16n8k16_f16;

// The group (or NF4 block) of a column: a shift when the size is a power of two, else a division.
struct GroupOf {
  int shift, size;
  __host__ __device__ int operator()(int col) const { return shift >= 0 ? col >> shift : col / size; }
  static GroupOf make(int64_t groups, int64_t size) {
    int shift = groups == 1 ? 30 : -1;
    for (int b = 0; b < 30 && shift < 0; ++b)
      if ((int64_t(1) << b) == size) shift = b;
    return {shift, int(size)};
  }
};

// One k-step (64 columns) of a warp's RT row tiles: dequantize the codes q with their metadata and
// add W · x to acc (fp32). load_x(t, xl) gives the lane's 16 columns of x row 8t + g (two uint4:
// columns 16c .. 16c + 15 of the k-step). kStepScale: the k-step's four MMAs sum into a fresh
// partial, scaled once in fp32; else the fragments are scaled in f16. kInterleave (NT >= 4): MMAs
// that follow each other go to different accumulators, for kernels with few warps per SM to hide
// the MMA latency (the asm statements keep their order).
template <int NT, int RT, bool kStepScale, bool kInterleave = false, class Format, class LoadX>
__device__ __forceinline__ void k_step(const Format& fmt, const uint4 (&q)[RT][Format::kU4], const typename Format::Meta (&meta)[RT], const LoadX& load_x,
                                       float (&acc)[RT][NT][4]) {
  float part[RT][NT][4];
  if constexpr (kStepScale) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) part[r][t][0] = part[r][t][1] = part[r][t][2] = part[r][t][3] = 0.0f;
  }
  auto mma = [&](int r, int t, const uint32_t* a, const uint4 (&xl)[2], int f) {
    const uint32_t* xb = reinterpret_cast<const uint32_t*>(&xl[f / 2]);   // columns k0 k0+1 | k0+2 k0+3 of x row n
    if constexpr (kStepScale) mma_m16n8k16_f16(part[r][t], a, xb[(f % 2) * 2], xb[(f % 2) * 2 + 1]);
    else mma_m16n8k16_f16(acc[r][t], a, xb[(f % 2) * 2], xb[(f % 2) * 2 + 1]);
  };
  if constexpr (NT <= 2) {   // x first (its latency overlaps the dequantization), each fragment used as soon as it is formed
    uint4 xv[NT][2];
#pragma unroll
    for (int t = 0; t < NT; ++t) load_x(t, xv[t]);
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      const auto prep = fmt.template prep<!kStepScale>(meta[r]);
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        uint32_t a[4];
        fmt.template dequant<!kStepScale, (NT > 1)>(q[r], f, prep, a);
#pragma unroll
        for (int t = 0; t < NT; ++t) mma(r, t, a, xv[t], f);
      }
    }
  } else {   // all fragments first, then x one n8 tile at a time (registers)
    uint32_t a[RT][4][4];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      const auto prep = fmt.template prep<!kStepScale>(meta[r]);
#pragma unroll
      for (int f = 0; f < 4; ++f) fmt.template dequant<!kStepScale, true>(q[r], f, prep, a[r][f]);
    }
    if constexpr (kInterleave) {   // x in blocks of 4 n8 tiles; MMAs back to back on different accumulators (few warps per SM)
#pragma unroll
      for (int tb = 0; tb < NT; tb += 4) {
        uint4 xl[4][2];
#pragma unroll
        for (int t = 0; t < 4; ++t) load_x(tb + t, xl[t]);
#pragma unroll
        for (int f = 0; f < 4; ++f)
#pragma unroll
          for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int t = 0; t < 4; ++t) mma(r, tb + t, a[r][f], xl[t], f);
      }
    } else {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        uint4 xl[2];
        load_x(t, xl);
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int f = 0; f < 4; ++f) mma(r, t, a[r][f], xl, f);
      }
    }
  }
  if constexpr (kStepScale) {
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      const float2 sc = fmt.scales(meta[r]);   // rows g, g + 8
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        acc[r][t][0] = fmaf(part[r][t][0], sc.x, acc[r][t][0]);
        acc[r][t][1] = fmaf(part[r][t][1], sc.x, acc[r][t][1]);
        acc[r][t][2] = fmaf(part[r][t][2], sc.y, acc[r][t][2]);
        acc[r][t][3] = fmaf(part[r][t][3], sc.y, acc[r][t][3]);
      }
    }
  }
}

// k-steps per batch of loads in flight: uint4 loads per lane of 2 for M > 16 (registers), the
// format's choice at M <= 8 with two row tiles, else 4; divided among the row tiles.
template <class Format>
constexpr int batch_steps(int nt, int rt) {
  const int loads = nt >= 4 ? 2 : nt == 1 && rt == 2 ? Format::kLoadsM8 : 4;
  return loads / (Format::kU4 * rt) > 0 ? loads / (Format::kU4 * rt) : 1;
}

// A one-row kernel's side of a norm split between two Linears (A16RowNorm): none, the reader
// (in_ss: x is the writer's f16(y * w / 16)) or the writer (row_ss, out).
enum class SplitNorm { none, reader, writer };
// The slot of a CTA's slice partials (red: 32 lanes x kAcc sums a warp) that holds token nn (of an
// n8 tile) at row `row` of a 16-row tile, in C fragment column col = r NT + t (row tile r, n8 tile
// t): lane (row % 8) 4 + nn / 2, register col 4 + (row / 8) 2 + nn % 2.
__device__ constexpr int red_slot(int kAcc, int row, int col, int nn) { return ((row % 8) * 4 + nn / 2) * kAcc + col * 4 + (row / 8) * 2 + nn % 2; }
// A split norm's reader scale: 16 / rms(X) = rsqrt(ss / K + eps) / kSplitNormScale, ss the sum of
// the writer's sums of squares over X's K columns (every reader forms it so).
__device__ __forceinline__ float split_norm_inv(float ss, int K, float eps) { return rsqrtf(ss / float(K) + eps) * (1.0f / kSplitNormScale); }
// A split norm's writer at 17..32 rows: the reader's x = f16(y w_R / 16) of token n's row R into out
// and, when set, into out_perm at a16_wgmma_x_col(R).
__device__ __forceinline__ void write_split_x(const A16RowNorm& norm, int n, int N, int R, float y) {
  const __half xh = __float2half_rn(y * __ldg(norm.w + R) * kSplitNormScale);
  static_cast<__half*>(norm.out)[int64_t(n) * N + R] = xh;
  if (norm.out_perm) static_cast<__half*>(norm.out_perm)[int64_t(n) * N + a16_wgmma_x_col(R)] = xh;
}

// Which loops a kernel of NT n8 tiles and RT row tiles comes in: overlap_only (the batches
// overlapped, mma_kernel's kOverlap), both (the planner picks), plain_only.
enum class Overlap { plain_only, overlap_only, both };
template <class Format>
constexpr Overlap overlap_variants(int nt, int rt) {
  if (nt == 1 && Format::kOverlapM8 && Format::kU4 >= 2) return Overlap::both;   // 8-bit codes, f16 weights: both loops, one or two row tiles
  if (Format::kU4 != 1) return Overlap::plain_only;
  if (nt == 2 && rt == 2) return Overlap::overlap_only;
  if (nt == 1 && Format::kOverlapM8) return rt == 1 ? Overlap::overlap_only : Overlap::both;
  return Overlap::plain_only;
}

// The launch bound's CTAs per SM: 2 (64 registers at 512 threads) for the kernels mma_kernel's
// comment names, else 0 (no bound).
template <class Format>
constexpr int min_ctas(int nt, int rt, bool k_step_scale, bool overlap) {
  const bool held = nt == 1 && (rt == 1 ? overlap : !overlap && k_step_scale && !Format::kPairTable);
  return held ? 2 : 0;
}

// The folded RMSNorm (a16_path.h, A16RowNorm) at M = 1, called by every thread of every CTA after
// its y stores. Thread 0 counts the CTA's arrival with an acquire-release atomic after a barrier
// (the release covers the CTA's y stores, which the barrier ordered before it: no fence); the CTA
// that arrives last loads y (through L2: other CTAs wrote it) and w, V float4 of each a thread and
// pass, sums the squares of y in a fixed order (thread layout, shuffles: the same bytes every run),
// and writes out = f16(y * inv * w), inv = rsqrt(mean(y²) + eps): the decode norm kernel's
// arithmetic, its sum in another order. Rows past V float4 a thread are read twice (Llama's 4096
// at the 512-thread plans: once). No shared memory beyond 33 floats of sm: a larger allocation
// than its neighbours' asks for another carveout, which an SM changes only when idle (the first
// form, the row and w staged in 33 KB, ran the W8A16 step 7% slower).
__device__ __forceinline__ void norm_row_after(const A16RowNorm& nr, const float* y, int N, float* sm) {
  int* flag = reinterpret_cast<int*>(sm + 32);
  __syncthreads();   // the CTA's y stores, before thread 0's release (also: every thread is done with sm)
  if (threadIdx.x == 0) {
    int before;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(nr.arrivals) : "memory");
    const bool last = before == int(gridDim.x) - 1;
    if (last) *nr.arrivals = 0;   // every CTA has arrived: ready for the next launch
    *flag = last;
  }
  __syncthreads();
  if (!*flag) return;
  constexpr int V = 2;
  const int n4 = N / 4, step = V * int(blockDim.x);
  const float4* y4 = reinterpret_cast<const float4*>(y);
  const float4* w4 = reinterpret_cast<const float4*>(nr.w);
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 yv[V], wv[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int i = int(threadIdx.x) + v * int(blockDim.x);
    yv[v] = i < n4 ? __ldcg(y4 + i) : zero;
    wv[v] = i < n4 ? __ldg(w4 + i) : zero;
  }
  auto sq = [](float4 a) { return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w; };
  float ss = 0.0f;
#pragma unroll
  for (int v = 0; v < V; ++v) ss += sq(yv[v]);
  for (int i = int(threadIdx.x) + step; i < n4; i += int(blockDim.x)) ss += sq(__ldcg(y4 + i));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.0f;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) tot += sm[w];
  const float inv = rsqrtf(tot / float(N) + nr.eps);
  uint2* out = static_cast<uint2*>(nr.out);
  auto store = [&](int i, float4 a, float4 g) {
    union {
      __half2 h[2];
      uint2 u;
    } o;
    o.h[0] = __floats2half2_rn(a.x * inv * g.x, a.y * inv * g.y);
    o.h[1] = __floats2half2_rn(a.z * inv * g.z, a.w * inv * g.w);
    out[i] = o.u;
  };
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int i = int(threadIdx.x) + v * int(blockDim.x);
    if (i < n4) store(i, yv[v], wv[v]);
  }
  for (int i = int(threadIdx.x) + step; i < n4; i += int(blockDim.x)) store(i, __ldcg(y4 + i), __ldg(w4 + i));
}

// y = x · Wᵀ for M <= 8 * NT rows, RT row tiles per warp (x loaded once for them). Dynamic shared
// memory: S * 32 * 4 * NT * RT floats. kOverlap: the next batch's loads follow this batch's steps
// in program order (see below). Held to 64 registers (two CTAs of 512 threads per SM) at M <= 8:
// the overlapped one-row-tile kernel (free, it takes 68, and its plans would differ from those of
// the plain loop) and the plain two-row-tile kernel of the GPTQ formats with whole-k-step scales
// (free, 70 / 66: 3 CTAs of 256 threads resident instead of 4, and W4 14336 x 4096 would leave its
// one-wave plan; held, it spills 4 / 8 bytes (W4 / W8) and is faster).
// kSilu (one n8 tile: a16_fold_silu): W is a stacked gate, up Linear (N = 2F, F a multiple of 16);
// CTA b takes gate tile b and up tile b + F / 16 — with RT = 2 each warp both (its K slice of
// each), with RT = 1 warps 0..S/2-1 the gate's K slices and S/2..S-1 the up's — and the epilogue
// writes yh [M, F] f16 = silu(gate) * up (fp32, then rounded: the decode's silu·mul kernel) instead
// of y. Both sum each tile's slices in slice order.
// kSplit (one n8 tile at M = 1; the writer also at four, 17..32 rows), a norm split between two Linears (A16RowNorm):
//   reader: x is f16(y * w / 16) as the writer left it (any column order: the scale is one number),
//           and the sums are scaled by 16 * inv, inv = rsqrt(sum(in_ss) / K + in_eps);
//   writer: fp32 y, and also row_ss (the sum of squares of each 16 rows of y) and out = f16(y * w / 16).
template <int NT, int RT, bool kStepScale, class Format, bool kOverlap, bool kStageX = false, bool kFold = false, bool kSilu = false, bool kRoll = false,
          SplitNorm kSplit = SplitNorm::none>
__global__ void __launch_bounds__(32 * max_slices(NT), min_ctas<Format>(NT, RT, kStepScale, kOverlap))
    mma_kernel(Format fmt, const uint4* __restrict__ W, const __half* __restrict__ x, __half* __restrict__ yh, float* __restrict__ yf, float beta,
               int M, int N, int K, int sps, A16RowNorm norm) {
  static_assert(!kSilu || NT == 1, "silu: one n8 tile; RT = 2: a gate and an up row tile per warp, RT = 1: gate warps and up warps");
  constexpr int kU4 = Format::kU4, kBatch = batch_steps<Format>(NT, RT);
  // kOverlap: the next batch's loads follow this batch's steps in program order, so the compiler
  // may issue them while the MMAs run: 4-bit codes at 9..16 rows with two row tiles, and GPTQ 4-bit at
  // M <= 8. Elsewhere each batch is loaded, then used: as fast or faster (8-bit codes, one row tile
  // at 9..16 rows). Both loops sum in the same order. At one row, held to 64 registers, ptxas puts
  // the next batch's loads after all of this batch's MMAs (lab run 255's SASS); kRoll loads each
  // slot as its k-step frees it instead.
  using Meta = typename Format::Meta;
  extern __shared__ float red[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, S = blockDim.x >> 5;
  const int g = lane >> 2, c = lane & 3, tiles = (N + 15) / 16, tile0 = blockIdx.x * RT, KS = (K + 63) / 64;
  // kSilu with one row tile: warps 0..S/2-1 take the gate tile's K slices, S/2..S-1 the up tile's.
  constexpr bool kSiluSplit = kSilu && RT == 1;
  const int s0 = (kSiluSplit ? warp % (S / 2) : warp) * sps, s1 = min(KS, s0 + sps);
  int tile[RT];
  const uint4* wp[RT];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    tile[r] = kSiluSplit ? int(blockIdx.x) + (warp >= S / 2 ? tiles / 2 : 0)
              : kSilu    ? int(blockIdx.x) + r * (tiles / 2)
                         : min(tile0 + r, tiles - 1);   // past the last tile: a copy of it, not stored
    wp[r] = W + int64_t(tile[r]) * KS * kU4 * 32 + lane;
  }
  const __half* xr = x + int64_t(min(g, M - 1)) * K + 16 * c;   // B column n = g of n8 tile 0 (rows past M: copies, not stored)
  // Two n8 tiles and two row tiles (9..16 rows): n8 tile t's x row from xr is set once, and the
  // code loads of a batch share their base (computed at each load, x's addresses took about 35
  // instructions a k-step and the codes' 12 a batch). Not elsewhere: there the same change moved
  // register counts and plans, and measured slower. The form matters: with xs folded into load_x,
  // ptxas gives the W4 kernel 100 registers instead of 124 and it runs slower.
  // One n8 tile and one row tile with overlapped batches (the M <= 8 kernel held to 64 registers):
  // x's address from one 32-bit element offset, both loads off one base. ptxas rematerializes it
  // at each k-step either way (registers), but from the offset in about 20 instructions, not 30
  // (the 64-bit row pointer and a second base for the second load); other kernels unchanged.
  constexpr bool kHoist = NT == 2 && RT == 2;
  constexpr bool kLeanX = NT == 1 && RT == 1 && Format::kOverlapM8 && (Format::kU4 == 1 || kOverlap);   // 8-bit codes: the overlapped loop only
  static_assert(!kStageX || (NT == 1 && Format::kOverlapM8 && kOverlap && kBatch * 8 <= 32), "x staged: the overlapped one-n8-tile kernel at M = 1, one 16-byte chunk per lane");
  static_assert(!kRoll || kStageX, "the rolled loads: the x-staged kernel");
  constexpr bool kNormIn = kSplit == SplitNorm::reader, kRowSs = kSplit == SplitNorm::writer;
  static_assert(!kNormIn || (NT == 1 && !kFold), "a split norm's reader: one n8 tile (M = 1)");
  static_assert(!kRowSs || ((NT == 1 || NT == 4) && !kFold && !kSilu), "a split norm's writer: one n8 tile (M = 1) or four (17..32 rows), y itself");
  constexpr int kAcc = 4 * NT * RT;   // fp32 sums per lane (the C fragments of RT row tiles x NT n8 tiles)
  const int xo = min(g, M - 1) * K + 16 * c;   // x [M, K] with M <= 8: fits an int
  int xoff[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) xoff[t] = kHoist ? (min(t * 8 + g, M - 1) - min(g, M - 1)) * K : 0;
  auto code_at = [&](int r, int s, int b, int j) {   // uint4 j of k-step s + b of row tile r
    if constexpr (Format::kRowMajor) return fmt.code_ptr(W, tile[r], s + b, j, lane);   // weights as stored (F16RowFormat)
    else if constexpr (kHoist) return wp[r] + int64_t(s) * (kU4 * 32) + (b * kU4 + j) * 32;
    else return wp[r] + int64_t((s + b) * kU4 + j) * 32;
  };
  // Launched with PDL (cuda/pdl.cuh): the next kernel may take this one's SMs as its CTAs exit, and
  // this one's first batch of codes and metadata (never written by a kernel) is in flight before
  // it waits for the previous kernel; x is read and y written after the wait.
  pdl::allow_dependents();
  float acc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t][0] = acc[r][t][1] = acc[r][t][2] = acc[r][t][3] = 0.0f;

  // x through L2 (__ldcg), never the non-coherent path: under PDL the kernel before may have
  // let this one launch before it wrote x, and __ldg reads then went stale (eval/decode_cuda.cu).
  auto step = [&](const uint4 (&q)[RT][kU4], const Meta (&meta)[RT], int s) {
    const bool in_k = 64 * s + 16 * c < K;   // this lane's 16 columns: all inside K or all past it
    const __half* xs = xr + 64 * s;
    auto load_x = [&](int t, uint4 (&xl)[2]) {
      if constexpr (kLeanX) {
        const uint4* xt = reinterpret_cast<const uint4*>(x + (xo + 64 * s));
        xl[0] = in_k ? __ldcg(xt) : make_uint4(0, 0, 0, 0);
        xl[1] = in_k ? __ldcg(xt + 1) : make_uint4(0, 0, 0, 0);
        return;
      }
      const __half* xt = kHoist ? xs + xoff[t] : xr + int64_t(min(t * 8 + g, M - 1) - min(g, M - 1)) * K + 64 * s;
      xl[0] = in_k ? __ldcg(reinterpret_cast<const uint4*>(xt)) : make_uint4(0, 0, 0, 0);
      xl[1] = in_k ? __ldcg(reinterpret_cast<const uint4*>(xt + 8)) : make_uint4(0, 0, 0, 0);
    };
    k_step<NT, RT, kStepScale>(fmt, q, meta, load_x, acc);
  };
  // kNormIn: the writer's sums of squares (K / 16 floats, written by the kernel before) copied
  // into shared memory after the slice sums by warp 0 right after the wait; read in the epilogue.
  auto fetch_in_ss = [&] {
    if constexpr (kNormIn) {
      float* dst = red + S * 32 * kAcc;
      if (warp == 0)
        for (int j = lane; j < K / 64; j += 32) ptx::cp_async16(ptx::smem_addr(dst + 4 * j), norm.in_ss + 4 * j, 16);
      ptx::cp_async_commit();
    }
  };
  // NF4's pair table: filled before any load (the fill needs a barrier every warp reaches), before
  // the wait for the previous kernel.
  if constexpr (Format::kPairTable) {
    fmt.template fill_pairs<(NT > 1)>();
    __syncthreads();
  }
  if constexpr (kOverlap) {
    using Codes = uint4[kBatch][RT][kU4];
    using Metas = Meta[kBatch][RT];
    // f(b) for the first nb k-steps of a batch; a whole batch as straight-line code (its steps interleave).
    auto each_step = [](int nb, auto&& f) {
      if (nb == kBatch) {
#pragma unroll
        for (int b = 0; b < kBatch; ++b) f(b);
      } else {
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          if (b < nb) f(b);
      }
    };
    // Slot b of a batch: the codes and metadata of k-step s + b.
    auto load_slot = [&](Codes& q, Metas& m, int s, int b) {
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < kU4; ++j) q[b][r][j] = __ldcs(code_at(r, s, b, j));
#pragma unroll
      for (int r = 0; r < RT; ++r) m[b][r] = __ldg(fmt.meta_ptr(tile[r], s + b, lane, kStepScale));
    };
    auto issue = [&](Codes& q, Metas& m, int s, int nb) { each_step(nb, [&](int b) { load_slot(q, m, s, b); }); };
    // kStageX (M = 1, overlapped batches; run_mma says where): the batch's x (its 4, 2 or 1
    // k-steps of 64 columns, 512, 256 or 128 bytes) is copied into the warp's own rows of red by one
    // 16-byte cp.async per lane (zeros past K and past the batch), so each batch takes one L2 round
    // trip for x, not the one or two per k-step that ptxas schedules within 64 registers; the MMAs
    // read it with two shared-memory loads per k-step and no address arithmetic.
    auto stage_x = [&](int s, int nb) {
      uint4* xst = reinterpret_cast<uint4*>(red + warp * 32 * kAcc);   // the warp's slice-sum rows (512 bytes at least)
      const int b = lane >> 3, col = 64 * (s + b) + 8 * (lane & 7);
      const bool ok = b < nb && col < K;
      __syncwarp();   // the previous batch's reads are done
      ptx::cp_async16(ptx::smem_addr(xst + lane), ok ? x + col : x, ok ? 16 : 0);
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();
      __syncwarp();
      return xst;
    };
    // k-step b of a batch whose x is staged at xst.
    auto staged_step = [&](const uint4* xst, const Codes& q, const Metas& m, int b) {
      auto lx = [&](int, uint4 (&xl)[2]) {
        xl[0] = xst[b * 8 + 2 * c];
        xl[1] = xst[b * 8 + 2 * c + 1];
      };
      k_step<NT, RT, kStepScale>(fmt, q[b], m[b], lx, acc);
    };
    auto use = [&](const Codes& q, const Metas& m, int s, int nb) {
      if constexpr (kStageX) {
        const uint4* xst = stage_x(s, nb);
        each_step(nb, [&](int b) { staged_step(xst, q, m, b); });
      } else {
        each_step(nb, [&](int b) { step(q[b], m[b], s + b); });
      }
    };
    Codes q;
    Metas m;
    int s = s0, nb = min(kBatch, s1 - s0);
    issue(q, m, s, nb);
    pdl::wait_prior_grid();   // every warp waits, one with no k-steps too: a kernel completes after the one before it
    fetch_in_ss();
    if constexpr (kRoll) {
      // x staged, one row (mma_kernel_pick says where): slot b of the next batch (k-step sn + b,
      // if b < nbn) is loaded as soon as k-step b of this batch has used its registers, so the
      // next batch's bytes are in flight under this batch's math, with no second register set.
      while (nb > 0) {
        const int sn = s + nb, nbn = min(kBatch, s1 - sn);
        const uint4* xst = stage_x(s, nb);
        each_step(nb, [&](int b) {
          staged_step(xst, q, m, b);
          if (b < nbn) load_slot(q, m, sn, b);
        });
        s = sn;
        nb = nbn;
      }
    } else {
      while (nb > 0) {
        use(q, m, s, nb);
        s += nb;
        nb = min(kBatch, s1 - s);
        issue(q, m, s, nb);
      }
    }
  } else {   // whole batches loaded, then used; the rest one k-step at a time
    bool waited = false;
    auto wait_prior = [&] {
      if (!waited) pdl::wait_prior_grid(), fetch_in_ss();
      waited = true;
    };
    int s = s0;
    for (; s + kBatch <= s1; s += kBatch) {
      uint4 q[kBatch][RT][kU4];
      Meta m[kBatch][RT];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int j = 0; j < kU4; ++j) q[b][r][j] = __ldcs(code_at(r, s, b, j));   // streamed once: not kept in L1
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
#pragma unroll
        for (int r = 0; r < RT; ++r) m[b][r] = __ldg(fmt.meta_ptr(tile[r], s + b, lane, kStepScale));
      wait_prior();
#pragma unroll
      for (int b = 0; b < kBatch; ++b) step(q[b], m[b], s + b);
    }
    for (; s < s1; ++s) {
      uint4 q[RT][kU4];
      Meta m[RT];
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < kU4; ++j) q[r][j] = __ldcs(code_at(r, s, 0, j));
#pragma unroll
      for (int r = 0; r < RT; ++r) m[r] = __ldg(fmt.meta_ptr(tile[r], s, lane, kStepScale));
      wait_prior();
      step(q, m, s);
    }
    wait_prior();   // every warp waits, one with no k-steps too: a kernel completes after the one before it
  }
  // The writer's side of a split norm (kRowSs; run_mma launches it at M = 1 with fp32 y): thread
  // o < 16 RT (warp 0) holds row o of the CTA's tiles; its weight w is loaded before the slice
  // sums' barrier.
  float w_row = 0.0f;
  if constexpr (kRowSs && NT == 1) {
    const int o = threadIdx.x, R = (tile0 + o / 16) * 16 + o % 16;
    if (o < 16 * RT && R < N) w_row = __ldg(norm.w + R);
  }
  // The S slices sum in slice order. C fragment: e = 0, 1 at (W row g, x row 2c + e), e = 2, 3 at W row g + 8.
  if constexpr (kStageX) __syncwarp();   // the warp's staged x (its part of red) is read
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(warp * 32 + lane) * kAcc + (r * NT + t) * 4 + e] = acc[r][t][e];
  __syncthreads();
  // kNormIn: x was f16(y * w / 16) (the writer's), so the sums take 16 * inv, inv = rsqrt(sum(in_ss)
  // / K + eps): warp 0 (the threads that write y at M = 1) adds the sums in a fixed order.
  float inv = 1.0f;
  if constexpr (kNormIn) {
    if (warp == 0) {
      ptx::cp_async_wait<0>();
      __syncwarp();
      const float4* s4 = reinterpret_cast<const float4*>(red + S * 32 * kAcc);
      float ss = 0.0f;
      for (int j = lane; j < K / 64; j += 32) {
        const float4 v = s4[j];
        ss += (v.x + v.y) + (v.z + v.w);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      inv = split_norm_inv(ss, K, norm.in_eps);
    }
  }
  if constexpr (kSilu) {
    const int F = N / 2;
    for (int o = threadIdx.x; o < 16 * M; o += blockDim.x) {
      const int row = o % 16, n = o / 16, nn = n % 8;
      float gu[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if constexpr (kSiluSplit) {   // the gate's slices in warps 0..S/2-1, the up's after them
          const int src = ((row % 8) * 4 + nn / 2) * kAcc + (row / 8) * 2 + nn % 2;
#pragma unroll
          for (int w = 0; w < max_slices(NT) / 2; ++w)
            if (w < S / 2) gu[r] += red[(r * (S / 2) + w) * 32 * kAcc + src];
        } else {
          const int src = red_slot(kAcc, row, r, nn);
#pragma unroll
          for (int w = 0; w < max_slices(NT); ++w)
            if (w < S) gu[r] += red[w * 32 * kAcc + src];
        }
      }
      if constexpr (kNormIn) gu[0] *= inv, gu[1] *= inv;
      yh[int64_t(n) * F + 16 * int(blockIdx.x) + row] = __float2half_rn(gu[0] / (1.0f + __expf(-gu[0])) * gu[1]);
    }
    return;
  }
  // The writer's side of a split norm at 17..32 rows with one row tile a warp (kRowSs, NT = 4, RT =
  // 1): each warp walks 32 outputs at a time, a half-warp one token's 16 rows in order, so each 16
  // rows' sum of squares of y is a fixed shuffle tree over the half-warp, as at one row. The loop's
  // bound is warp-uniform (the shuffles take every lane); lanes past the end hold 0. (Two row tiles
  // take the form after the loop below: this one took ptxas from 166 registers to 128 in NF4's
  // kernel and its down Linear 10% slower, while the other cost the GPTQ o Linear ~2 µs a launch;
  // lab runs 317 and 320.)
  if constexpr (kRowSs && NT > 1 && RT == 1) {
    const int total = 16 * M;
    for (int ob = 32 * warp; ob < total; ob += blockDim.x) {
      const int o = ob + lane, n = o / 16, row = o % 16, t = n / 8, nn = n % 8;
      const int R = tile0 * 16 + row;
      float y = 0.0f;
      if (o < total && R < N) {
        const int src = red_slot(kAcc, row, t, nn);
        float v = 0.0f;
        for (int w = 0; w < S; ++w) v += red[w * 32 * kAcc + src];
        const int64_t i = int64_t(n) * N + R;
        y = v + (beta != 0.0f ? beta * yf[i] : 0.0f);
        yf[i] = y;
        write_split_x(norm, n, N, R, y);
      }
      float sq = y * y;
#pragma unroll
      for (int d = 8; d > 0; d >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, d);
      if (o < total && row == 0 && tile0 < tiles) norm.row_ss[int64_t(n) * tiles + tile0] = sq;
    }
    return;
  }
  float y_row = 0.0f;   // kRowSs: this thread's row of y (M = 1)
  for (int o = threadIdx.x; o < 16 * RT * M; o += blockDim.x) {
    const int rr = o % (16 * RT), n = o / (16 * RT), r = rr / 16, row = rr % 16, t = n / 8, nn = n % 8;
    const int src = red_slot(kAcc, row, r * NT + t, nn);
    float v = 0.0f;
    // The one-row-tile overlapped kernel (kLeanX): unrolled to the compiled bound, so the S loads issue
    // together and the adds follow in slice order (the same sums). Not elsewhere: the same unroll
    // moved the registers of the other kernels, and at 9..16 rows it gained nothing for W4 and lost
    // for W8.
    if constexpr (kLeanX) {
#pragma unroll
      for (int w = 0; w < max_slices(NT); ++w)
        if (w < S) v += red[w * 32 * kAcc + src];
    } else {
      for (int w = 0; w < S; ++w) v += red[w * 32 * kAcc + src];
    }
    if constexpr (kNormIn) v *= inv;
    const int R = (tile0 + r) * 16 + row;
    if (R >= N) continue;
    const int64_t i = int64_t(n) * N + R;
    if (yf) {
      const float y = v + (beta != 0.0f ? beta * yf[i] : 0.0f);
      yf[i] = y;
      if constexpr (kRowSs && NT == 1)
        y_row = y, static_cast<__half*>(norm.out)[R] = __float2half_rn(y * w_row * kSplitNormScale);   // the reader's x
      if constexpr (kRowSs && NT > 1 && RT == 2) {   // 17..32 rows, two row tiles: x in both orders, y² over slice 0's slot of this output (read above; no other thread reads it)
        write_split_x(norm, n, N, R, y);
        red[src] = y * y;
      }
    } else {
      yh[i] = __float2half_rn(v);
    }
  }
  // The writer's side of a split norm (kRowSs): the sum of squares of each 16 rows of y. At 17..32
  // rows with two row tiles (NT = 4; the squares left in red by the loop above): after a barrier,
  // thread o < M RT sums the 16 squares of token o / RT's row tile o % RT in row order.
  if constexpr (kRowSs && NT > 1 && RT == 2) {
    __syncthreads();
    for (int o = threadIdx.x; o < M * RT; o += blockDim.x) {
      const int n = o / RT, r = o % RT, t = n / 8, nn = n % 8;
      if (tile0 + r >= tiles) continue;
      float sq = 0.0f;
#pragma unroll
      for (int row = 0; row < 16; ++row)
        sq += (tile0 + r) * 16 + row < N ? red[red_slot(kAcc, row, r * NT + t, nn)] : 0.0f;
      norm.row_ss[int64_t(n) * tiles + tile0 + r] = sq;
    }
  }
  // At one row: thread o = row o of the CTA's tiles (16 RT <= 32: warp 0) with its y from the loop
  // above; a fixed shuffle tree over each half-warp.
  if constexpr (kRowSs && NT == 1) {
    if (threadIdx.x < 32) {
      const int o = threadIdx.x;
      float sq = y_row * y_row;
#pragma unroll
      for (int d = 8; d > 0; d >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, d);
      if (o % 16 == 0 && o < 16 * RT && tile0 + o / 16 < tiles) norm.row_ss[tile0 + o / 16] = sq;
    }
  }
  // kFold (one n8 tile: run_mma launches it only at M = 1 with fp32 y and a request): its own
  // instantiation, so the other kernels' code and registers are those without it.
  if constexpr (kFold) norm_row_after(norm, yf, N, red);
}

// W in f16 ([N, K] row-major, scaled in f16 as an f16 dequantized matrix holds it): a warp per
// (tile, k-step); each lane's four fragments go to a 16 x 64 tile in shared memory (rows padded to
// 33 words: conflict-free), which the warp writes out as 16-byte chunks, 128 bytes per row.
template <class Format>
__global__ void __launch_bounds__(256) dequant_kernel(Format fmt, const uint4* __restrict__ W, __half* __restrict__ out, int N, int K) {
  constexpr int kU4 = Format::kU4;
  __shared__ uint32_t tile_buf[8][16][33];
  const int KS = (K + 63) / 64, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t unit = blockIdx.x * int64_t(8) + warp;   // (tile, k-step)
  if (unit >= int64_t((N + 15) / 16) * KS) return;
  const int s = int(unit % KS), tile = int(unit / KS), g = lane >> 2, c = lane & 3;
  uint4 q[kU4];
  const uint4* wp = W + int64_t(tile) * KS * kU4 * 32 + lane;
#pragma unroll
  for (int j = 0; j < kU4; ++j) q[j] = wp[int64_t(s * kU4 + j) * 32];
  const auto prep = fmt.template prep<true>(__ldg(fmt.meta_ptr(tile, s, lane, false)));
  auto& buf = tile_buf[warp];
#pragma unroll
  for (int f = 0; f < 4; ++f) {
    uint32_t a[4];
    fmt.template dequant<true>(q, f, prep, a);
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      buf[g + 8 * hi][8 * c + 2 * f] = a[hi];           // columns 16c + 4f, +1
      buf[g + 8 * hi][8 * c + 2 * f + 1] = a[2 + hi];   // columns 16c + 4f + 2, +3
    }
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int chunk = lane + 32 * i, row = chunk / 8, part = chunk % 8;   // 8 halves each
    const int r = tile * 16 + row, col = 64 * s + 8 * part;
    if (r >= N || col >= K) continue;
    const uint4 v = make_uint4(buf[row][4 * part], buf[row][4 * part + 1], buf[row][4 * part + 2], buf[row][4 * part + 3]);
    *reinterpret_cast<uint4*>(out + int64_t(r) * K + col) = v;
  }
}

// ---- shared by the three tensor-core kernels' planners (a16_dispatch.cuh, a16_shared_x.cuh, a16_wgmma.cu)

// The work split: RT row tiles per warp, S warps (K slices) per CTA. set_a16_split (a16_path.h)
// forces it for sweeps and tests; 0 = the planner's choice.
inline A16Split g_split;
// Whether the wgmma k-step loop's last call summed its K slices over a cluster (a16_wgmma_last_clustered).
inline bool g_wgmma_clustered = false;
// The thread's fold request (a16_fold_norm, a16_fold_silu, a16_fold_rope: one at a time) and
// whether a call took it.
struct FoldRequest {
  const A16RowNorm* norm = nullptr;
  void* silu = nullptr;
  void* silu_perm = nullptr;   // act's copy in the wgmma kernel's order, or null (a16_fold_silu)
  const A16Rope* rope = nullptr;
  A16Fold taken = A16Fold::none;   // what the call did with it (a16_folded)
};
inline thread_local FoldRequest g_fold;
// The thread's request to be a split norm's reader (a16_norm_in) and whether a call took it.
struct NormInRequest {
  const A16RowNorm* norm = nullptr;
  bool taken = false;
};
inline thread_local NormInRequest g_norm_in;
// The thread's offer of x in the wgmma kernel's k-step order (a16_offer_wgmma_x: x_of, its copy
// x_perm) and whether a call took it: apart from the fold request, so that neither's setting or
// clearing touches the other.
struct XOffer {
  const void* x_of = nullptr;
  const void* x_perm = nullptr;
  bool taken = false;
};
inline thread_local XOffer g_x_offer;

// CTAs of kern with S warps resident per SM (the occupancy calculator).
inline int resident_ctas(const void* kern, int S, size_t smem) {
  int n = 0;
  PTQ_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, 32 * S, smem));
  return n;
}

inline int static_smem(const void* kern) {
  cudaFuncAttributes a{};
  PTQ_CUDA(cudaFuncGetAttributes(&a, kern));
  return int(a.sharedSizeBytes);
}

// The most dynamic shared memory a CTA of kern may ask for (the opt-in limit less its static shared memory).
inline int max_dynamic_smem(const void* kern) {
  int dev = 0, optin = 0;
  PTQ_CUDA(cudaGetDevice(&dev));
  PTQ_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return optin - static_smem(kern);
}

}  // namespace ptq::cuda::a16
