// pdl_floor.cu — what bounds a small layer's weight stream when kernels run back to back with
// programmatic dependent launch (PDL), measured without ptqkit's kernels. ptqkit's A16 kernels
// (lib/kernels/a16_mma.cuh) read their codes before they wait for the previous kernel and read
// x after it; at 4096 x 4096 (8.9 MB of 4-bit codes and metadata) they stream at 60% of the copy
// bandwidth back to back. This program measures, on the same number of bytes, stand-in kernels
// that do only that (docs/lab/kernels.md has what they showed):
//   1. read floors by launch mode: plain launches; PDL with every read before the wait; PDL with
//      every read after it; PDL with an L2 bulk prefetch of the CTA's bytes before the wait and
//      the reads after it. Best over grid x block x loads in flight, and the geometry that won.
//   2. reads before the wait, then a dependent tail after it (an x load, a block reduction) and
//      `work` added FMAs per thread (ptqkit's dequantization and MMAs run there): weights in
//      registers, 256 CTAs of 512 threads held to 2 per SM as the W4 M = 1 4096² plan is (its
//      registers), or bulk-copied (cp.async.bulk) into shared memory by CTAs small enough for the
//      next kernel's CTAs to be resident beside them.
//   3. a timeline of (2) at work 0 from %globaltimer stamps per CTA: how long after the previous
//      grid's last CTA ends the wait returns (release), and how long the tail after it takes.
//   4. (2) with the wait replaced by a counter in global memory: each CTA adds 1 when done
//      (release), each launch spins until the CTAs before it are all done (acquire).
//   5. (2) in registers, each CTA prefetching its share of the next launch's bytes into L2 once its
//      own are in (before the wait): DRAM streams the next layer during this one's wait and tail.
// Timing as `ptqkit bench kernels`' stream column: R launches on R copies of the bytes (R copies
// span 256 MiB, so each launch reads from DRAM), queued behind a spinning kernel, median of runs;
// and the same R launches as one CUDA graph (as decode loops run them).
// Usage: pdl_floor [bytes] [runs]   (default 8912896 = W4 g128 4096 x 4096, 50 runs); sm_90 only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_timing.cuh"

using namespace bench;

namespace {

__device__ __forceinline__ void allow_dependents() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ __forceinline__ void wait_prior_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ unsigned fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

// 1. Reads of the CTA's contiguous share, U uint4 in flight per thread. mode: 0 plain, 1 PDL reads
// before the wait, 2 PDL reads after it, 3 as 2 with an L2 bulk prefetch of the share before the wait.
template <int U>
__global__ void read_kernel(const uint4* __restrict__ w, size_t n16, unsigned* out, int mode) {
  if (mode) allow_dependents();
  const size_t per = (n16 + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(n16, lo + per);
  if (mode == 3 && threadIdx.x == 0)
    for (size_t a = lo; a < hi; a += 4096)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + a), "r"(unsigned((min(hi, a + 4096) - a) * 16)) : "memory");
  if (mode >= 2) wait_prior_grid();
  unsigned acc = 0;
  for (size_t b = lo + threadIdx.x; b < hi; b += size_t(blockDim.x) * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t i = b + size_t(u) * blockDim.x;
      v[u] = i < hi ? __ldcs(w + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= fold(v[u]);
  }
  if (mode == 1) wait_prior_grid();
  if (acc == 0x12345678u) out[blockIdx.x] = acc;   // never true: keeps the reads
}

// The dependent tail of 2: x (written by the previous kernel in a real step) read after the wait,
// `work` x 4 FMAs per thread, a block reduction through shared memory. Stamps (3): started, data in,
// wait returned, tail done; j: the launch's index in the stream.
struct Stamps {
  unsigned long long* at;   // [launch][CTA][4], or null
  int j;
};
__device__ void tail(unsigned acc, const uint4* x, unsigned* out, int work, unsigned* red, const Stamps& st, const unsigned long long (&t)[3]) {
  acc ^= fold(__ldg(x + (threadIdx.x & 255)));
  float a0 = __uint_as_float(acc & 0xffffu), a1 = a0 + 1.0f, a2 = a0 + 2.0f, a3 = a0 + 3.0f;
  for (int i = 0; i < work; ++i) {
    a0 = fmaf(a0, 1.0001f, 0.5f);
    a1 = fmaf(a1, 1.0001f, 0.5f);
    a2 = fmaf(a2, 1.0001f, 0.5f);
    a3 = fmaf(a3, 1.0001f, 0.5f);
  }
  acc ^= __float_as_uint(a0 + a1 + a2 + a3);
  red[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    unsigned s = 0;
    for (int i = threadIdx.x; i < blockDim.x; i += 32) s += red[i];
    if (s == 0x12345678u) out[blockIdx.x] = s;
  }
  __syncthreads();
  if (st.at && threadIdx.x == 0) {
    unsigned long long* p = st.at + (size_t(st.j) * gridDim.x + blockIdx.x) * 4;
    p[0] = t[0], p[1] = t[1], p[2] = t[2], p[3] = global_ns();
  }
}

// The wait for the previous launch: griddepcontrol.wait, or with `done` (4) a counter instead. Every
// CTA of every launch adds 1 to *done after its last read and write (signal_done, after tail's
// closing barrier: a gpu-scope release), and a launch waits until *done reaches the CTAs launched
// before it (`before`; an acquire spin of one thread). Deadlock-free because a PDL launch comes only
// after every CTA of the previous grid has started (they call allow_dependents first): the CTAs it
// waits for are resident.
__device__ __forceinline__ void wait_for(unsigned* done, unsigned before) {
  if (!done) {
    wait_prior_grid();
    return;
  }
  if (threadIdx.x == 0) {
    unsigned d;
    do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(d) : "l"(done) : "memory");
    while (d < before);
  }
  __syncthreads();
}
__device__ __forceinline__ void signal_done(unsigned* done) {
  if (done && threadIdx.x == 0) asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(done) : "memory");
}

// 2, weights in registers: 4 uint4 per thread before the wait (the W4 M = 1 4096² plan's batch), the rest after.
// 5, with `next` (the next launch's bytes): once this CTA's own loads are in, its thread 0 prefetches
// the same share of them into L2 (cp.async.bulk.prefetch.L2), so DRAM streams them during the wait
// and the tail.
__global__ void reg_kernel(const uint4* __restrict__ w, size_t n16, const uint4* x, unsigned* out, int work, Stamps st, const uint4* next,
                           unsigned* done, unsigned before) {
  extern __shared__ unsigned red[];
  allow_dependents();
  unsigned long long t[3];
  t[0] = global_ns();
  const size_t per = n16 / gridDim.x, lo = blockIdx.x * per;
  uint4 v[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const size_t i = threadIdx.x + size_t(u) * blockDim.x;
    v[u] = i < per ? __ldcs(w + lo + i) : make_uint4(0, 0, 0, 0);
  }
  unsigned acc = 0;
#pragma unroll
  for (int u = 0; u < 4; ++u) acc ^= fold(v[u]);
  __syncthreads();
  t[1] = global_ns();
  if (next && threadIdx.x == 0)
    for (size_t a = 0; a < per; a += 4096)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(next + lo + a), "r"(unsigned((min(per, a + 4096) - a) * 16)) : "memory");
  wait_for(done, before);
  t[2] = global_ns();
  for (size_t i = threadIdx.x + 4 * size_t(blockDim.x); i < per; i += blockDim.x) acc ^= fold(__ldcs(w + lo + i));
  tail(acc, x, out, work, red, st, t);
  signal_done(done);
}

// 2, weights bulk-copied into shared memory (one mbarrier, copies of 16 KB) before the wait.
__global__ void smem_kernel(const uint4* __restrict__ w, size_t n16, const uint4* x, unsigned* out, int work, Stamps st, unsigned* done, unsigned before) {
  extern __shared__ __align__(128) uint4 buf[];
  __shared__ __align__(8) unsigned long long bar;
  __shared__ unsigned red[1024];
  allow_dependents();
  unsigned long long t[3];
  t[0] = global_ns();
  const size_t per = n16 / gridDim.x, lo = blockIdx.x * per;
  const unsigned b = unsigned(__cvta_generic_to_shared(&bar));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b));
    asm volatile("fence.proxy.async.shared::cta;");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(unsigned(per * 16)) : "memory");
    for (size_t a = 0; a < per; a += 1024)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       unsigned(__cvta_generic_to_shared(buf + a))),
                   "l"(w + lo + a), "r"(unsigned(min(per - a, size_t(1024)) * 16)), "r"(b)
                   : "memory");
  }
  __syncthreads();
  asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0; @!p bra W; }" ::"r"(b) : "memory");
  t[1] = global_ns();
  wait_for(done, before);
  t[2] = global_ns();
  unsigned acc = 0;
  for (size_t i = threadIdx.x; i < per; i += blockDim.x) acc ^= fold(buf[i]);
  tail(acc, x, out, work, red, st, t);
  signal_done(done);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) / 16 * 16 : 8912896;
  const int runs = argc > 2 ? std::atoi(argv[2]) : 50;
  int dev = 0, major = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (major < 9 || bytes < (size_t(1) << 20) || runs < 1) {
    std::fprintf(stderr, "pdl_floor: needs an sm_90 GPU (PDL, bulk copies), bytes >= 1 MiB and runs >= 1\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  const size_t n16 = bytes / 16, span = size_t(256) << 20;
  const int R = int(std::max<size_t>(2, (span + bytes - 1) / bytes));
  uint4 *w = nullptr, *x = nullptr;
  unsigned* out = nullptr;
  CK(cudaMalloc(&w, size_t(R) * bytes));
  CK(cudaMemset(w, 1, size_t(R) * bytes));
  CK(cudaMalloc(&x, 1 << 16));
  CK(cudaMemset(x, 2, 1 << 16));
  CK(cudaMalloc(&out, 1 << 20));
  // Copy bandwidth (bytes read + written) of a 1 GiB device-to-device copy, median of 20 (as ptqkit bench kernels).
  const double copy_gbs = bench::copy_gbs();
  auto pct = [&](double us) { return 100.0 * double(bytes) / (us * 1e-6) / 1e9 / copy_gbs; };
  std::printf("pdl_floor on %s, %d SMs: %zu bytes back to back on %d rotating copies, median of %d; copy %.0f GB/s (read + write)\n", prop.name, sms,
              bytes, R, runs, copy_gbs);

  // 1. Read floors by launch mode.
  const char* modes[] = {"plain launches", "PDL, reads before the wait", "PDL, reads after the wait", "PDL, L2 prefetch before the wait, reads after"};
  for (int mode = 0; mode < 4; ++mode) {
    double best = 1e30;
    int bg = 0, bb = 0, bu = 0;
    for (int grid : {sms, 2 * sms, 4 * sms, 8 * sms})
      for (int block : {256, 512, 1024})
        for (int U : {4, 8}) {
          if (size_t(grid) * block > size_t(sms) * 2048) continue;
          auto f = [&](int j) {
            const uint4* p = w + size_t(j) * n16;
            if (U == 4) launch(read_kernel<4>, mode > 0, grid, block, 0, p, n16, out, mode);
            else launch(read_kernel<8>, mode > 0, grid, block, 0, p, n16, out, mode);
          };
          const double us = stream_us(runs, R, f);
          if (us < best) best = us, bg = grid, bb = block, bu = U;
        }
    auto fb = [&](int j) {
      const uint4* p = w + size_t(j) * n16;
      if (bu == 4) launch(read_kernel<4>, mode > 0, bg, bb, 0, p, n16, out, mode);
      else launch(read_kernel<8>, mode > 0, bg, bb, 0, p, n16, out, mode);
    };
    const double gu = graph_us(runs, R, fb);
    std::printf("1. %-46s %6.2f us %5.1f%% of copy | graph %6.2f us %5.1f%%  (grid %d, block %d, %d uint4 in flight)\n", modes[mode], best, pct(best), gu, pct(gu),
                bg, bb, bu);
  }

  // 2. Reads before the wait, a dependent tail after it.
  CK(cudaFuncSetAttribute(reg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  CK(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  struct Cfg {
    const char* name;
    bool smem, flag;
    int grid, block;
    bool prefetch = false;
  };
  const Cfg cfgs[] = {{"registers, 2 CTAs per SM", false, false, 256, 512},
                      {"shared memory, 1 CTA per SM per kernel", true, false, sms, 512},
                      {"shared memory, 2 CTAs per SM per kernel", true, false, 2 * sms, 256},
                      {"registers, 2 per SM, a counter for the wait", false, true, 256, 512},
                      {"shared memory, 1 per SM, a counter for the wait", true, true, sms, 512},
                      {"shared memory, 2 per SM, a counter for the wait", true, true, 2 * sms, 256},
                      {"registers, 2 per SM, next launch's bytes to L2", false, false, 256, 512, true}};
  unsigned long long* at = nullptr;
  unsigned* done = nullptr;   // 4's counter
  CK(cudaMalloc(&at, size_t(R) * 4096 * 4 * sizeof(unsigned long long)));
  CK(cudaMalloc(&done, sizeof(unsigned)));
  auto reset = [&] { CK(cudaMemsetAsync(done, 0, sizeof(unsigned), g_stream)); };
  for (const Cfg& c : cfgs) {
    const size_t per = n16 / size_t(c.grid), smem = c.smem ? per * 16 : 100 * 1024;   // registers: 100 KB holds it to 2 CTAs per SM
    if (smem > 200 * 1024) {
      std::printf("2. %-40s skipped: %zu bytes of shared memory per CTA\n", c.name, smem);
      continue;
    }
    const int per_sm = c.block * ((c.grid + sms - 1) / sms);
    auto one = [&](const Cfg& k, int j, int iters, Stamps st) {
      const uint4* p = w + size_t(j) * n16;
      if (k.smem) launch(smem_kernel, true, k.grid, k.block, smem, p, n16, (const uint4*)x, out, iters, st, k.flag ? done : nullptr, unsigned(j * k.grid));
      else
        launch(reg_kernel, true, k.grid, k.block, smem, p, n16, (const uint4*)x, out, iters, st, k.prefetch && j + 1 < R ? p + n16 : nullptr,
               k.flag ? done : nullptr, unsigned(j * k.grid));
    };
    std::printf("%s %-40s", c.flag ? "4." : c.prefetch ? "5." : "2.", c.name);
    for (int work : {0, 25, 50, 100}) {   // FMAs x 4 per thread at 1024 threads per SM: the same work per SM in each layout
      const int iters = int(int64_t(work) * 1024 / per_sm);
      auto f = [&](int j) { one(c, j, iters, Stamps{nullptr, j}); };
      const double us = stream_us(runs, R, f, reset), gu = graph_us(runs, R, f, reset);
      std::printf(" | work %3d: %5.2f us %5.1f%%, graph %5.2f us %5.1f%%", work, us, pct(us), gu, pct(gu));
    }
    std::printf("\n");
    // 3. Timeline at work 0: the middle launches (from max(2, R / 4) to R - 2) of three streams.
    std::vector<unsigned long long> h(size_t(R) * c.grid * 4);
    double release = 0, tail_ns = 0, period = 0;
    int n = 0;
    for (int rep = 0; rep < 3; ++rep) {
      reset();
      spin_kernel<<<1, 1, 0, g_stream>>>(20000LL * R);
      for (int j = 0; j < R; ++j) one(c, j, 0, Stamps{at, j});
      CK(cudaStreamSynchronize(g_stream));
      CK(cudaMemcpy(h.data(), at, h.size() * sizeof(h[0]), cudaMemcpyDeviceToHost));
      auto stamp = [&](int j, int b, int k) { return double(h[(size_t(j) * c.grid + b) * 4 + k]); };
      for (int j = std::max(2, R / 4); j + 1 < R - 1; ++j) {
        double end_j = 0, prev_end = 0, release_j = 1e30, next_release = 1e30;   // last CTA ends, first waits returned
        for (int b = 0; b < c.grid; ++b) {
          end_j = std::max(end_j, stamp(j, b, 3));
          prev_end = std::max(prev_end, stamp(j - 1, b, 3));
          release_j = std::min(release_j, stamp(j, b, 2));
          next_release = std::min(next_release, stamp(j + 1, b, 2));
        }
        release += next_release - end_j, tail_ns += end_j - release_j, period += end_j - prev_end, ++n;
      }
    }
    if (n > 0)   // R >= 5: fewer rotating copies leave no launch with neighbours on both sides
      std::printf("3. %-40s release %4.0f ns after the previous grid's last CTA, tail %4.0f ns, period %4.0f ns (work 0, mean of %d launches)\n", c.name,
                  release / n, tail_ns / n, period / n, n);
  }
  CK(cudaFree(at));
  CK(cudaFree(done));
  CK(cudaFree(w));
  CK(cudaFree(x));
  CK(cudaFree(out));
  return 0;
}
