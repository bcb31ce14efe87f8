// gemv_probe.cu — a probe, not a ptqkit kernel: can a one-row 4-bit GEMV of another design stream
// a decode layer's codes faster than ptqkit's tensor-core kernel (lib/kernels/a16_mma.cuh) when
// kernels run back to back under programmatic dependent launch (PDL)?
//
// ptqkit's one-row W4 kernel runs 64-78 registers a thread, holds about 64 KB of codes in flight
// an SM and streams 2.7-2.9 TB/s on the big decode layers; bench/pdl_floor.cu's plain reader
// reaches 3.6-3.9 TB/s after the same wait with 2,048 threads and 128 KB in flight an SM
// (docs/lab/2026-11-24-decode-h200.md, runs 355-358). This probe is a real GEMV in the reader's
// geometry: no tensor cores (at one row an m16n8k16 MMA uses 1 of its 8 columns), few registers,
// many warps. Two kernels: gemv_w4 on a layout of its own (below), gemv_frag on ptqkit's fragment
// order (kernels/relayout.h, the weights the decode holds). What they measured on the H200 (runs
// 359-360): gemv_frag 10-17% faster than mma_kernel on 4096 x 4096, 12288 x 4096 and 22016 x 4096,
// not on 4096 x 11008; in the decode step a kernel of this form gained 1.3% (runs 363-366).
//
// Contract: gemv_w4, its work split and the rows layout are bench/w4_rows.cuh's; y f16. N a
// multiple of 32, K of 256.
// Numerics: (q - z) exactly in f16; a word's 8 products summed in f16 (two halves of 4), then in
// fp32 across the group, scaled by s in fp32, fp32 across groups and splits; checked against an
// fp64 host sum (norm-wise relative error <= 2e-3, ptqkit's A16 kernel tests' bound).
// Timing (bench_timing.cuh, as bench/pdl_floor.cu): R launches on R rotating copies of the codes
// (256 MiB in all, so each launch reads from DRAM), queued behind a spinning kernel, median over
// runs; and the same R launches as one CUDA graph. Each launch waits for the one before (PDL), as
// a decode step's do.
// Usage: gemv_probe [runs] [NxK ...]   (default 30 runs; the Llama-2-7B decode layers)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/pdl.cuh"
#include "cuda/ptx.cuh"
#include "kernels/relayout.h"

#include "bench_timing.cuh"
#include "w4_rows.cuh"

using namespace bench;

namespace {

using ptq::cuda::pdl::allow_dependents;
using ptq::cuda::pdl::wait_prior_grid;

// The same math on ptqkit's own fragment order (kernels/relayout.h; GptqFormat of
// kernels/a16_formats.cuh), so that no second copy of the weights is needed: a warp's load is one
// row tile (16 rows) x one k-step (64 columns); lane (g, c) holds rows g and g + 8, columns
// 16c .. 16c + 15 of the k-step, and its metadata pair (1024 + z, s) of rows g and g + 8. A batch
// is 4 k-steps (2 groups of 128) of one tile: 64 bytes a lane. CTA (split, tile block): kTiles
// tiles; warp w takes tile w % kTiles and batches w / kTiles, + W / kTiles, ... of the split's
// range. Each lane sums its 16 columns of each row, then the 4 lanes of a row by shuffles, then the
// warps of a tile in shared memory in warp order.
template <int kThreads, int kMinBlocks, int kTiles>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gemv_frag(const uint4* __restrict__ codes, const uint2* __restrict__ meta, const __half* x, float* part, int* arrivals, __half* y, int N, int KS, int S,
              int bps) {
  constexpr int W = kThreads / 32, kPer = W / kTiles;   // warps a tile
  __shared__ __align__(16) __half xs[W][256];
  __shared__ float red[W][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, s = blockIdx.x, g = lane / 4, c = lane % 4;
  const int tile = blockIdx.y * kTiles + warp % kTiles, G = (KS + 1) / 2, NB = KS / 4;
  const int b1 = min(NB, (s + 1) * bps);
  int b = s * bps + warp / kTiles;
  auto load = [&](int bb, uint4 (&q)[4], uint2 (&m)[2]) {
    const uint4* p = codes + (size_t(tile) * KS + 4 * bb) * 32 + lane;
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = __ldcs(p + i * 32);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint2* mp = meta + (size_t(tile) * G + 2 * bb + i) * 8 + g;
      m[i] = make_uint2(__ldcs(&mp->x), __ldcs(&mp->y));
    }
  };
  uint4 q[4];
  uint2 m[2];
  if (b < b1) load(b, q, m);
  wait_prior_grid();
  allow_dependents();
  float acc_lo = 0.0f, acc_hi = 0.0f;   // rows g, g + 8
  uint4* xw = reinterpret_cast<uint4*>(xs[warp]);
  const __half2 sixteenth = __float2half2_rn(1.0f / 16.0f);
  while (b < b1) {
    xw[lane] = __ldcg(reinterpret_cast<const uint4*>(x + size_t(b) * 256) + lane);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint2& mm = m[i / 2];
      const __half2 lo = h2(mm.x), hi = h2(mm.y);
      const __half2 z_lo = __half2half2(__low2half(lo));
      const __half2 z_hi = __hneg2(__hsub2(__half2half2(__low2half(hi)), __float2half2_rn(960.0f)));   // -(64 + z)
      const uint4 x0 = xw[i * 8 + c * 2], x1 = xw[i * 8 + c * 2 + 1];   // columns 16c .. 16c + 7, + 8 .. + 15
      const uint32_t xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      const uint32_t wd[4] = {q[i].x, q[i].y, q[i].z, q[i].w};
      __half2 pl = __float2half2_rn(0.0f), ph = pl;
#pragma unroll
      for (int f = 0; f < 4; ++f) {   // fragment f: columns 4f .. 4f + 3 of the lane's 16
        const uint32_t w = wd[f], w8 = w >> 8;
        const __half2 d0 = __hsub2(h2(lop(w, 0x000F000Fu)), z_lo);               // row g, columns 0, 1
        const __half2 d1 = __hfma2(h2(lop(w, 0x00F000F0u)), sixteenth, z_hi);    // row g + 8
        const __half2 d2 = __hsub2(h2(lop(w8, 0x000F000Fu)), z_lo);              // row g, columns 2, 3
        const __half2 d3 = __hfma2(h2(lop(w8, 0x00F000F0u)), sixteenth, z_hi);   // row g + 8
        pl = __hfma2(d0, h2(xv[2 * f]), pl);
        pl = __hfma2(d2, h2(xv[2 * f + 1]), pl);
        ph = __hfma2(d1, h2(xv[2 * f]), ph);
        ph = __hfma2(d3, h2(xv[2 * f + 1]), ph);
      }
      const float2 fl = __half22float2(pl), fh = __half22float2(ph);
      acc_lo = fmaf(fl.x + fl.y, __high2float(lo), acc_lo);
      acc_hi = fmaf(fh.x + fh.y, __high2float(hi), acc_hi);
    }
    __syncwarp();
    b += kPer;
    if (b < b1) load(b, q, m);
  }
  acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 1);
  acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 1);
  acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 2);
  acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 2);
  if (c == 0) red[warp][g] = acc_lo, red[warp][g + 8] = acc_hi;
  __syncthreads();
  const int t_in = threadIdx.x / 16, r = threadIdx.x % 16;   // kTiles x 16 threads: one output row each
  float sum = 0.0f;
  if (t_in < kTiles) {
    for (int w = t_in; w < W; w += kTiles) sum += red[w][r];
    const int row = (blockIdx.y * kTiles + t_in) * 16 + r;
    if (S == 1) y[row] = __float2half_rn(sum);
    else part[size_t(s) * N + row] = sum;
  }
  if (S == 1 || !arrived_last(arrivals + blockIdx.y, S)) return;
  if (t_in < kTiles) {
    const int row = (blockIdx.y * kTiles + t_in) * 16 + r;
    float v = 0.0f;
    for (int z = 0; z < S; ++z) v += __ldcg(part + size_t(z) * N + row);
    y[row] = __float2half_rn(v);
  }
}

// One shape's weights on the device, R rotating copies of each layout, x, y and the split sums.
struct Shape {
  int N, R, runs;
  size_t bytes;                      // codes and metadata of one copy (either layout: the same size)
  double copy;                       // GB/s, read + written
  std::vector<double> ref;           // y in fp64
  __half *x = nullptr, *y = nullptr;
  float* part = nullptr;             // [splits][N]
  int* arrivals = nullptr;           // a counter a row block (32 rows) or tile block (16 rows), zero between launches
};

// A variant at S = 1, 2, 4, ... CTAs a row block (while units / S keeps half its warps busy):
// each checked against the fp64 sums first (norm-wise <= 2e-3), then timed back to back; the best
// S again as one graph. launch(S, j) launches it with S splits on copy j.
template <class Launch>
void sweep(const Shape& sh, const char* name, const void* kern, int threads, int units, int warps_a_unit, int ctas_a_split, Launch&& launch) {
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, 0));
  auto pct = [&](double us) { return 100.0 * double(sh.bytes) / (us * 1e-6) / 1e9 / sh.copy; };
  double best = 1e30;
  int best_s = 0;
  for (int S = 1; S <= units; S *= 2) {
    const int per = (units + S - 1) / S;
    if (S > 1 && per < warps_a_unit / 2) break;   // most warps idle
    CK(cudaMemset(sh.y, 0, size_t(sh.N) * 2));
    launch(S, 0);
    CK(cudaStreamSynchronize(g_stream));
    std::vector<__half> hy(size_t(sh.N));
    CK(cudaMemcpy(hy.data(), sh.y, size_t(sh.N) * 2, cudaMemcpyDeviceToHost));
    double e2 = 0, r2 = 0;
    for (int r = 0; r < sh.N; ++r) e2 += std::pow(double(__half2float(hy[size_t(r)])) - sh.ref[size_t(r)], 2), r2 += sh.ref[size_t(r)] * sh.ref[size_t(r)];
    const double rel = std::sqrt(e2 / r2);
    if (!(rel <= 2e-3)) {
      std::printf("  %-36s S %2d: WRONG, relative error %.3g\n", name, S, rel);
      continue;
    }
    const double us = stream_us(sh.runs, sh.R, [&](int j) { launch(S, j); });
    if (us < best) best = us, best_s = S;
    std::printf("  %-36s S %2d (%5d CTAs, %d an SM resident): %7.2f us, %6.0f GB/s, %5.1f%% of copy (rel. error %.1e)\n", name, S, S * ctas_a_split, per_sm,
                us, double(sh.bytes) / (us * 1e-6) / 1e9, pct(us), rel);
  }
  if (best_s) {
    const double gu = graph_us(sh.runs, sh.R, [&](int j) { launch(best_s, j); });
    std::printf("  %-36s best S %d: stream %.2f us, graph %.2f us (%.1f%% of copy)\n", name, best_s, best, gu, pct(gu));
  }
}

using RowsKernel = void (*)(const uint4*, const uint32_t*, const __half*, float*, int*, __half*, int, int, int, int);
using FragKernel = void (*)(const uint4*, const uint2*, const __half*, float*, int*, __half*, int, int, int, int);
template <class K>
struct Variant {
  const char* name;
  K k;
  int threads, tiles;   // tiles: row tiles a CTA (gemv_frag)
};

void print_registers(const char* name, const void* k, int threads) {
  cudaFuncAttributes fa{};
  CK(cudaFuncGetAttributes(&fa, k));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, 0));
  std::printf("variant %-36s %3d registers, %4zu bytes local (spills), %d CTAs an SM resident\n", name, fa.numRegs, size_t(fa.localSizeBytes), per_sm);
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 30;
  std::vector<std::pair<int, int>> shapes;
  for (int i = 2; i < argc; ++i) {
    int n = 0, k = 0;
    if (std::sscanf(argv[i], "%dx%d", &n, &k) != 2 || n % 32 || k % 256 || n <= 0 || k <= 0) {
      std::fprintf(stderr, "gemv_probe: shape '%s': want NxK, N a multiple of 32, K of 256\n", argv[i]);
      return 2;
    }
    shapes.push_back({n, k});
  }
  if (shapes.empty()) shapes = {{4096, 4096}, {12288, 4096}, {22016, 4096}, {4096, 11008}};
  int dev = 0, major = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (major < 9) {
    std::fprintf(stderr, "gemv_probe: needs an sm_90 GPU (PDL)\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  const Variant<RowsKernel> rows_variants[] = {
      {"rows: 512 thr, 3 CTAs/SM", gemv_w4<512, 3, false>, 512, 1},
      {"rows: 1024 thr, 1 CTA/SM", gemv_w4<1024, 1, false>, 1024, 1},
      {"rows: 512 thr, 2 CTAs/SM, 2 batches", gemv_w4<512, 2, true>, 512, 1},
  };
  const Variant<FragKernel> frag_variants[] = {
      {"frag: 512 thr, 3 CTAs/SM, 1 tile", gemv_frag<512, 3, 1>, 512, 1},   {"frag: 512 thr, 3 CTAs/SM, 2 tiles", gemv_frag<512, 3, 2>, 512, 2},
      {"frag: 256 thr, 6 CTAs/SM, 1 tile", gemv_frag<256, 6, 1>, 256, 1},   {"frag: 512 thr, 4 CTAs/SM, 1 tile", gemv_frag<512, 4, 1>, 512, 1},
      {"frag: 1024 thr, 1 CTA/SM, 1 tile", gemv_frag<1024, 1, 1>, 1024, 1}, {"frag: 1024 thr, 1 CTA/SM, 2 tiles", gemv_frag<1024, 1, 2>, 1024, 2},
  };
  for (const auto& v : rows_variants) print_registers(v.name, reinterpret_cast<const void*>(v.k), v.threads);
  for (const auto& v : frag_variants) print_registers(v.name, reinterpret_cast<const void*>(v.k), v.threads);
  const double copy = copy_gbs();
  std::printf("gemv_probe on %s, %d SMs: copy %.0f GB/s (read + write); back to back under PDL on rotating copies, median of %d\n", prop.name, sms, copy, runs);

  std::mt19937 rng(1234);
  for (const auto& shape : shapes) {
    const int N = shape.first, K = shape.second, G = K / 128, RB = N / 32, KS = K / 64, tiles = N / 16, NB = KS / 4;
    const size_t n_codes = size_t(N) * K / 32, n_meta = size_t(N) * G;   // uint4; uint32 (rows) or half a uint2 (fragment order)
    const size_t gptq_bytes = size_t(N) * K / 2 + size_t(N) * G * 5 / 2;
    // Host weights: codes, scales, zeros, x; their fp64 product.
    std::vector<uint8_t> qv(size_t(N) * K), zv(n_meta);
    std::vector<__half> sv(n_meta), xv(static_cast<size_t>(K));
    std::uniform_int_distribution<int> d16(0, 15);
    std::uniform_real_distribution<float> ds(0.001f, 0.02f), dx(-1.0f, 1.0f);
    for (auto& v : qv) v = uint8_t(d16(rng));
    for (auto& v : zv) v = uint8_t(d16(rng));
    for (auto& v : sv) v = __float2half_rn(ds(rng));
    for (auto& v : xv) v = __float2half_rn(dx(rng));
    Shape sh{N, 0, runs, n_codes * 16 + n_meta * 4, copy};
    sh.R = int(std::max<size_t>(2, ((size_t(256) << 20) + sh.bytes - 1) / sh.bytes));
    sh.ref.assign(size_t(N), 0.0);
    for (int r = 0; r < N; ++r)
      for (int g = 0; g < G; ++g) {
        const double s = double(__half2float(sv[size_t(r) * G + g])), z = zv[size_t(r) * G + g];
        double u = 0;
        for (int k = g * 128; k < g * 128 + 128; ++k) u += (double(qv[size_t(r) * K + k]) - z) * double(__half2float(xv[size_t(k)]));
        sh.ref[size_t(r)] += s * u;
      }
    CK(cudaMalloc(&sh.x, size_t(K) * 2));
    CK(cudaMemcpy(sh.x, xv.data(), size_t(K) * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&sh.y, size_t(N) * 2));
    CK(cudaMalloc(&sh.part, size_t(G) * N * 4));
    CK(cudaMalloc(&sh.arrivals, size_t(N / 16) * 4));
    CK(cudaMemset(sh.arrivals, 0, size_t(N / 16) * 4));
    std::printf("\n%d x %d: %.2f MB (codes %.2f + metadata %.2f; a GPTQ checkpoint %.2f MB), %d rotating copies\n", N, K, sh.bytes / 1e6, n_codes * 16 / 1e6,
                n_meta * 4 / 1e6, gptq_bytes / 1e6, sh.R);

    // The rows layout (gemv_w4's contract): codes [row block][group][chunk][lane], metadata [row block][group][lane].
    {
      std::vector<uint32_t> hc(n_codes * 4), hm(n_meta);
            for (int r = 0; r < N; ++r)
        for (int g = 0; g < G; ++g) {
          const __half2 mh = __halves2half2(sv[size_t(r) * G + g], __float2half_rn(-(1024.0f + float(zv[size_t(r) * G + g]))));
          hm[(size_t(r / 32) * G + g) * 32 + r % 32] = *reinterpret_cast<const uint32_t*>(&mh);
          for (int c = 0; c < 4; ++c)
            for (int j = 0; j < 4; ++j) {
              uint32_t w = 0;
              for (int i = 0; i < 8; ++i) w |= uint32_t(qv[size_t(r) * K + g * 128 + c * 32 + j * 8 + kRowsColOfNibble[i]]) << (4 * i);
              hc[(((size_t(r / 32) * G + g) * 4 + c) * 32 + r % 32) * 4 + j] = w;
            }
        }
      uint4* dc = nullptr;
      uint32_t* dm = nullptr;
      CK(cudaMalloc(&dc, size_t(sh.R) * n_codes * 16));
      CK(cudaMalloc(&dm, size_t(sh.R) * n_meta * 4));
      for (int j = 0; j < sh.R; ++j) {
        CK(cudaMemcpy(dc + size_t(j) * n_codes, hc.data(), n_codes * 16, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dm + size_t(j) * n_meta, hm.data(), n_meta * 4, cudaMemcpyHostToDevice));
      }
      for (const auto& v : rows_variants)
        sweep(sh, v.name, reinterpret_cast<const void*>(v.k), v.threads, G, v.threads / 32, RB, [&](int S, int j) {
          launch(v.k, true, dim3(unsigned(S), unsigned(RB)), dim3(unsigned(v.threads)), 0, (const uint4*)(dc + size_t(j) * n_codes),
                 (const uint32_t*)(dm + size_t(j) * n_meta), (const __half*)sh.x, sh.part, sh.arrivals, sh.y, N, G, S, (G + S - 1) / S);
        });
      CK(cudaFree(dc));
      CK(cudaFree(dm));
    }
    // ptqkit's fragment order: the same codes through kernels/relayout.h, metadata [tiles][groups][8] uint2.
    {
      const std::vector<uint32_t> fw = ptq::relayout_codes(N, K, ptq::FragmentCodes::gptq4, [&](int64_t r, int64_t k) { return qv[size_t(r) * K + size_t(k)]; });
      std::vector<uint2> fm(size_t(tiles) * G * 8);
      for (int t = 0; t < tiles; ++t)
        for (int g = 0; g < G; ++g)
          for (int g8 = 0; g8 < 8; ++g8) {
            uint32_t h[2];
            for (int hi = 0; hi < 2; ++hi) {
              const size_t ri = size_t(16 * t + g8 + 8 * hi) * G + g;
              const __half2 v = __halves2half2(__float2half_rn(1024.0f + float(zv[ri])), sv[ri]);
              h[hi] = *reinterpret_cast<const uint32_t*>(&v);
            }
            fm[(size_t(t) * G + g) * 8 + g8] = make_uint2(h[0], h[1]);
          }
      const size_t fw4 = fw.size() / 4;   // uint4
      uint4* fc = nullptr;
      uint2* fmd = nullptr;
      CK(cudaMalloc(&fc, size_t(sh.R) * fw4 * 16));
      CK(cudaMalloc(&fmd, size_t(sh.R) * fm.size() * 8));
      for (int j = 0; j < sh.R; ++j) {
        CK(cudaMemcpy(fc + size_t(j) * fw4, fw.data(), fw4 * 16, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(fmd + size_t(j) * fm.size(), fm.data(), fm.size() * 8, cudaMemcpyHostToDevice));
      }
      for (const auto& v : frag_variants) {
        const int blocks = tiles / v.tiles;
        sweep(sh, v.name, reinterpret_cast<const void*>(v.k), v.threads, NB, v.threads / 32 / v.tiles, blocks, [&](int S, int j) {
          launch(v.k, true, dim3(unsigned(S), unsigned(blocks)), dim3(unsigned(v.threads)), 0, (const uint4*)(fc + size_t(j) * fw4),
                 (const uint2*)(fmd + size_t(j) * fm.size()), (const __half*)sh.x, sh.part, sh.arrivals, sh.y, N, KS, S, (NB + S - 1) / S);
        });
      }
      CK(cudaFree(fc));
      CK(cudaFree(fmd));
    }
    CK(cudaFree(sh.x));
    CK(cudaFree(sh.y));
    CK(cudaFree(sh.part));
    CK(cudaFree(sh.arrivals));
  }
  return 0;
}
