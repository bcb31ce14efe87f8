// bench_timing.cuh — what the standalone measurements in bench/ (pdl_floor, gemv_probe) share:
// an error check, the stream every launch, capture and event uses (default streams cannot be
// captured), the copy bandwidth as `ptqkit bench kernels` measures it, and two timings of R
// launches (each program includes this header once: it is its only translation unit):
//   stream_us  the R launches queued behind a spinning kernel (so they run back to back), median
//              over runs of time / R — `ptqkit bench kernels`' stream column;
//   graph_us   the same R launches captured once into a CUDA graph (PDL launches become
//              programmatic edges), the graph launched behind a short spinning kernel, median
//              over runs of time / R (the first replay warms up).
// reset: called before each run's spinning kernel, outside the timed span (stream_us), or captured
// first into the graph (graph_us: a memset node at each replay).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                   \
  do {                                                                                          \
    const cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));          \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

namespace bench {

inline cudaStream_t g_stream;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(long long ns) {
  for (const unsigned long long t0 = global_ns(); global_ns() - t0 < (unsigned long long)ns;) {
  }
}

// Bytes read + written per second of a 1 GiB device-to-device copy, median of 20 (GB/s).
inline double copy_gbs() {
  const size_t half = size_t(1) << 30;
  char* c = nullptr;
  CK(cudaMalloc(&c, 2 * half));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(a, g_stream));
    CK(cudaMemcpyAsync(c + half, c, half, cudaMemcpyDeviceToDevice, g_stream));
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    float m = 0;
    CK(cudaEventElapsedTime(&m, a, b));
    ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaFree(c));
  return 2.0 * double(half) / (double(ms[10]) * 1e-3) / 1e9;
}

template <class F, class Reset = void (*)()>
double stream_us(int runs, int R, F&& f, Reset reset = [] {}) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < runs; ++i) {
    reset();
    spin_kernel<<<1, 1, 0, g_stream>>>(20000LL * R);
    CK(cudaEventRecord(a, g_stream));
    for (int j = 0; j < R; ++j) f(j);
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    float m = 0;
    CK(cudaEventElapsedTime(&m, a, b));
    ms.push_back(m / float(R));
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return 1000.0 * ms[ms.size() / 2];
}

template <class F, class Reset = void (*)()>
double graph_us(int runs, int R, F&& f, Reset reset = [] {}) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
  reset();
  for (int j = 0; j < R; ++j) f(j);
  CK(cudaStreamEndCapture(g_stream, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i <= runs; ++i) {   // the first run warms up
    spin_kernel<<<1, 1, 0, g_stream>>>(20000LL);
    CK(cudaEventRecord(a, g_stream));
    CK(cudaGraphLaunch(ge, g_stream));
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    float m = 0;
    CK(cudaEventElapsedTime(&m, a, b));
    if (i > 0) ms.push_back(m / float(R));
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return 1000.0 * ms[ms.size() / 2];
}

// kern<<<grid, block, smem, g_stream>>>(args...), with programmatic stream serialization where pdl.
template <class... P, class... A>
void launch(void (*kern)(P...), bool pdl, dim3 grid, dim3 block, size_t smem, A... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.stream = g_stream;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, kern, args...));
}

}  // namespace bench
