// a16_mma.cuh — the tensor-core kernel shared by the W4A16 / W8A16 (w4a16.cu) and NF4 (nf4.cu)
// paths for M = 5..64 activation rows: y [M, N] = x [M, K] · Wᵀ, x f16, y f16 or fp32 (+ beta y).
//
// Contract. W is read in the GEMV's row-major layout, one uint4 (kCodes codes of consecutive
// columns, one quantization group / block) at a time; the Format supplies the per-(row, uint4)
// metadata and turns one 32-bit word of codes into B fragments (f16 weights, dequantized exactly
// as an f16 dequantized matrix holds them). Accepted: K a multiple of kCodes (the rest is the
// Format's contract), N any, 1 <= M <= 64. sm_90 (thread-block clusters).
// Mapping. mma.sync.m16n8k16 (f16 x f16 -> fp32) only needs A and B to agree on the order of K
// inside a k16 step. Lane (g = lane / 4, t = lane % 4) reads uint4 number 4c + t of row n0 + g for
// chunk c; each 32-bit word of it holds kPerWord consecutive columns = kPerWord / 4 k16 steps of
// 4 consecutive columns for this lane, so its A fragment is 4 consecutive columns of x rows
// g and g + 8, staged in shared memory as ready fragments (one LDS.128 per mma): no re-layout of W.
// Work. A warp owns kNT n8 tiles (16 rows of W); a CTA (8 warps) owns 128 rows and one of S <= 8
// K slices, which it walks in batches of kKS chunks: all of a batch's W loads issued before any
// math (8 KB per warp in flight at 4 bits), the batch's x staged in shared memory meanwhile.
// The S CTAs of a row tile form a thread-block cluster and sum their fp32 accumulators through
// distributed shared memory, each CTA finishing 1/S of the tile's outputs in slice order
// 0..S-1: deterministic, no workspace, one launch. (Measured before, docs/benchmarks.md: x read
// from global memory and a last-CTA reduction through an fp32 workspace, 1.1-1.3x cuBLAS at
// M = 16: the last CTA's serial L2 reads were the tail.)
// Roofline at M = 16, 4096 x 4096, 4 bits: 8.4 MB of codes and metadata + 0.3 MB of x and y ->
// 2.9 us at the H100's 3.0 TB/s copy bandwidth; cuBLAS f16 reads 33.6 MB (11 us at the floor).
// Measured 14.9 us (1.48x cuBLAS), 1.7-1.9x on the larger Llama shapes: latency-bound, each CTA
// loads one batch, then computes (no multi-stage pipeline over K yet).
#pragma once
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include <string>

#include "core/error.h"
#include "cuda/runtime.h"
#include "kernels/a16_path.h"

namespace ptq::cuda::a16 {

constexpr int kNT = 2, kWarps = 8, kRows = kWarps * kNT * 8, kMaxSlices = 8;
constexpr int64_t kMaxM = 64, kGemvMaxM = 4;   // rows served by the tensor-core kernel and by the GEMVs

// The kernel that serves a call (automatic: by M), or Errc::usage when a forced one cannot take M.
inline A16Path resolve(A16Path path, int64_t M, bool f32, const char* kernel) {
  if (path == A16Path::automatic) return M <= kGemvMaxM && !f32 ? A16Path::gemv : M <= kMaxM ? A16Path::mma : A16Path::dequant;
  if (path == A16Path::gemv && (M > kGemvMaxM || f32))
    fail(Errc::usage, "", "M", std::string("the ") + kernel + " GEMV takes M <= 4 rows and f16 output, got M = " + std::to_string(M));
  if (path == A16Path::mma && M > kMaxM)
    fail(Errc::usage, "", "M", std::string("the ") + kernel + " tensor-core kernel takes M <= 64 rows, got M = " + std::to_string(M));
  return path;
}

__device__ __forceinline__ void mma_m16n8k16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// What one lane loads for one word and x row: kPerWord consecutive halves (16 or 8 bytes).
template <int kPerWord> struct XVec;
template <> struct XVec<8> { using type = uint4; };
template <> struct XVec<4> { using type = uint2; };

// The A fragment of one k16 step for x rows (lo, hi) = (g, g + 8): {lo c0c1, hi c0c1, lo c2c3,
// hi c2c3} for the step's 4 columns, from the two rows' loads (step st of the word).
__device__ __forceinline__ uint4 a_fragment(const uint4& lo, const uint4& hi, int st) {
  return st == 0 ? make_uint4(lo.x, hi.x, lo.y, hi.y) : make_uint4(lo.z, hi.z, lo.w, hi.w);
}
__device__ __forceinline__ uint4 a_fragment(const uint2& lo, const uint2& hi, int) { return make_uint4(lo.x, hi.x, lo.y, hi.y); }

// K chunks per batch: 4 (512 columns at 4 bits) up to 32 rows of x, 2 above (registers).
template <int MB> __host__ __device__ constexpr int chunks_per_batch() { return MB <= 2 ? 4 : 2; }

// Format: kCodes (codes per uint4), kPerWord; Raw raw(row, j) loads the metadata of uint4 j of
// row (none(): zero weights); Prep prep(Raw) readies it once per uint4 (after the loads are all
// issued); void setup() runs first on every thread (may fill shared memory and sync);
// void dequant(uint32_t word, const Prep&, uint32_t* b) -> kPerWord / 2 f16x2 registers: pair p
// holds columns 2p, 2p + 1 of the word. cpc: chunks per K slice (gridDim.y slices = the cluster).
template <int MB, class Format>
__device__ __forceinline__ void mma_kernel_body(Format f, const uint4* __restrict__ W, const __half* __restrict__ x, __half* __restrict__ yh,
                                                float* __restrict__ yf, float beta, int M, int N, int K, int cpc) {
  constexpr int kCodes = Format::kCodes, kPerWord = Format::kPerWord, kSteps = kPerWord / 4, kKS = chunks_per_batch<MB>();
  using Raw = typename Format::Raw;
  using Vec = typename XVec<kPerWord>::type;
  // The batch's x in shared memory as ready A fragments: row pair p = 8b + g (x rows 16b + g and
  // 16b + g + 8), fragment ((c * 4 + wi) * kSteps + st) * 4 + t = step st of word wi of chunk c for
  // lane t, 16 bytes: one LDS.128 per mma operand, no register shuffling. A quarter warp (pairs
  // g, g + 1; t = 0..3) reads 2 x 64 consecutive bytes; the pair pitch is padded by 64 bytes so
  // that the two fall in different banks: conflict-free. After the K loop the same bytes hold the
  // fp32 accumulators [MB * 16][kRows] for the cluster reduction.
  constexpr int kSlots = kKS * 16, kFrags = kSlots * kSteps, kPitch = kFrags + 4, kXPer = MB * 8 * kSlots / (kWarps * 32);
  static_assert(kXPer * kWarps * 32 == MB * 8 * kSlots, "x staging: whole slots per thread");
  constexpr int kXBytes = MB * 8 * kPitch * 16, kRedBytes = MB * 16 * kRows * 4;
  __shared__ __align__(16) unsigned char smem[kXBytes > kRedBytes ? kXBytes : kRedBytes];
  auto xs = reinterpret_cast<uint4(*)[kPitch]>(smem);
  f.setup();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n16 = K / kCodes, chunks = (n16 + 3) / 4, S = int(gridDim.y), slice = int(blockIdx.y);
  const int row0 = blockIdx.x * kRows + warp * kNT * 8;
  const int cbeg = slice * cpc, cend = min(chunks, cbeg + cpc);
  const uint4* wrow[kNT];
#pragma unroll
  for (int i = 0; i < kNT; ++i) wrow[i] = W + int64_t(min(row0 + i * 8 + g, N - 1)) * n16;
  float acc[MB][kNT][4];
#pragma unroll
  for (int b = 0; b < MB; ++b)
#pragma unroll
    for (int i = 0; i < kNT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[b][i][e] = 0.0f;
  for (int cb = cbeg; cb < cend; cb += kKS) {
    // x first (a few KB, needed by every warp), then all of the batch's W: the barrier below then
    // waits for x alone, and chunk c's math starts as soon as chunk c's codes land.
    const int col0 = cb * 4 * kCodes, colend = min(K, cend * 4 * kCodes);
    Vec xlo[kXPer], xhi[kXPer];
#pragma unroll
    for (int u = 0; u < kXPer; ++u) {
      const int idx = u * kWarps * 32 + threadIdx.x, p = idx / kSlots, col = col0 + (idx % kSlots) * kPerWord;
      const int rlo = (p / 8) * 16 + p % 8, rhi = rlo + 8;
      xlo[u] = Vec{};
      xhi[u] = Vec{};
      if (col < colend) {
        if (rlo < M) xlo[u] = __ldg(reinterpret_cast<const Vec*>(x + int64_t(rlo) * K + col));
        if (rhi < M) xhi[u] = __ldg(reinterpret_cast<const Vec*>(x + int64_t(rhi) * K + col));
      }
    }
    uint4 w[kKS][kNT];
    Raw meta[kKS][kNT];
#pragma unroll
    for (int c = 0; c < kKS; ++c) {
      const int j = (cb + c) * 4 + t;
#pragma unroll
      for (int i = 0; i < kNT; ++i) {
        const int row = row0 + i * 8 + g;
        const bool ok = cb + c < cend && j < n16 && row < N;
        w[c][i] = ok ? __ldcs(wrow[i] + j) : make_uint4(0, 0, 0, 0);   // streamed once
        meta[c][i] = ok ? f.raw(row, j) : f.none();
      }
    }
    if (cb != cbeg) __syncthreads();   // the previous batch's reads of xs are done
#pragma unroll
    for (int u = 0; u < kXPer; ++u) {
      const int idx = u * kWarps * 32 + threadIdx.x, p = idx / kSlots, sg = idx % kSlots;   // sg = (c * 4 + t) * 4 + wi
      const int frag0 = ((sg / 16) * 4 + sg % 4) * kSteps * 4 + (sg / 4) % 4;
#pragma unroll
      for (int st = 0; st < kSteps; ++st) xs[p][frag0 + st * 4] = a_fragment(xlo[u], xhi[u], st);
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kKS; ++c) {
      typename Format::Prep prep[kNT];
#pragma unroll
      for (int i = 0; i < kNT; ++i) prep[i] = f.prep(meta[c][i]);
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) {
        uint4 a[MB][kSteps];
#pragma unroll
        for (int b = 0; b < MB; ++b)
#pragma unroll
          for (int st = 0; st < kSteps; ++st) a[b][st] = xs[8 * b + g][((c * 4 + wi) * kSteps + st) * 4 + t];
#pragma unroll
        for (int i = 0; i < kNT; ++i) {
          const uint32_t words[4] = {w[c][i].x, w[c][i].y, w[c][i].z, w[c][i].w};
          uint32_t d[kPerWord / 2];
          f.dequant(words[wi], prep[i], d);
#pragma unroll
          for (int st = 0; st < kSteps; ++st)
#pragma unroll
            for (int b = 0; b < MB; ++b) mma_m16n8k16(acc[b][i], a[b][st].x, a[b][st].y, a[b][st].z, a[b][st].w, d[2 * st], d[2 * st + 1]);
        }
      }
    }
  }
  auto store = [&](int m, int n, float v) {
    const int64_t o = int64_t(m) * N + n;
    if (yf) yf[o] = v + (beta != 0.0f ? beta * yf[o] : 0.0f);
    else yh[o] = __float2half_rn(v);
  };
  // C fragment: e = 0, 1 at (x row 16b + g, W row 2t + e of the n8 tile); e = 2, 3 at x row + 8.
  if (S == 1) {
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int i = 0; i < kNT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int m = 16 * b + g + (e >= 2 ? 8 : 0), n = row0 + i * 8 + 2 * t + (e & 1);
          if (m < M && n < N) store(m, n, acc[b][i][e]);
        }
    return;
  }
  __syncthreads();   // xs no longer read: its bytes become red
  auto red = reinterpret_cast<float(*)[kRows]>(smem);
#pragma unroll
  for (int b = 0; b < MB; ++b)
#pragma unroll
    for (int i = 0; i < kNT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[16 * b + g + (e >= 2 ? 8 : 0)][warp * kNT * 8 + i * 8 + 2 * t + (e & 1)] = acc[b][i][e];
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();   // every slice's accumulators are visible to the cluster
  const int rows = min(kRows, N - int(blockIdx.x) * kRows);
  for (int idx = slice * blockDim.x + threadIdx.x; idx < M * kRows; idx += S * blockDim.x) {
    const int m = idx / kRows, nl = idx % kRows;
    if (nl >= rows) continue;
    float v = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxSlices; ++s)   // slice order: the same sum whichever CTA computes it
      if (s < S) v += cluster.map_shared_rank(&red[0][0], s)[idx];
    store(m, int(blockIdx.x) * kRows + nl, v);
  }
  // No CTA may leave while a peer still reads its shared memory; the reads above have completed
  // (their values are stored), so the arrive needs no release fence.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;\n" ::: "memory");
}

// Grid, cluster and chunks per slice of one call: (row tiles, S slices), S a power of two <= 8.
struct Launch {
  dim3 grid;
  int S, cpc;
};
inline Launch plan(int64_t N, int64_t K, int kCodes) {
  const int chunks = int((K / kCodes + 3) / 4);
  int S = 1;   // measured (docs/benchmarks.md): at most 1, 2, 4 slices ran 0.63-1.54x, 1.05-1.78x, 1.38-2.03x at M = 16
  while (S * 2 <= kMaxSlices && S * 2 <= chunks) S *= 2;
  return {dim3(unsigned((N + kRows - 1) / kRows), unsigned(S)), S, (chunks + S - 1) / S};
}

// Launches kernel on grid l with l.S CTAs per cluster along y (the default stream).
template <class Kern, class... Args>
void launch(const Launch& l, Kern kernel, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = l.grid;
  cfg.blockDim = dim3(kWarps * 32);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = unsigned(l.S);
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  PTQ_CUDA(cudaLaunchKernelEx(&cfg, kernel, args...));
}

}  // namespace ptq::cuda::a16
