// w8a8.cu — y = (sx ⊗ sw) ∘ (x · wᵀ) with int8 x and w: the W8A8 GEMM of SmoothQuant checkpoints.
//
// Contract. Operands (device): x [M, K] int8 row-major with per-row (per-token) scales sx [M] fp32;
// w [N, K] int8 row-major (the Linear's weight as stored, no re-layout) with per-row (per-output-
// channel) scales sw [N] fp32; y [M, N] row-major, bf16 or fp32. Σ_k x·w is exact in int32 (|x·w|
// <= 128² = 2^14, K < 2^17 keeps it below 2^31); the epilogue forms float(acc) · sx[m] · sw[n] in fp32
// and rounds once to the output type. Accepted: K a multiple of 16 (the copy engine's row pitch),
// N even (two outputs per store), any M >= 1, x and w 16-byte aligned; rows and columns past M, N
// and K are zero-filled by the copy engine and never stored. sm_90 only (built for sm_90a).
// Math: a persistent grid (one CTA per SM) walks the 128 × 256 tiles of y in groups of 8 row-tiles
// (so x's rows and a band of w stay in L2); a CTA computes a tile with three warpgroups. Warpgroup 0 is the producer:
// one thread streams K-slices of 128 bytes (x: 128 rows, w: 256 rows) into a four-deep ring of
// shared memory with the bulk tensor copy engine (TMA, 128-byte swizzle: the layout wgmma reads),
// each slice completing on its own "full" mbarrier. Warpgroups 1 and 2 each own 64 rows: per slice,
// four wgmma m64n256k32 (s8·s8 → s32, accumulators in registers) from shared-memory descriptors,
// then they release the previous slice on its "empty" mbarrier once their wgmma retired it.
// setmaxnreg moves registers from the producer (40) to the consumers (232).
// Roofline at M = N = K = 4096: 137 GOP; at the datasheet's 1979 int8 TOPS 69 us, at the bf16
// cuBLAS rate measured beside it (≈ 780 TFLOP/s) 175 us: the target (1.5× cuBLAS bf16) is 117 us.
#include "kernels/w8a8.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda/ptx.cuh"
#include "cuda/runtime.h"
#include "cuda/tma.cuh"

namespace ptq::cuda {

namespace {
constexpr int kBM = 128, kBN = 256, kBK = kTmaBoxBytes, kStages = 4, kThreads = 384, kGroupM = 8;
constexpr int kABytes = kBM * kBK, kBBytes = kBN * kBK, kStageBytes = kABytes + kBBytes;   // 16 + 32 KiB
constexpr int kSmemBytes = kStages * kStageBytes + 1024 + 2 * kStages * 8;                  // + alignment, mbarriers

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PTQ_W8A8_WGMMA 1
#endif

#ifdef PTQ_W8A8_WGMMA
using ptx::smem_addr;

__device__ __forceinline__ uint64_t smem_desc(const void* p) { return ptx::smem_desc_sw128(smem_addr(p)); }

using tma::mbar_arrive;
using tma::mbar_expect_tx;
using tma::mbar_init;
using tma::mbar_wait;
using tma::tma_load;

__device__ __forceinline__ void wgmma_m64n256k32_s8(int (&d)[128], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p;\n"
      "}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]),
        "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]),
        "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]),
        "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]),
        "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]),
        "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]),
        "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]),
        "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]),
        "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
      : "l"(a), "l"(b), "r"(accumulate));
}
#endif  // PTQ_W8A8_WGMMA

template <bool F32>
__global__ void __launch_bounds__(kThreads, 1)
    w8a8_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w, const float* __restrict__ sx,
                const float* __restrict__ sw, int M, int N, int K, void* __restrict__ y) {
#ifdef PTQ_W8A8_WGMMA
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int wg = threadIdx.x / 128, slices = (K + kBK - 1) / kBK;
  const int tiles_m = (M + kBM - 1) / kBM, tiles_n = (N + kBN - 1) / kBN, tiles = tiles_m * tiles_n;
  // Tile order: groups of kGroupM row-tiles, row-tiles fastest inside a group, so the tiles that run
  // at once share a few row-tiles of x and a band of w that both stay in L2.
  auto tile_origin = [&](int tile, int* m0, int* n0) {
    const int per_group = kGroupM * tiles_n, first = (tile / per_group) * kGroupM, rows = min(tiles_m - first, kGroupM);
    *m0 = (first + (tile % per_group) % rows) * kBM;
    *n0 = ((tile % per_group) / rows) * kBN;
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);    // the producer's arrive (with the copy's byte count)
      mbar_init(&empty[s], 2);   // one arrive per consumer warpgroup
    }
    tma::mbar_init_fence();
  }
  __syncthreads();
  // Persistent: CTA b takes tiles b, b + gridDim.x, ...; the ring's slice counter runs across tiles,
  // so the producer fetches the next tile's first slices while the consumers store this one.
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0) {
      int it = 0;
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        int m0, n0;
        tile_origin(tile, &m0, &n0);
        for (int t = 0; t < slices; ++t, ++it) {
          const int s = it % kStages;
          if (it >= kStages) mbar_wait(&empty[s], ((it / kStages) - 1) & 1);
          mbar_expect_tx(&full[s], kStageBytes);   // out-of-bounds parts of a box are zero-filled and counted
          uint8_t* a = smem + s * kStageBytes;
          tma_load(a, &map_x, t * kBK, m0, &full[s]);
          tma_load(a + kABytes, &map_w, t * kBK, n0, &full[s]);
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int c = wg - 1;   // consumer: rows 64c .. 64c + 63 of the tile
  const int lane = threadIdx.x % 32, q = (threadIdx.x / 32) % 4;
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int m0, n0;
    tile_origin(tile, &m0, &n0);
    int acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0;
    for (int t = 0; t < slices; ++t, ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], (it / kStages) & 1);
      const uint8_t* a = smem + s * kStageBytes + c * 64 * kBK;
      const uint8_t* b = smem + s * kStageBytes + kABytes;
      ptx::fence_regs(acc);
      ptx::wgmma_fence();
#pragma unroll
      for (int k = 0; k < kBK / 32; ++k) wgmma_m64n256k32_s8(acc, smem_desc(a + 32 * k), smem_desc(b + 32 * k), 1);
      ptx::wgmma_commit();
      ptx::fence_regs(acc);
      ptx::wgmma_wait<1>();   // the previous slice retired
      if (t > 0 && threadIdx.x % 128 == 0) mbar_arrive(&empty[(it - 1) % kStages]);
    }
    ptx::wgmma_wait<0>();
    ptx::fence_regs(acc);
    if (threadIdx.x % 128 == 0) mbar_arrive(&empty[(it - 1) % kStages]);
    // Accumulator layout of m64nNk32: warp q of the warpgroup holds rows 16q + lane/4 (+8); register
    // 4j + {0, 1} columns 8j + 2(lane mod 4) + {0, 1} of the first row, 4j + {2, 3} of the second.
    const int64_t r_lo = m0 + c * 64 + q * 16 + lane / 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = r_lo + 8 * h;
      if (r >= M) continue;
      const float s_r = sx[r];
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int64_t col = n0 + 8 * j + 2 * (lane % 4);
        if (col >= N) continue;
        const float v0 = float(acc[4 * j + 2 * h]) * s_r * sw[col], v1 = float(acc[4 * j + 2 * h + 1]) * s_r * sw[col + 1];
        if constexpr (F32) {
          *reinterpret_cast<float2*>(static_cast<float*>(y) + r * N + col) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(y) + r * N + col) = __floats2bfloat162_rn(v0, v1);
        }
      }
    }
  }
#endif  // PTQ_W8A8_WGMMA (other targets: an empty body, never launched: w8a8_supported())
}

}  // namespace

bool w8a8_supported() {
  return compute_capability() == 90;   // wgmma: sm_90a code only (0 without a device)
}

void w8a8_gemm(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, void* y, bool out_f32) {
  if (K % 16 || K < 16 || K >= (int64_t(1) << 17)) fail(Errc::usage, "", "in_features", "the W8A8 kernel takes K a multiple of 16 below 131072 (an exact int32 sum), got " + std::to_string(K));
  if (N % 2 || N < 2) fail(Errc::usage, "", "out_features", "the W8A8 kernel takes an even N, got " + std::to_string(N));
  if (M < 1) return;
  if (M > (int64_t(1) << 24) || N > (int64_t(1) << 24)) fail(Errc::usage, "", "shape", "the W8A8 kernel takes M and N up to 2^24");
  if (!w8a8_supported()) fail(Errc::usage, "", "device", "the W8A8 kernel is built for sm_90 (H100/H200) only: " + describe());
  static const bool attrs = [] {
    PTQ_CUDA(cudaFuncSetAttribute(w8a8_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    PTQ_CUDA(cudaFuncSetAttribute(w8a8_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)attrs;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16) fail(Errc::usage, "", "x, w", "the W8A8 kernel needs 16-byte aligned operands");
  const CUtensorMap mx = encode_tensor_map(tma_spec_int8(x, M, K, kBM)), mw = encode_tensor_map(tma_spec_int8(w, N, K, kBN));
  const int sms = sm_count();
  const int64_t tiles = ((M + kBM - 1) / kBM) * ((N + kBN - 1) / kBN);
  if (tiles > INT32_MAX) fail(Errc::usage, "", "shape", "the W8A8 kernel takes at most 2^31 tiles of 128 x 256");
  const unsigned grid = unsigned(std::min<int64_t>(tiles, sms));   // one CTA per SM (its shared memory), persistent
  if (out_f32) w8a8_kernel<true><<<grid, kThreads, kSmemBytes, static_cast<cudaStream_t>(current_stream())>>>(mx, mw, sx, sw, int(M), int(N), int(K), y);
  else w8a8_kernel<false><<<grid, kThreads, kSmemBytes, static_cast<cudaStream_t>(current_stream())>>>(mx, mw, sx, sw, int(M), int(N), int(K), y);
  PTQ_CUDA_LAUNCH("w8a8_kernel");
}

}  // namespace ptq::cuda
