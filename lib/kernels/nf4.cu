// nf4.cu — y = x · Wᵀ with W in bitsandbytes NF4 (4-bit normal-float codes, absmax per block);
// x and y in f16.
//
// Contract. Operands: x [M, K] f16 row-major (device), y [M, N] f16 (or fp32 with beta) row-major.
// W [N, K] kept in bitsandbytes' own layout, so no re-layout beyond resolving absmax: codes of the
// row-major flattening, two per byte, the first element in the high nibble; absmax per block of B
// consecutive elements (nested double quantization resolved to fp32 at load: absmax =
// nested_map[q] * nested_absmax + offset). Accepted: K a multiple of 32 and of B; B in {32, 64,
// 128, 256} (so a lane's 32 codes share one absmax); N any; M any (M <= 4 the GEMV, M <= 64 the
// tensor-core kernel of kernels/a16_mma.cuh, larger M dequantizes to f16 and calls cuBLAS).
// Math: a 256-entry shared-memory table maps a code byte to the half2 {NF4[hi], NF4[lo]}; one
// HFMA2 per byte against the matching x pair, four bytes summed in f16, then fp32, times the
// block's absmax in fp32. Tolerance against the fp32 reference: the NF4 values rounded to f16
// (2^-11 relative) and 8-term f16 partial sums (tests: 3e-3 relative, norm-wise).
// Roofline at M = 1: N*K/2 bytes of codes + 4*N*K/B of absmax + 2K of x; 4096 x 4096 with B = 64
// moves 9.4 MB: 3.1 us at the H100's 3.0 TB/s copy bandwidth.
#include "kernels/nf4.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <vector>

#include "core/error.h"
#include "cuda/blas.h"
#include "cuda/runtime.h"
#include "kernels/a16_mma.cuh"

namespace ptq::cuda {

namespace {

__constant__ float kCode[16];

__device__ __forceinline__ void fill_table(__half2* lut) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = __halves2half2(__float2half_rn(kCode[i >> 4]), __float2half_rn(kCode[i & 15]));
  __syncthreads();
}

// A warp per kRows rows of W; lane l streams 16-byte chunks l, l+32, ... (32 codes each) of each
// row, loading the kRows chunks before using any and its x slice once for all of them. (Measured
// on the H100 at M = 1: 1.53-2.07x cuBLAS against 1.45-1.63x with a warp per row; a register
// double buffer on top of it measured no better, 1.50-1.79x.)
template <int M>
__global__ void nf4_gemv_kernel(const uint4* __restrict__ codes, const float* __restrict__ absmax, const __half* __restrict__ x,
                                __half* __restrict__ y, int N, int K, int B) {
  constexpr int kRows = 4;
  __shared__ __half2 lut[256];
  fill_table(lut);
  const int row0 = int((blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32) * kRows, lane = threadIdx.x % 32;
  if (row0 >= N) return;
  const int chunks = K / 32;
  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  int rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = min(row0 + r, N - 1);   // a partial last warp re-reads row N - 1, stores nothing for it
  for (int u = lane; u < chunks; u += 32) {
    uint4 w[kRows];
    float s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      w[r] = __ldcs(codes + int64_t(rows[r]) * chunks + u);
      s[r] = __ldg(absmax + (int64_t(rows[r]) * K + int64_t(u) * 32) / B);
    }
    uint4 xv[M][4];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int q = 0; q < 4; ++q) xv[m][q] = __ldg(reinterpret_cast<const uint4*>(x + int64_t(m) * K + int64_t(u) * 32) + q);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint32_t words[4] = {w[r].x, w[r].y, w[r].z, w[r].w};
      __half2 v[16];
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int b = 0; b < 4; ++b) v[q * 4 + b] = lut[(words[q] >> (8 * b)) & 255u];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float part = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const __half2* xh = reinterpret_cast<const __half2*>(&xv[m][q]);
          __half2 h = __hmul2(v[q * 4], xh[0]);
#pragma unroll
          for (int b = 1; b < 4; ++b) h = __hfma2(v[q * 4 + b], xh[b], h);
          const float2 f = __half22float2(h);
          part += f.x + f.y;
        }
        acc[r][m] = fmaf(part, s[r], acc[r][m]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float a = acc[r][m];
      for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(~0u, a, o);
      if (lane == 0 && row0 + r < N) y[int64_t(m) * N + row0 + r] = __float2half_rn(a);
    }
}

// The tensor-core path (M = 5..64, kernels/a16_mma.cuh): a word's 4 bytes through the same
// shared-memory table, times the block's absmax in f16 (the f16 NF4 value times the f16 absmax:
// two more roundings than the fp32 product of a dequantized f16 matrix, within 3 * 2^-11).
struct Nf4Format {
  static constexpr int kCodes = 32, kPerWord = 8;
  using Raw = float;
  using Prep = __half2;   // {absmax, absmax}
  const float* absmax;
  __half2* lut;
  int blocks_per_row, shift;   // block of uint4 j in its row: j >> shift (B / 32 a power of two)
  __device__ void setup() const { fill_table(lut); }
  __device__ Raw raw(int row, int j) const { return __ldg(absmax + int64_t(row) * blocks_per_row + (j >> shift)); }
  __device__ Raw none() const { return 0.0f; }
  __device__ Prep prep(Raw r) const { return __float2half2_rn(r); }
  __device__ void dequant(uint32_t word, const Prep& m, uint32_t* b) const {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const __half2 v = __hmul2(lut[(word >> (8 * p)) & 255u], m);   // {first (high nibble), second}
      b[p] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
};

template <int MB>
__global__ void __launch_bounds__(a16::kWarps * 32, MB == 1 ? 3 : 2)
    nf4_mma_kernel(const float* __restrict__ absmax, int B, const uint4* __restrict__ W, const __half* __restrict__ x, __half* __restrict__ yh,
                   float* __restrict__ yf, float beta, int M, int N, int K, int cpc) {
  __shared__ __half2 lut[256];
  a16::mma_kernel_body<MB>(Nf4Format{absmax, lut, K / B, B == 32 ? 0 : B == 64 ? 1 : B == 128 ? 2 : 3}, W, x, yh, yf, beta, M, N, K, cpc);
}

// W in f16 (fp32 product, one rounding: what a dequantized f16 model holds). A thread per 16 bytes
// of codes (32 weights, one absmax since B >= 32), four 16-byte stores; the 16 code values in
// shared memory sit in 16 distinct banks, so the lookups never conflict.
__global__ void nf4_dequant_kernel(const uint4* __restrict__ codes, const float* __restrict__ absmax, uint4* __restrict__ w, int64_t n_chunks, int B) {
  __shared__ float code[16];
  if (threadIdx.x < 16) code[threadIdx.x] = kCode[threadIdx.x];
  __syncthreads();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n_chunks) return;
  const uint4 c = codes[i];
  const float s = absmax[(32 * i) / B];
  const uint32_t words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    __half2 h[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (words[q] >> (8 * b)) & 255u;
      h[b] = __floats2half2_rn(code[byte >> 4] * s, code[byte & 15] * s);   // first weight: high nibble
    }
    w[4 * i + q] = *reinterpret_cast<const uint4*>(h);
  }
}
}  // namespace

struct Nf4Linear::Impl {
  int64_t N = 0, K = 0;
  int B = 64;
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> absmax;
};

Nf4Linear::Nf4Linear() : p_(new Impl) {}
Nf4Linear::~Nf4Linear() = default;
int64_t Nf4Linear::out() const { return p_->N; }
int64_t Nf4Linear::in() const { return p_->K; }
size_t Nf4Linear::weight_bytes() const { return size_t(p_->N * p_->K / 2) + size_t(p_->N * p_->K / p_->B) * 4; }

std::unique_ptr<Nf4Linear> Nf4Linear::from_nf4(const Nf4Tensor& t, int64_t out, int64_t in) {
  const int B = t.blocksize;
  if (B != 32 && B != 64 && B != 128 && B != 256) fail(Errc::usage, "", "blocksize", "the NF4 kernel takes blocks of 32, 64, 128 or 256, got " + std::to_string(B));
  if (in % 32 || in % B) fail(Errc::usage, "", "in_features", "must be a multiple of 32 and of the block size, got " + std::to_string(in));
  const int64_t n = out * in, blocks = n / B;
  if (int64_t(t.packed.size()) != n / 2) fail(Errc::usage, "", "packed", "holds " + std::to_string(t.packed.size()) + " bytes, expected " + std::to_string(n / 2));
  std::vector<float> am(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b)
    am[size_t(b)] = t.nested ? t.nested_map[t.absmax_q[size_t(b)]] * t.nested_absmax[size_t(b / t.nested_blocksize)] + t.offset : t.absmax[size_t(b)];
  static bool table = [] {
    PTQ_CUDA(cudaMemcpyToSymbol(kCode, kNf4Code.data(), 16 * sizeof(float)));
    return true;
  }();
  (void)table;
  std::unique_ptr<Nf4Linear> L(new Nf4Linear);
  Impl& m = *L->p_;
  m.N = out;
  m.K = in;
  m.B = B;
  m.codes = DeviceBuffer<uint8_t>(size_t(n / 2), "NF4 codes");
  m.absmax = DeviceBuffer<float>(size_t(blocks), "NF4 absmax");
  copy_to_device(m.codes.get(), t.packed.data(), size_t(n / 2));
  copy_to_device(m.absmax.get(), am.data(), am.size() * 4);
  return L;
}

void Nf4Linear::gemm(const void* x, int64_t M, void* y, A16Path path) const { run(x, M, y, false, 0.0f, path); }
void Nf4Linear::gemm_f32(const void* x, int64_t M, float* y, float beta) const { run(x, M, y, true, beta, A16Path::automatic); }

void Nf4Linear::run(const void* x, int64_t M, void* y, bool f32, float beta, A16Path path) const {
  const Impl& m = *p_;
  if (M < 1) return;
  path = a16::resolve(path, M, f32, "NF4");
  const auto* xh = static_cast<const __half*>(x);
  auto* cw = reinterpret_cast<const uint4*>(m.codes.get());
  if (path == A16Path::mma) {
    const a16::Launch l = a16::plan(m.N, m.K, 32);
    __half* yh = f32 ? nullptr : static_cast<__half*>(y);
    float* yf = f32 ? static_cast<float*>(y) : nullptr;
    const int N = int(m.N), K = int(m.K);
    switch ((M + 15) / 16) {
#define PTQ_NF4_MMA(mb) \
  case mb: a16::launch(l, nf4_mma_kernel<mb>, m.absmax.get(), m.B, cw, xh, yh, yf, beta, int(M), N, K, l.cpc); break;
      PTQ_NF4_MMA(1) PTQ_NF4_MMA(2) PTQ_NF4_MMA(3) PTQ_NF4_MMA(4)
#undef PTQ_NF4_MMA
    }
    PTQ_CUDA_LAUNCH("nf4_mma_kernel");
    return;
  }
  if (path == A16Path::gemv) {
    const unsigned blocks = unsigned(((m.N + 3) / 4 * 32 + 255) / 256);   // a warp per 4 rows
    auto* yh = static_cast<__half*>(y);
    switch (M) {
      case 1: nf4_gemv_kernel<1><<<blocks, 256>>>(cw, m.absmax.get(), xh, yh, int(m.N), int(m.K), m.B); break;
      case 2: nf4_gemv_kernel<2><<<blocks, 256>>>(cw, m.absmax.get(), xh, yh, int(m.N), int(m.K), m.B); break;
      case 3: nf4_gemv_kernel<3><<<blocks, 256>>>(cw, m.absmax.get(), xh, yh, int(m.N), int(m.K), m.B); break;
      default: nf4_gemv_kernel<4><<<blocks, 256>>>(cw, m.absmax.get(), xh, yh, int(m.N), int(m.K), m.B); break;
    }
    PTQ_CUDA_LAUNCH("nf4_gemv_kernel");
    return;
  }
  DeviceBuffer<__half> wf(size_t(m.N * m.K), "NF4 dequantized workspace (M > 64)");
  const int64_t chunks = m.N * m.K / 32;
  nf4_dequant_kernel<<<unsigned((chunks + 255) / 256), 256>>>(reinterpret_cast<const uint4*>(m.codes.get()), m.absmax.get(),
                                                              reinterpret_cast<uint4*>(wf.get()), chunks, m.B);
  PTQ_CUDA_LAUNCH("nf4_dequant_kernel");
  const float one = 1.0f, b = f32 ? beta : 0.0f;
  PTQ_CUBLAS(cublasGemmEx(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(m.N), int(M), int(m.K), &one, wf.get(), CUDA_R_16F, int(m.K), xh,
                          CUDA_R_16F, int(m.K), &b, y, f32 ? CUDA_R_32F : CUDA_R_16F, int(m.N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace ptq::cuda
