// l2_gemm_probe: can 4-bit weights, dequantized to f16 a tile of rows at a time into a scratch that
// stays in L2, each tile then multiplied by cuBLAS, beat cuBLAS f16 on the same layer at 64 and 128
// activation rows, where ptqkit's wgmma kernel runs 0.6-0.9x cuBLAS f16 (docs/benchmarks.md)?
// A timing probe: the dequantization is a stand-in with the real kernel's bytes (4-bit codes read
// once from DRAM, f16 written to the scratch) and a magic-number conversion a pair; its values are
// not GPTQ's. Times, µs a layer (median; codes and f16 weights rotated over 256 MiB so that each
// layer starts cold in L2, as a model's layers do):
//   f16 cold  cuBLAS on f16 weights (rotated): what the A16 kernels are compared with;
//   f16 hot   cuBLAS on the same f16 weights every time (L2-resident where they fit);
//   serial T  per tile of T rows: the stand-in, then cuBLAS on the tile, one stream;
//   piped T   the same with the stand-in of tile i + 1 on a second stream under tile i's GEMM,
//             two scratch buffers (a CUDA graph of both streams).
// Usage: l2_gemm_probe [runs]. Output columns per (N x K, M).
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "bench_timing.cuh"

#define CB(x)                                                                  \
  do {                                                                         \
    const cublasStatus_t s_ = (x);                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                         \
      std::fprintf(stderr, "%s:%d: cuBLAS status %d\n", __FILE__, __LINE__, int(s_)); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

// 32 codes (a uint4) -> 32 f16 values (four uint4), each (code - 8) * 0.01 by the magic number.
__global__ void dequant_standin(const uint4* __restrict__ codes, uint4* __restrict__ w, int64_t n) {
  const __half2 bias = __floats2half2_rn(1032.0f, 1032.0f), scale = __floats2half2_rn(0.01f, 0.01f);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 c = __ldcs(codes + i);
    const uint32_t v[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t o[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t bits = ((v[j] >> (4 * k)) & 0x000f000fu) | 0x64006400u;
        __half2 h = *reinterpret_cast<const __half2*>(&bits);
        h = __hmul2(__hsub2(h, bias), scale);
        o[k] = *reinterpret_cast<const uint32_t*>(&h);
      }
      w[4 * i + j] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 20;
  CK(cudaStreamCreateWithFlags(&bench::g_stream, cudaStreamNonBlocking));
  cudaStream_t s1;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  cublasHandle_t h;
  CB(cublasCreate(&h));
  void* ws = nullptr;
  CK(cudaMalloc(&ws, size_t(64) << 20));
  CB(cublasSetWorkspace(h, ws, size_t(64) << 20));
  CB(cublasSetStream(h, bench::g_stream));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("l2_gemm_probe: copy %.0f GB/s; µs a layer, median of %d\n", bench::copy_gbs(), runs);
  std::printf("%-12s %4s | %9s %9s | %9s %9s %9s | %9s %9s %9s\n", "N x K", "M", "f16 cold", "f16 hot", "serial 1k", "serial 2k", "serial all",
              "piped 512", "piped 1k", "piped 2k");
  const int64_t shapes[][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {14336, 4096}, {4096, 14336}, {12288, 4096}, {22016, 4096}};
  const size_t rot = size_t(256) << 20;
  for (const auto& sh : shapes) {
    const int64_t N = sh[0], K = sh[1];
    const size_t wbytes = size_t(N * K) * 2, cbytes = size_t(N * K) / 2;
    const int wcopies = int(std::max<size_t>(2, rot / wbytes + 1)), ccopies = int(std::max<size_t>(2, rot / cbytes + 1));
    __half *W = nullptr, *x = nullptr, *y = nullptr, *scratch = nullptr;
    uint4* codes = nullptr;
    CK(cudaMalloc(&W, wbytes * wcopies));
    CK(cudaMalloc(&codes, cbytes * ccopies));
    CK(cudaMalloc(&x, size_t(128 * K) * 2));
    CK(cudaMalloc(&y, size_t(128 * N) * 2));
    CK(cudaMalloc(&scratch, wbytes));   // two tiles at most of the piped form, or the whole layer
    CK(cudaMemset(W, 0, wbytes * wcopies));
    CK(cudaMemset(codes, 0x5a, cbytes * ccopies));
    CK(cudaMemset(x, 0, size_t(128 * K) * 2));
    for (int M : {64, 128}) {
      const float one = 1.0f, zero = 0.0f;
      // y[:, r0 : r0 + T] = x · W[r0 : r0 + T]ᵀ (row-major y [M, N]: column-major yᵀ, ldc N).
      auto gemm = [&](const __half* w, int64_t r0, int64_t T) {
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(T), M, int(K), &one, w, CUDA_R_16F, int(K), x, CUDA_R_16F, int(K), &zero, y + r0, CUDA_R_16F,
                        int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      auto deq = [&](cudaStream_t s, int j, int64_t r0, int64_t T, __half* dst) {
        const int64_t n = T * K / 32;
        const uint4* src = codes + (size_t(j % ccopies) * cbytes + size_t(r0 * K) / 2) / 16;
        dequant_standin<<<unsigned(std::min<int64_t>((n + 255) / 256, 8 * sms)), 256, 0, s>>>(src, reinterpret_cast<uint4*>(dst), n);
      };
      const double cold = bench::stream_us(runs, 8, [&](int j) { gemm(W + size_t(j % wcopies) * N * K, 0, N); });
      const double hot = bench::stream_us(runs, 8, [&](int) { gemm(W, 0, N); });
      auto serial = [&](int64_t T) {
        return bench::stream_us(runs, 8, [&](int j) {
          for (int64_t r0 = 0; r0 < N; r0 += T) {
            const int64_t t = std::min(T, N - r0);
            deq(bench::g_stream, j, r0, t, scratch);
            gemm(scratch, r0, t);
          }
        });
      };
      // Piped: tile i's stand-in on s1 into buffer i % 2 once tile i - 2's GEMM has read it; its GEMM
      // on the main stream once the stand-in is done. Captured as one graph (events as edges).
      auto piped = [&](int64_t T) {
        const int tiles = int((N + T - 1) / T);
        std::vector<cudaEvent_t> ev(size_t(2 * tiles + 2));
        for (auto& e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        const double us = bench::graph_us(runs, 4, [&](int j) {
          CK(cudaEventRecord(ev[0], bench::g_stream));   // fork
          CK(cudaStreamWaitEvent(s1, ev[0]));
          for (int i = 0; i < tiles; ++i) {
            const int64_t r0 = i * T, t = std::min(T, N - r0);
            __half* buf = scratch + size_t(i % 2) * size_t(T * K);
            if (i >= 2) CK(cudaStreamWaitEvent(s1, ev[2 + 2 * (i - 2) + 1]));   // tile i - 2's GEMM is done with buf
            deq(s1, j, r0, t, buf);
            CK(cudaEventRecord(ev[2 + 2 * i], s1));
            CK(cudaStreamWaitEvent(bench::g_stream, ev[2 + 2 * i]));
            gemm(buf, r0, t);
            CK(cudaEventRecord(ev[2 + 2 * i + 1], bench::g_stream));
          }
          CK(cudaEventRecord(ev[1], s1));   // join
          CK(cudaStreamWaitEvent(bench::g_stream, ev[1]));
        });
        for (auto& e : ev) CK(cudaEventDestroy(e));
        return us;
      };
      const double s1k = serial(1024), s2k = serial(2048), sall = serial(N);
      const double p512 = piped(512), p1k = piped(1024), p2k = piped(2048);
      std::printf("%5lldx%-6lld %4d | %9.2f %9.2f | %9.2f %9.2f %9.2f | %9.2f %9.2f %9.2f\n", (long long)N, (long long)K, M, cold, hot, s1k, s2k, sall, p512,
                  p1k, p2k);
      std::fflush(stdout);
    }
    CK(cudaFree(W));
    CK(cudaFree(codes));
    CK(cudaFree(x));
    CK(cudaFree(y));
    CK(cudaFree(scratch));
  }
  return 0;
}
