// bench_kernels.cu — `ptqkit bench kernels`: the W4A16 (g128), W8A16 (per channel) and NF4 (block 64) kernels against cuBLAS f16, and
// the W8A8 product (the decode GEMV's forms at M <= 32, the GEMM above) against cuBLAS bf16 and cuBLAS int8, on the same
// shapes, cold L2, CUDA events, median of the runs; µs, GB/s, % of the device-to-device copy
// bandwidth measured in the same run, speedup. Two timings of each A16 and W8A8 call (cuBLAS int8: single only), both cold in L2:
//   single: one launch after a 256 MiB buffer is rewritten (its time includes the launch's
//           fixed cost, ~3 us on the H100, and the write-back of the dirty lines it evicts);
//   stream: R launches back to back, each on the next of R copies of the weights (R copies span
//           >= 256 MiB, so each launch's weights were last touched >= 256 MiB ago), queued behind a
//           spinning kernel so the host's launch rate does not show; time / R. This is how a
//           decode step runs its layers. cuBLAS is timed the same way on R copies of f16 weights
//           (bf16 for W8A8). The A16 kernels and the W8A8 decode product are launched with PDL
//           (cuda/pdl.cuh), so here each starts its weight loads during the previous launch's
//           tail; PTQKIT_PDL=0 times them without it.
// PTQKIT_A16_SWEEP="rt:slices[:warps[:loop[:form[:sum]]]],..." adds a row per forced work split of the tensor-core
// kernels (set_a16_split, a16_path.h): how the planners' choices were checked.
// PTQKIT_A16_PATHS="mma,shared_x,wgmma,dequant" times those paths (where they take M) instead of the
// automatic one: how the crossovers of a16_auto_path were found.
// PTQKIT_A16_PLAN_LOG=1 prints each plan of the L2-fed kernel to stderr when it is made (rows
// tiles, slices, CTAs, shared memory, registers, resident CTAs per SM).
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda/pdl.cuh"
#include "cuda/random.h"
#include "cuda/runtime.h"
#include "kernels/bench_kernels.h"
#include "kernels/nf4.h"
#include "kernels/w4a16.h"
#include "kernels/w8a8.h"

namespace ptq::cuda {

namespace {
struct Timer {
  cudaEvent_t a, b;
  Timer() { PTQ_CUDA(cudaEventCreate(&a)); PTQ_CUDA(cudaEventCreate(&b)); }
  ~Timer() { cudaEventDestroy(a); cudaEventDestroy(b); }
};
template <class F>
double median_us(int runs, void* flush, size_t flush_bytes, F&& f) {
  Timer t;
  std::vector<float> ms;
  for (int i = 0; i < runs; ++i) {
    PTQ_CUDA(cudaMemsetAsync(flush, i & 0xff, flush_bytes));   // evict L2
    PTQ_CUDA(cudaEventRecord(t.a));
    f();
    PTQ_CUDA(cudaEventRecord(t.b));
    PTQ_CUDA(cudaEventSynchronize(t.b));
    float m = 0;
    PTQ_CUDA(cudaEventElapsedTime(&m, t.a, t.b));
    ms.push_back(m);
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return 1000.0 * ms[ms.size() / 2];
}
__global__ void spin_kernel(long long ns) {
  long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (long long t = t0; t - t0 < ns;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
}

// Median over runs of (time of R back-to-back calls f(0..R-1)) / R, the calls queued behind a
// spinning kernel (20 us per call, longer than a call takes to enqueue) so that they start back to back.
template <class F>
double stream_us(int runs, int R, F&& f) {
  Timer t;
  std::vector<float> ms;
  for (int i = 0; i < runs; ++i) {
    spin_kernel<<<1, 1>>>(20000LL * R);
    PTQ_CUDA(cudaEventRecord(t.a));
    for (int j = 0; j < R; ++j) f(j);
    PTQ_CUDA(cudaEventRecord(t.b));
    PTQ_CUDA(cudaEventSynchronize(t.b));
    float m = 0;
    PTQ_CUDA(cudaEventElapsedTime(&m, t.a, t.b));
    ms.push_back(m / float(R));
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return 1000.0 * ms[ms.size() / 2];
}
// Copies of bytes each that together span at least 256 MiB.
int rotation(size_t bytes) { return int(std::max<size_t>(2, ((size_t(256) << 20) + bytes - 1) / bytes)); }
}  // namespace

std::unique_ptr<W4A16Linear> random_gguf_linear(int64_t N, int64_t K, const std::string& type, float scale, Rng& r) {
  const bool q4k = type == "q4_k";
  if (!q4k && type != "q6_k") fail(Errc::usage, "", "format", "unknown GGUF kernel format '" + type + "' (q4_k, q6_k)");
  QuantSpec s;
  s.bits = q4k ? 4 : 6;
  s.group_size = q4k ? 32 : 16;
  s.form = q4k ? GridForm::f16_min : GridForm::integer_zero;   // Q4_K's grid is s q + m per group of 32, as Q4_1's
  s.sym = !q4k;
  QuantizedLinear q = QuantizedLinear::empty(N, K, s);
  std::vector<uint8_t> codes(size_t(N * K));
  for (auto& c : codes) c = uint8_t(r.next() & ((1u << s.bits) - 1));
  q.set_codes(codes.data());
  for (auto& v : q.scales) v = scale;
  for (auto& m : q.mins) m = -8.0f * scale;      // codes 0..15 centred on zero
  for (auto& z : q.zeros) z = q4k ? 0 : 32;
  return W4A16Linear::from_quantized(q);
}

std::unique_ptr<W4A16Linear> random_gptq_linear(int64_t N, int64_t K, int bits, float scale, Rng& r) {
  QuantSpec s;
  s.bits = bits;
  s.group_size = bits == 4 ? 128 : -1;
  s.sym = true;
  QuantizedLinear q = QuantizedLinear::empty(N, K, s);
  std::vector<uint8_t> codes(size_t(N * K));
  for (auto& c : codes) c = uint8_t(r.next() & ((1u << bits) - 1));
  q.set_codes(codes.data());
  for (auto& v : q.scales) v = scale;
  // The symmetric zero point (QuantizedLinear::empty leaves 0): weights centred on zero. With 0 every
  // weight was positive, and a synthetic 7B's 8-bit MLP overflowed f16 (silu·mul's act, found by
  // PTQKIT_DECODE_CHECK, lab run 151); the kernels' speed does not depend on the values.
  for (auto& z : q.zeros) z = 1 << (bits - 1);
  return W4A16Linear::from_gptq(pack_gptq(q, true), true);
}

std::unique_ptr<Nf4Linear> random_nf4_linear(int64_t N, int64_t K, float absmax, Rng& r) {
  Nf4Tensor t;
  t.blocksize = 64;
  t.packed.resize(size_t(N * K / 2));
  for (auto& b : t.packed) b = uint8_t(r.next());
  t.absmax.assign(size_t(N * K / 64), absmax);
  return Nf4Linear::from_nf4(t, N, K);
}

void bench_kernels(const std::vector<std::pair<int64_t, int64_t>>& shapes, const std::vector<int64_t>& Ms, int runs, const std::vector<std::string>& kernels) {
  auto wanted = [&](const char* k) { return std::find(kernels.begin(), kernels.end(), k) != kernels.end(); };
  // PTQKIT_A16_SWEEP="rt:slices[:warps[:loop[:form[:sum]]]],...": each A16 call is also timed with those forced splits (rows labelled rRsSwWlLfFuU).
  std::vector<A16Split> sweep{{}};
  for (const std::vector<int64_t>& f : env_int_list("PTQKIT_A16_SWEEP", "rt:slices[:warps[:loop[:form[:sum]]]]", ':', 2, 6)) {
    auto at = [&](size_t i) { return i < f.size() ? int(f[i]) : 0; };
    sweep.push_back({at(0), at(1), at(2), at(3), at(4), at(5)});
  }
  std::vector<A16Path> paths{A16Path::automatic};
  const A16Path named[] = {A16Path::mma, A16Path::shared_x, A16Path::wgmma, A16Path::dequant};
  std::vector<std::string> names;
  for (A16Path p : named) names.push_back(a16_path_name(p));
  if (const std::vector<int> picked = env_name_list("PTQKIT_A16_PATHS", names); !picked.empty()) {   // any other name refused
    paths.clear();
    for (int i : picked) paths.push_back(named[i]);
  }
  const size_t flush_bytes = size_t(256) << 20;
  DeviceBuffer<uint8_t> flush(flush_bytes, "L2 flush buffer");
  // Copy bandwidth: 1 GiB device to device, bytes read + written.
  double copy_gbs = 0;
  {
    const size_t n = size_t(1) << 30;
    DeviceBuffer<uint8_t> a(n, "copy src"), b(n, "copy dst");
    const double us = median_us(20, flush.get(), flush_bytes, [&] { PTQ_CUDA(cudaMemcpyAsync(b.get(), a.get(), n, cudaMemcpyDeviceToDevice)); });
    copy_gbs = 2.0 * double(n) / (us * 1e-6) / 1e9;
  }
  std::printf("bench kernels on %s: device-to-device copy %.0f GB/s (read + write); cold L2, median of %d runs; A16 kernels launched with PDL: %s\n",
              describe().c_str(), copy_gbs, runs, pdl_enabled() ? "yes" : "no (PTQKIT_PDL=0 or no sm_90)");
  std::printf("%-17s %5s %-11s | %-38s | %s\n", "", "", "", "single launch after a 256 MiB rewrite", "stream: back to back, rotating weights");
  std::printf("%-17s %5s %-11s | %8s %6s %6s %8s %7s | %8s %6s %6s %8s %7s\n", "bits N x K", "M", "path", "us", "GB/s", "%copy", "cuBLAS", "speedup", "us",
              "GB/s", "%copy", "cuBLAS", "speedup");
  cublasHandle_t h;
  PTQ_CUBLAS(cublasCreate(&h));
  // kind 4: W4A16 g128, 8: W8A16 per channel, 0: NF4 with blocks of 64
  for (int kind : {4, 8, 0})
  for (const auto& shape_nk : shapes) {
    const int64_t N = shape_nk.first, K = shape_nk.second;
    if (!wanted(kind == 4 ? "w4a16" : kind == 8 ? "w8a16" : "nf4")) continue;
    std::vector<std::unique_ptr<W4A16Linear>> L;
    std::vector<std::unique_ptr<Nf4Linear>> F;
    Rng r(uint64_t(N + K));
    if (kind) L.push_back(random_gptq_linear(N, K, kind, 0.01f, r));
    else F.push_back(random_nf4_linear(N, K, 0.05f, r));
    const size_t wbytes = kind ? L[0]->weight_bytes() : F[0]->weight_bytes();
    const int R = rotation(wbytes), Rf = rotation(size_t(2 * N * K));
    for (int i = 1; i < R; ++i) {
      if (kind) L.push_back(L[0]->clone());
      else F.push_back(F[0]->clone());
    }
    std::vector<DeviceBuffer<__half>> Wf;
    for (int i = 0; i < Rf; ++i) {
      Wf.emplace_back(size_t(N * K), "cuBLAS f16 weights");
      fill_random_normal(Wf.back().get(), DType::F16, N * K, uint64_t(1 + i), 0.02f);
    }
    const int64_t maxM = *std::max_element(Ms.begin(), Ms.end());
    DeviceBuffer<__half> x(size_t(maxM * K), "x"), y(size_t(maxM * N), "y");
    fill_random_normal(x.get(), DType::F16, maxM * K, 2, 1.0f);
    for (int64_t M : Ms) {
      const float one = 1.0f, zero = 0.0f;
      auto cublas = [&](int i) {
        PTQ_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, Wf[size_t(i)].get(), CUDA_R_16F, int(K), x.get(), CUDA_R_16F,
                                int(K), &zero, y.get(), CUDA_R_16F, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      const double cub = median_us(runs, flush.get(), flush_bytes, [&] { cublas(0); });
      const double cub_s = stream_us(runs, Rf, cublas);
      for (A16Path forced : paths) {
        if ((forced == A16Path::mma && M > kA16MmaMaxM) || (forced == A16Path::shared_x && M > kA16SharedXMaxM) || (forced == A16Path::wgmma && (M > kA16WgmmaMaxM || !a16_wgmma_supported()))) continue;
        const A16Path path = forced != A16Path::automatic ? forced : kind ? L[0]->path_for(M) : F[0]->path_for(M);
        auto ours_call = [&](int i) {
          if (kind) L[size_t(i)]->gemm(x.get(), M, y.get(), path);
          else F[size_t(i)]->gemm(x.get(), M, y.get(), path);
        };
        for (const A16Split& split : sweep) {
          const bool forced_split = split.rt || split.slices || split.warps || split.loop || split.form || split.sum;
          if (forced_split && path == A16Path::dequant) continue;
          set_a16_split(split);
          const double ours = median_us(runs, flush.get(), flush_bytes, [&] { ours_call(0); });
          const double ours_s = stream_us(runs, R, ours_call);
          const double act = 2.0 * double(M) * double(K + N);
          const double ob = double(wbytes) + act;
          auto gbs = [](double bytes, double us) { return bytes / (us * 1e-6) / 1e9; };
          char shape[32], label[32];
          if (kind) std::snprintf(shape, sizeof shape, "W%d %lldx%lld", kind, (long long)N, (long long)K);
          else std::snprintf(shape, sizeof shape, "NF4 %lldx%lld", (long long)N, (long long)K);
          const char* pn = path == A16Path::mma ? "mma" : path == A16Path::shared_x ? "shx" : path == A16Path::wgmma ? "wg" : "deq";
          if (forced_split) std::snprintf(label, sizeof label, "%s r%ds%dw%dl%df%du%d", pn, split.rt, split.slices, split.warps, split.loop, split.form, split.sum);
          else std::snprintf(label, sizeof label, "%s", pn);
          std::printf("%-17s %5lld %-11s | %8.2f %6.0f %5.1f%% %8.2f %6.2fx | %8.2f %6.0f %5.1f%% %8.2f %6.2fx\n", shape, (long long)M,
                      label, ours, gbs(ob, ours), 100.0 * gbs(ob, ours) / copy_gbs, cub, cub / ours, ours_s, gbs(ob, ours_s),
                      100.0 * gbs(ob, ours_s) / copy_gbs, cub_s, cub_s / ours_s);
          std::fflush(stdout);
        }
        set_a16_split({});
      }
    }
  }
  // W8A8: compute-bound from a few hundred rows; against cuBLAS bf16 and cuBLAS's own int8 GEMM
  // (int8 x int8 -> int32, no rescale: the baseline to beat) on the same shapes.
  if (wanted("w8a8") && !w8a8_supported()) {
    std::printf("\nW8A8: skipped (the kernel needs sm_90): %s\n", describe().c_str());
  } else if (wanted("w8a8")) {
    std::printf("\n%-17s %5s | %-44s | %-17s | %s\n", "", "", "single launch after a 256 MiB rewrite", "cuBLAS int8 (single)", "stream: back to back, rotating weights");
    std::printf("%-17s %5s | %9s %8s | %9s %8s %7s | %9s %7s | %9s %9s %7s\n", "W8A8 N x K", "M", "kernel us", "TOPS", "bf16 us", "TFLOPS", "speedup", "int8 us",
                "vs int8", "kernel us", "bf16 us", "speedup");
    std::vector<int64_t> Ms8 = Ms;
    Ms8.push_back(8192);
    const int64_t maxM = *std::max_element(Ms8.begin(), Ms8.end());
    for (const auto& shape_nk : shapes) {
    const int64_t N = shape_nk.first, K = shape_nk.second;
      Rng r(uint64_t(7 * N + K));
      std::vector<int8_t> hw(size_t(N * K));
      for (auto& v : hw) v = int8_t(int(r.next() % 255) - 127);
      std::vector<int8_t> hx(size_t(maxM * K));
      for (auto& v : hx) v = int8_t(int(r.next() % 255) - 127);
      std::vector<float> hs(size_t(std::max(N, maxM)));
      for (auto& v : hs) v = float(1e-3 * (0.5 + r.uniform()));
      // The stream timing's copies (as the A16 kernels': each launch's weights last touched >= 256 MiB ago):
      // R of the int8 weights, Rb of cuBLAS's bf16 ones.
      const int R = rotation(size_t(N * K)), Rb = rotation(size_t(2 * N * K));
      std::vector<DeviceBuffer<int8_t>> ws;
      for (int i = 0; i < R; ++i) ws.emplace_back(hw.size(), "W8A8 weights");
      std::vector<DeviceBuffer<uint16_t>> wbs;
      for (int i = 0; i < Rb; ++i) wbs.emplace_back(size_t(N * K), "bf16 weights");
      DeviceBuffer<int8_t>& w = ws[0];
      DeviceBuffer<int8_t> x(hx.size(), "W8A8 activations");
      DeviceBuffer<float> sc(hs.size(), "W8A8 scales");
      DeviceBuffer<int32_t> y32(size_t(maxM * N), "int8 GEMM output");
      DeviceBuffer<uint16_t> xb(size_t(maxM * K), "bf16 activations"), yb(size_t(maxM * N), "bf16 output");
      for (auto& wi : ws) copy_to_device(wi.get(), hw.data(), hw.size());
      copy_to_device(x.get(), hx.data(), hx.size());
      copy_to_device(sc.get(), hs.data(), hs.size() * 4);
      for (int i = 0; i < Rb; ++i) fill_random_normal(wbs[size_t(i)].get(), DType::BF16, N * K, uint64_t(3 + i), 0.02f);
      fill_random_normal(xb.get(), DType::BF16, maxM * K, 4, 1.0f);
      DeviceBuffer<float> yf(size_t(maxM * N), "W8A8 decode GEMV output");
      for (int64_t M : Ms8) {
        // The kernel a W8A8 Linear takes (w8a8_takes_gemv): the decode product (w8a8_gemv.cu, fp32 out; its wgmma form
        // w8a8_wgmma_gemv.cu from kW8A8WgmmaFromM rows: "W8A8w") or the wgmma GEMM.
        const bool gemv = w8a8_takes_gemv(M, N, K), wg = gemv && w8a8_wgmma_takes(M, K);
        auto ours_call = [&](int i) {
          if (gemv) w8a8_gemv(x.get(), sc.get(), ws[size_t(i)].get(), sc.get(), M, N, K, yf.get(), 0.0f);
          else w8a8_gemm(x.get(), sc.get(), ws[size_t(i)].get(), sc.get(), M, N, K, yb.get(), false);
        };
        const float one = 1.0f, zero = 0.0f;
        auto bf16_call = [&](int i) {
          PTQ_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, wbs[size_t(i)].get(), CUDA_R_16BF, int(K), xb.get(), CUDA_R_16BF,
                                  int(K), &zero, yb.get(), CUDA_R_16BF, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        };
        const double ours = median_us(runs, flush.get(), flush_bytes, [&] { ours_call(0); });
        const double bf = median_us(runs, flush.get(), flush_bytes, [&] { bf16_call(0); });
        const double ours_s = stream_us(runs, R, ours_call), bf_s = stream_us(runs, Rb, bf16_call);
        double i8 = 0;
        if (M % 4 == 0) {   // cuBLAS's int8 GEMM wants dimensions in multiples of 4
          const int32_t ione = 1, izero = 0;
          i8 = median_us(runs, flush.get(), flush_bytes, [&] {
            PTQ_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &ione, w.get(), CUDA_R_8I, int(K), x.get(), CUDA_R_8I, int(K),
                                    &izero, y32.get(), CUDA_R_32I, int(N), CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
          });
        }
        const double ops = 2.0 * double(M) * double(N) * double(K);
        char shape[32];
        std::snprintf(shape, sizeof shape, "W8A8%s %lldx%lld", wg ? "w" : gemv ? "v" : "", (long long)N, (long long)K);
        std::printf("%-17s %5lld | %9.1f %8.1f | %9.1f %8.1f %6.2fx | %9.1f %6.2fx | %9.2f %9.2f %6.2fx\n", shape, (long long)M, ours, ops / ours * 1e-6, bf,
                    ops / bf * 1e-6, bf / ours, i8, i8 > 0 ? i8 / ours : 0.0, ours_s, bf_s, bf_s / ours_s);
      }
    }
  }
  cublasDestroy(h);
}

// ---- the chain floor (bench_kernels.h: stream_chain_ms)

namespace {
// One link of stream_chain_ms: the n uint4 at p read once by a grid-stride walk, U 16-byte
// streaming loads (__ldcs) a thread in flight; the first U issued before the wait for the previous
// kernel (as the A16 kernels issue their first batch of codes), the rest after. The XOR of what it
// read keeps the loads live (it is stored only when it equals a constant no random pool is likely
// to give); the output word is the previous kernel's plus one, written after the wait: the
// dependency the step's kernels have.
constexpr int kChainThreads = 256;
template <int U>
__global__ void __launch_bounds__(kChainThreads) stream_link(const uint4* __restrict__ p, int64_t n, const int* prev, int* next) {
  pdl::allow_dependents();
  const int64_t stride = int64_t(gridDim.x) * kChainThreads;
  int64_t i = int64_t(blockIdx.x) * kChainThreads + threadIdx.x;
  uint32_t acc = 0;
  auto load = [&](uint4 (&v)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = i + u * stride < n ? __ldcs(p + i + u * stride) : make_uint4(0, 0, 0, 0);
    i += U * stride;
  };
  auto fold = [&](const uint4 (&v)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  };
  uint4 v[U];
  load(v);
  pdl::wait_prior_grid();
  fold(v);
  while (i < n) {
    load(v);
    fold(v);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) next[0] = __ldcg(prev) + 1;
  if (acc == 0x9e3779b9u) next[1] = int(acc);
}
}  // namespace

double stream_chain_ms(const std::vector<double>& bytes, int reps) {
  // The regions one after another (each 256-byte aligned) in a pool of at most 2 GiB, wrapping to
  // its start: a region is read again only after ~2 GiB of others (40x the H200's L2), and the
  // pool fits beside the model on a smaller GPU.
  std::vector<int64_t> n(bytes.size()), at(bytes.size(), 0);
  int64_t pool16 = 0, total = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    n[i] = std::max<int64_t>(1, int64_t(bytes[i] / 16.0 + 0.5));
    pool16 = std::max(pool16, (n[i] + 15) / 16 * 16);
    total += (n[i] + 15) / 16 * 16;
  }
  pool16 = std::min(total, std::max(pool16, (int64_t(2) << 30) / 16));
  for (size_t i = 0, cur = 0; i < bytes.size(); ++i) {
    const int64_t len = (n[i] + 15) / 16 * 16;
    if (int64_t(cur) + len > pool16) cur = 0;
    at[i] = int64_t(cur);
    cur += size_t(len);
  }
  DeviceBuffer<uint4> pool(size_t(pool16), "chain floor regions");
  DeviceBuffer<int> words(2 * (bytes.size() + 1), "chain floor words");
  PTQ_CUDA(cudaMemset(pool.get(), 0x5a, size_t(pool16) * 16));
  PTQ_CUDA(cudaMemset(words.get(), 0, words.size() * sizeof(int)));
  const int sms = sm_count();
  // 16 loads a thread in flight, 2,048 threads an SM for a large region (fewer CTAs for a small
  // one, a thread's first U loads covering it): the fastest of the sweep over 4, 8, 16 loads and
  // 1,024, 2,048 threads (docs/lab/2026-11-24-decode-h200.md run 116: 512 KB in flight an SM; 64
  // KB reads the W4A16 step's bytes 30% slower).
  // PTQKIT_CHAIN_UNROLL (4, 8 or 16) and PTQKIT_CHAIN_THREADS repeat the sweep.
  const int U = env_int("PTQKIT_CHAIN_UNROLL", 16), per_sm = env_int("PTQKIT_CHAIN_THREADS", 2048);
  const int64_t full = int64_t(sms) * std::max(1, per_sm / kChainThreads);
  const int u = U >= 16 ? 16 : U >= 8 ? 8 : 4;
  auto kern = u == 16 ? stream_link<16> : u == 8 ? stream_link<8> : stream_link<4>;
  cudaStream_t s = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  PTQ_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  set_current_stream(s);
  PTQ_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int64_t ctas = std::clamp<int64_t>((n[i] + kChainThreads * u - 1) / (kChainThreads * u), 1, full);
    launch_pdl("stream_link", true, -1, kern, dim3(unsigned(ctas)), dim3(kChainThreads), 0, pool.get() + at[i], n[i], words.get() + 2 * i,
               words.get() + 2 * (i + 1));
  }
  PTQ_CUDA(cudaStreamEndCapture(s, &graph));
  set_current_stream(nullptr);
  PTQ_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  Timer t;
  PTQ_CUDA(cudaGraphLaunch(exec, s));
  PTQ_CUDA(cudaEventRecord(t.a, s));
  for (int r = 0; r < reps; ++r) PTQ_CUDA(cudaGraphLaunch(exec, s));
  PTQ_CUDA(cudaEventRecord(t.b, s));
  PTQ_CUDA(cudaEventSynchronize(t.b));
  float ms = 0;
  PTQ_CUDA(cudaEventElapsedTime(&ms, t.a, t.b));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  return double(ms) / reps;
}

}  // namespace ptq::cuda
