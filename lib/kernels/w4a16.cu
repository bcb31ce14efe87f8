// w4a16.cu — y = x · Wᵀ with W in 4 bits (W4A16) or 8 bits (W8A16), GPTQ layouts; x and y in f16.
//
// Contract. Operands: x [M, K] f16 row-major (device), y [M, N] f16 row-major (device).
// W [N, K] re-laid out at load from GPTQ's canonical layout (qweight int32 [K/8, N] packed along K,
// qzeros packed along N, scales [G, N], g_idx [K]):
//   - columns sorted by group (act-order g_idx becomes contiguous groups; x is gathered by the
//     same permutation on every call: perm [K] int32);
//   - codes row-major, 32/BITS per uint32, interleaved so that one mask yields a half2 of
//     neighbours (column c of a word: even c in bits BITS(c/2), odd c in bits 16 + BITS(c/2)), read
//     as uint4 (128/BITS codes) per lane: each warp streams one row, fully coalesced;
//   - per (row, group): the zero point as an f16 integer z and the scale s (f16, the value GPTQ
//     stored), so w = (q - z) * s is formed in f16 exactly as a dequantized f16 weight would be.
// Math: per 8-code word, (q - z) from the magic-number trick (0x6400 | q = 1024 + q in f16, less
// 1024 + z: exact; codes in bits 4..7 taken in place and brought down by an exact FMA), times s
// (one f16 rounding = the f16 dequantized weight), times x with f16 FMA over the word's 4 half2
// pairs, then fp32 across words and lanes. Tolerance against the fp32 reference: the f16 weight
// rounding plus 4-term f16 partial sums (tests: 2e-3 relative, norm-wise).
// Paths by M: M <= 4 the GEMV below (CUDA cores); M <= 64 the tensor-core kernel of
// kernels/a16_mma.cuh on the same layout (fp32 accumulation); larger M dequantizes to f16 and calls
// cuBLAS (correct, slower than cuBLAS on f16 weights). Shapes accepted: K and the group size
// multiples of 128/BITS (or one group), N any.
// Roofline at M = 1: reads N*K/2 bytes of codes + 4*N*K/gs bytes of (z, s) + 2K of x; on the
// H100 (3.0 TB/s copy) a 4096 x 4096 g128 layer moves 8.9 MB: 3.0 us at the floor.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "cuda/blas.h"
#include "cuda/runtime.h"
#include "kernels/a16_mma.cuh"
#include "kernels/w4a16.h"

namespace ptq::cuda {

namespace {
cublasHandle_t blas() { return blas_handle(); }

__global__ void gather_kernel(const __half* x, const int* perm, __half* xp, int64_t M, int64_t K) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < M * K) xp[i] = x[(i / K) * K + perm[i % K]];
}

// (q - z) for the 32/BITS codes of a word, as half2 {code 2t, code 2t+1} (the interleaved order of
// the layout: code 2t at bit BITS t, code 2t+1 at bit 16 + BITS t). 0x6400 | q = 1024 + q in f16
// (exact for q < 1024), less 1024 + z: exact. At 4 bits the pairs at bits 4 and 20 are taken in
// place as 1024 + 16q and brought to q - z by one FMA with 1/16 and -(64 + z), exact too (h / 16
// and the difference are small integers): 2 shifts fewer per word (Marlin's lop3 trick).
struct ZeroPoint {
  __half2 z1024, nz64;   // {1024 + z} x 2, {-(64 + z)} x 2
};
__device__ __forceinline__ ZeroPoint zero_point(__half z1024) {
  const __half2 z = __half2half2(z1024);
  return {z, __hneg2(__hsub2(z, __float2half2_rn(960.0f)))};
}
template <int BITS>
__device__ __forceinline__ void codes_minus_zero(uint32_t w, ZeroPoint z, __half2* d) {
  constexpr uint32_t magic = 0x64006400u;
  auto h2 = [](uint32_t u) { return *reinterpret_cast<const __half2*>(&u); };
  if constexpr (BITS == 4) {
    const __half2 sixteenth = __float2half2_rn(0.0625f);
    const uint32_t w8 = w >> 8;
    d[0] = __hsub2(h2((w & 0x000F000Fu) | magic), z.z1024);
    d[1] = __hfma2(h2((w & 0x00F000F0u) | magic), sixteenth, z.nz64);
    d[2] = __hsub2(h2((w8 & 0x000F000Fu) | magic), z.z1024);
    d[3] = __hfma2(h2((w8 & 0x00F000F0u) | magic), sixteenth, z.nz64);
  } else {
    d[0] = __hsub2(h2((w & 0x00FF00FFu) | magic), z.z1024);
    d[1] = __hsub2(h2(((w >> 8) & 0x00FF00FFu) | magic), z.z1024);
  }
}

// The x slice of one word: 8 halves (4-bit) or 4 halves (8-bit), as half2 pairs.
template <int BITS> struct XSlice;
template <> struct XSlice<4> { uint4 v; __device__ void load(const __half* p) { v = __ldg(reinterpret_cast<const uint4*>(p)); } };
template <> struct XSlice<8> { uint2 v; __device__ void load(const __half* p) { v = __ldg(reinterpret_cast<const uint2*>(p)); } };

// One uint4 of a row (4 words, 128/BITS codes from column j * 128/BITS, one group) against M rows of x.
template <int M, int BITS>
__device__ __forceinline__ void accumulate_uint4(const uint4 q, const __half2 zsv, const __half* __restrict__ xp, int K, int j, float* acc) {
  constexpr int kPerWord = 32 / BITS, kPairs = kPerWord / 2;
  const ZeroPoint z = zero_point(__low2half(zsv));   // zsv = {1024 + z, s}
  const __half2 s2 = __half2half2(__high2half(zsv));
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
    __half2 d[kPairs];
    codes_minus_zero<BITS>(words[wi], z, d);
#pragma unroll
    for (int t = 0; t < kPairs; ++t) d[t] = __hmul2(d[t], s2);   // the f16 dequantized weights {w_2t, w_2t+1}
#pragma unroll
    for (int m = 0; m < M; ++m) {
      XSlice<BITS> xs;
      xs.load(xp + int64_t(m) * K + int64_t(j) * 4 * kPerWord + wi * kPerWord);
      const __half2* x2 = reinterpret_cast<const __half2*>(&xs.v);   // {x_2t, x_2t+1}: the codes' order
      __half2 p = __hmul2(d[0], x2[0]);
#pragma unroll
      for (int t = 1; t < kPairs; ++t) p = __hfma2(d[t], x2[t], p);
      const float2 f = __half22float2(p);
      acc[m] += f.x + f.y;
    }
  }
}

// The group of uint4 number j of a row, for the tensor-core path: j >> shift when a group holds a
// power of two uint4s (30 for one group per row), else j / div. (The GEMV keeps its division:
// this struct in its loop measured 10-15% slower at M = 1, docs/benchmarks.md.)
struct GroupOf {
  int shift, div;
  __device__ int operator()(int j) const { return shift >= 0 ? j >> shift : j / div; }
  static GroupOf make(int64_t groups, int64_t gs, int codes_per_u4) {
    const int div = groups == 1 ? 1 << 30 : int(gs / codes_per_u4);
    int shift = groups == 1 ? 30 : -1;
    for (int b = 0; b < 30 && shift < 0; ++b)
      if ((1 << b) == div) shift = b;
    return {shift, div};
  }
};

// One warp per output row; lanes stride over the row's uint4 words, issuing kU loads before using
// any (memory-level parallelism: a 4096-wide 4-bit row is only 4 loads per lane).
// Measured on the H100 and dropped (docs/benchmarks.md): four rows per warp with each x slice read
// once for the four (1.8-1.9x cuBLAS at M = 1 instead of 2.2-2.5x: fewer warps, fewer loads in
// flight), and a register double buffer of the next kU words (1.5-2.0x: registers, occupancy).
template <int M, int BITS>
__global__ void wq_gemv_kernel(const uint4* __restrict__ W, const __half2* __restrict__ zs, const __half* __restrict__ xp, __half* __restrict__ y,
                               int N, int K, int groups, int gs) {
  constexpr int kU = 4, kCodes = 128 / BITS;   // codes per uint4
  const int row = int((blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const int n16 = K / kCodes;
  const uint4* wr = W + int64_t(row) * n16;
  const __half2* zr = zs + int64_t(row) * groups;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  int j = lane;
  for (; j + 32 * (kU - 1) < n16; j += 32 * kU) {
    uint4 q[kU];
    __half2 z[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) q[u] = __ldcs(wr + j + 32 * u);   // streamed once: not kept in L1
#pragma unroll
    for (int u = 0; u < kU; ++u) z[u] = __ldg(zr + ((j + 32 * u) * kCodes) / gs);
#pragma unroll
    for (int u = 0; u < kU; ++u) accumulate_uint4<M, BITS>(q[u], z[u], xp, K, j + 32 * u, acc);
  }
  for (; j < n16; j += 32) accumulate_uint4<M, BITS>(__ldcs(wr + j), __ldg(zr + (j * kCodes) / gs), xp, K, j, acc);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float v = acc[m];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) y[int64_t(m) * N + row] = __float2half_rn(v);
  }
}

// The tensor-core path (M = 5..64, kernels/a16_mma.cuh) reads the same layout: a word's codes
// (q - z) * s as f16 pairs, exactly the GEMV's dequantization.
template <int BITS>
struct GptqFormat {
  static constexpr int kCodes = 128 / BITS, kPerWord = 32 / BITS;
  using Raw = __half2;   // {1024 + z, s}
  struct Prep {
    ZeroPoint z;
    __half2 s;
  };
  const __half2* zs;
  int groups;
  GroupOf group;
  __device__ void setup() const {}
  __device__ Raw raw(int row, int j) const { return __ldg(zs + int64_t(row) * groups + group(j)); }
  __device__ Raw none() const { return __halves2half2(__float2half_rn(1024.0f), __float2half_rn(0.0f)); }
  __device__ Prep prep(Raw r) const { return {zero_point(__low2half(r)), __half2half2(__high2half(r))}; }
  __device__ void dequant(uint32_t word, const Prep& p, uint32_t* b) const {
    __half2 d[kPerWord / 2];
    codes_minus_zero<BITS>(word, p.z, d);
#pragma unroll
    for (int q = 0; q < kPerWord / 2; ++q) {
      const __half2 v = __hmul2(d[q], p.s);
      b[q] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
};

template <int MB, int BITS>
__global__ void __launch_bounds__(a16::kWarps * 32, MB == 1 ? 3 : 2)
    wq_mma_kernel(GptqFormat<BITS> f, const uint4* __restrict__ W, const __half* __restrict__ x, __half* __restrict__ yh, float* __restrict__ yf,
                  float beta, int M, int N, int K, int cpc) {
  a16::mma_kernel_body<MB>(f, W, x, yh, yf, beta, M, N, K, cpc);
}

// W (f16, row-major [N, K], permuted columns) for the large-M path; one thread per word.
template <int BITS>
__global__ void dequant_kernel(const uint32_t* W, const __half2* zs, __half* out, int N, int K, int groups, int gs) {
  constexpr int kPerWord = 32 / BITS;
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= int64_t(N) * (K / kPerWord)) return;
  const int row = int(i / (K / kPerWord)), c0 = int(i % (K / kPerWord)) * kPerWord;
  const __half2 zsv = zs[int64_t(row) * groups + c0 / gs];
  __half2 d[kPerWord / 2];
  codes_minus_zero<BITS>(W[i], zero_point(__low2half(zsv)), d);
  const __half2 s2 = __half2half2(__high2half(zsv));
  __half2* o = reinterpret_cast<__half2*>(out + int64_t(row) * K + c0);
#pragma unroll
  for (int t = 0; t < kPerWord / 2; ++t) o[t] = __hmul2(d[t], s2);   // pairs in column order
}
}  // namespace

struct W4A16Linear::Impl {
  int64_t N = 0, K = 0, groups = 0, gs = 0;
  int bits = 4;
  DeviceBuffer<uint32_t> W;
  DeviceBuffer<__half2> zs;
  DeviceBuffer<int> perm;
  bool identity = true;   // groups already contiguous: x is used as given, no gather launch
};

W4A16Linear::W4A16Linear() : p_(new Impl) {}
W4A16Linear::~W4A16Linear() = default;
int64_t W4A16Linear::out() const { return p_->N; }
int64_t W4A16Linear::in() const { return p_->K; }
size_t W4A16Linear::weight_bytes() const { return size_t(p_->N * p_->K * p_->bits / 8) + size_t(p_->N * p_->groups) * 4; }
int W4A16Linear::bits() const { return p_->bits; }

std::unique_ptr<W4A16Linear> W4A16Linear::from_gptq(const GptqPacked& pk, bool v2) {
  if (pk.bits != 4 && pk.bits != 8) fail(Errc::usage, "", "bits", "the A16 kernels take 4- or 8-bit weights, got " + std::to_string(pk.bits));
  const int bits = pk.bits, per_word = 32 / bits, per_u4 = 4 * per_word;
  if (pk.cols % per_u4) fail(Errc::usage, "", "in_features", "must be a multiple of " + std::to_string(per_u4) + ", got " + std::to_string(pk.cols));
  const QuantizedLinear q = unpack_gptq(pk, v2, /*sym=*/false);   // zeros as stored, whatever the grid
  const int64_t N = q.rows, K = q.cols, G = q.groups;
  // Columns sorted by group (stable): contiguous groups of equal size.
  std::vector<int> perm(static_cast<size_t>(K));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int a, int b) { return q.g_idx[size_t(a)] < q.g_idx[size_t(b)]; });
  const int64_t gs = K / G;
  if (G * gs != K || (G > 1 && gs % per_u4)) fail(Errc::usage, "", "group_size", "groups must hold a multiple of " + std::to_string(per_u4) + " columns each, equally");
  for (int64_t k = 0; k < K; ++k)
    if (q.g_idx[size_t(perm[size_t(k)])] != k / gs) fail(Errc::usage, "", "g_idx", "groups of unequal sizes are not served by the W4A16 kernel");
  std::vector<uint32_t> W(static_cast<size_t>(N * K / per_word), 0);
  const uint32_t cmask = (1u << bits) - 1;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t k = 0; k < K; ++k) {   // column c of a word: even c at bits BITS(c/2), odd c at 16 + BITS(c/2)
      const int c = int(k % per_word), shift = (c % 2 ? 16 : 0) + bits * (c / 2);
      W[size_t(r * (K / per_word) + k / per_word)] |= (uint32_t(q.codes[size_t(r * K + perm[size_t(k)])]) & cmask) << shift;
    }
  std::vector<__half2> zs(static_cast<size_t>(N * G));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t g = 0; g < G; ++g)
      zs[size_t(r * G + g)] = __halves2half2(__float2half_rn(1024.0f + float(q.zeros[size_t(g * N + r)])), __float2half_rn(q.scales[size_t(g * N + r)]));
  std::unique_ptr<W4A16Linear> L(new W4A16Linear);
  Impl& m = *L->p_;
  m.N = N; m.K = K; m.groups = G; m.gs = gs; m.bits = bits;
  for (int64_t k = 0; k < K; ++k) m.identity = m.identity && perm[size_t(k)] == int(k);
  m.W = DeviceBuffer<uint32_t>(W.size(), "W4A16 codes");
  m.zs = DeviceBuffer<__half2>(zs.size(), "W4A16 zeros and scales");
  m.perm = DeviceBuffer<int>(size_t(K), "W4A16 column permutation");
  PTQ_CUDA(cudaMemcpy(m.W.get(), W.data(), W.size() * 4, cudaMemcpyHostToDevice));
  PTQ_CUDA(cudaMemcpy(m.zs.get(), zs.data(), zs.size() * 4, cudaMemcpyHostToDevice));
  PTQ_CUDA(cudaMemcpy(m.perm.get(), perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
  return L;
}

// Workspaces (the gathered x, the dequantized W) come from the pool on each call and go back at
// its end: one model's Linears share them, and stream order makes the reuse safe.
void W4A16Linear::gemm(const void* x, int64_t M, void* y, A16Path path) const { run(x, M, y, false, 0.0f, path); }
void W4A16Linear::gemm_f32(const void* x, int64_t M, float* y, float beta) const { run(x, M, y, true, beta, A16Path::automatic); }

void W4A16Linear::run(const void* x, int64_t M, void* y, bool f32, float beta, A16Path path) const {
  const Impl& m = *p_;
  if (M < 1) return;
  path = a16::resolve(path, M, f32, "W4A16");
  const __half* xp = static_cast<const __half*>(x);
  DeviceBuffer<__half> xg;
  if (!m.identity) {   // act-order: x in the kernel's column order
    xg = DeviceBuffer<__half>(size_t(M * m.K), "W4A16 gathered activations");
    gather_kernel<<<unsigned((M * m.K + 255) / 256), 256>>>(xp, m.perm.get(), xg.get(), M, m.K);
    PTQ_CUDA_LAUNCH("gather_kernel");
    xp = xg.get();
  }
  auto* Wv = reinterpret_cast<const uint4*>(m.W.get());
  const int N = int(m.N), K = int(m.K), G = int(m.groups);
  const GroupOf group = GroupOf::make(m.groups, m.gs, 128 / m.bits);
  if (path == A16Path::gemv) {
    const unsigned blocks = unsigned((m.N * 32 + 255) / 256);
    auto* yh = static_cast<__half*>(y);
    const int key = int(M) * 100 + m.bits;
    switch (key) {
#define PTQ_WQ_CASE(mm, b) case mm * 100 + b: wq_gemv_kernel<mm, b><<<blocks, 256>>>(Wv, m.zs.get(), xp, yh, N, K, G, int(m.gs)); break;
      PTQ_WQ_CASE(1, 4) PTQ_WQ_CASE(2, 4) PTQ_WQ_CASE(3, 4) PTQ_WQ_CASE(4, 4)
      PTQ_WQ_CASE(1, 8) PTQ_WQ_CASE(2, 8) PTQ_WQ_CASE(3, 8) PTQ_WQ_CASE(4, 8)
#undef PTQ_WQ_CASE
    }
    PTQ_CUDA_LAUNCH("wq_gemv_kernel");
    return;
  }
  if (path == A16Path::mma) {
    const a16::Launch l = a16::plan(m.N, m.K, 128 / m.bits);
    __half* yh = f32 ? nullptr : static_cast<__half*>(y);
    float* yf = f32 ? static_cast<float*>(y) : nullptr;
    const int MB = int((M + 15) / 16), key = MB * 100 + m.bits;
    switch (key) {
#define PTQ_MMA_CASE(mb, b) \
  case mb * 100 + b: a16::launch(l, wq_mma_kernel<mb, b>, GptqFormat<b>{m.zs.get(), G, group}, Wv, xp, yh, yf, beta, int(M), N, K, l.cpc); break;
      PTQ_MMA_CASE(1, 4) PTQ_MMA_CASE(2, 4) PTQ_MMA_CASE(3, 4) PTQ_MMA_CASE(4, 4)
      PTQ_MMA_CASE(1, 8) PTQ_MMA_CASE(2, 8) PTQ_MMA_CASE(3, 8) PTQ_MMA_CASE(4, 8)
#undef PTQ_MMA_CASE
    }
    PTQ_CUDA_LAUNCH("wq_mma_kernel");
    return;
  }
  DeviceBuffer<__half> wf(size_t(m.N * m.K), "W4A16 dequantized workspace (M > 64)");
  const unsigned dq_blocks = unsigned((m.N * m.K * m.bits / 32 + 255) / 256);
  if (m.bits == 4) dequant_kernel<4><<<dq_blocks, 256>>>(m.W.get(), m.zs.get(), wf.get(), int(m.N), int(m.K), int(m.groups), int(m.gs));
  else dequant_kernel<8><<<dq_blocks, 256>>>(m.W.get(), m.zs.get(), wf.get(), int(m.N), int(m.K), int(m.groups), int(m.gs));
  PTQ_CUDA_LAUNCH("dequant_kernel");
  const float one = 1.0f, b = f32 ? beta : 0.0f;
  PTQ_CUBLAS(cublasGemmEx(blas(), CUBLAS_OP_T, CUBLAS_OP_N, int(m.N), int(M), int(m.K), &one, wf.get(), CUDA_R_16F, int(m.K), xp,
                          CUDA_R_16F, int(m.K), &b, y, f32 ? CUDA_R_32F : CUDA_R_16F, int(m.N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace ptq::cuda
