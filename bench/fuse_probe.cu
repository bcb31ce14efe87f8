// fuse_probe.cu — a probe, not a ptqkit kernel: a batch-1 layer's MLP (gate, up; silu · mul; down)
// as one kernel whose CTAs never wait for one another, against one launch a Linear.
//
// Why. Every structure measured for the batch-1 decode step pays about 3 µs beyond its bytes at
// each Linear's dependency on the one before, launched or persistent (docs/lab/
// 2026-11-24-decode-h200.md, runs 372-383, 513, 518-523): the four 4-bit cells stop at ~700 tok/s
// where 750 is the target. Those structures all keep the dependencies; this one removes one a
// layer. The down projection y = W_d h is a sum over h's elements, so the CTA that forms 32 of
// them (their gate and up rows: 128 KB of W4) can multiply them into W_d's 32 matching columns
// (4096 x 32: 80 KB) at once and add its 4096 partial sums to y: no CTA waits for another, and
// only the sum is left. It goes into the residual stream, which a layer only ever adds to: here as
// 32.32 fixed point in int64 (red.add: integer adds commute, so the bytes do not depend on the
// order the adds land in), once a cluster of CTAs has added its partials through distributed
// shared memory.
//
// Contract. fused_mlp: x [4096] (f16, or the fixed-point accumulator before it), the stacked gate,
// up W_gu [22016, 4096] in w4_rows.cuh's layout (row block 2b the gate rows 32b .. 32b + 31, 2b + 1
// the same rows of up), W_d [4096, 11008]; acc [4096] += fixed(W_d · (silu(W_g x) · W_u x)).
// h in f16 (as ptqkit's silu · mul writes it); every sum in fp32 in a fixed order (the warps' in
// warp order, the cluster's partials in rank order); acc's adds exact. acc starts at zero (a
// memset a step here; in a decode step it would be the residual stream, added to, never zeroed).
// Work. CTA b (344 of them) takes h's elements 32b .. 32b + 31, chunk b % 4 of W_d's group b / 4.
// Before its PDL wait it loads its first gate group (and, in the staged form, starts its slice of
// W_d, 128 row blocks x one 512-byte chunk of codes and their 128-byte metadata, on cp.async into
// shared memory); after the wait it stages x, then warp w of W takes groups w, w + W, ... of the
// gate and the up row block (gemv_w4's loop, the next group's loads in flight), the warps' sums are
// added in warp order and h = silu(gate) · up; then warp w takes W_d's row blocks w, w + W, ... (a
// lane its row's 32 columns) into a partial y [4096] in shared memory; the cluster (CS CTAs) adds
// its partials, rank r the rows r 4096 / CS .., and red.adds them. Three forms: 8 warps with W_d
// staged (106 KB of shared memory: two CTAs an SM, so 1.3 waves), 8 warps with W_d in registers
// (held to 80: three an SM, one wave, spills) and 4 warps with W_d in registers (four an SM, one
// wave). A traced launch stamps each CTA's phases (globaltimer).
// Checked against fp64 (w4_rows.cuh's reference) after one layer; a second launch gives the same
// bytes.
// Compared with, in one CUDA graph a step under PDL over L layers (timing only, but the check):
//   A  q, k, v; o; gate, up; down: 4 gemv_w4 launches a layer (chain_probe's arm of launches);
//   B  q, k, v (x from the accumulator before it); o; fused_mlp: 3 launches a layer;
//   C  gate, up; down: 2 launches a layer;
//   D  fused_mlp alone (x from the accumulator before it): 1 a layer.
// A memset of the L accumulators (L x 32 KB) opens B's and D's graphs and counts in their time.
// What it measured (lab runs 524-528, 2026-12-02, five H200s): every form loses. The fused MLP
// takes 30.5-39.2 µs a layer against 24.4-24.9 for the two launches (D against C; its best form
// 30.5-31.9), and in the layer (B against A) 5.4-16.1 µs more. Traced: all CTAs run their phases
// in lockstep (gate, up for all, then W_d for all), so the bytes are no more overlapped than across
// a kernel boundary; what the boundary saved is spent on the cluster's sum and the adds (about 4 µs
// from the median CTA's partials to its end) and, staged, on a second wave of 80 CTAs (16 µs).
// Usage: fuse_probe [runs] [layers]   (default 10 runs, 32 layers)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_timing.cuh"
#include "w4_rows.cuh"

using namespace bench;
namespace cg = cooperative_groups;
namespace ptx = ptq::cuda::ptx;

namespace {

constexpr int kD = 4096, kH = 11008, kQkv = 12288;
constexpr int kXGroups = kD / 128, kDGroups = kH / 128, kDRowBlocks = kD / 32, kUnits = kH / 32;
constexpr int kMaxWarps = 8;

struct FusedSmem {
  float part[kD];                  // the CTA's partial y
  float red[kMaxWarps][64];        // the warps' gate (0..31) and up (32..63) sums
  __align__(16) __half x[kD];
  __align__(16) __half h[32];
  uint4 dq[kDRowBlocks * 32];      // kStageD: W_d's slice, row block r, lane l at 32 r + l
  uint32_t dm[kDRowBlocks * 32];   // its metadata, the same order
};
// Shared memory of a CTA: without kStageD the slice's space is not requested.
constexpr size_t fused_smem(bool stage_d) { return stage_d ? sizeof(FusedSmem) : offsetof(FusedSmem, dq); }

// kStageD: W_d's slice goes into shared memory by cp.async before the PDL wait (106 KB a CTA: two
// an SM, so the 344 CTAs take 1.3 waves); else each warp loads its row blocks of it into registers
// once its gate and up loads are issued, 4 at a time with the next 4 in flight (27 KB a CTA; 8 warps
// at most 80 registers: three an SM, one wave).
// W warps a CTA: 8 (two or three CTAs an SM), or 4 (four an SM: 128 registers a thread and one
// wave with W_d in registers).
template <bool kXFixed, bool kStageD, int W>
__global__ void __launch_bounds__(32 * W, W == 4 ? 4 : kStageD ? 2 : 3)
    fused_mlp(const uint4* __restrict__ gu_codes, const uint32_t* __restrict__ gu_meta, const uint4* __restrict__ d_codes,
              const uint32_t* __restrict__ d_meta, const __half* x16, const long long* x_acc, long long* acc, unsigned long long* trace) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  FusedSmem& sm = *reinterpret_cast<FusedSmem*>(smem_raw);
  constexpr int kThreads_ = 32 * W;
  const int b = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = b / 4, c = b % 4;
  auto stamp = [&](int k) {   // trace: globaltimer at the CTA's start, x staged, h formed, partials written, end
    if (trace && tid == 0) trace[b * 5 + k] = global_ns();
  };
  stamp(0);
  auto d_code = [&](int r, int l) { return d_codes + ((size_t(r) * kDGroups + g) * 4 + c) * 32 + l; };   // row block r's chunk, lane l
  if constexpr (kStageD) {
    for (int i = tid; i < kDRowBlocks * 32; i += kThreads_) ptx::cp_async16(ptx::smem_addr(&sm.dq[i]), d_code(i / 32, i % 32), 16);
    for (int i = tid; i < kDRowBlocks * 8; i += kThreads_)
      ptx::cp_async16(ptx::smem_addr(reinterpret_cast<uint4*>(sm.dm) + i), reinterpret_cast<const uint4*>(d_meta + (size_t(i / 8) * kDGroups + g) * 32) + i % 8, 16);
    ptx::cp_async_commit();
  }
  // Item it = 0..2 x 32 / W - 1 of warp w: row block 2b + (it & 1) (gate, up), group w + W (it >> 1).
  auto load = [&](int it, uint4 (&q)[4], uint32_t& m) {
    const size_t u = size_t(2 * b + (it & 1)) * kXGroups + size_t(warp + W * (it >> 1));
    const uint4* p = gu_codes + u * 128 + lane;
#pragma unroll
    for (int k = 0; k < 4; ++k) q[k] = __ldcs(p + k * 32);
    m = __ldcs(gu_meta + u * 32 + lane);
  };
  uint4 q[4], qn[4];
  uint32_t m = 0, mn = 0;
  load(0, q, m);
  ptq::cuda::pdl::wait_prior_grid();
  ptq::cuda::pdl::allow_dependents();
  if constexpr (kXFixed) {
    for (int i = tid; i < kD; i += kThreads_) sm.x[i] = __float2half_rn(from_fixed(__ldcg(x_acc + i)));
  } else {
    for (int i = tid; i < kD / 8; i += kThreads_) reinterpret_cast<uint4*>(sm.x)[i] = __ldcg(reinterpret_cast<const uint4*>(x16) + i);
  }
  __syncthreads();
  stamp(1);
  float acc_g = 0.0f, acc_u = 0.0f;
  constexpr int kItems = 2 * kXGroups / W;
#pragma unroll 2
  for (int it = 0; it < kItems; ++it) {
    if (it + 1 < kItems) load(it + 1, qn, mn);
    const uint4* xw = reinterpret_cast<const uint4*>(sm.x + (warp + W * (it >> 1)) * 128);
    if (it & 1) acc_u = group_dot(q, m, xw, acc_u);
    else acc_g = group_dot(q, m, xw, acc_g);
#pragma unroll
    for (int k = 0; k < 4; ++k) q[k] = qn[k];
    m = mn;
  }
  // W_d's row blocks of this warp, r = w + W j (kStageD: from shared memory).
  constexpr int kRb = kDRowBlocks / W, kBatch = 4;
  uint4 dq[2][kBatch];   // this batch and the next, in flight while this one is summed
  uint32_t dm[2][kBatch];
  auto load_d = [&](int j0, int k) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int r = warp + W * (j0 + j);
      dq[k][j] = __ldcs(d_code(r, lane));
      dm[k][j] = __ldcs(d_meta + (size_t(r) * kDGroups + g) * 32 + lane);
    }
  };
  if constexpr (!kStageD) load_d(0, 0);
  sm.red[warp][lane] = acc_g;
  sm.red[warp][32 + lane] = acc_u;
  __syncthreads();
  if (warp == 0) {
    float gs = 0.0f, us = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) gs += sm.red[w][lane], us += sm.red[w][32 + lane];
    sm.h[lane] = __float2half_rn(gs / (1.0f + __expf(-gs)) * us);
  }
  if constexpr (kStageD) ptx::cp_async_wait<0>();
  __syncthreads();
  stamp(2);
  const uint4* hw = reinterpret_cast<const uint4*>(sm.h);
  auto down_row = [&](int r, const uint4& cq, uint32_t mm) {
    const __half2 mh = h2(mm);
    __half2 zlo, zhi;
    zero_points(mh, zlo, zhi);
    sm.part[r * 32 + lane] = chunk_dot(cq, hw, zlo, zhi, 0.0f) * __low2float(mh);
  };
  if constexpr (kStageD) {
    for (int r = warp; r < kDRowBlocks; r += W) down_row(r, sm.dq[r * 32 + lane], sm.dm[r * 32 + lane]);
  } else {
#pragma unroll
    for (int j0 = 0; j0 < kRb; j0 += kBatch) {
      const int k = (j0 / kBatch) & 1;
      if (j0 + kBatch < kRb) load_d(j0 + kBatch, k ^ 1);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) down_row(warp + W * (j0 + j), dq[k][j], dm[k][j]);
    }
  }
  stamp(3);
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();   // every rank's partials written (release / acquire over the cluster)
  const int CS = int(cl.num_blocks()), rows = kD / CS, row0 = int(cl.block_rank()) * rows;
  for (int i = tid; i < rows; i += kThreads_) {
    float v = 0.0f;
    for (int k = 0; k < CS; ++k) v += cl.map_shared_rank(sm.part, k)[row0 + i];
    atomicAdd(reinterpret_cast<unsigned long long*>(acc + row0 + i), static_cast<unsigned long long>(to_fixed(v)));
  }
  cl.sync();   // no rank leaves while another still reads its partials
  stamp(4);
}

__global__ void to_fixed_kernel(const __half* x, long long* a, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) a[i] = to_fixed(__half2float(x[i]));
}

struct Linear {
  uint4* codes = nullptr;
  uint32_t* meta = nullptr;
  __half* out = nullptr;
  int N = 0, K = 0;
};

Linear make_linear(int N, int K, uint64_t seed, size_t& bytes) {
  Linear l;
  l.N = N, l.K = K;
  const size_t U = size_t(N / 32) * (K / 128);
  CK(cudaMalloc(&l.codes, U * 2048));
  CK(cudaMalloc(&l.meta, U * 128));
  CK(cudaMalloc(&l.out, size_t(N) * 2));
  fill_rows<<<1024, 256, 0, g_stream>>>(reinterpret_cast<uint32_t*>(l.codes), l.meta, int64_t(U) * 512, int64_t(U) * 32, seed, float(1.0 / std::sqrt(21.0 * K)));
  CK(cudaGetLastError());
  bytes += U * 2176;
  return l;
}

template <class... P, class... A>
void launch_cluster(void (*kern)(P...), int cs, dim3 grid, dim3 block, size_t smem, A... args) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim = {unsigned(cs), 1, 1};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  cfg.stream = g_stream;
  CK(cudaLaunchKernelEx(&cfg, kern, args...));
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 10;
  const int layers = argc > 2 ? std::max(1, std::atoi(argv[2])) : 32;
  int dev = 0, major = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 9) {
    std::fprintf(stderr, "fuse_probe: needs an sm_90 GPU (clusters, PDL)\n");
    return 2;
  }
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  const double gbs = copy_gbs();

  struct Layer {
    Linear qkv, o, gu, down;
    long long* acc = nullptr;
  };
  std::vector<Layer> L(static_cast<size_t>(layers));
  size_t bytes = 0;
  long long* acc_all = nullptr;   // the layers' accumulators, one memset
  CK(cudaMalloc(&acc_all, size_t(layers) * kD * 8));
  for (int l = 0; l < layers; ++l) {
    const uint64_t s = uint64_t(l) * 4 + 1;
    L[size_t(l)] = {make_linear(kQkv, kD, s, bytes), make_linear(kD, kD, s + 1, bytes), make_linear(2 * kH, kD, s + 2, bytes), make_linear(kD, kH, s + 3, bytes),
                    acc_all + size_t(l) * kD};
  }
  __half* x0 = nullptr;
  long long* acc0 = nullptr;   // x0 in fixed point: the accumulator before layer 0
  CK(cudaMalloc(&x0, kD * 2));
  CK(cudaMalloc(&acc0, kD * 8));
  std::vector<__half> hx(kD);
  for (int i = 0; i < kD; ++i) hx[size_t(i)] = __float2half_rn(std::sin(0.37f * float(i) + 0.1f) * 1.41421356f);   // unit RMS
  CK(cudaMemcpy(x0, hx.data(), kD * 2, cudaMemcpyHostToDevice));
  to_fixed_kernel<<<16, 256, 0, g_stream>>>(x0, acc0, kD);
  CK(cudaGetLastError());
  float* part = nullptr;
  int* arrivals = nullptr;
  CK(cudaMalloc(&part, size_t(4) * 2 * kH * 4));
  CK(cudaMalloc(&arrivals, size_t(2 * kH / 32) * 4));
  CK(cudaMemset(arrivals, 0, size_t(2 * kH / 32) * 4));
  CK(cudaStreamSynchronize(g_stream));

  // The fused kernel's forms: W_d staged or not, x f16 (the check, and after o in B) or fixed.
  struct Form {
    bool stage_d;
    int warps;
    int cs;   // CTAs a cluster
    void (*f16)(const uint4*, const uint32_t*, const uint4*, const uint32_t*, const __half*, const long long*, long long*, unsigned long long*);
    void (*fixed)(const uint4*, const uint32_t*, const uint4*, const uint32_t*, const __half*, const long long*, long long*, unsigned long long*);
  };
  std::vector<Form> forms;
  for (int cs : {4, 8}) forms.push_back({true, 8, cs, fused_mlp<false, true, 8>, fused_mlp<true, true, 8>});
  forms.push_back({false, 8, 4, fused_mlp<false, false, 8>, fused_mlp<true, false, 8>});
  for (int cs : {2, 4, 8}) forms.push_back({false, 4, cs, fused_mlp<false, false, 4>, fused_mlp<true, false, 4>});
  auto name_of = [](const Form& f) { return std::string(f.warps == 8 ? "8 warps" : "4 warps") + (f.stage_d ? ", W_d staged" : ", W_d in registers"); };
  std::printf("fuse_probe: %d layers, %.3f GB of W4 a step (%.3f ms at the copy rate %.0f GB/s); fused_mlp %d CTAs\n", layers, double(bytes) / 1e9,
              double(bytes) / (gbs * 1e9) * 1e3, gbs, kUnits);
  std::vector<const void*> seen;   // each kernel once (forms differ in their cluster size only)
  for (const Form& f : forms)
    for (auto k : {f.f16, f.fixed}) {
      if (std::find(seen.begin(), seen.end(), reinterpret_cast<const void*>(k)) != seen.end()) continue;
      seen.push_back(reinterpret_cast<const void*>(k));
      const size_t smem = fused_smem(f.stage_d);
      CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      cudaFuncAttributes fa{};
      CK(cudaFuncGetAttributes(&fa, k));
      int per_sm = 0;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, 32 * f.warps, smem));
      std::printf("  fused_mlp, %s, x %s: %zu B shared, %d registers, %d spilled bytes, %d CTAs an SM\n", name_of(f).c_str(), k == f.f16 ? "f16" : "fixed", smem,
                  fa.numRegs, int(fa.localSizeBytes), per_sm);
    }
  auto fused = [&](const Form& f, const Layer& y, const __half* x, const long long* xa, unsigned long long* trace = nullptr) {
    launch_cluster(xa ? f.fixed : f.f16, f.cs, dim3(kUnits), dim3(unsigned(32 * f.warps)), fused_smem(f.stage_d), (const uint4*)y.gu.codes, (const uint32_t*)y.gu.meta,
                   (const uint4*)y.down.codes, (const uint32_t*)y.down.meta, x, xa, y.acc, trace);
  };

  // The check: one layer's fused MLP from x0 against fp64, and its bytes again.
  {
    const Layer& y = L[0];
    std::vector<double> x(kD);
    for (int i = 0; i < kD; ++i) x[size_t(i)] = double(__half2float(hx[size_t(i)]));
    const std::vector<double> gu = rows_gemv_ref(y.gu.codes, y.gu.meta, 2 * kH, kD, x);
    std::vector<double> h(kH);
    for (int j = 0; j < kH; ++j) {
      const double gt = gu[size_t(64 * (j / 32) + j % 32)], up = gu[size_t(64 * (j / 32) + 32 + j % 32)];
      h[size_t(j)] = double(__half2float(__float2half_rn(float(gt / (1.0 + std::exp(-gt)) * up))));
    }
    const std::vector<double> ref = rows_gemv_ref(y.down.codes, y.down.meta, kD, kH, h);
    for (const Form& f : forms) {
      std::vector<long long> a1(kD), a2(kD);
      for (std::vector<long long>* a : {&a1, &a2}) {
        CK(cudaMemsetAsync(y.acc, 0, kD * 8, g_stream));
        fused(f, y, x0, nullptr);
        CK(cudaMemcpyAsync(a->data(), y.acc, kD * 8, cudaMemcpyDeviceToHost, g_stream));
        CK(cudaStreamSynchronize(g_stream));
      }
      std::vector<double> yv(kD);
      for (int i = 0; i < kD; ++i) yv[size_t(i)] = double(a1[size_t(i)]) / kFixOne;
      const double rel = rel_error(yv, ref);
      const bool same = std::memcmp(a1.data(), a2.data(), kD * 8) == 0;
      std::printf("check: fused_mlp, %s, clusters of %d: relative error %.3g against fp64 (bound 2e-3), %s bytes on a second launch: %s\n", name_of(f).c_str(), f.cs,
                  rel, same ? "the same" : "OTHER", rel <= 2e-3 && same ? "ok" : "FAIL");
      if (rel > 2e-3 || !same) return 1;
    }
  }

  auto gemv = [&](const Linear& w, const __half* x, const long long* xa) {
    const int G = w.K / 128, RB = w.N / 32, S = RB >= 256 ? 1 : 4;
    if (xa)
      launch(gemv_w4<512, 3, false, long long>, true, dim3(unsigned(S), unsigned(RB)), dim3(512), 0, (const uint4*)w.codes, (const uint32_t*)w.meta, xa, part,
             arrivals, w.out, w.N, G, S, (G + S - 1) / S);
    else
      launch(gemv_w4<512, 3, false>, true, dim3(unsigned(S), unsigned(RB)), dim3(512), 0, (const uint4*)w.codes, (const uint32_t*)w.meta, x, part, arrivals, w.out,
             w.N, G, S, (G + S - 1) / S);
  };
  auto zero = [&] { CK(cudaMemsetAsync(acc_all, 0, size_t(layers) * kD * 8, g_stream)); };
  auto before = [&](int l) { return l == 0 ? (const long long*)acc0 : (const long long*)L[size_t(l) - 1].acc; };
  unsigned long long* d_trace = nullptr;
  CK(cudaMalloc(&d_trace, size_t(kUnits) * 5 * 8));
  // A traced step of D (stream launches): the middle layer's fused kernel, its CTAs' stamps relative
  // to its first CTA's start, µs: the earliest, median and latest of each.
  auto traced = [&](const Form& f) {
    zero();
    for (int l = 0; l < layers; ++l) fused(f, L[size_t(l)], nullptr, before(l), l == layers / 2 ? d_trace : nullptr);
    std::vector<unsigned long long> t(size_t(kUnits) * 5);
    CK(cudaMemcpyAsync(t.data(), d_trace, t.size() * 8, cudaMemcpyDeviceToHost, g_stream));
    CK(cudaStreamSynchronize(g_stream));
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < kUnits; ++b) t0 = std::min(t0, t[size_t(b) * 5]);
    std::printf("   traced (layer %d), us from its first CTA's start, min / median / max over the CTAs:", layers / 2);
    const char* what[5] = {"start", "x staged", "h formed", "partials", "end"};
    for (int k = 0; k < 5; ++k) {
      std::vector<double> v(kUnits);
      for (int b = 0; b < kUnits; ++b) v[size_t(b)] = double(t[size_t(b) * 5 + size_t(k)] - t0) / 1e3;
      std::sort(v.begin(), v.end());
      std::printf(" %s %.2f / %.2f / %.2f;", what[k], v.front(), v[v.size() / 2], v.back());
    }
    std::printf("\n");
  };
  auto report = [&](const char* name, double us, int launches) {
    std::printf("%-66s %8.3f ms a step  %6.2f us a layer  (%d launches a layer)\n", name, us / 1e3, us / layers, launches);
    return us;
  };

  const double a = report("A  q, k, v; o; gate, up; down", graph_us(runs, 1, [&](int) {
                            for (int l = 0; l < layers; ++l) {
                              const Layer& y = L[size_t(l)];
                              gemv(y.qkv, l == 0 ? x0 : L[size_t(l) - 1].down.out, nullptr);
                              gemv(y.o, y.qkv.out, nullptr);
                              gemv(y.gu, y.o.out, nullptr);
                              gemv(y.down, y.gu.out, nullptr);
                            }
                          }),
                          4);
  const double c = report("C  gate, up; down", graph_us(runs, 1, [&](int) {
                            for (int l = 0; l < layers; ++l) {
                              const Layer& y = L[size_t(l)];
                              gemv(y.gu, l == 0 ? x0 : L[size_t(l) - 1].down.out, nullptr);
                              gemv(y.down, y.gu.out, nullptr);
                            }
                          }),
                          2);
  for (const Form& f : forms) {
    char name[96];
    const std::string where_s = name_of(f);
    const char* where = where_s.c_str();
    std::snprintf(name, sizeof name, "B  q, k, v; o; fused MLP, %s, clusters of %d", where, f.cs);
    const double b = report(name, graph_us(
                                      runs, 1,
                                      [&](int) {
                                        for (int l = 0; l < layers; ++l) {
                                          const Layer& y = L[size_t(l)];
                                          gemv(y.qkv, nullptr, before(l));
                                          gemv(y.o, y.qkv.out, nullptr);
                                          fused(f, y, y.o.out, nullptr);
                                        }
                                      },
                                      zero),
                            3);
    std::snprintf(name, sizeof name, "D  fused MLP, %s, clusters of %d", where, f.cs);
    const double d = report(name, graph_us(
                                      runs, 1,
                                      [&](int) {
                                        for (int l = 0; l < layers; ++l) fused(f, L[size_t(l)], nullptr, before(l));
                                      },
                                      zero),
                            1);
    traced(f);
    std::printf("   %s, clusters of %d: B saves %.2f us a layer against A (%.1f%%), D %.2f against C (%.1f%%)\n", where, f.cs, (a - b) / layers, 100.0 * (a - b) / a, (c - d) / layers,
                100.0 * (c - d) / c);
  }
  return 0;
}
