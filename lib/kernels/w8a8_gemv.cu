// w8a8_gemv.cu — the W8A8 product for decode-sized M (1..16 rows): int8 weights streamed once,
// int8 activations from shared memory, dp4a.
//
// Contract. Operands (device): x [M, K] int8 row-major with per-row scales sx [M] fp32; w [N, K]
// int8 row-major (the Linear's weight as stored) with per-row scales sw [N] fp32; y [M, N] fp32.
// y = sx[m] · sw[n] · Σ_k x[m, k] · w[n, k] + beta · y (beta 0: y is only written). The sum is
// exact in int32 as in w8a8.cu (K < 2^17); the epilogue forms float(acc) · sx[m] · sw[n] in fp32,
// the same expression as w8a8.cu's and ref_gemm_w8a8's. Accepted: 1 <= M <= kW8A8GemvMaxM, K a
// multiple of 16, x and w 16-byte aligned. Any sm (dp4a: sm_61+).
// Math: a CTA of 8 warps owns 32 rows of w (4 per warp); K is walked in tiles of 2 KiB: the CTA
// stages x[:, tile] in shared memory, then each lane loads its 4 16-byte pieces of each of its
// warp's 4 rows (16 loads in flight), and each x piece read from shared memory serves the 4 rows
// (4 dp4a per piece per activation row) into M x 4 int32 accumulators; a warp reduction at the end.
// Each weight byte is read once from HBM: at M = 1 the kernel is bound by w's bytes.
// The reference is ref_gemm_w8a8 (lib/kernels/reference.h).
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "cuda/runtime.h"
#include "kernels/w8a8.h"

namespace ptq::cuda {

namespace {
constexpr int kWarps = 8, kRowsPerWarp = 4, kTile = 2048, kMaxM = 16, kUnroll = kTile / 16 / 32;   // a tile: 4 pieces per lane

// kM: the activation rows, a template parameter so that the accumulators stay in registers.
template <int kM>
__global__ void __launch_bounds__(kWarps * 32) w8a8_gemv_kernel(const int8_t* __restrict__ x, const float* __restrict__ sx, const int8_t* __restrict__ w,
                                                                const float* __restrict__ sw, int N, int K, float* y, float beta) {
  __shared__ __align__(16) int8_t xs[kM * kTile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + warp) * kRowsPerWarp;
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
    __syncthreads();   // the previous tile's x is no longer read
    for (int i = threadIdx.x; i < kM * (tk / 16); i += blockDim.x) {
      const int m = i / (tk / 16), c = i % (tk / 16);
      reinterpret_cast<int4*>(xs + m * kTile)[c] = __ldg(reinterpret_cast<const int4*>(x + size_t(m) * K + k0) + c);
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = lane + 32 * u;
      if (c >= tk / 16) break;
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        const int4 xv = reinterpret_cast<const int4*>(xs + m * kTile)[c];   // one x piece serves the warp's rows
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          int a = acc[r][m];
          a = __dp4a(wv[u][r].x, xv.x, a);
          a = __dp4a(wv[u][r].y, xv.y, a);
          a = __dp4a(wv[u][r].z, xv.z, a);
          a = __dp4a(wv[u][r].w, xv.w, a);
          acc[r][m] = a;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int n = n0 + r;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      int a = acc[r][m];
      for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0 && n < N) {
        const float v = float(a) * sx[m] * sw[n];
        float* out = y + size_t(m) * N + n;
        *out = beta == 0.0f ? v : v + beta * *out;
      }
    }
  }
}

template <int kM>
void launch_gemv(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta) {
  if (M != kM) {
    if constexpr (kM > 1) launch_gemv<kM - 1>(x, sx, w, sw, M, N, K, y, beta);
    return;
  }
  const int64_t per_cta = kWarps * kRowsPerWarp;
  w8a8_gemv_kernel<kM><<<unsigned((N + per_cta - 1) / per_cta), kWarps * 32, 0, static_cast<cudaStream_t>(current_stream())>>>(x, sx, w, sw, int(N),
                                                                                                                                int(K), y, beta);
  PTQ_CUDA_LAUNCH("w8a8_gemv_kernel");
}
}  // namespace

void w8a8_gemv(const int8_t* x, const float* sx, const int8_t* w, const float* sw, int64_t M, int64_t N, int64_t K, float* y, float beta) {
  if (M < 1 || M > kW8A8GemvMaxM) fail(Errc::usage, "", "w8a8_gemv", "takes 1.." + std::to_string(kW8A8GemvMaxM) + " rows, not " + std::to_string(M));
  if (K % 16 || K >= (int64_t(1) << 17)) fail(Errc::usage, "", "w8a8_gemv", "K must be a multiple of 16 below 2^17, not " + std::to_string(K));
  launch_gemv<kMaxM>(x, sx, w, sw, M, N, K, y, beta);
}

}  // namespace ptq::cuda
