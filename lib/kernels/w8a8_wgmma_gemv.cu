// w8a8_wgmma_gemv.cu — the W8A8 decode product on Hopper: weights and activations streamed into
// shared memory by the copy engine (TMA), products on int8 wgmma, K split over a cluster of CTAs.
//
// Contract. The same as w8a8_gemv (w8a8_gemv.cu), which dispatches here (w8a8_wgmma_takes):
// x [M, K] int8 row-major with per-row scales sx [M] fp32; w [N, K] int8 row-major (the Linear's
// weight as stored) with per-row scales sw [N] fp32; y [M, N] fp32 = float(Σ_k x·w) · sx[m] · sw[n]
// + beta · y (beta 0: y is only written). The sum is exact in int32 (K < 2^17) whatever the order
// of its parts, and the epilogue is w8a8_gemv's expression, so both give the same bytes. Accepted:
// 1 <= M <= 128, K a multiple of 16 (the tensor map's row pitch), x and w 16-byte aligned; sm_90.
// The reference is ref_gemm_w8a8 (kernels/reference.h).
// Work. Swapped operands: wgmma's A (its M = 64 rows) is w, 64 rows a consumer warpgroup, and its B
// (N = BN = 8, 16, 32, 64 or 128) the activation rows, so a few tokens cost a narrow n and no
// padding of the weight stream. A CTA: ROWS = 128 rows of w (two consumer warpgroups) or 64 (one; the
// measured cells, kCells64 below) and one producer warp, whose
// lane 0 streams K-steps of 128 bytes — w's ROWS rows and x's BN rows, two boxes in the 128-byte
// swizzle (rows past M and N, columns past K: zeros from the copy engine) — into a ring of kStages,
// each completing on its "full" mbarrier (the bytes counted); the consumers issue four wgmma
// m64nBNk32 (s8 · s8 -> s32) a stage and release it on its "empty" mbarrier once retired. No
// dequantization, no copies or CTA barriers in the consumers' loop. The weights of the first
// stages are requested before the PDL wait (they are never written by a kernel), x after it.
// Split K: the grid is (row groups of ROWS, S slices), the S CTAs of a row group one cluster.
// Each CTA leaves its int32 partial in its own shared memory; after a cluster barrier CTA r adds
// the S partials of its share of the outputs through distributed shared memory (no global
// workspace, no arrival counter) and writes y. S: the most, up to 4, whose clusters are all
// resident at once (two CTAs an SM: ~100 KB of shared memory); at 9..16 rows one where two would
// double up CTAs on under 40% of the SMs (slices_for); a measured cell's own on its layers.
// Measured on the H200 (docs/lab/2026-11-24-decode-h200.md, runs 213-218, 410-413): at most 4
// slices (8 ran the 4096-row layers 25-30% slower: W8A8 4096x11008 at 32 rows 29.6 against 23.4
// µs); a ring of 4 stages at 17..32 rows (5 or more hold one CTA an SM there: decode at batch 32
// 9.5% slower on llama2-7b) and of 5 at 9..16 (still two an SM: 4096x4096 at 16 rows back to
// back 9.0 -> 8.4 µs, decode at batch 16 +1.0-1.8%; 6 stages lost). Where
// it serves: from 9 rows (w8a8_wgmma_takes): decode W8A8 at batch 32 +28% on llama2-7b (6,536 ->
// 8,345 tok/s), batch 16 +16%; at 1..8 rows the mma.sync and dp4a forms stay (batch 8 -7%, batch
// 1 -19% through this kernel: its fixed cost, the cluster and the ring's fill, outweighs its stream).
// At 33..128 rows (BN 64 and 128, lab run 461; a ring of 4 stages, one CTA an SM) it replaced the
// wgmma GEMM on layers whose 128-row groups fit one wave (w8a8_takes_gemv), stream µs at 64 / 128
// rows against the GEMM: 4096x4096 9.9 / 12.6 against 25.5 / 27.1 (the GEMM's 256-row tiles left the
// 4096-row layers 16 CTAs), 4096x11008 19.1 / 22.3 against 57.4 / 59.1, 12288x4096 22.2 / 28.3
// against 28.2 / 30.1; decode W8A8 at batch 64 from 0.88x to 1.15x f16 (llama2-7b), 0.81x to 1.23x
// (llama3-8b).
// The 64-row cells (runs 428-431), back to back at 16 / 32 rows against 128-row CTAs: 4096x4096
// 8.39 -> 8.07 / 9.52 -> 8.21 µs, 11008x4096 16.49 -> 15.72 / 18.89 -> 16.39, 4096x11008 17.23 ->
// 16.26 / 18.15 -> 16.60; decode W8A8 at batch 16 / 32 +2.2 / +2.3% (llama2-7b), +1.5 / +0.4%
// (llama3-8b), +0.6 / +2.8% (phi3-mini).
// Roofline: N·K bytes of w once from HBM (4096 x 4096: 16.8 MB, 4.0 µs at 4.2 TB/s), x (M·K) once
// a CTA from L2.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "cuda/pdl.cuh"
#include "cuda/ptx.cuh"
#include "cuda/runtime.h"
#include "cuda/tma.cuh"
#include "kernels/w8a8.h"

namespace ptq::cuda {

namespace {
namespace cg = cooperative_groups;

// ROWS: the rows of w a CTA holds, 64 a consumer warpgroup (128 or 64); its threads, the
// consumers' and the producer warp's.
constexpr int kBK = kTmaBoxBytes, kMaxSlices = 4;
constexpr int consumers(int rows) { return 2 * rows; }
constexpr int threads(int rows) { return consumers(rows) + 32; }
constexpr int w_bytes(int rows) { return rows * kBK; }       // w's box of a stage: 16 KiB at 128 rows
constexpr int red_stride(int rows) { return rows + 4; }      // int32 words a token row of the partial (+4: the epilogue's stores hit 32 banks)
template <int BN, int ROWS>
constexpr int stage_bytes() { return w_bytes(ROWS) + BN * kBK; }   // a multiple of 1024 (the swizzle's alignment) for BN = 8 .. 128
template <int BN, int ST, int ROWS>
constexpr size_t smem_bytes() { return size_t(ST * stage_bytes<BN, ROWS>() + BN * red_stride(ROWS) * 4 + 2 * ST * 8 + 1024); }   // + mbarriers, alignment

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PTQ_W8A8_GEMV_WGMMA 1
#endif

// d (int32, BN / 2 a thread) += a (64 x 32 int8, shared memory) · b (BN x 32 int8, shared memory), both K-major.
template <int BN>
struct WgmmaS8;
template <>
struct WgmmaS8<8> {
  __device__ static void mma(int (&d)[4], uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\nwgmma.mma_async.sync.aligned.m64n8k32.s32.s8.s8 {%0, %1, %2, %3}, %4, %5, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "l"(a), "l"(b));
  }
};
template <>
struct WgmmaS8<16> {
  __device__ static void mma(int (&d)[8], uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\nwgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7])
                 : "l"(a), "l"(b));
  }
};
template <>
struct WgmmaS8<32> {
  __device__ static void mma(int (&d)[16], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\nwgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
          "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
        : "l"(a), "l"(b));
  }
};
template <>
struct WgmmaS8<64> {
  __device__ static void mma(int (&d)[32], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\nwgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
        "%30, %31}, %32, %33, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
          "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]),
          "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "l"(a), "l"(b));
  }
};
template <>
struct WgmmaS8<128> {
  __device__ static void mma(int (&d)[64], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\nwgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
        "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
        "%58, %59, %60, %61, %62, %63}, %64, %65, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
          "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]),
          "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]),
          "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]),
          "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
          "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
        : "l"(a), "l"(b));
  }
};

template <int BN, int kStages, int ROWS>
__global__ void __launch_bounds__(threads(ROWS)) w8a8_wgmma_gemv_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                                                                   const float* __restrict__ sx, const float* __restrict__ sw, int M, int N, int K,
                                                                   float* y, float beta, int sps) {
#ifdef PTQ_W8A8_GEMV_WGMMA
  constexpr int SB = stage_bytes<BN, ROWS>(), kRows = ROWS, kConsumers = consumers(ROWS), kThreads = threads(ROWS), kWBytes = w_bytes(ROWS),
                kRedStride = red_stride(ROWS);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  int* red = reinterpret_cast<int*>(smem + kStages * SB);   // [BN][kRedStride]: this CTA's int32 partial, token-major
  uint64_t* full = reinterpret_cast<uint64_t*>(red + BN * kRedStride);
  uint64_t* empty = full + kStages;
  const int KS = (K + kBK - 1) / kBK, s0 = blockIdx.y * sps, steps = max(0, min(KS, s0 + sps) - s0);
  const int n0 = blockIdx.x * kRows;
  if (threadIdx.x == kConsumers) {   // the producer: its descriptors fetched while the barriers are set up
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::mbar_init(&full[s], 1);    // the producer's arrive (with the boxes' byte count)
      tma::mbar_init(&empty[s], kConsumers / 128);   // one arrive per consumer warpgroup
    }
    tma::mbar_init_fence();
  }
  __syncthreads();
  pdl::allow_dependents();
  if (threadIdx.x >= kConsumers) {   // the producer warp: lane 0 streams the ring
    if (threadIdx.x == kConsumers) {
      const int pre = min(kStages, steps);
      for (int i = 0; i < pre; ++i) {   // the weights first: never written by a kernel
        tma::mbar_expect_tx(&full[i], SB);
        tma::tma_load(smem + i * SB, &map_w, (s0 + i) * kBK, n0, &full[i]);
      }
      pdl::wait_prior_grid();   // x comes from the kernel before
      for (int i = 0; i < pre; ++i) tma::tma_load(smem + i * SB + kWBytes, &map_x, (s0 + i) * kBK, 0, &full[i]);
      for (int i = kStages; i < steps; ++i) {
        const int s = i % kStages;
        tma::mbar_wait(&empty[s], ((i / kStages) - 1) & 1);
        tma::mbar_expect_tx(&full[s], SB);
        tma::tma_load(smem + s * SB, &map_w, (s0 + i) * kBK, n0, &full[s]);
        tma::tma_load(smem + s * SB + kWBytes, &map_x, (s0 + i) * kBK, 0, &full[s]);
      }
    } else {
      pdl::wait_prior_grid();   // every thread that writes y waits first
    }
  } else {
    pdl::wait_prior_grid();
    const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, q = (threadIdx.x / 32) % 4;
    int acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
    for (int i = 0; i < steps; ++i) {
      const int s = i % kStages;
      tma::mbar_wait(&full[s], (i / kStages) & 1);
      const uint32_t a = ptx::smem_addr(smem + s * SB + wg * 64 * kBK), b = ptx::smem_addr(smem + s * SB + kWBytes);
      ptx::fence_regs(acc);
      ptx::wgmma_fence();
#pragma unroll
      for (int k = 0; k < kBK / 32; ++k) WgmmaS8<BN>::mma(acc, ptx::smem_desc_sw128(a + 32 * k), ptx::smem_desc_sw128(b + 32 * k));
      ptx::wgmma_commit();
      ptx::fence_regs(acc);
      ptx::wgmma_wait<1>();   // the previous stage's wgmmas retired: release it
      if (i > 0 && threadIdx.x % 128 == 0) tma::mbar_arrive(&empty[(i - 1) % kStages]);
    }
    ptx::wgmma_wait<0>();
    ptx::fence_regs(acc);
    // Accumulator layout of m64nBNk32: warp q holds w rows 16q + g (+ 8); register 4j + e is token
    // 8j + 2c + (e & 1) of row 16q + g + 8 (e >> 1).
    const int g = lane >> 2, c = lane & 3, r0 = 64 * wg + 16 * q + g;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(8 * j + 2 * c + (e & 1)) * kRedStride + r0 + 8 * (e >> 1)] = acc[4 * j + e];
  }
  // The sum over the cluster's S partials (a cluster of one: this CTA's own), then the epilogue.
  // CTA r of the cluster takes quads (4 rows of one token) r, r + S, ...
  cg::cluster_group cluster = cg::this_cluster();
  const int S = int(gridDim.y), rank = int(blockIdx.y), rows = min(kRows, N - n0), quads = M * (kRows / 4);
  if (S > 1) cluster.sync();
  else __syncthreads();
  for (int o = rank * kThreads + int(threadIdx.x); o < quads; o += S * kThreads) {
    const int n = o / (kRows / 4), r = 4 * (o % (kRows / 4));
    if (r >= rows) continue;
    int4 sum = make_int4(0, 0, 0, 0);
    for (int z = 0; z < S; ++z) {   // exact in int32: the order does not matter
      const int* src = S > 1 ? cluster.map_shared_rank(red, z) : red;
      const int4 v = *reinterpret_cast<const int4*>(src + n * kRedStride + r);
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    const int part[4] = {sum.x, sum.y, sum.z, sum.w};
    const float s_n = __ldcg(sx + n);   // sx: written by the kernel before (not the non-coherent path)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (r + e >= rows) break;
      const int R = n0 + r + e;
      const float v = float(part[e]) * s_n * sw[R];
      float* out = y + int64_t(n) * N + R;
      *out = beta == 0.0f ? v : __fmaf_rn(beta, *out, v);   // as add_scaled and w8a8_gemv round it
    }
  }
  if (S > 1) cluster.sync();   // no CTA leaves while another reads its partial
#endif  // PTQ_W8A8_GEMV_WGMMA (other targets: an empty body, never launched: w8a8_supported())
}

CUtensorMap cached_map(const int8_t* p, int64_t rows, int64_t K, int box_rows) {
  return cached_tensor_map(tma_spec_int8(p, rows, K, box_rows));
}

// K slices (a cluster's CTAs): the most, up to kMaxSlices and two K-steps a slice, whose clusters
// are all resident at once. cap[S] is that count of clusters of S CTAs
// (cudaOccupancyMaxActiveClusters): a cluster's CTAs share a GPC, so clusters of 3 pack fewer than
// a third of the resident CTAs. By the CTA count alone (the rule before, lab run 412) 11008x4096 at
// 16 rows took 3 slices in 86 clusters: 19.4 µs back to back against 16.6 with one slice.
// At 9..16 rows (BN = 16), where that leaves 2 slices on a grid of one slice that covers at least
// half the SMs: one slice unless the groups reach 0.7 x the SMs. Two slices put two CTAs on
// 2 x groups - SMs of the SMs, and until that is about 40% of them one CTA an SM over fewer SMs is
// faster. Measured on the H200 (lab runs 419-420, K = 4096, back to back, µs at 16 rows with 1 / 2
// slices): 80 row groups 16.0 / 16.9, 86 16.6 / 17.5, 96 18.4 / 18.3, 104 18.8 / 18.8, 112 19.6 /
// 19.2, 128 21.4 / 20.7. At 24 and 32 rows two slices stay: 86 groups 18.8 / 18.7 and 19.5 / 19.2.
// PTQKIT_W8A8_WG_SLICES forces a count up to 8, the portable cluster size, for sweeps.
int slices_for(int64_t groups, int KS, const int* cap, int sms, int BN) {
  static const int forced = env_int("PTQKIT_W8A8_WG_SLICES", 0);
  if (forced > 0) return std::min({forced, 8, std::max(1, KS / 2)});
  int S = std::min(kMaxSlices, std::max(1, KS / 2));
  while (S > 1 && groups > cap[S]) --S;
  if (BN <= 16 && S == 2 && 2 * groups >= sms && 10 * groups < 7 * int64_t(sms)) S = 1;
  return S;
}

// slices: a measured cell's K slices (0: slices_for's), taken only where its clusters are all
// resident at once (else slices_for's: a GPU of fewer SMs than the H200 the cells were measured on).
template <int BN, int ST, int ROWS>
void launch_stages(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta, int slices = 0) {
  static const std::array<int, kMaxSlices + 1> cap = [] {
    auto* kernel = w8a8_wgmma_gemv_kernel<BN, ST, ROWS>;
    PTQ_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes<BN, ST, ROWS>())));
    std::array<int, kMaxSlices + 1> c{};
    for (int S = 1; S <= kMaxSlices; ++S)
      c[size_t(S)] = resident_clusters(reinterpret_cast<const void*>(kernel), dim3(1, unsigned(S), 1), dim3(threads(ROWS)), smem_bytes<BN, ST, ROWS>());
    if (env_switch("PTQKIT_W8A8_PLAN_LOG", false))
      std::fprintf(stderr, "w8a8_wgmma_gemv (%d token rows, %d stages, %d weight rows, %zu B shared): clusters resident of 1..4 CTAs: %d %d %d %d\n", BN, ST,
                   ROWS, smem_bytes<BN, ST, ROWS>(), c[1], c[2], c[3], c[4]);
    return c;
  }();
  const int64_t groups = (N + ROWS - 1) / ROWS;
  const int KS = int((K + kBK - 1) / kBK);
  const bool cell = slices >= 1 && slices <= kMaxSlices && slices <= std::max(1, KS / 2) && groups <= cap[size_t(slices)];
  const int S0 = cell ? slices : slices_for(groups, KS, cap.data(), sm_count(), BN), sps = (KS + S0 - 1) / S0, S = (KS + sps - 1) / sps;   // no empty slice
  const CUtensorMap mx = cached_map(x, M, K, BN), mw = cached_map(w, N, K, ROWS);
  launch_ex("w8a8_wgmma_gemv_kernel", true, -1, S > 1 ? dim3(1, unsigned(S), 1) : dim3(0), w8a8_wgmma_gemv_kernel<BN, ST, ROWS>, dim3(unsigned(groups), unsigned(S)),
            dim3(threads(ROWS)), smem_bytes<BN, ST, ROWS>(), mx, mw, sx, sw, int(M), int(N), int(K), y, beta, sps);
}

// CTAs of 64 weight rows (one consumer warpgroup) on measured layers: the ring's depth and the K
// slices that ran fastest there, back to back on the H200 (docs/lab/2026-11-24-decode-h200.md,
// runs 428-429: every depth of 4..6 and slice count of 1..4 over 13 layers at 16 and 32 rows; a
// cell only where it beat 128-row CTAs under the planner by 3% or more). Half the rows a CTA
// doubles the CTAs: more of the ring's bytes in flight on more SMs, and at K = 4096 fewer slices
// for the same spread. No one depth or slice rule fitted every layer (a 6-stage ring lost 7-10% on
// 14336x4096 and 28672x4096 where it won 6-11% on 12288x4096 and 22016x4096), so the cells are
// the measurements. bn: 16 (9..16 rows) or 32 (17..32).
struct Cell64 {
  int64_t N, K;
  int bn, stages, slices;
};
constexpr Cell64 kCells64[] = {
    // Llama 7B/8B: o (4096²), the unstacked and stacked (q, k, v; gate, up) projections, down.
    {4096, 4096, 16, 6, 4},   {4096, 4096, 32, 5, 4},   {11008, 4096, 16, 6, 2}, {11008, 4096, 32, 5, 2}, {4096, 11008, 16, 6, 2},
    {4096, 11008, 32, 6, 3},  {14336, 4096, 32, 6, 1},  {4096, 14336, 16, 6, 2}, {4096, 14336, 32, 6, 3}, {12288, 4096, 16, 6, 1},
    {12288, 4096, 32, 5, 2},  {22016, 4096, 16, 6, 1},  {22016, 4096, 32, 5, 1}, {6144, 4096, 16, 6, 3},  {6144, 4096, 32, 6, 2},
    // Phi-3-mini: o (3072²), gate, up (16384x3072), down (3072x8192).
    {3072, 3072, 16, 6, 3},   {3072, 3072, 32, 6, 4},   {16384, 3072, 32, 6, 1}, {3072, 8192, 16, 6, 4},  {3072, 8192, 32, 6, 4},
};

// The ring's depth: 5 stages at 9..16 rows, 4 at 17..32 (PTQKIT_W8A8_WG_STAGES = 3..6 forces one
// for sweeps), or a cell's.
template <int BN, int ROWS>
void launch_rows(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta, int stages,
                 int slices) {
  switch (stages) {
    case 3: return launch_stages<BN, 3, ROWS>(x, sx, w, sw, M, N, K, y, beta, slices);
    case 5: return launch_stages<BN, 5, ROWS>(x, sx, w, sw, M, N, K, y, beta, slices);
    case 6: return launch_stages<BN, 6, ROWS>(x, sx, w, sw, M, N, K, y, beta, slices);
    default: return launch_stages<BN, 4, ROWS>(x, sx, w, sw, M, N, K, y, beta, slices);
  }
}

// A measured cell's 64-row plan; else 128 rows under the planner. Sweeps: PTQKIT_W8A8_WG_ROWS (64
// or 128), _STAGES and _SLICES force the plan (any of them set: no cell).
template <int BN>
void launch(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta) {
  static const int rows = env_int("PTQKIT_W8A8_WG_ROWS", 0), stages = env_int("PTQKIT_W8A8_WG_STAGES", 0);
  static const bool forced = rows || stages || env_int("PTQKIT_W8A8_WG_SLICES", 0);
  if (rows && rows != 64 && rows != 128) fail(Errc::usage, "", "PTQKIT_W8A8_WG_ROWS", "'" + std::to_string(rows) + "': want 64 or 128 (or unset)");
  if (stages && (stages < 3 || stages > 6)) fail(Errc::usage, "", "PTQKIT_W8A8_WG_STAGES", "'" + std::to_string(stages) + "': want 3..6 (or unset)");
  const int depth = stages ? stages : BN == 16 ? 5 : 4;
  if (!forced)
    for (const Cell64& c : kCells64)
      if (c.N == N && c.K == K && c.bn == BN) return launch_rows<BN, 64>(x, sx, w, sw, M, N, K, y, beta, c.stages, c.slices);
  if (rows == 64) return launch_rows<BN, 64>(x, sx, w, sw, M, N, K, y, beta, depth, 0);
  return launch_rows<BN, 128>(x, sx, w, sw, M, N, K, y, beta, depth, 0);
}

}  // namespace

bool w8a8_wgmma_gemv_serves(int64_t M, int64_t K) { return M >= 1 && M <= kW8A8WgmmaMaxM && K % 16 == 0 && K >= 16 && K < (int64_t(1) << 17) && w8a8_supported(); }

void w8a8_wgmma_gemv(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta) {
  if (!w8a8_wgmma_gemv_serves(M, K))
    fail(Errc::usage, "", "w8a8_wgmma_gemv", "takes 1..128 rows with K a multiple of 16 below 2^17 on sm_90; got M = " + std::to_string(M) + ", K = " + std::to_string(K) + " on " + describe());
  if (N < 1 || N > (int64_t(1) << 24)) fail(Errc::usage, "", "w8a8_wgmma_gemv", "takes 1..2^24 output rows, not " + std::to_string(N));
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16) fail(Errc::usage, "", "x, w", "the W8A8 product needs 16-byte aligned operands");
  if (M <= 8) launch<8>(x, sx, w, sw, M, N, K, y, beta);
  else if (M <= 16) launch<16>(x, sx, w, sw, M, N, K, y, beta);
  else if (M <= 32) launch<32>(x, sx, w, sw, M, N, K, y, beta);
  else if (M <= 64) launch<64>(x, sx, w, sw, M, N, K, y, beta);
  else launch<128>(x, sx, w, sw, M, N, K, y, beta);
}

}  // namespace ptq::cuda
