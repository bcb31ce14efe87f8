// a16_wgmma.cu — the Hopper kernel of the 16-bit-activation formats (W4A16, W8A16, NF4) for 17..256
// activation rows (a16_path.h: automatic picks it on an sm_90 GPU at 33..128 rows, 129..256 on
// large layers, 17..32 for GPTQ codes on large layers and NF4 on its streamed cells; forced, any M
// up to 256), in two forms: the k-step loop below, and from 8 to 32 staged rows on measured layers a streamed form fed by the
// copy engine (wgmma_tma_kernel, further down):
// y [M, N] = x [M, K] · Wᵀ, x f16, y f16 or fp32 (+ beta y). Reference: ref_gemm_gptq /
// ref_gemm_nf4 (kernels/reference.h); tests/test_kernels_cuda.cpp checks it against them.
//
// Contract. W is the fragment order of kernels/a16_mma.cuh, unchanged (one layout serves every
// kernel): a lane's uint4 of a 16-row tile and 64-column k-step holds its mma A fragments f = 0..3.
// wgmma.m64nBNk16 takes A from registers in that same per-warp fragment layout (warp q of a
// warpgroup: rows 16q .. 16q + 15 of the 64), so each warp dequantizes its codes exactly as the
// mma.sync kernels do, and x is the B operand (BN = 8, 16, 32, 64, 128 or 256 activation rows, the
// next at or above M, rows past M zero) read by wgmma from shared memory. The fragment order
// permutes K inside a k-step (fragment f of lane quad c holds columns 16c + 4f .. 16c + 4f + 3, as
// logical k 2c, 2c + 1 | 2c + 8, 2c + 9 of the k16 step f), so x is permuted the same way once per
// call (permute_x_kernel: column pair (c, f, hi) of each 64-column k-step to the 4-byte slot
// 8f + 4hi + c; rows padded to whole k-steps with zeros) into a workspace, which the kernel copies
// as it lies — or, where the caller offers x already in that order (a16_offer_wgmma_x, K % 64 ==
// 0: the decode's norm and silu·mul write it, a16_wgmma_x_col), it reads that copy and no permute
// pass runs.
// The streamed form also takes a16_fold_silu's request (a stacked gate, up Linear: its CTA holds 64
// gate and the matching 64 up rows and writes silu(gate) · up, and its copy in the order above for
// the next Linear) and, at 17..32 rows, a16_fold_rope's (a stacked q, k, v Linear:
// its CTA holds one head of 128 rows and writes it rotated into q or the KV cache; Epi, below),
// and in those two epilogues a16_norm_in's (a split norm's reader: each token's sums scaled by
// 16 / rms(X) from the writer's sums of squares; kNormIn, below).
// Work. A CTA = 2 warpgroups x 64 rows = 128 rows of W, one of Sk K slices; one k-step per pipeline
// stage: x (BN rows x 128 bytes, in the 128-byte swizzle wgmma reads), the codes and metadata of
// the CTA's rows (GPTQ codes with one group: no metadata, read once before the loop), all by 16-
// and 8-byte cp.async (x from 128 staged rows, and from 64 for 8-bit codes, by one TMA box a k-step
// on an mbarrier of its stage: tma_x) into a ring of D stages, D - 2 ahead of the math (the stage refilled was
// read by the wgmmas of two k-steps back, retired before the barrier); the sources and the stage
// advance a k-step at a time, and the codes are read (LDS) before the next copies are issued. Per
// k-step each warpgroup dequantizes its 4 fragments into registers (scales in f16, as the
// dequantized matrix holds them: numerics.md; GPTQ codes with one group: q - z only, each row's
// scale applied to its accumulators once at the end in fp32) and issues 4 wgmmas, fp32 accumulators in registers
// (BN / 2 per thread); one warpgroup's dequantization overlaps the other's wgmmas (and, at BN <=
// 32, other CTAs': 60-71 registers, several CTAs per SM), and for NF4 and from 128 rows its own
// (the interleaved loop: each fragment dequantized behind the wgmmas in flight). Split-K partials are summed in slice
// order, deterministic: at 64..256 staged rows over a cluster of the slices through shared memory
// (cluster_sum_store) where the clusters are all resident, else by the last CTA to arrive through
// a global workspace (a16_split_k.cuh); both in the same order, so the same bytes. With one slice
// from 128 staged rows and f16 y, each warpgroup's tile goes through the free ring to the copy
// engine as one box store (tma::tma_store). At 64 and 128 staged rows
// (144 and 152 registers: one CTA an SM) a layer of more 128-row groups than SMs runs a variant
// held to 128 registers and a ring of at most 110 KB, two CTAs an SM, so that its CTAs fit one
// wave (run(), below). NF4 dequantizes through a table of f16 pairs in shared memory in both forms
// (Nf4PairFormat, 32 KB a CTA, which the ring's budget leaves room for: table_bytes).
// Roofline, 4096 x 4096 W4 g128 at M = 128: 8.9 MB of codes (3.0 us at 3.0 TB/s) and 4.3 GFLOP
// (4.4 us at the H100's dense f16 wgmma peak, 989 TFLOP/s); cuBLAS f16 reads 33.6 MB and does the
// same flops (21.8 us measured, docs/lab/kernels.md).
#include "kernels/a16_wgmma.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "cuda/pdl.cuh"
#include "cuda/ptx.cuh"
#include "cuda/runtime.h"
#include "cuda/tma.cuh"
#include "kernels/a16_path.h"
#include "kernels/a16_split_k.cuh"
#include "kernels/rotary.cuh"
#include "kernels/w8a8.h"

namespace ptq::cuda::a16 {

namespace {

namespace cg = cooperative_groups;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PTQ_A16_WGMMA 1
#endif

constexpr int kWarpgroups = 2, kThreads = 128 * kWarpgroups;

// Bytes of one pipeline stage: x (BN rows of 128 bytes, wgmma's 128-byte swizzle), then the codes
// ([kU4][256 threads] uint4) and the metadata ([256] of 8 bytes) of the CTA's rows; a multiple of
// 1024 (the swizzle's alignment) for every BN.
constexpr int stage_bytes(int bn, int u4) { return bn * 128 + u4 * kThreads * 16 + kThreads * 8; }
// Stages: as many as fit in 220 KB (110 KB for a kernel of two CTAs an SM), 3 to 6.
// reserve: static shared memory a CTA holds besides the ring (NF4's pair table, table_bytes).
constexpr int stages(int bn, int u4, int per_sm = 1, int reserve = 0) {
  return std::min(6, std::max(3, (220 * 1024 / per_sm - reserve) / stage_bytes(bn, u4)));
}
constexpr size_t smem_bytes(int bn, int u4, int per_sm = 1, int reserve = 0) { return size_t(stages(bn, u4, per_sm, reserve)) * stage_bytes(bn, u4) + 1024; }   // + alignment
template <class Format>
constexpr int table_bytes() {
  if constexpr (Format::kPairTable) return Format::kPairWords * 4;
  else return 0;
}
// The k-step loop's ring and NF4's table fit what an sm_90 SM gives a CTA (227 KB of its 228, a
// CTA an SM; 113 KB each at two): every BN at one CTA an SM, 64 and 128 at two; u4 1 (4-bit codes,
// NF4 with its table) and 2 (8-bit codes, no table).
constexpr bool ring_fits(int per_sm, int u4, int reserve) {
  for (int bn : {8, 16, 32, 64, 128, 256})
    if ((per_sm == 1 || bn == 64 || bn == 128) && smem_bytes(bn, u4, per_sm, reserve) + size_t(reserve) > size_t(per_sm == 1 ? 227 : 113) * 1024) return false;
  return true;
}
static_assert(ring_fits(1, 1, 0) && ring_fits(1, 2, 0) && ring_fits(1, 1, table_bytes<Nf4PairFormat>()) && ring_fits(2, 1, 0) && ring_fits(2, 2, 0) &&
                  ring_fits(2, 1, table_bytes<Nf4PairFormat>()),
              "the wgmma loop's ring and NF4's pair table exceed the shared memory of an SM");

// x [M, K] -> xp [M, KP] (KP = K rounded up to 64) in the fragment order's K permutation, zeros
// past K. A thread per (row, k-step, p): the 16-byte chunks 2c + p (c = 0..3) of the k-step hold
// 4 column pairs each, (f, hi) = (2p + k / 2, k % 2) at word k; chunk 4p + k of the output is word
// k of the four (slot 8f + 4hi + c): a 4 x 4 transpose, free in registers.
__global__ void permute_x_kernel(const __half* __restrict__ x, __half* __restrict__ xp, int M, int K, int KP) {
  const int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, units = int64_t(M) * (KP / 64) * 2;
  pdl::allow_dependents();   // the GEMM's CTAs may start their weight loads meanwhile
  pdl::wait_prior_grid();    // x is the previous kernel's output; xp may still be read by the one before
  if (o >= units) return;
  const int p = int(o % 2), s = int(o / 2 % (KP / 64));
  const int64_t m = o / 2 / (KP / 64);
  uint4 v[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int col = 64 * s + 16 * c + 8 * p;
    v[c] = col < K ? *reinterpret_cast<const uint4*>(x + m * K + col) : make_uint4(0, 0, 0, 0);
  }
  uint4* out = reinterpret_cast<uint4*>(xp + m * KP + 64 * s + 32 * p);
  out[0] = make_uint4(v[0].x, v[1].x, v[2].x, v[3].x);
  out[1] = make_uint4(v[0].y, v[1].y, v[2].y, v[3].y);
  out[2] = make_uint4(v[0].z, v[1].z, v[2].z, v[3].z);
  out[3] = make_uint4(v[0].w, v[1].w, v[2].w, v[3].w);
}

// wgmma.m64nBNk16, f32 += f16 (A: 4 registers per thread) x f16 (B: shared-memory descriptor, K-major).
template <int BN>
struct Wgmma;
template <>
struct Wgmma<8> {
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
        "{%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
};
template <>
struct Wgmma<16> {
  __device__ static void mma(float (&d)[8], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
};
template <>
struct Wgmma<32> {
  __device__ static void mma(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
};
template <>
struct Wgmma<64> {
  __device__ static void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
};
template <>
struct Wgmma<128> {
  __device__ static void mma(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
};
template <>
struct Wgmma<256> {
  __device__ static void mma(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "{%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  }
};

// One k-step of a warpgroup in the plain order: its 4 fragments dequantized into a (the
// registers the previous k-step's wgmmas read: retired before this is called), then 4 wgmma
// m64nBNk16 adding a · x to acc as one group (x: the k-step's BN rows at shared address xs, in the
// 128-byte swizzle).
template <int BN, bool kScaled, class Format, class Prep>
__device__ __forceinline__ void kstep_wgmma(const Format& fmt, const uint4 (&cq)[Format::kU4], const Prep& prep, uint32_t (&a)[4][4], float (&acc)[BN / 2], uint32_t xs) {
#pragma unroll
  for (int f = 0; f < 4; ++f) fmt.template dequant<kScaled>(cq, f, prep, a[f]);
  ptx::fence_regs(acc);
  ptx::wgmma_fence();
  const uint64_t desc = ptx::smem_desc_sw128(xs);
#pragma unroll
  for (int f = 0; f < 4; ++f) Wgmma<BN>::mma(acc, a[f], ptx::desc_advance(desc, 32 * f));
  ptx::wgmma_commit();
  ptx::fence_regs(acc);
}
// GPTQ codes with one group (kRowScale): each row's scale on its fp32 accumulators, once, from the
// group's metadata the loop read before its first k-step (meta1). Warp rows g (registers with bit 1
// clear) and g + 8.
template <int BN, class Format>
__device__ __forceinline__ void scale_rows(const Format& fmt, const typename Format::Meta& meta1, float (&acc)[BN / 2]) {
  const float2 sc = fmt.scales(meta1);
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] *= (i & 2) ? sc.y : sc.x;
}

// The k-step loop's split-K sum over a cluster (K split over the cluster's CTAs, one per slice;
// 64..256 staged rows): each CTA writes its fp32 partial [BN tokens][128 rows] into its own shared
// memory at red (the free ring), and after the cluster's barrier CTA z of S takes the quads (4 rows
// of one token) z, z + S, ... and adds the S partials through distributed shared memory in slice
// order from zero, then writes y: sum_split_k's order and arithmetic (a16_split_k.cuh), so the same
// bytes as the global workspace's sum, without its stores, fences, arrival counter and the last
// CTA's reads in series. Lab run 469 (docs/lab/2026-11-24-decode-h200.md), W4 4096 x 4096 at 128
// rows, stream µs through the workspace / over a cluster: 2 slices 28.1 / 23.5, 3 slices 24.9 /
// 19.0. r0: the thread's first row in the CTA's 128
// (its m64 tile's warp row), c: its lane's column quad; n0: the CTA's first row of W.
// The partials' row stride in shared memory (floats): a CTA's 128 rows and 4 of padding.
constexpr int kRedStride = 128 + 4;
// A thread's fp32 accumulators into the CTA's partial red [BN tokens][kRedStride], token-major
// (this file's two cluster sums). Accumulator layout of m64nBN: register 4j + e is x row (token)
// 8j + 2c + (e & 1) of the CTA's row r0 + 8 (e >> 1) (r0: the warp's row g of its 16-row tile).
template <int BN>
__device__ __forceinline__ void write_partial(float* red, const float (&acc)[BN / 2], int r0, int c) {
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(8 * j + 2 * c + (e & 1)) * kRedStride + r0 + 8 * (e >> 1)] = acc[4 * j + e];
}
template <int BN>
__device__ __forceinline__ void cluster_sum_store(float* red, const float (&acc)[BN / 2], int r0, int c, int n0, int M, int N, __half* yh, float* yf, float beta) {
  write_partial<BN>(red, acc, r0, c);
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int S = int(gridDim.y), rank = int(blockIdx.y), rows = min(128, N - n0);
  for (int o = rank * int(blockDim.x) + int(threadIdx.x); o < M * 32; o += S * int(blockDim.x)) {
    const int n = o / 32, r = 4 * (o % 32);
    if (r >= rows) continue;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int z = 0; z < S; ++z) {
      const float4 t = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, z) + n * kRedStride + r);
      v.x += t.x, v.y += t.y, v.z += t.z, v.w += t.w;
    }
    float vv[4] = {v.x, v.y, v.z, v.w};
    store_quad(vv, min(4, rows - r), n, N, n0 + r, yh, yf, beta);
  }
  cluster.sync();   // no CTA leaves while another reads its partial
}

// Whether the loop's x comes by the copy engine (one TMA box of 64 columns x BN rows a k-step on an
// mbarrier of its stage, rows past M zero-filled by the box) rather than by cp.async: from 128
// staged rows, and from 64 for 8-bit codes. Measured on the H200 (docs/lab/2026-11-24-decode-h200.md,
// run 482, the box from 64 rows for every format): at 128 rows W8 -5 to -9%, at 256 every format
// -6 to -12%, at 64 rows W8 -1 to -3% but W4 +9 to +17% and NF4 +7 to +10%. The rule (run 483,
// against cp.async everywhere): at 128 rows W8 -5 to -9%, NF4 unchanged, W4 +1 to +4% on single
// layers but decode at 128 sequences W4A16 +2.1-2.4% (stacked layers), W8A16 +4%.
constexpr bool tma_x(int bn, int u4) { return bn >= 128 || (bn >= 64 && u4 == 2); }

// kRowScale (GPTQ codes with one group, per-channel scales): the fragments are dequantized to
// q - z only and each row's scale multiplies its accumulators once at the end, in fp32.
// kRowSs (BN = 32, K split over CTAs, fp32 y, N % 16 == 0: run() launches it only so): a split
// norm's writer (a16_fold_norm with row_ss; a16_path.h, A16RowNorm) in the split-K sum
// (sum_split_k's kRowSs): each token's sums of squares of each 16 rows of y, and x = f16(y w / 16)
// in both column orders.
template <int BN, class Format, bool kInterleave, int kMinBlocks = 1, bool kRowScale = false, bool kRowSs = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    wgmma_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_y, int y_by_tma, Format fmt, const uint4* __restrict__ W, const __half* __restrict__ xp, __half* __restrict__ yh, float* __restrict__ yf, float beta,
                 float* __restrict__ part, int* __restrict__ arrivals, int M, int N, int K, int sps, const A16RowNorm norm) {
#ifdef PTQ_A16_WGMMA
  static_assert(!kRowSs || BN == 32, "a split norm's writer: 17..32 rows");
  constexpr int kU4 = Format::kU4, D = stages(BN, kU4, kMinBlocks, table_bytes<Format>()), SB = stage_bytes(BN, kU4);
  using Meta = typename Format::Meta;
  static_assert(sizeof(Meta) == 8, "8-byte metadata per lane and tile");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, q = warp & 3;
  const int tiles = (N + 15) / 16, KS = (K + 63) / 64;
  const int s0 = blockIdx.y * sps, chunks = min(KS, s0 + sps) - s0;
  const int m64 = blockIdx.x * kWarpgroups + wg;      // this warpgroup's 64-row tile
  const int tile = min(m64 * 4 + q, tiles - 1);       // this warp's 16-row tile (past the last: a copy, not stored)

  if constexpr (Format::kPairTable) fmt.template fill_pairs<true>();   // NF4's pair table: the loop's first barrier orders it before any lookup
  // x rows past M stay zero in every stage (written once; the loop's proxy fence and barrier order
  // these stores before any wgmma reads them), or the copy engine stages x (kTmaX, tma_x) on an
  // mbarrier a stage.
  constexpr bool kTmaX = tma_x(BN, kU4);
  __shared__ alignas(8) uint64_t xfull[kTmaX ? D : 1];
  if constexpr (kTmaX) {
    if (tid == 0) {
      for (int st = 0; st < D; ++st) tma::mbar_init(&xfull[st], 1);
      tma::mbar_init_fence();
    }
  }
  for (int o = tid; !kTmaX && o < D * (BN - M) * 8; o += kThreads) {
    const int st = o / ((BN - M) * 8), rest = o % ((BN - M) * 8);
    reinterpret_cast<uint4*>(smem + st * SB + (M + rest / 8) * 128)[rest % 8] = make_uint4(0, 0, 0, 0);
  }
  // Staging k-step i of the slice into the stage at shared address st (stage i % D), from the codes
  // at w and x at xg: the loop advances both sources a k-step and the stage a slot at a time (no
  // index arithmetic a k-step: lab run 474 counted ~65 of the 204 instructions a warp issued a
  // k-step in these copies and their addresses). x: thread tid copies 16-byte chunk u = tid % 8 of rows
  // tid / 8 + 32 j (< M) to chunk u ^ (row % 8) (the swizzle; row % 8 is the thread's own).
  // Codes and metadata: each thread copies its own.
  const int KP = 64 * KS, xu = tid & 7, xrow0 = tid >> 3;
  const uint32_t sbase = ptx::smem_addr(smem), ring_end = sbase + uint32_t(D * SB), xdst = uint32_t(xrow0 * 128 + ((xu ^ (xrow0 & 7)) << 4));
  constexpr int kStepCodes = kU4 * 32;                                          // uint4 of one tile and k-step
  const uint4* const w0 = W + (int64_t(tile) * KS + s0) * kStepCodes + lane;   // the slice's first k-step
  const __half* const x0 = xp + int64_t(xrow0) * KP + 8 * xu + 64 * int64_t(s0);
  auto stage_w = [&](int i, uint32_t st, const uint4* w) {
    if (i >= chunks) return;
    const uint32_t cs = st + BN * 128, ms = cs + kU4 * kThreads * 16;
#pragma unroll
    for (int j = 0; j < kU4; ++j) ptx::cp_async16(cs + uint32_t((j * kThreads + tid) * 16), w + j * 32, 16);
    if constexpr (!kRowScale) ptx::cp_async8(ms + uint32_t(tid * 8), fmt.meta_ptr(tile, s0 + i, lane, false));
  };
  auto stage_x = [&](int i, uint32_t st, const __half* xg) {
    if constexpr (kTmaX) {
      if (tid == 0 && i < chunks) {
        const int slot = int((st - sbase) / uint32_t(SB));
        tma::mbar_expect_tx(&xfull[slot], BN * 128);
        tma::tma_load(smem + (st - sbase), &map_x, 64 * (s0 + i), 0, &xfull[slot]);
      }
    } else if (i < chunks) {
#pragma unroll
      for (int j = 0; j < (BN + 31) / 32; ++j)
        if (xrow0 + 32 * j < M) ptx::cp_async16(st + xdst + uint32_t(j * 32 * 128), xg + int64_t(32 * j) * KP, 16);
    }
    ptx::cp_async_commit();   // past the last k-step an empty group: the wait below counts groups
  };
  auto next_stage = [&](uint32_t st) { return st + SB == ring_end ? sbase : st + uint32_t(SB); };
  // One group (kRowScale): the metadata is the same every k-step, read once (never written by a
  // kernel: before the PDL wait), and so is its preparation.
  Meta meta1{};
  if constexpr (kRowScale) meta1 = *fmt.meta_ptr(tile, 0, lane, false);

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  uint32_t a[4][4];   // the A fragments of one k-step (fragment f: k16 step f)

  // K-step i, one of two loops (interleaved(), below). Plain: the wgmmas of k-step i - 1 retire,
  // then all four fragments are dequantized and their wgmmas issued as one group; the overlap is
  // across the two warpgroups. Interleaved: a group per fragment, fragment f dequantized into a[f]
  // as soon as the group that last read a[f] (k-step i - 1's) retired, i.e. behind three groups
  // still in flight; a wgmma.fence between the writes and the wgmma that reads them. (Dequantizing
  // the whole next k-step into a second register set while this one's wgmmas run made ptxas
  // serialize every wgmma, C7513; a register set per fragment with per-fragment groups does not.)
  // Launched with PDL (cuda/pdl.cuh): the first stages' codes and metadata (never written by a
  // kernel) are in flight before the wait for the previous kernel (permute_x); x, the split-K
  // workspace and y come after it. The group of the first commit holds them all.
  pdl::allow_dependents();
#pragma unroll
  for (int i = 0; i < D - 2; ++i) stage_w(i, sbase + uint32_t(i * SB), w0 + i * kStepCodes);
  pdl::wait_prior_grid();
#pragma unroll
  for (int i = 0; i < D - 2; ++i) stage_x(i, sbase + uint32_t(i * SB), x0 + 64 * i);
  uint32_t fill = sbase + uint32_t((D - 2) * SB), read = sbase;   // the stages of k-steps i + D - 2 and i
  const uint4* wn = w0 + (D - 2) * kStepCodes;                     // k-step i + D - 2's codes and x
  const __half* xn = x0 + 64 * (D - 2);
  int rslot = 0, rphase = 0;   // kTmaX: the stage of k-step i and its mbarrier's phase
  for (int i = 0; i < chunks; ++i) {
    ptx::cp_async_wait<D - 3>();   // this thread's copies of k-step i landed
    if constexpr (!kTmaX) ptx::fence_proxy_async();   // (x by cp.async: the generic proxy's writes, read by wgmma)
    __syncthreads();               // ... and every thread's; the wgmmas of k-step i - 2 retired everywhere
    if constexpr (kTmaX) {
      tma::mbar_wait(&xfull[rslot], rphase);   // k-step i's x landed
      if (++rslot == D) rslot = 0, rphase ^= 1;
    }
    // This k-step's codes and metadata first, then the copies: read after them, the loads waited on
    // the copies' address registers (lab run 475: 7% of the stall samples on the codes' LDS).
    uint4 cq[kU4];
#pragma unroll
    for (int j = 0; j < kU4; ++j) cq[j] = ptx::ld_shared_u4(read + uint32_t(BN * 128 + (j * kThreads + tid) * 16));
    Meta meta = meta1;
    if constexpr (!kRowScale) {
      const uint2 mw = ptx::ld_shared_u2(read + uint32_t(BN * 128 + kU4 * kThreads * 16 + tid * 8));
      __builtin_memcpy(&meta, &mw, sizeof(Meta));
    }
    stage_w(i + D - 2, fill, wn);  // into the stage k-step i - 2 used
    stage_x(i + D - 2, fill, xn);
    fill = next_stage(fill), wn += kStepCodes, xn += 64;
    const uint32_t xs = read;
    read = next_stage(read);
    const auto prep = fmt.template prep<!kRowScale>(meta);
    if constexpr (kInterleave) {
      const uint64_t desc = ptx::smem_desc_sw128(xs);
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        ptx::wgmma_wait<3>();   // the group that read a[f] (k-step i - 1's fragment f) retired
        fmt.template dequant<!kRowScale>(cq, f, prep, a[f]);
        ptx::wgmma_fence();
        Wgmma<BN>::mma(acc, a[f], ptx::desc_advance(desc, 32 * f));
        ptx::wgmma_commit();
      }
    } else {
      ptx::wgmma_wait<0>();   // k-step i - 1 retired: the A registers are free
      kstep_wgmma<BN, !kRowScale>(fmt, cq, prep, a, acc, xs);
    }
  }
  ptx::wgmma_wait<0>();
  ptx::fence_regs(acc);
  ptx::cp_async_wait<0>();

  // Accumulator layout of m64nBN: warp q holds W rows 16q + g (+ 8); register 4j + e is x row
  // 8j + 2c + (e & 1) of W row 16q + g + 8 (e >> 1).
  if constexpr (kRowScale) scale_rows<BN>(fmt, meta1, acc);
  const int g = lane >> 2, c = lane & 3;
  const bool split = gridDim.y > 1;
  // One slice, f16 y (run(): y_by_tma, from 128 staged rows): each warpgroup's tile through the free
  // ring to the copy engine, one box store, instead of the accumulators' scattered 2-byte stores.
  if constexpr (BN >= 128) {
    if (y_by_tma && !split) {   // f16 y by the copy engine (run(): N % 8 == 0, y 16-byte aligned)
      __syncthreads();   // every warpgroup's wgmmas retired and copies landed: the ring is free
      // Warpgroup wg's 64 rows x BN tokens at smem + wg BN 128, token-major in the 128-byte
      // swizzle of map_y's boxes: row r (0..63) of token t at byte t 128 + ((r / 8) ^ (t % 8)) 16 + (r % 8) 2.
      uint8_t* const tile = smem + wg * BN * 128;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = 8 * j + 2 * c + (e & 1), r = 16 * q + g + 8 * (e >> 1);
          *reinterpret_cast<__half*>(tile + t * 128 + (((r >> 3) ^ (t & 7)) << 4) + (r & 7) * 2) = __float2half_rn(acc[4 * j + e]);
        }
      ptx::fence_proxy_async();   // the generic proxy's writes, read by the copy engine
      ptx::named_barrier<128>(1 + wg);   // this warpgroup's tile written
      if ((tid & 127) == 0) {
        tma::tma_store(&map_y, 128 * int(blockIdx.x) + 64 * wg, 0, tile);
        tma::bulk_wait_read();
      }
      return;
    }
  }
  // K split over a cluster of all the slices (64..256 staged rows; run() launches it so where the
  // clusters are all resident): the partials meet in shared memory instead of the global workspace.
  if constexpr (BN >= 64 && !kRowSs) {
    if (split && int(cg::this_cluster().dim_blocks().y) == int(gridDim.y)) {
      static_assert(D * SB >= BN * kRedStride * 4, "the ring holds the CTA's partial");
      __syncthreads();   // every thread's wgmmas retired and copies landed (waits above): the ring is free
      cluster_sum_store<BN>(reinterpret_cast<float*>(smem), acc, 64 * wg + 16 * q + g, c, 128 * int(blockIdx.x), M, N, yh, yf, beta);
      return;
    }
  }
  float* out = split ? part + int64_t(blockIdx.y) * M * N : yf;
  const int R0 = 64 * m64 + 16 * q + g;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    if (8 * j >= M) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int n = 8 * j + 2 * c + (e & 1), R = R0 + 8 * (e >> 1);
      if (n < M && R < N) {
        const int64_t o = int64_t(n) * N + R;
        if (out) out[o] = acc[4 * j + e] + (!split && beta != 0.0f ? beta * out[o] : 0.0f);
        else yh[o] = __float2half_rn(acc[4 * j + e]);
      }
    }
  }
  // The sum's quads a thread (a16_split_k.cuh: 2 for 8-bit codes at 32 staged rows, lab run 330).
  if (split) sum_split_k<BN <= 32 ? (Format::kU4 == 2 && BN == 32 ? 2 : 1) : 4, kRowSs>(part, arrivals, 64 * kWarpgroups * blockIdx.x, 64 * kWarpgroups, M, N, yh, yf, beta, norm);
#endif  // PTQ_A16_WGMMA (other targets: an empty body, never launched: a16_wgmma_supported())
}

// The streamed form at 8..32 staged rows (wgmma_tma_kernel). The loop above spends most of its
// instructions on its own copies, their addresses and the barrier a k-step (lab run 178: ~183 a
// warp a k-step, 53 of them dequantization). Here lane 0 of a producer warp streams each stage of
// kTmaNK k-steps by the copy engine in 2 + kTmaNK boxes: the codes of the CTA's 8 tiles (a 3-D
// tensor map over the fragment order, [tiles][KS][a tile's k-step]), their metadata of kTmaNK
// groups from the stage's first ([tiles][groups][8]; none with one group: the consumers read it
// once), and x a box a k-step (the permuted x, 64 columns x BN rows in the 128-byte swizzle, rows
// past M zero-filled); all complete on the stage's "full" mbarrier. The two consumer warpgroups
// read codes and metadata from shared memory, dequantize and issue the wgmmas as the loop does, and
// release a stage on its "empty" mbarrier once its wgmmas retired: no copies, no CTA barrier in
// their loop. NF4 dequantizes through its pair table (Nf4PairFormat, 32 KB of static shared memory
// filled by every thread before the first barrier; run(), below), as the loop does. K is split
// over a cluster of S CTAs (at most 8, as many as keep the grid resident) whose fp32 partials are
// added in slice order through distributed shared memory: sum_split_k's
// order, so at the same slices the loop's bytes (a test checks it). Groups (NF4 blocks) of a
// multiple of 64 columns, or one group: a k-step reads one group's metadata.
// Measured on the H200 (docs/lab/2026-11-24-decode-h200.md, runs 228-234), stream µs at 32 rows
// against the loop: a plain bulk copy a tile (18 copies a stage of 2 k-steps) ran 10-40% slower
// (a stage of one k-step slower still: the cost is per copy); 4 k-steps a stage in 6 boxes ran
// W4 22016 x 4096 30.9 against 37.0, W8 22016 x 4096 32.8 against 40.0, W8 12288 x 4096 22.1
// against 28.0, but W8 4096 x 11008 28.5 against 25.3. In the decode step the kernel figures did not carry over alike (Phi-3-mini's W4
// layers lost 11% in the step at equal kernel figures; llama3-8b's W8 gate, up and down 6%), so
// it serves the measured cells of a16_wgmma_streamed (a16_path.h).
constexpr int kTmaThreads = kThreads + 32;
constexpr int tma_stage_bytes(int bn, int u4, int nk) { return (nk * bn * 128 + 8 * nk * u4 * 512 + 8 * nk * 64 + 1023) / 1024 * 1024; }
constexpr size_t tma_smem_bytes(int bn, int u4, int nk, int D) {
  return std::max<size_t>(size_t(D) * tma_stage_bytes(bn, u4, nk), size_t(bn) * kRedStride * 4) + 2 * 8 * size_t(D) + 1024;
}

// The epilogue, after the cluster's slice-order sum:
//   plain  y [M, N] (f16 yh, or fp32 yf + beta yf);
//   silu   (a16_fold_silu; W a stacked gate, up Linear, N = 2F, F % 64 == 0): CTA b's warpgroups
//          take the gate's rows 64b .. 64b + 63 and the up's F + 64b .. (two boxes of 4 tiles a
//          stage where the plain form copies one of 8), and it writes act [M, F] f16 = silu(g) · u
//          (fp32, then rounded, as the decode's silu·mul kernel) into yh, and into act_perm (when
//          set) the same values at a16_wgmma_x_col's columns: the next Linear's x in the wgmma
//          kernel's order;
//   rope   (a16_fold_rope; W a stacked q, k, v Linear of heads of 128 rows): CTA b holds head b
//          (q heads, then k's, then v's), each dim j < 64 beside its rotary partner j + 64, and
//          writes the rotated q head into rope.q, the rotated key and the value into the caches at
//          their token's position (kernels/rotary.cuh), no y.
// kNormIn (BN = 32): a split norm's reader (a16_norm_in; a16_path.h, A16RowNorm): x is the
// writer's f16(X w / 16) and in_ss [M][K / 16] its sums of squares of each 16 columns of X; every
// sum of token n is scaled by inv_n = 16 / rms(X_n) before the epilogue's arithmetic. The consumers
// form inv_n right after the PDL wait, while the first stages land (8 threads a token: each adds
// its K / 128 float4s in order, the loads unrolled into one L2 round trip, then a fixed shuffle
// tree), and keep it in a register until the ring is free. (Formed by the producer warp's idle
// lanes 1..31 instead, beside lane 0's copies, it delayed them: decode at batch 32 3-4% slower on
// llama2-7b, lab run 319.)
// kRowSs (BN = 32, the plain epilogue, GPTQ 4-bit codes, N % 128 == 0): a split norm's writer
// (a16_fold_norm with row_ss; A16RowNorm), as the k-step loop's split-K sum writes it: y = the sum
// + beta y in fp32 into yf (the residual row X), the reader's x = f16(X w / 16) into out and
// out_perm, and each 16 rows' sum of squares of X into row_ss (a quad's four squares in order, then
// a shuffle tree over the 4 lanes of the 16 rows). (This writer for the down Linear alone, beside
// the L2-fed kernel's o writer, measured -0.5% on llama2-7b W4A16 at batch 32, lab run 321; with
// the o projection on this form too it serves both of a layer's norms: lab run 396.)
enum class Epi { plain, silu, rope };
template <int BN, class Format, bool kRowScale, int kTmaNK, Epi kEpi = Epi::plain, bool kNormIn = false, bool kRowSs = false>
__global__ void __launch_bounds__(kTmaThreads) wgmma_tma_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                                                                const __grid_constant__ CUtensorMap map_m, Format fmt, __half* __restrict__ yh, float* __restrict__ yf,
                                                                __half* __restrict__ act_perm, const A16Rope rope, float beta, int M, int N, int K, int sps, int D,
                                                                const A16RowNorm norm) {
#ifdef PTQ_A16_WGMMA
  static_assert(!kNormIn || (BN == 32 && kEpi != Epi::plain), "a split norm's reader: 17..32 rows, 8 consumer threads a token, a folded epilogue");
  static_assert(!kNormIn || 2 * tma_stage_bytes(BN, Format::kU4, kTmaNK) >= (BN * kRedStride + BN) * 4, "the tokens' inv past the partial, inside the ring");
  static_assert(!kRowSs || (BN == 32 && kEpi == Epi::plain && !kNormIn), "a split norm's writer: 17..32 rows, the plain epilogue");
  constexpr bool kSilu = kEpi == Epi::silu;
  constexpr int kU4 = Format::kU4, SB = tma_stage_bytes(BN, kU4, kTmaNK);
  constexpr int XB = kTmaNK * BN * 128, TB = kTmaNK * kU4 * 512, CB = 8 * TB;   // x boxes, then 8 tiles' codes (TB each), then metadata
  constexpr int kBytes = XB + CB + (kRowScale ? 0 : 8 * kTmaNK * 64);           // a stage's copies (boxes past K or N: zeros, counted)
  using Meta = typename Format::Meta;
  static_assert(sizeof(Meta) == 8, "8-byte metadata per lane and tile");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + max(D * SB, BN * kRedStride * 4));
  uint64_t* empty = full + D;
  float* red = reinterpret_cast<float*>(smem);   // after the loop, over the ring: [BN][kRedStride], token-major
  const int tiles = (N + 15) / 16, KS = (K + 63) / 64;
  const int s0 = blockIdx.y * sps, steps = max(0, min(KS, s0 + sps) - s0), nst = (steps + kTmaNK - 1) / kTmaNK;
  const int tile0 = blockIdx.x * 8;
  // kSilu: the gate's 4 tiles (warpgroup 0) and the up's 4 (warpgroup 1) of the CTA's 64 rows.
  const int tile_g = blockIdx.x * 4, tile_u = tiles / 2 + blockIdx.x * 4;
  if (threadIdx.x == kThreads) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
    if (!kRowScale) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_m)) : "memory");
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < D; ++s) {
      tma::mbar_init(&full[s], 1);    // the producer's arrive (with the stage's byte count)
      tma::mbar_init(&empty[s], 2);   // one arrive per consumer warpgroup
    }
    tma::mbar_init_fence();
  }
  if constexpr (Format::kPairTable) fmt.template fill_pairs<true>();   // NF4's pair table, before the barrier its lookups follow
  __syncthreads();
  pdl::allow_dependents();
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31, q = (threadIdx.x / 32) & 3, tl = 4 * wg + q;   // consumers: tile tl of the CTA's 8
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  float inv = 1.0f;   // kNormIn: 16 / rms(X_n) of token n = threadIdx.x / 8 (consumers)
  if (threadIdx.x >= kThreads) {   // the producer warp: lane 0 streams the ring
    if (lane == 0) {
      // Stage i: k-steps s0 + kTmaNK i ..; the codes of the CTA's 8 tiles (one box), the metadata of
      // kTmaNK groups from the first k-step's (one box), x one box a k-step.
      auto weights = [&](int i, int slot) {
        const int s = s0 + kTmaNK * i;
        uint8_t* st = smem + slot * SB;
        tma::mbar_expect_tx(&full[slot], kBytes);
        const int mg = int(fmt.meta_ptr(0, s, 0, true) - fmt.meta_ptr(0, 0, 0, true)) / 8;
        if constexpr (kSilu) {   // boxes of 4 tiles: the gate's, then the up's
          tma::tma_load_3d(st + XB, &map_w, 0, s, tile_g, &full[slot]);
          tma::tma_load_3d(st + XB + 4 * TB, &map_w, 0, s, tile_u, &full[slot]);
          if (!kRowScale) {
            tma::tma_load_3d(st + XB + CB, &map_m, 0, mg, tile_g, &full[slot]);
            tma::tma_load_3d(st + XB + CB + 4 * kTmaNK * 64, &map_m, 0, mg, tile_u, &full[slot]);
          }
        } else {
          tma::tma_load_3d(st + XB, &map_w, 0, s, tile0, &full[slot]);
          if (!kRowScale) tma::tma_load_3d(st + XB + CB, &map_m, 0, mg, tile0, &full[slot]);
        }
      };
      auto activations = [&](int i, int slot) {
#pragma unroll
        for (int k = 0; k < kTmaNK; ++k) tma::tma_load(smem + slot * SB + k * BN * 128, &map_x, 64 * (s0 + kTmaNK * i + k), 0, &full[slot]);
      };
      const int pre = min(D, nst);
      for (int i = 0; i < pre; ++i) weights(i, i);   // never written by a kernel: before the wait
      pdl::wait_prior_grid();                        // x comes from the kernel before
      for (int i = 0; i < pre; ++i) activations(i, i);
      for (int i = D; i < nst; ++i) {
        const int slot = i % D;
        tma::mbar_wait(&empty[slot], ((i / D) - 1) & 1);
        weights(i, slot);
        activations(i, slot);
      }
    } else {
      pdl::wait_prior_grid();
    }
  } else {
    pdl::wait_prior_grid();
    if constexpr (kNormIn) {
      const int n = threadIdx.x >> 3, j = threadIdx.x & 7;
      float ss = 0.0f;
      if (n < M) {
        const float4* p = reinterpret_cast<const float4*>(norm.in_ss + int64_t(n) * (K / 16));
#pragma unroll 8
        for (int i = j; i < K / 64; i += 8) {
          const float4 v = __ldcg(p + i);
          ss += (v.x + v.y) + (v.z + v.w);
        }
      }
#pragma unroll
      for (int d = 4; d > 0; d >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, d);
      inv = split_norm_inv(ss, K, norm.in_eps);
    }
    const int tile = kSilu ? (wg == 0 ? tile_g : tile_u) + q : min(tile0 + tl, tiles - 1);
    uint32_t a[4][4];
    Meta meta1{};   // one group: its metadata, read once
    if constexpr (kRowScale) meta1 = *fmt.meta_ptr(tile, 0, lane, false);
    for (int i = 0; i < nst; ++i) {
      const int slot = i % D, s = s0 + kTmaNK * i, nk = min(kTmaNK, steps - kTmaNK * i);
      tma::mbar_wait(&full[slot], (i / D) & 1);
      const uint8_t* st = smem + slot * SB;
#pragma unroll
      for (int k = 0; k < kTmaNK; ++k) {
        if (k >= nk) break;
        uint4 cq[kU4];
#pragma unroll
        for (int j = 0; j < kU4; ++j) cq[j] = reinterpret_cast<const uint4*>(st + XB + tl * TB)[(k * kU4 + j) * 32 + lane];
        Meta meta = meta1;
        if constexpr (!kRowScale) {
          const int gi = k == 0 ? 0 : int(fmt.meta_ptr(tile, s + k, 0, true) - fmt.meta_ptr(tile, s, 0, true)) / 8;
          meta = reinterpret_cast<const Meta*>(st + XB + CB + tl * kTmaNK * 64)[gi * 8 + (lane >> 2)];
        }
        const auto prep = fmt.template prep<!kRowScale>(meta);
        ptx::wgmma_wait<0>();   // the previous k-step's wgmmas retired: the A registers are free
        if (k == 0 && i > 0 && (threadIdx.x & 127) == 0) tma::mbar_arrive(&empty[(i - 1) % D]);   // ... and the previous stage's
        kstep_wgmma<BN, !kRowScale>(fmt, cq, prep, a, acc, ptx::smem_addr(st + k * BN * 128));
      }
    }
    ptx::wgmma_wait<0>();
    ptx::fence_regs(acc);
    if constexpr (kRowScale) scale_rows<BN>(fmt, meta1, acc);
  }
  __syncthreads();   // every warpgroup's wgmmas retired: the partial goes over the ring
  float* inv_s = red + BN * kRedStride;   // kNormIn: token n's inv, past the partial (the ring is free)
  if constexpr (kNormIn)
    if (threadIdx.x < 8 * BN && (threadIdx.x & 7) == 0) inv_s[threadIdx.x >> 3] = inv;
  if (threadIdx.x < kThreads) write_partial<BN>(red, acc, 16 * tl + (lane >> 2), lane & 3);   // warp tl holds rows 16 tl .. 16 tl + 15
  // The cluster's S partials added in slice order (sum_split_k's), then y. CTA r of the cluster
  // takes quads (4 rows of one token) r, r + S, ...
  cg::cluster_group cluster = cg::this_cluster();
  const int S = int(gridDim.y), rank = int(blockIdx.y), n0 = 128 * int(blockIdx.x), rows = min(128, N - n0), quads = M * 32;
  if (S > 1) cluster.sync();
  else __syncthreads();
  // Token n's sums of the CTA's rows r .. r + 3: the S slices' partials added in slice order.
  auto quad_sum = [&](int n, int r) {
    float4 v = *reinterpret_cast<const float4*>((S > 1 ? cluster.map_shared_rank(red, 0) : red) + n * kRedStride + r);
    for (int z = 1; z < S; ++z) {
      const float4 t = *reinterpret_cast<const float4*>(cluster.map_shared_rank(red, z) + n * kRedStride + r);
      v.x += t.x, v.y += t.y, v.z += t.z, v.w += t.w;
    }
    return v;
  };
  // Four values rounded to f16 at p (8-byte aligned), one store.
  auto store4 = [](__half* p, float a, float b, float c, float d) {
    const __half2 lo = __floats2half2_rn(a, b), hi = __floats2half2_rn(c, d);
    *reinterpret_cast<uint2*>(p) = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  };
  if constexpr (kEpi != Epi::plain) {   // quads of the CTA's first 64 rows, each with its partner quad 64 rows on
    const int F = N / 2, c0 = 64 * int(blockIdx.x), h = int(blockIdx.x), p0 = kEpi == Epi::rope ? *rope.pos : 0;
    for (int o = rank * kTmaThreads + int(threadIdx.x); o < M * 16; o += S * kTmaThreads) {
      const int n = o / 16, r = 4 * (o % 16);
      const float4 a4 = quad_sum(n, r), b4 = quad_sum(n, 64 + r);
      float a[4] = {a4.x, a4.y, a4.z, a4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
      if constexpr (kNormIn) {
        const float s = inv_s[n];
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] *= s, b[e] *= s;
      }
      if constexpr (kSilu) {   // a: the gate, b: the up
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const __half v = __float2half_rn(a[e] / (1.0f + __expf(-a[e])) * b[e]);
          const int col = c0 + r + e;
          yh[int64_t(n) * F + col] = v;
          if (act_perm) act_perm[int64_t(n) * F + a16_wgmma_x_col(col)] = v;
        }
      } else {   // a: dims r .. r + 3 of head h, b: their partners r + 64 ..
        const int p = p0 + n % rope.T;
        if (h < rope.nh + rope.nkv) {   // q and k rotate; v passes
          const float4 cs = __ldg(reinterpret_cast<const float4*>(rope.cos + int64_t(p) * 64 + r)), sn = __ldg(reinterpret_cast<const float4*>(rope.sin + int64_t(p) * 64 + r));
          const float c[4] = {cs.x, cs.y, cs.z, cs.w}, si[4] = {sn.x, sn.y, sn.z, sn.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float lo = a[e], hi = b[e];
            a[e] = rotary_lo(lo, hi, c[e], si[e]), b[e] = rotary_hi(lo, hi, c[e], si[e]);
          }
        }
        const int kv = h < rope.nh ? -1 : (h - rope.nh) % rope.nkv;   // the key or value head
        __half* dst = kv < 0 ? static_cast<__half*>(rope.q) + (int64_t(n) * rope.nh + h) * 128
                             : static_cast<__half*>(h < rope.nh + rope.nkv ? rope.k_cache : rope.v_cache) +
                                   ((int64_t(n / rope.T) * rope.max_len + p) * rope.nkv + kv) * 128;
        store4(dst + r, a[0], a[1], a[2], a[3]);
        store4(dst + 64 + r, b[0], b[1], b[2], b[3]);
      }
    }
  } else {
    for (int o = rank * kTmaThreads + int(threadIdx.x); o < quads; o += S * kTmaThreads) {
      const int n = o / 32, r = 4 * (o % 32);
      if (r >= rows) continue;
      const float4 v = quad_sum(n, r);
      float vv[4] = {v.x, v.y, v.z, v.w};
      store_quad(vv, min(4, rows - r), n, N, n0 + r, yh, yf, beta);
      if constexpr (kRowSs) {   // vv: X (fp32, after beta y); rows == 128, so every lane of the warp is here
        const int R = n0 + r;
        float sq = write_split_quad(norm, n, N, R, vv, __ldg(reinterpret_cast<const float4*>(norm.w + R)));
        sq += __shfl_xor_sync(0xffffffffu, sq, 1);
        sq += __shfl_xor_sync(0xffffffffu, sq, 2);
        if ((o & 3) == 0) norm.row_ss[int64_t(n) * (N / 16) + R / 16] = sq;
      }
    }
  }
  if (S > 1) cluster.sync();   // no CTA leaves while another reads its partial
#endif  // PTQ_A16_WGMMA
}

template <class Format>
using WgmmaKernel = void (*)(CUtensorMap, CUtensorMap, int, Format, const uint4*, const __half*, __half*, float*, float, float*, int*, int, int, int, int, const A16RowNorm);

// x rows staged per k-step (wgmma's N): the next of 8, 16, 32, 64, 128, 256 at or above M.
constexpr int wgmma_bn(int64_t M) { return M <= 8 ? 8 : M <= 16 ? 16 : M <= 32 ? 32 : M <= 64 ? 64 : M <= 128 ? 128 : 256; }

// The k-step loop: each fragment dequantized behind the wgmmas still in flight (interleaved), or
// all four after the previous k-step's retired. Measured on the H200 (lab run 84, bench kernels,
// the wgmma path forced): interleaved NF4 +1-8% at 32-128 rows (its dequantization is the
// longest), GPTQ +0.5-4% at 128 rows but -2-6% at 32-64 (decode batch 32: W4A16 -1.3%, NF4 +0.9%).
template <int BN, class Format>
constexpr bool interleaved() { return std::is_base_of_v<Nf4Format, Format> || BN >= 128; }

// Whether a call's scales go per row at the end (kRowScale): GPTQ codes with one group (per-channel
// scales). Measured on the H200 (docs/lab/2026-11-24-decode-h200.md, run 225), against the scales
// in f16 on every fragment: W8 22016x4096 at 32 rows 42.1 -> 40.0 µs, at 64 rows 49.2 -> 46.9;
// decode W8A16 batch 32 llama2-7b +2.8%, llama3-8b +4.2%, batch 64 +3.2-3.4%.
// Formats that never scale per row: NF4 (blocks), and grids with mins (their m is added per
// weight); their kRowScale forms are not instantiated.
template <class Format>
constexpr bool never_row_scale() {
  return std::is_base_of_v<Nf4Format, Format> || Format::kMin;
}
template <class Format>
bool scales_per_row(const Format& f) {
  if constexpr (never_row_scale<Format>()) return false;
  else return f.groups == 1;
}
// BN = 64 and 128 held to 128 registers and 110 KB of ring, two CTAs an SM: for the layers whose
// CTAs at one an SM need more than one wave.
template <class Format, bool kRowScale>
WgmmaKernel<Format> wgmma_kernel_two_per_sm(int bn) {
  return bn == 64 ? wgmma_kernel<64, Format, interleaved<64, Format>(), 2, kRowScale> : wgmma_kernel<128, Format, interleaved<128, Format>(), 2, kRowScale>;
}
template <class Format, bool kRowScale>
WgmmaKernel<Format> wgmma_kernel_of(int bn) {
  switch (bn) {
    case 8: return wgmma_kernel<8, Format, interleaved<8, Format>(), 1, kRowScale>;
    case 16: return wgmma_kernel<16, Format, interleaved<16, Format>(), 1, kRowScale>;
    case 32: return wgmma_kernel<32, Format, interleaved<32, Format>(), 1, kRowScale>;
    case 64: return wgmma_kernel<64, Format, interleaved<64, Format>(), 1, kRowScale>;
    case 128: return wgmma_kernel<128, Format, interleaved<128, Format>(), 1, kRowScale>;
    default: return wgmma_kernel<256, Format, interleaved<256, Format>(), 1, kRowScale>;
  }
}
// row_ss: the split norm's writer (kRowSs) at 32 staged rows, GPTQ codes only (the decode's down
// Linear where it runs this loop: W8 4096 x 11008 and 4096 x 14336; NF4's down runs the L2-fed
// kernel, a16_path.h).
template <class Format>
WgmmaKernel<Format> wgmma_kernel_of(int bn, bool row_scale, bool row_ss = false) {
  if constexpr (std::is_base_of_v<Nf4Format, Format>) return wgmma_kernel_of<Format, false>(bn);
  else if constexpr (Format::kMin) return row_ss && bn == 32 ? wgmma_kernel<32, Format, interleaved<32, Format>(), 1, false, true> : wgmma_kernel_of<Format, false>(bn);
  else {
    if (row_ss && bn == 32)
      return row_scale ? wgmma_kernel<32, Format, interleaved<32, Format>(), 1, true, true> : wgmma_kernel<32, Format, interleaved<32, Format>(), 1, false, true>;
    return row_scale ? wgmma_kernel_of<Format, true>(bn) : wgmma_kernel_of<Format, false>(bn);
  }
}
// Whether the loop has the split norm's writer at these staged rows and codes (wgmma_kernel_of's row_ss).
template <class Format>
constexpr bool loop_writes_split_norm(int bn) {
  return bn == 32 && !std::is_base_of_v<Nf4Format, Format>;
}
template <class Format>
WgmmaKernel<Format> wgmma_kernel_two_per_sm(int bn, bool row_scale) {
  if constexpr (never_row_scale<Format>()) return wgmma_kernel_two_per_sm<Format, false>(bn);
  else return row_scale ? wgmma_kernel_two_per_sm<Format, true>(bn) : wgmma_kernel_two_per_sm<Format, false>(bn);
}

struct WgmmaPlan {
  int groups, slices, sps;
};
// 128 rows of W per CTA (two 64-row tiles per warpgroup, which halve the x traffic, measured slower
// in every forced split and were dropped). K slices: the most (powers of two) that keep one wave of
// the CTAs resident at once (the occupancy calculator: shared memory and registers; 1 per SM from
// 64 staged x rows), e.g. at 64..256 rows: 4096 rows 4 slices, 11008 and 14336 rows none. (A wave
// model, waves x k-steps per CTA, chose 8 slices in 7 waves at 14336 rows: 1.22x -> 0.63x cuBLAS at
// M = 128.) A forced split (g_split: slices) overrides; else at 17..32 rows so does a measured cell
// (slices: a16_wgmma_slices).
inline WgmmaPlan plan_wgmma(int64_t N, int64_t K, int per_sm, int slices = 0) {
  const int KS = int((K + 63) / 64), groups = int((N + 127) / 128);
  const int64_t resident = int64_t(sm_count()) * std::max(1, per_sm);
  int S = 1;
  while (int64_t(groups) * S * 2 <= resident && 2 * S <= std::min(kMaxSlices, KS)) S *= 2;
  if (const int forced = g_split.slices ? g_split.slices : slices) S = std::max(1, std::min(forced, KS));
  const int sps = (KS + S - 1) / S;
  return {groups, (KS + sps - 1) / sps, sps};   // no empty slice
}

// PTQKIT_A16_TMA_CELLS="NxK:bits[:stages[:slices]],...": cells a sweep adds to the streamed form
// (a16_streamed_swept), each optionally with its own ring depth (a) and K slices (b; 0: the
// planner's); stages -1 takes a cell out of it (the k-step loop serves the layer).
inline const A16SweepCell* swept_cell(int64_t N, int64_t K, int bits) {
  static const std::vector<A16SweepCell> cells = a16_sweep_cells("PTQKIT_A16_TMA_CELLS");
  return a16_sweep_cell(cells, N, K, bits);
}

// The streamed form's switches, for sweeps: PTQKIT_A16_WG_TMA=0 the loop above on every layer (the
// path table's choice of kernel stays), PTQKIT_A16_TMA_STAGES the ring's stages on every cell
// (else a16_wgmma_stages: 2, or 3 on the cells measured faster with 3),
// PTQKIT_A16_TMA_SLICES a forced slice count (at most 8, the portable cluster; clusters of up to
// 16, non-portable, ran the layers long in K 8-14% slower and decode at batch 32 3-6% slower, lab
// run 242),
// PTQKIT_A16_TMA_MAXS the most slices the planner takes (8), PTQKIT_A16_TMA_PDL=0 launches
// without PDL.
// Whether the streamed form takes a call: 8..32 staged rows, groups of whole k-steps (or one), a
// measured cell (a16_wgmma_streamed) unless forced (g_split.form: tests and sweeps). At 64 and 128
// staged rows (lab run 237, every wgmma call on it) it ran the large K = 4096 layers 5-18% faster
// than the loop and the layers long in K 20-45% slower; decode at batch 64 and 128 lost 1-12%.
template <class Format>
bool tma_takes(const Format& f, int bn, int64_t N, int64_t K) {
  static const bool on = env_switch("PTQKIT_A16_WG_TMA", true);
  bool whole;
  if constexpr (std::is_base_of_v<Nf4Format, Format>) whole = f.blocks > 1 && f.block.size % 64 == 0;   // one block: K <= 64, the loop
  else whole = f.groups == 1 || f.group.size % 64 == 0;
  const int bits = code_bits<Format>();
  const A16SweepCell* cell = swept_cell(N, K, bits);
  if (!g_split.form && cell && cell->a < 0) return false;
  return bn <= 32 && whole && (g_split.form ? g_split.form == 2 : on && (a16_wgmma_streamed(N, K, bits) || cell));
}
// The metadata's base and groups (NF4: blocks) a 16-row tile, for its tensor map.
template <int B, bool M>
const void* meta_base(const GptqFormat<B, M>& f) { return f.zs; }
inline const void* meta_base(const Nf4Format& f) { return f.absmax; }
template <int B, bool M>
int meta_groups(const GptqFormat<B, M>& f) { return f.groups; }
inline int meta_groups(const Nf4Format& f) { return f.blocks; }

// Whether the streamed form has a split norm's reader (kNormIn) at these staged rows and codes: 32
// staged rows; NF4 with its pair table only (the PRMT form is a sweep's). A call takes the request
// (a16_norm_in) in a folded epilogue (the decode's q, k, v and gate, up Linears) with K % 64 == 0.
template <int BN, class Format>
constexpr bool tma_reads_split_norm() {
  return BN == 32 && (!std::is_base_of_v<Nf4Format, Format> || Format::kPairTable);
}
// Whether the streamed form has the split norm's writer (a16_fold_norm with row_ss, kRowSs) at
// these staged rows and codes: GPTQ 4-bit at 32 (the decode's o and down projections on this form).
template <int BN, class Format>
constexpr bool tma_writes_split_norm() {
  return BN == 32 && !std::is_base_of_v<Nf4Format, Format> && Format::kU4 == 1 && !Format::kRowMajor;
}
// The streamed form's instantiation for a call: its scales (row_scale: GPTQ codes with one group),
// its epilogue (rope at 32 staged rows only), the split norm's reader (norm_in, in a folded
// epilogue where the form has it: tma_reads_split_norm) or its writer (norm_out, in the plain
// epilogue: tma_writes_split_norm). Only these combinations are instantiated.
template <int BN, class Format, bool kRowScale, int NK, Epi kEpi>
auto tma_kernel_reading(bool norm_in, bool norm_out) {
  if constexpr (kEpi != Epi::plain && tma_reads_split_norm<BN, Format>())
    if (norm_in) return wgmma_tma_kernel<BN, Format, kRowScale, NK, kEpi, true>;
  if constexpr (kEpi == Epi::plain && NK == 4 && tma_writes_split_norm<BN, Format>())
    if (norm_out) return wgmma_tma_kernel<BN, Format, kRowScale, NK, kEpi, false, true>;
  return wgmma_tma_kernel<BN, Format, kRowScale, NK, kEpi>;
}
template <int BN, class Format, bool kRowScale, int NK>
auto tma_kernel_with(Epi epi, bool norm_in, bool norm_out) {
  if constexpr (BN == 32)
    if (epi == Epi::rope) return tma_kernel_reading<BN, Format, kRowScale, NK, Epi::rope>(norm_in, false);
  return epi == Epi::silu ? tma_kernel_reading<BN, Format, kRowScale, NK, Epi::silu>(norm_in, false)
                          : tma_kernel_reading<BN, Format, kRowScale, NK, Epi::plain>(false, norm_out);
}
template <int BN, class Format, int NK>
auto tma_kernel_of(bool row_scale, Epi epi, bool norm_in, bool norm_out) {
  if constexpr (!never_row_scale<Format>())   // NF4's blocks and grids with mins are never per-row scales
    if (row_scale) return tma_kernel_with<BN, Format, true, NK>(epi, norm_in, norm_out);
  return tma_kernel_with<BN, Format, false, NK>(epi, norm_in, norm_out);
}

template <int BN, class Format, int NK = 4>
void launch_tma(const Format& fmt, const uint4* W, const __half* xk, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K, Epi epi = Epi::plain,
                __half* act_perm = nullptr, const A16Rope& rope = {}, const A16RowNorm* norm_in = nullptr, const A16RowNorm* norm_out = nullptr) {
  static const int D0 = env_int("PTQKIT_A16_TMA_STAGES", 0), forced = env_int("PTQKIT_A16_TMA_SLICES", 0), max_s = env_int("PTQKIT_A16_TMA_MAXS", 8);
  const A16SweepCell* cell = swept_cell(N, K, code_bits<Format>());
  const int D = cell && cell->a >= 2 ? cell->a : D0 >= 2 ? D0 : a16_wgmma_stages(N, K, code_bits<Format>());
  const bool row_scale = scales_per_row(fmt);
  const bool silu = epi == Epi::silu;
  const auto kern = tma_kernel_of<BN, Format, NK>(row_scale, epi, norm_in != nullptr, norm_out != nullptr);
  const size_t smem = tma_smem_bytes(BN, Format::kU4, NK, D);
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> resident;   // CTAs resident at once, per kernel and ring depth
  int res = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_pair(reinterpret_cast<const void*>(kern), D);
    auto it = resident.find(key);
    if (it == resident.end()) {
      cudaFuncAttributes fa{};   // the attribute is per kernel: raised to the deepest ring asked for, never lowered
      PTQ_CUDA(cudaFuncGetAttributes(&fa, kern));
      if (int(smem) > fa.maxDynamicSharedSizeBytes) PTQ_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      int per_sm = 0;
      PTQ_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, kTmaThreads, smem));
      it = resident.emplace(key, std::max(1, per_sm) * sm_count()).first;
    }
    res = it->second;
  }
  const int64_t KP = (K + 63) / 64 * 64, KS = KP / 64, tiles = (N + 15) / 16, u4 = Format::kU4, meta_g = meta_groups(fmt);
  // Tensor maps (cached_tensor_map): x [M][KP] f16 in boxes of 64 columns x BN rows; the codes
  // [tiles][KS][u4 x 64 words of 8 bytes] in boxes of 8 tiles x NK k-steps; the metadata
  // [tiles][groups][8 words] in boxes of 8 tiles x NK groups.
  const CUtensorMap map = cached_tensor_map(tma_spec_f16(xk, M, KP, BN));
  // (Epi::silu: boxes of 4 tiles, two a stage.)
  const int box_tiles = silu ? 4 : 8;
  const CUtensorMap map_w = cached_tensor_map(tma_spec_3d_u64(W, {u4 * 64, KS, tiles}, {u4 * 512, KS * u4 * 512}, {int(u4 * 64), NK, box_tiles}));
  const CUtensorMap map_m = row_scale ? map_w : cached_tensor_map(tma_spec_3d_u64(meta_base(fmt), {8, meta_g, tiles}, {64, meta_g * 64}, {8, NK, box_tiles}));
  const int64_t groups = (N + 127) / 128;
  const int cell_s = cell && cell->b > 0 ? cell->b : a16_wgmma_tma_slices(N, K, code_bits<Format>());   // a sweep's cell, else a measured one
  int S = forced > 0      ? std::min(forced, 8)
          : g_split.slices ? std::min(g_split.slices, 8)
          : cell_s > 0     ? std::min(cell_s, 8)
                           : int(std::max<int64_t>(1, std::min<int64_t>(max_s, res / groups)));
  S = std::max(1, std::min(S, int(KS / NK)));
  const int sps = int((KS + S - 1) / S);
  S = (KS + sps - 1) / sps;   // no empty slice
  static const bool pdl = env_switch("PTQKIT_A16_TMA_PDL", true);
  launch_ex("a16 wgmma_tma_kernel", pdl, -1, S > 1 ? dim3(1, unsigned(S), 1) : dim3(0), kern, dim3(unsigned(groups), unsigned(S)), dim3(kTmaThreads), smem, map, map_w, map_m, fmt,
            yh, yf, act_perm, rope, beta, int(M), int(N), int(K), sps, D, norm_in ? *norm_in : norm_out ? *norm_out : A16RowNorm{});
}

// x [M, K] in the kernels' k-step order [M, KP]: the copy a producer offered (a16_offer_wgmma_x:
// the decode's norm and silu·mul write it beside x), else permute_x's, written into xp.
inline const __half* x_in_kernel_order(const __half* x, int64_t M, int64_t K, DeviceBuffer<__half>& xp) {
  const int64_t KP = (K + 63) / 64 * 64, units = M * (KP / 64) * 2;
  if (g_x_offer.x_perm && g_x_offer.x_of == x && KP == K) {
    g_x_offer.taken = true;
    return static_cast<const __half*>(g_x_offer.x_perm);
  }
  xp = DeviceBuffer<__half>(size_t(M * KP), "A16 wgmma permuted activations");
  launch_pdl("a16 permute_x_kernel", true, -1, permute_x_kernel, dim3(unsigned((units + 255) / 256)), dim3(256), 0, x, xp.get(), int(M), int(K), int(KP));
  return xp.get();
}

template <class Format>
void run(const Format& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K) {
  if (M > kA16WgmmaMaxM) fail(Errc::usage, "", "M", "the wgmma A16 kernel takes M <= " + std::to_string(kA16WgmmaMaxM) + " rows, got M = " + std::to_string(M));
  if (!a16_wgmma_supported()) fail(Errc::usage, "", "device", "the wgmma A16 kernel is built for sm_90 (H100/H200) only: " + describe());
  // NF4 dequantizes through its pair table in shared memory (Nf4PairFormat: a byte of codes to an
  // f16 pair by one lookup, where Nf4Format's PRMT lookup takes 11 integer instructions a 4 codes).
  // Against the PRMT form (docs/lab/2026-11-24-decode-h200.md, runs 305 and 310), stream µs: the
  // streamed form at 32 rows 12288x4096 22.5 / 32.5, 22016x4096 37.2 / 45.1, 28672x4096 38.2 /
  // 76.3; the k-step loop at 64 rows 22016x4096 56.4 / 64.0, 28672x4096 57.6 / 64.8, the other
  // layers and 128..256 rows within ±3%. Decode NF4 at batch 64 +4.3-4.7%, batch 128 +0.9-1.8%.
  // PTQKIT_A16_WG_PAIRS=0 (a sweep switch) runs the PRMT form in both.
  if constexpr (std::is_same_v<Format, Nf4Format>) {
    static const bool pairs = env_switch("PTQKIT_A16_WG_PAIRS", true);
    if (pairs) return run(Nf4PairFormat(fmt), W, x, yh, yf, beta, M, N, K);
  }
  const int bn = wgmma_bn(M);
  if (tma_takes(fmt, bn, N, K)) {
    DeviceBuffer<__half> xp;
    const __half* xk = x_in_kernel_order(x, M, K, xp);
    // silu(gate) · up asked of a stacked gate, up Linear (a16_fold_silu): taken here where its
    // halves are whole 64-row groups.
    const bool silu = g_fold.silu && N % 128 == 0;   // (a16_fold_silu leaves no norm request)
    __half* act = silu ? static_cast<__half*>(g_fold.silu) : nullptr;
    __half* act_perm = silu ? static_cast<__half*>(g_fold.silu_perm) : nullptr;
    if (silu) g_fold.taken = A16Fold::whole, yh = act, yf = nullptr;
    // The rotary and KV append asked of a stacked q, k, v Linear (a16_fold_rope): taken where a
    // CTA's 128 rows are one head, at 32 staged rows (the rows where the path table puts the
    // decode's q, k, v on this form).
    const A16Rope* rope = g_fold.rope;
    const bool roped = rope && bn == 32 && N == int64_t(rope->nh + 2 * rope->nkv) * kA16RopeHead && M % rope->T == 0;
    if (roped) g_fold.taken = A16Fold::whole, yh = nullptr, yf = nullptr;
    const Epi epi = silu ? Epi::silu : roped ? Epi::rope : Epi::plain;
    // A split norm's reader (a16_norm_in) where this form takes it (tma_reads_split_norm, a folded
    // epilogue, K % 64 == 0): x the writer's f16(X w / 16), the sums scaled by 16 / rms(X) (kNormIn).
    const bool reads = tma_reads_split_norm<32, Format>() && bn == 32 && epi != Epi::plain && K % 64 == 0;
    const A16RowNorm* norm_in = g_norm_in.norm && reads ? g_norm_in.norm : nullptr;
    if (norm_in) g_norm_in.taken = true;
    // A split norm's writer (a16_fold_norm with row_ss) where this form has it (tma_writes_split_norm,
    // the plain epilogue, fp32 y, whole 128-row groups) on the cells measured faster so
    // (a16_wgmma_tma_writes_norm): the residual row X, x for the reader, and X's sums of squares, as
    // the k-step loop's split-K sum writes them.
    const bool writes = tma_writes_split_norm<32, Format>() && bn == 32 && epi == Epi::plain && yf && N % 128 == 0 &&
                        a16_wgmma_tma_writes_norm(N, K, code_bits<Format>());   // the measured cells
    const A16RowNorm* norm_out = g_fold.norm && g_fold.norm->row_ss && writes ? g_fold.norm : nullptr;
    if (norm_out) g_fold.taken = A16Fold::split;

    // K-steps a stage: 4 (lab runs 230-231: 2 and 1 slower for GPTQ codes), 2 on NF4's cells of
    // a16_wgmma_nk (its pair table and 2 stages of 2 k-steps fit three CTAs an SM).
    if constexpr (std::is_same_v<Format, Nf4PairFormat>)
      if (bn == 32 && a16_wgmma_nk(N, K, 0) == 2)
        return launch_tma<32, Format, 2>(fmt, W, xk, yh, yf, beta, M, N, K, epi, act_perm, roped ? *rope : A16Rope{}, norm_in);
    if (bn == 8) launch_tma<8>(fmt, W, xk, yh, yf, beta, M, N, K, epi, act_perm);
    else if (bn == 16) launch_tma<16>(fmt, W, xk, yh, yf, beta, M, N, K, epi, act_perm);
    else launch_tma<32>(fmt, W, xk, yh, yf, beta, M, N, K, epi, act_perm, roped ? *rope : A16Rope{}, norm_in, norm_out);
    return;
  }
  const bool row_scale = scales_per_row(fmt);
  // A split norm's writer (a16_fold_norm with row_ss) where the loop has it (loop_writes_split_norm)
  // for fp32 y, N % 16 == 0 and K split over CTAs (its sum writes it: below, after the plan).
  const A16RowNorm* norm_out = g_fold.norm && g_fold.norm->row_ss && yf && loop_writes_split_norm<Format>(bn) && N % 16 == 0 ? g_fold.norm : nullptr;
  const WgmmaKernel<Format> plain = wgmma_kernel_of<Format>(bn, row_scale);
  size_t smem = smem_bytes(bn, Format::kU4, 1, table_bytes<Format>());
  static std::mutex mu;
  struct Chosen {
    WgmmaKernel<Format> kern;
    WgmmaPlan plan;
    size_t smem;
    bool cluster;   // K split over a cluster, the partials summed in shared memory (cluster_sum_store)
  };
  static std::map<std::tuple<const void*, int64_t, int64_t, int, int>, Chosen> plans;
  WgmmaKernel<Format> kern = norm_out ? wgmma_kernel_of<Format>(bn, row_scale, true) : plain;
  WgmmaPlan p;
  bool cluster = false;
  for (;;) {
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_tuple(reinterpret_cast<const void*>(kern), N, K, g_split.slices, g_split.sum);   // kern: format, BN, writer
    auto it = plans.find(key);
    if (it == plans.end()) {   // first call of this kernel and shape: its shared memory (over the 48 KB default) allowed once
      auto planned = [&](WgmmaKernel<Format> k, size_t bytes) {
        PTQ_CUDA(cudaFuncSetAttribute(reinterpret_cast<const void*>(k), cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
        return plan_wgmma(N, K, resident_ctas(reinterpret_cast<const void*>(k), kThreads / 32, bytes), a16_wgmma_slices(M, N, K, code_bits<Format>()));
      };
      WgmmaPlan plan = planned(kern, smem);   // with the measured slice counts at 17..32 rows (a16_path.h)
      WgmmaKernel<Format> chosen = kern;
      size_t chosen_smem = smem;
      // At 64 and 128 staged rows one CTA an SM (144 and 152 registers): a layer of more 128-row
      // groups than SMs (no split) ran in two waves. The two-CTA kernel holds it in one, with the
      // same slices. Stream µs (docs/lab/2026-11-24-decode-h200.md, runs 185-186), 22016x4096 and
      // 28672x4096: at 64 rows W4 53.1 -> 46.5 and 53.9 -> 47.7, W8 56.8 -> 49.3 and 58.1 -> 50.8,
      // NF4 72.1 -> 64.6 and 72.7 -> 65.4; at 128 rows W4 71.9 -> 64.2 and 73.0 -> 68.4, W8 73.2 ->
      // 65.8 and 75.0 -> 69.7, NF4 87.4 -> 81.8 and 88.4 -> 84.5. Decode llama3-8b batch 64 W8A16
      // +5.4%, W4A16 +4.5%, NF4 +4.1%; batch 128 +3.0%, +2.7%, +0.6%; prefill +2.5-3.6%. Where it
      // would take more slices instead it lost (run 89), so it is not used there.
      if ((bn == 64 || bn == 128) && !g_split.slices && int64_t(plan.groups) * plan.slices > sm_count()) {
        const size_t smem2 = smem_bytes(bn, Format::kU4, 2, table_bytes<Format>());
        const WgmmaPlan plan2 = planned(wgmma_kernel_two_per_sm<Format>(bn, row_scale), smem2);
        if (plan2.slices == plan.slices) {
          plan = plan2;
          chosen = wgmma_kernel_two_per_sm<Format>(bn, row_scale);
          chosen_smem = smem2;
        }
      }
      // At 64..256 staged rows K's slices sum over a cluster (cluster_sum_store) where every cluster
      // of the split is resident at once; else through the global workspace. Where the planner's
      // slices' clusters are not all resident (4096 rows at 4 slices: 32 clusters of 4, 30 resident
      // on the H200), fewer slices over a cluster serve when each slice keeps at most 32 k-steps: there
      // the workspace's sum is the larger cost. Lab runs 468-469, stream µs at 128 / 64 rows, the
      // planner's 4 slices through the workspace against 3 over a cluster: W4 4096 x 4096 23.8 / 16.9
      // -> 19.0 / 14.3 (cuBLAS f16 14.7 / 12.4), NF4 26.2 / 19.4 -> 21.4 / 17.0; but 4096 x 11008
      // (58 k-steps a slice) 39.2 / 27.8 -> 39.2 / 29.4 and 4096 x 14336 45.9 / 32.7 -> 48.8 / 35.9.
      // g_split.sum 1 (PTQKIT_A16_WG_CLUSTER_SUM=0, a sweep switch) keeps the workspace and the
      // planner's slices.
      static const bool cluster_sum = env_switch("PTQKIT_A16_WG_CLUSTER_SUM", true);
      bool over_cluster = false;
      if ((g_split.sum ? g_split.sum == 2 : cluster_sum) && bn >= 64 && plan.slices > 1) {
        for (int S = std::min(plan.slices, 8); S >= 2; --S) {
          const int resident = resident_clusters(reinterpret_cast<const void*>(chosen), dim3(1, unsigned(S), 1), dim3(kThreads), chosen_smem);
          if (resident < plan.groups) continue;
          const WgmmaPlan fewer = plan_wgmma(N, K, 1, S);
          if (fewer.slices == S && (S == plan.slices || (!g_split.slices && fewer.sps <= 32))) plan = fewer, over_cluster = true;
          if (env_switch("PTQKIT_A16_PLAN_LOG", false))
            std::fprintf(stderr, "a16 wgmma loop %lldx%lld at %d staged rows: %d row groups x %d slices, %zu B shared, %d clusters of %d resident -> sum %s\n",
                         (long long)N, (long long)K, bn, plan.groups, plan.slices, chosen_smem, resident, S, over_cluster ? "over the cluster" : "global");
          break;
        }
      }
      it = plans.emplace(key, Chosen{chosen, plan, chosen_smem, over_cluster}).first;
    }
    p = it->second.plan;
    if (norm_out && p.slices < 2) {   // one slice: no split-K sum to write it; the plain kernel, the norm left to its kernel
      norm_out = nullptr, kern = plain;
      continue;
    }
    kern = it->second.kern;
    smem = it->second.smem;
    cluster = it->second.cluster;
    break;
  }
  if (norm_out) g_fold.taken = A16Fold::split;
  g_wgmma_clustered = cluster;
  DeviceBuffer<__half> xp;
  const __half* xk = x_in_kernel_order(x, M, K, xp);
  DeviceBuffer<float> part;
  int* arrivals = nullptr;
  if (p.slices > 1 && !cluster) {
    part = DeviceBuffer<float>(size_t(p.slices * M * N), "A16 split-K partial sums");
    arrivals = arrival_counters(p.groups);
  }
  // PDL for the GEMM from 64 staged x rows (one CTA per SM). With x tiles of 8..32 rows (several
  // CTAs per SM, fewer CTAs than the GPU holds) it lost on most layers after permute_x (the next
  // kernel's CTAs crowd SMs this one still holds): off there. With x in the kernel's order from
  // the kernel before (a norm, silu·mul), on for 8-bit codes: decode batch 32 W8A16 +1.6%, while
  // W4A16 lost 1.4% (docs/lab/2026-11-24-decode-h200.md, run 154). permute_x always takes it.
  const bool pdl = bn >= 64 || (!xp.get() && Format::kU4 == 2);
  // x by the copy engine (tma_x): boxes of 64 columns x bn rows, rows past M zero-filled.
  const CUtensorMap map_x = tma_x(bn, Format::kU4) ? cached_tensor_map(tma_spec_f16(xk, M, (K + 63) / 64 * 64, bn)) : CUtensorMap{};
  // f16 y of one slice by the copy engine (the kernel's y_by_tma): boxes of 64 rows of W x bn
  // tokens, from 128 staged rows. Lab runs 496-497 (docs/lab/2026-11-24-decode-h200.md), stream µs
  // against the accumulators' own stores: at 128 and 256 rows W4 and W8 -5 to -8%, NF4 -4 to -7%
  // on the layers of one slice, the decode at 128 sequences within 0.4%; at 64 rows the one-CTA
  // kernels -3% but the decode at 64 sequences -0.5 to -1%, so the 64-row kernels keep their
  // stores and are compiled without this path (run 498: at 64 sequences W4A16 +0.7-1.5% and NF4
  // +1.3% against the path compiled in but not taken).
  // PTQKIT_A16_TMA_Y=0 keeps the stores everywhere.
  static const bool tma_y_on = env_switch("PTQKIT_A16_TMA_Y", true);
  const bool y_by_tma = tma_y_on && bn >= 128 && !norm_out && yh && !yf && p.slices == 1 && N % 8 == 0 && reinterpret_cast<uintptr_t>(yh) % 16 == 0;
  const CUtensorMap map_y = y_by_tma ? cached_tensor_map(tma_spec_f16(yh, M, N, bn)) : CUtensorMap{};
  launch_ex("a16 wgmma_kernel", pdl, -1, cluster ? dim3(1, unsigned(p.slices), 1) : dim3(0), kern, dim3(unsigned(p.groups), unsigned(p.slices)), dim3(kThreads), smem, map_x, map_y, int(y_by_tma), fmt, W, xk, yh, yf, beta, part.get(), arrivals,
             int(M), int(N), int(K), p.sps, norm_out ? *norm_out : A16RowNorm{});
}

}  // namespace

void run_wgmma(const GptqFormat<4>& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K) {
  run(fmt, W, x, yh, yf, beta, M, N, K);
}
void run_wgmma(const GptqFormat<8>& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K) {
  run(fmt, W, x, yh, yf, beta, M, N, K);
}
void run_wgmma(const Nf4Format& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K) {
  run(fmt, W, x, yh, yf, beta, M, N, K);
}
void run_wgmma(const GptqFormat<4, true>& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K) {
  run(fmt, W, x, yh, yf, beta, M, N, K);
}
void run_wgmma(const GptqFormat<8, true>& fmt, const uint4* W, const __half* x, __half* yh, float* yf, float beta, int64_t M, int64_t N, int64_t K) {
  run(fmt, W, x, yh, yf, beta, M, N, K);
}

}  // namespace ptq::cuda::a16

namespace ptq::cuda {
bool a16_wgmma_supported() { return w8a8_supported(); }   // the same target: sm_90a
bool a16_streamed_swept(int64_t N, int64_t K, int bits) { return a16::swept_cell(N, K, bits) != nullptr; }
std::vector<A16SweepCell> a16_sweep_cells(const char* var) {
  std::vector<A16SweepCell> c;
  for (const std::vector<int64_t>& f : env_int_list(var, "NxK:bits[:a[:b]]", 'x', 3, 5))
    c.push_back({f[0], f[1], int(f[2]), f.size() > 3 ? int(f[3]) : 0, f.size() > 4 ? int(f[4]) : 0});
  return c;
}
}  // namespace ptq::cuda
