// w4a16.cu — y = x · Wᵀ with W in 4 bits (W4A16) or 8 bits (W8A16), GPTQ layouts; x and y in f16.
//
// Contract. Operands: x [M, K] f16 row-major (device), y [M, N] f16 (or fp32 with beta) row-major.
// W [N, K] re-laid out at load from GPTQ's canonical layout (qweight int32 [K/8, N] packed along K,
// qzeros packed along N, scales [G, N], g_idx [K]):
//   - columns sorted by group (act-order g_idx becomes contiguous groups; x is gathered by the
//     same permutation on every call: perm [K] int32);
//   - codes in the fragment order of kernels/a16_mma.cuh: one uint32 per A fragment at 4 bits
//     (pair p = 0..3 = a0a1, a2a3, a4a5, a6a7 in bits 4p.. (first column) and 16 + 4p..
//     (second)), two at 8 bits (a0a1 | a2a3 in bytes 0, 2 | 1, 3 of the first word, a4a5 | a6a7 of
//     the second);
//   - per (row, group): the zero point as an f16 integer 1024 + z and the scale s (f16, the value
//     GPTQ stored), stored per tile and group as the pairs (row g, row g + 8); for a grid with mins
//     (w = s q + m, GGUF's Q4_1 / Q5_1 / Q4_K / Q5_K: from_quantized) the min m in place of 1024 + z.
// Math: (q - z) from the magic-number trick (0x6400 | q = 1024 + q in f16, less 1024 + z: exact;
// 4-bit codes in bits 4..7 taken in place and brought down by an exact FMA with 1/16, Marlin's
// lop3 trick), f16 x f16 products summed in fp32 by mma.sync; s applied in fp32 to each k-step's
// partial when groups hold whole k-steps (groups of 64, 128, per channel), else in f16 to the
// weights. Mins: q formed exactly the same way, then s q + m by one f16 FMA (always in f16; s and
// m rounded to f16 at load, 2^-11 relative each, so |error| <= 2^-11 (|s q| + |m|) + the FMA's).
// Tolerance against the fp32 reference: x and s are f16 (exact inputs); (q - z) * s in f16 where
// scaled in f16 (2^-11 relative); fp32 sums (tests: 2e-3 relative, norm-wise).
// Paths by M (a16_path.h): the tensor-core kernels a16_mma.cuh (x through L1), a16_wgmma.cu (sm_90,
// 33..128 rows, 129..256 and at 4 bits 17..32 on large layers) and a16_shared_x.cuh (33..64 rows of
// large layers without sm_90), the last two scaling weights in f16 (wgmma: per-channel scales in
// fp32 at the end); else dequantize to f16 and cuBLAS.
// Accepted (a16_grid.h: a16_takes, which the loaders ask first): K a multiple of 16, N any; groups
// as runs of equal size, a multiple of 16 columns (or one group): a checkpoint's unequal groups in
// runs of their sizes' common divisor, each carrying its group's grid; codes of 1..3 bits (GPTQ's
// 2- and 3-bit) held in the 4-bit layout and of 5..7 in the 8-bit one, zero points as stored: exact,
// at 4 or 8 bits a weight.
// Roofline at M = 1: reads N*K*BITS/8 bytes of codes + 4*N*K/gs bytes of (z, s) + 2K of x; on the
// H100 (3.0 TB/s copy) a 4096 x 4096 g128 layer moves 8.9 MB: 3.0 us at the floor.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/bits.h"
#include "core/error.h"
#include "cuda/blas.h"
#include "cuda/runtime.h"
#include "kernels/a16_dispatch.cuh"
#include "kernels/a16_grid.h"
#include "kernels/relayout.h"
#include "kernels/relayout_cuda.h"
#include "kernels/w4a16.h"

namespace ptq::cuda {

namespace {
__global__ void gather_kernel(const __half* x, const int* perm, __half* xp, int64_t M, int64_t K) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < M * K) xp[i] = x[(i / K) * K + perm[i % K]];
}

}  // namespace

void set_a16_split(A16Split split) { a16::g_split = split; }
bool a16_wgmma_last_clustered() { return a16::g_wgmma_clustered; }
void a16_fold_norm(const A16RowNorm* norm) { a16::g_fold = {norm, nullptr, nullptr, nullptr, A16Fold::none}; }
void a16_fold_silu(void* act, void* act_perm) { a16::g_fold = {nullptr, act, act_perm, nullptr, A16Fold::none}; }
void a16_fold_rope(const A16Rope* rope) { a16::g_fold = {nullptr, nullptr, nullptr, rope, A16Fold::none}; }
A16Fold a16_folded() {
  const A16Fold taken = a16::g_fold.taken;
  a16::g_fold = {};
  return taken;
}
void a16_norm_in(const A16RowNorm* norm) { a16::g_norm_in = {norm, false}; }
bool a16_took_norm_in() {
  const bool taken = a16::g_norm_in.taken;
  a16::g_norm_in = {};
  return taken;
}
void a16_offer_wgmma_x(const void* x_of, const void* x_perm) { a16::g_x_offer = {x_of, x_perm, false}; }
bool a16_took_wgmma_x() {
  const bool taken = a16::g_x_offer.taken;
  a16::g_x_offer = {};
  return taken;
}

struct W4A16Linear::Impl {
  int64_t N = 0, K = 0, groups = 0, gs = 0;
  int bits = 4;        // the kernel's code width: 4 or 8
  int code_bits = 4;   // the checkpoint's (1..8): held in the kernel's width, values unchanged
  bool min = false;    // w = s q + m (zs holds {m, s}): GptqFormat<bits, true>
  DeviceBuffer<uint32_t> W;   // fragment order (kernels/a16_mma.cuh)
  DeviceBuffer<__half2> zs;   // [tiles][groups][8][2]
  DeviceBuffer<int> perm;
  bool identity = true;   // groups already contiguous: x is used as given, no gather launch
};

W4A16Linear::W4A16Linear() : p_(new Impl) {}
W4A16Linear::~W4A16Linear() = default;
int64_t W4A16Linear::out() const { return p_->N; }
int64_t W4A16Linear::in() const { return p_->K; }
size_t W4A16Linear::weight_bytes() const { return size_t(p_->N * p_->K * p_->bits / 8) + size_t(p_->N * p_->groups) * 4; }
int W4A16Linear::bits() const { return p_->bits; }
int W4A16Linear::code_bits() const { return p_->code_bits; }
bool W4A16Linear::has_min() const { return p_->min; }

std::unique_ptr<W4A16Linear> W4A16Linear::clone() const {
  std::unique_ptr<W4A16Linear> L(new W4A16Linear);
  Impl& m = *L->p_;
  const Impl& o = *p_;
  m.N = o.N; m.K = o.K; m.groups = o.groups; m.gs = o.gs; m.bits = o.bits; m.code_bits = o.code_bits; m.min = o.min; m.identity = o.identity;
  m.W = DeviceBuffer<uint32_t>(o.W.size(), "W4A16 codes");
  m.zs = DeviceBuffer<__half2>(o.zs.size(), "W4A16 zeros and scales");
  m.perm = DeviceBuffer<int>(o.perm.size(), "W4A16 column permutation");
  PTQ_CUDA(cudaMemcpy(m.W.get(), o.W.get(), o.W.size() * 4, cudaMemcpyDeviceToDevice));
  PTQ_CUDA(cudaMemcpy(m.zs.get(), o.zs.get(), o.zs.size() * 4, cudaMemcpyDeviceToDevice));
  PTQ_CUDA(cudaMemcpy(m.perm.get(), o.perm.get(), o.perm.size() * 4, cudaMemcpyDeviceToDevice));
  return L;
}

std::unique_ptr<W4A16Linear> W4A16Linear::from_gptq(const GptqPacked& pk, bool v2) {
  if (pk.bits < 1 || pk.bits > 8) fail(Errc::usage, "", "bits", "the A16 kernels take 1- to 8-bit weights, got " + std::to_string(pk.bits));   // before unpacking
  return from_quantized(unpack_gptq(pk, v2, /*sym=*/false));   // zeros as stored, whatever the grid
}

std::unique_ptr<W4A16Linear> W4A16Linear::from_quantized(const QuantizedLinear& q) {
  if (q.packed.size() != size_t(q.rows * packed_words(q.cols, q.spec.bits)))
    fail(Errc::usage, q.name, "codes", std::to_string(q.packed.size()) + " words for " + std::to_string(q.rows) + " rows of " + std::to_string(packed_words(q.cols, q.spec.bits)));
  return from_quantized(q, {{q.packed.data(), q.rows}});
}

std::unique_ptr<W4A16Linear> W4A16Linear::from_quantized(const QuantizedLinear& q, const std::vector<StoredRows>& codes) {
  A16Refusal why;
  if (!a16_takes(q, &why)) fail(Errc::usage, q.name, why.field, why.reason);
  // Narrower codes sit in the 4-bit kernel's nibbles (1..4 bits) or the 8-bit kernel's bytes (5..8),
  // their zero points (or mins) as they are: (q - z) * s, s q + m, is the same number, so nothing is rounded.
  const int code_bits = q.spec.bits;
  const int bits = code_bits <= 4 ? 4 : 8;
  const bool min = ptq::has_min(q.spec.form);
  // Columns sorted by group (stable), then cut into G runs of gs columns (a16_group_columns: a
  // checkpoint's unequal groups in runs of their sizes' common divisor), each with its group's grid.
  const int64_t N = q.rows, K = q.cols, gs = a16_group_columns(q), G = K / gs;
  std::vector<int> perm(static_cast<size_t>(K));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int a, int b) { return q.g_idx[size_t(a)] < q.g_idx[size_t(b)]; });
  const int64_t tiles = (N + 15) / 16;
  bool identity = true;
  for (int64_t k = 0; k < K; ++k) identity = identity && perm[size_t(k)] == int(k);
  // Per (row, group): {1024 + z, s}, or {m, s} for a grid with mins (GptqFormat); rows past N: zero weights.
  std::vector<__half2> zs(static_cast<size_t>(tiles * 16 * G), __halves2half2(__float2half_rn(min ? 0.0f : 1024.0f), __float2half_rn(0.0f)));
#pragma omp parallel for schedule(static) if (N * G > (int64_t(1) << 16))
  for (int64_t r = 0; r < N; ++r)
    for (int64_t g = 0; g < G; ++g) {
      const size_t i = size_t(q.g_idx[size_t(perm[size_t(g * gs)])] * N + r);   // the run's group
      const float first = min ? q.mins[i] : 1024.0f + float(q.zeros[i]);
      zs[size_t(((r / 16 * G + g) * 8 + r % 8) * 2 + (r % 16) / 8)] = __halves2half2(__float2half_rn(first), __float2half_rn(q.scales[i]));
    }
  std::unique_ptr<W4A16Linear> L(new W4A16Linear);
  Impl& m = *L->p_;
  m.N = N; m.K = K; m.groups = G; m.gs = gs; m.bits = bits; m.code_bits = code_bits; m.min = min; m.identity = identity;
  m.zs = DeviceBuffer<__half2>(zs.size(), "W4A16 zeros and scales");
  m.perm = DeviceBuffer<int>(size_t(K), "W4A16 column permutation");
  PTQ_CUDA(cudaMemcpy(m.zs.get(), zs.data(), zs.size() * 4, cudaMemcpyHostToDevice));
  PTQ_CUDA(cudaMemcpy(m.perm.get(), perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
  // The codes go up as stored and are laid out in fragment order on the device, columns in the
  // sorted order (kernels/relayout.cu; relayout_rows is its host reference).
  const FragmentCodes fc = bits == 4 ? FragmentCodes::gptq4 : FragmentCodes::gptq8;
  m.W = DeviceBuffer<uint32_t>(fragment_words(N, K, fc), "W4A16 codes");
  upload_relayout(codes, StoredCodes::stream, code_bits, N, K, identity ? nullptr : m.perm.get(), fc, m.W.get());
  return L;
}

// Workspaces (the gathered x, the dequantized W) come from the pool on each call and go back at
// its end: one model's Linears share them, and stream order makes the reuse safe.
A16Path W4A16Linear::path_for(int64_t M) const { return a16::resolve(A16Path::automatic, M, p_->N, p_->K, p_->bits, ""); }
void W4A16Linear::gemm(const void* x, int64_t M, void* y, A16Path path) const { run(x, M, y, false, 0.0f, path); }
void W4A16Linear::gemm_f32(const void* x, int64_t M, float* y, float beta, A16Path path) const { run(x, M, y, true, beta, path); }

void W4A16Linear::run(const void* x, int64_t M, void* y, bool f32, float beta, A16Path path) const {
  const Impl& m = *p_;
  if (M < 1) return;
  path = a16::resolve(path, M, m.N, m.K, m.bits, "W4A16");
  const __half* xp = static_cast<const __half*>(x);
  DeviceBuffer<__half> xg;
  if (!m.identity) {   // act-order: x in the kernel's column order
    xg = DeviceBuffer<__half>(size_t(M * m.K), "W4A16 gathered activations");
    gather_kernel<<<unsigned((M * m.K + 255) / 256), 256, 0, static_cast<cudaStream_t>(current_stream())>>>(xp, m.perm.get(), xg.get(), M, m.K);
    PTQ_CUDA_LAUNCH("gather_kernel");
    xp = xg.get();
  }
  auto* Wv = reinterpret_cast<const uint4*>(m.W.get());
  auto* zs = reinterpret_cast<const uint2*>(m.zs.get());
  const a16::GroupOf group = a16::GroupOf::make(m.groups, m.gs);
  const bool k_step_scale = !m.min && (m.groups == 1 || m.gs % 64 == 0);   // mins: always scaled in f16
  // The format of the codes' width and grid, to f(format).
  auto with_format = [&](auto&& f) {
    if (m.min) {
      if (m.bits == 4) f(a16::GptqFormat<4, true>{zs, int(m.groups), group});
      else f(a16::GptqFormat<8, true>{zs, int(m.groups), group});
    } else if (m.bits == 4) f(a16::GptqFormat<4>{zs, int(m.groups), group});
    else f(a16::GptqFormat<8>{zs, int(m.groups), group});
  };
  if (path != A16Path::dequant) {
    __half* yh = f32 ? nullptr : static_cast<__half*>(y);
    float* yf = f32 ? static_cast<float*>(y) : nullptr;
    with_format([&](const auto& fmt) { a16::run_tensor_cores(path, fmt, k_step_scale, Wv, xp, yh, yf, beta, M, m.N, m.K); });
    return;
  }
  DeviceBuffer<__half> wf(size_t(m.N * m.K), "W4A16 dequantized workspace");
  with_format([&](const auto& fmt) { a16::run_dequant(fmt, Wv, wf.get(), m.N, m.K); });
  const float one = 1.0f, b = f32 ? beta : 0.0f;
  PTQ_CUBLAS(cublasGemmEx(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(m.N), int(M), int(m.K), &one, wf.get(), CUDA_R_16F, int(m.K), xp,
                          CUDA_R_16F, int(m.K), &b, y, f32 ? CUDA_R_32F : CUDA_R_16F, int(m.N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace ptq::cuda
