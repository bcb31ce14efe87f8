// a16_shared_x.cuh — the tensor-core kernel of the 16-bit-activation formats with x staged in
// shared memory, for up to 128 activation rows (automatic: 33..64 rows of layers larger than
// 4096 x 4096 where the GPU is not sm_90, which takes a16_wgmma.cu; a16_path.h): y [M, N] = x [M, K] · Wᵀ, x f16, y f16 or fp32 (+ beta y). Same weights, fragment
// order and Format as kernels/a16_mma.cuh (its contract holds: W is the A operand, x the B operand
// in n8 tiles, one k-step = 64 columns, k_step() does the math). Reference: ref_gemm_gptq /
// ref_gemm_nf4 (kernels/reference.h); tests/test_kernels_cuda.cpp checks every split against them.
//
// Why a second kernel. In a16_mma.cuh every warp reads x from L1/L2 for its own row tiles and the
// warps of a CTA are K slices, so at M = 64 each tile re-reads all of x (8 KB per k-step against
// 512 bytes of codes): L2 traffic, not DRAM, bounds it (0.62-0.72x cuBLAS f16 for W4). Here the
// warps of a CTA own different row tiles of the same K slice and share x: a CTA copies each chunk
// of kC k-steps of x (8 NT rows x 64 kC columns; zeros past K and the slice by cp.async, rows past
// M zeroed once) into shared memory, in a ring of three, two chunks ahead of the math, while each
// warp holds the codes of the next chunk in registers (loaded while this one is computed: with a
// few warps per SM, the latency of global loads must hide behind the warp's own math). Each warp
// reads its x fragments from there (rows padded by 16 bytes: the 16-byte reads of 8 lanes hit
// distinct banks), and issues its MMAs interleaved over accumulators (k_step's kInterleave).
// Scales: applied in f16 to the dequantized weights, whatever the groups (see the kernel).
// Work. Grid = (row-tile groups of WR warps, one 16-row tile each, Sk K slices); plan_shared_x
// picks WR = 8 and the fewest Sk that give 3/4 of the SMs a CTA. With Sk = 1 the warps write y directly;
// else each CTA writes its fp32 partial [M, its rows] to a workspace [Sk][M][N], and the CTA that
// arrives last at its row group (an arrival counter per group, reset by that CTA) sums the Sk
// partials in slice order and writes y: deterministic, whatever order the CTAs finish in.
// Roofline, 4096 x 4096 W4 g128: M = 64, 8.9 MB of codes (3.0 us at 3.0 TB/s) and 2.1 GFLOP
// (mma.sync at ~65% of the tensor peak: ~3.3 us); cuBLAS f16 reads 33.6 MB (21 us measured). The
// kernel reaches ~29% tensor-pipe activity (ncu, 14336 x 4096, M = 64): one CTA of 8 warps per
// SM stalls on the dependent integer/f16 work of the dequantization (docs/lab/kernels.md).
#pragma once
#include "kernels/a16_mma.cuh"
#include "kernels/a16_split_k.cuh"
#include "kernels/a16_wgmma.h"

namespace ptq::cuda::a16 {

// k-steps of x per staged chunk: as many as the codes batch of a16_mma.cuh (4 uint4 per lane),
// no more than 16 / NT (shared memory: 3 stages x 8 NT x (64 kC + 8) halves <= 55 KB).
__host__ __device__ constexpr int chunk_steps(int nt, int rt, int u4) {
  const int b = 4 / (u4 * rt) > 0 ? 4 / (u4 * rt) : 1, cap = 16 / nt > 0 ? 16 / nt : 1;
  return b < cap ? b : cap;
}
constexpr size_t shared_x_bytes(int nt, int u4) { return size_t(3) * 8 * nt * (64 * chunk_steps(nt, 1, u4) + 8) * 2; }

// Threads per CTA the kernel is compiled for: 16 warps where its registers fit in 128 (up to
// NT = 8), else 8.
constexpr int shared_x_max_threads(int nt) { return nt <= 8 ? 512 : 256; }

template <int NT, class Format>
__global__ void __launch_bounds__(shared_x_max_threads(NT))
    shared_x_kernel(Format fmt, const uint4* __restrict__ W, const __half* __restrict__ x, __half* __restrict__ yh, float* __restrict__ yf, float beta,
                    float* __restrict__ part, int* __restrict__ arrivals, int M, int N, int K, int sps) {
  // One row tile per warp (two or four measured slower: registers, docs/lab/kernels.md); weights
  // scaled in f16 as they are dequantized, whatever the groups: the fp32 per-k-step partials would
  // double the accumulators. That is the rounding of an f16 dequantized matrix ((q - z) s in f16,
  // 2^-11 relative), the same as the dequantize + cuBLAS path above 64 rows.
  constexpr int RT = 1;
  constexpr bool kStepScale = false;
  constexpr int kU4 = Format::kU4, kC = chunk_steps(NT, RT, kU4), kRows = 8 * NT, kStride = 64 * kC + 8, kStages = 3;
  using Meta = typename Format::Meta;
  extern __shared__ __align__(16) __half xs[];   // [kStages][kRows][kStride]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, WR = blockDim.x >> 5;
  const int g = lane >> 2, c = lane & 3, tiles = (N + 15) / 16, KS = (K + 63) / 64;
  const int tile_base = blockIdx.x * WR * RT, s0 = blockIdx.y * sps, s1 = min(KS, s0 + sps), chunks = (s1 - s0 + kC - 1) / kC;
  int tile[RT];
  const uint4* wp[RT];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    tile[r] = min(tile_base + warp * RT + r, tiles - 1);   // past the last tile: a copy of it, not stored
    wp[r] = W + int64_t(tile[r]) * KS * kU4 * 32 + lane;
  }
  float acc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t][0] = acc[r][t][1] = acc[r][t][2] = acc[r][t][3] = 0.0f;

  // x rows past M stay zero in every buffer (written once here, never staged; the first barrier
  // below orders these stores before any read).
  for (int o = threadIdx.x; o < kStages * (kRows - M) * (kStride / 8); o += blockDim.x) {
    const int st = o / ((kRows - M) * (kStride / 8)), rest = o % ((kRows - M) * (kStride / 8));
    reinterpret_cast<uint4*>(xs + (st * kRows + M + rest / (kStride / 8)) * kStride)[rest % (kStride / 8)] = make_uint4(0, 0, 0, 0);
  }
  // Staging chunk i (k-steps s0 + kC i ..) into buffer i % kStages: a thread copies the same 16-byte piece (column 8 piece of the chunk) of rows r0,
  // r0 + rstep, ... < M of every chunk (blockDim is a multiple of the 8 kC pieces of a row).
  constexpr int kPieces = 8 * kC;
  const int piece = threadIdx.x % kPieces, r0 = threadIdx.x / kPieces, rstep = blockDim.x / kPieces;
  const __half* xsrc = x + int64_t(r0) * K + 8 * piece;
  auto stage = [&](int i) {
    if (i < chunks) {
      const int sa = s0 + kC * i;
      const bool ok = 64 * sa + 8 * piece < K && sa + piece / 8 < s1;   // zeros past K and past the slice
      const uint32_t dst = ptx::smem_addr(xs + ((i % kStages) * kRows + r0) * kStride + 8 * piece);
      const __half* src = xsrc + 64 * sa;
      for (int row = r0, j = 0; row < M; row += rstep, ++j)
        ptx::cp_async16(dst + uint32_t(j * rstep * kStride * 2), ok ? src + int64_t(j) * rstep * K : x, ok ? 16 : 0);
    }
    ptx::cp_async_commit();   // past the last chunk an empty group, so wait<1> always means "chunk i has landed"
  };
  // The codes and metadata of chunk i into registers (k-steps past the slice: repeats, not used).
  auto load_w = [&](int i, uint4 (&q)[kC][RT][kU4], Meta (&m)[kC][RT]) {
    const int sa = s0 + kC * min(i, chunks - 1);
#pragma unroll
    for (int b = 0; b < kC; ++b)
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < kU4; ++j) q[b][r][j] = __ldcs(wp[r] + int64_t(min(sa + b, s1 - 1) * kU4 + j) * 32);   // streamed once: not kept in L1
#pragma unroll
    for (int b = 0; b < kC; ++b)
#pragma unroll
      for (int r = 0; r < RT; ++r) m[b][r] = __ldg(fmt.meta_ptr(tile[r], min(sa + b, s1 - 1), lane, kStepScale));
  };
  // Chunk i: the codes of chunk i + 1 are loaded into the other register set while chunk i is
  // computed; x runs two chunks ahead in a ring of three buffers, so one barrier per chunk suffices
  // (the buffer staged at iteration i was last read at iteration i - 1, before this barrier).
  auto iteration = [&](int i, const uint4 (&q)[kC][RT][kU4], const Meta (&m)[kC][RT], uint4 (&q_next)[kC][RT][kU4], Meta (&m_next)[kC][RT]) {
    if (i + 1 < chunks) load_w(i + 1, q_next, m_next);
    ptx::cp_async_wait<1>();
    __syncthreads();
    stage(i + 2);
    const int sa = s0 + kC * i;
    const __half* buf = xs + (i % kStages) * kRows * kStride;
#pragma unroll
    for (int b = 0; b < kC; ++b) {
      if (sa + b >= s1) break;
      auto load_x = [&](int t, uint4 (&xl)[2]) {
        const __half* xt = buf + (8 * t + g) * kStride + 64 * b + 16 * c;
        xl[0] = *reinterpret_cast<const uint4*>(xt);
        xl[1] = *reinterpret_cast<const uint4*>(xt + 8);
      };
      k_step<NT, RT, kStepScale, true>(fmt, q[b], m[b], load_x, acc);
    }
  };
  uint4 q0[kC][RT][kU4], q1[kC][RT][kU4];
  Meta m0[kC][RT], m1[kC][RT];
  stage(0);
  stage(1);
  load_w(0, q0, m0);
  for (int i = 0; i < chunks; i += 2) {
    iteration(i, q0, m0, q1, m1);
    if (i + 1 < chunks) iteration(i + 1, q1, m1, q0, m0);
  }
  // C fragment: acc[r][t][e] = y[x row 8t + 2c + (e & 1)][W row 16 tile + g + 8 (e >> 1)].
  const bool split = gridDim.y > 1;
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = 8 * t + 2 * c + (e & 1), R = 16 * (tile_base + warp * RT + r) + g + 8 * (e >> 1);
        if (n >= M || R >= N) continue;
        const int64_t i = int64_t(n) * N + R;
        if (split) part[int64_t(blockIdx.y) * M * N + i] = acc[r][t][e];
        else if (yf) yf[i] = acc[r][t][e] + (beta != 0.0f ? beta * yf[i] : 0.0f);
        else yh[i] = __float2half_rn(acc[r][t][e]);
      }
  if (split) sum_split_k(part, arrivals, 16 * tile_base, 16 * WR * RT, M, N, yh, yf, beta);
}

template <class Format>
using SharedXKernel = void (*)(Format, const uint4*, const __half*, __half*, float*, float, float*, int*, int, int, int, int);

constexpr int shared_x_nt(int64_t M) { return M <= 16 ? 2 : M <= 32 ? 4 : M <= 64 ? 8 : 16; }

template <class Format>
SharedXKernel<Format> shared_x_kernel_of(int nt) {
  switch (nt) {
    case 2: return shared_x_kernel<2, Format>;
    case 4: return shared_x_kernel<4, Format>;
    case 8: return shared_x_kernel<8, Format>;
    default: return shared_x_kernel<16, Format>;
  }
}

struct SharedXPlan {
  int warps, slices, groups, sps;
};
// The split: WR warps per CTA, Sk K slices. Measured (docs/lab/kernels.md): one CTA of 8 warps per
// SM does best: more x reuse per staged chunk than 4 warps, the same as 16 with half the slices;
// and split-K only as far as needed to give the SMs a CTA (its partials cost L2 traffic and a
// reduction). So: the fewest slices (powers of two) with CTAs for at least 3/4 of the SMs (4096
// rows: 32 groups x 4 slices = 128 CTAs beat 256 at M = 32 and 64). A forced split (g_split:
// slices, warps) overrides either.
inline SharedXPlan plan_shared_x(int64_t N, int64_t K, int64_t M) {
  const int tiles = int((N + 15) / 16), KS = int((K + 63) / 64), sms = sm_count();
  const int wr = std::min(g_split.warps ? g_split.warps : 8, shared_x_max_threads(shared_x_nt(M)) / 32), groups = (tiles + wr - 1) / wr;
  int S = 1;
  while (4 * int64_t(groups) * S < 3 * sms && 2 * S <= std::min(kMaxSlices, KS)) S *= 2;
  if (g_split.slices) S = std::max(1, std::min(g_split.slices, KS));
  const int sps = (KS + S - 1) / S;
  return {wr, (KS + sps - 1) / sps, groups, sps};   // no empty slice
}

template <class Format>
void run_shared_x(const Format& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N,
                  int64_t K) {
  const int nt = shared_x_nt(M);
  const auto kern = shared_x_kernel_of<Format>(nt);
  const size_t smem = shared_x_bytes(nt, Format::kU4);
  static std::mutex mu;
  static std::map<std::tuple<const void*, int64_t, int64_t, int, int>, SharedXPlan> plans;
  SharedXPlan p;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_tuple(reinterpret_cast<const void*>(kern), N, K, g_split.slices, g_split.warps);   // kern: format and n8 tiles
    auto it = plans.find(key);
    if (it == plans.end()) {   // first call of this kernel and shape: its shared memory (over the 48 KB default) allowed once
      PTQ_CUDA(cudaFuncSetAttribute(reinterpret_cast<const void*>(kern), cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      it = plans.emplace(key, plan_shared_x(N, K, M)).first;
    }
    p = it->second;
  }
  DeviceBuffer<float> part;
  int* arrivals = nullptr;
  if (p.slices > 1) {
    part = DeviceBuffer<float>(size_t(p.slices * M * N), "A16 split-K partial sums");
    arrivals = arrival_counters(p.groups);
  }
  kern<<<dim3(unsigned(p.groups), unsigned(p.slices)), unsigned(32 * p.warps), smem, static_cast<cudaStream_t>(current_stream())>>>(fmt, W, x, yh, yf, beta, part.get(), arrivals, int(M), int(N),
                                                                                      int(K), p.sps);
  PTQ_CUDA_LAUNCH("a16 shared_x_kernel");
}

}  // namespace ptq::cuda::a16
