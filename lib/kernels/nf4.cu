// nf4.cu — y = x · Wᵀ with W in bitsandbytes NF4 (4-bit normal-float codes, absmax per block);
// x and y in f16.
//
// Contract. Operands: x [M, K] f16 row-major (device), y [M, N] f16 (or fp32 with beta) row-major.
// W [N, K] re-laid out at load from bitsandbytes' layout (codes of the row-major flattening, two
// per byte, the first in the high nibble; absmax per block of B consecutive elements, nested
// double quantization resolved to fp32: absmax = nested_map[q] * nested_absmax + offset) into the
// fragment order of kernels/a16_mma.cuh: one uint32 per A fragment, nibbles 0..3 = (row g, k0),
// (row g, k0+1), (row g+8, k0), (row g+8, k0+1) and nibbles 4..7 the same at k0+2, k0+3; absmax per
// tile and block as the pairs (row g, row g + 8), fp32. Accepted: K a multiple of 16 and of B;
// B in {32, 64, 128, 256}; N any; M any (the tensor-core kernels a16_mma.cuh, a16_wgmma.cu,
// a16_shared_x.cuh as a16_path.h picks; else dequantize to f16 and cuBLAS).
// Math: the L2-fed kernel (M <= 16) looks each byte of codes up in a shared-memory table of f16
// pairs, one copy per lane (a16_formats.cuh, Nf4PairFormat: 32 KB, no bank conflicts): 2 integer
// instructions and an LDS per 2 weights. The other kernels keep the 16 NF4 values in f16 as byte
// tables in registers; PRMT looks up 4 codes at once (the low 3 bits pick a byte from each half of
// the table, bit 3 picks the half, two more PRMTs interleave low and high bytes into f16 pairs): 11
// instructions per 4 weights, which bounded the L2-fed kernel at M = 1 to 38-49% of the copy
// bandwidth. The f16 NF4 values times x summed in fp32 by mma.sync; absmax applied in
// fp32 to each k-step's partial when B >= 64, in f16 to the weights for B = 32. Tolerance against
// the fp32 reference: the NF4 values rounded to f16 (2^-11 relative), f16 absmax products for
// B = 32 (tests: 3e-3 relative, norm-wise).
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
#include "kernels/a16_dispatch.cuh"
#include "kernels/relayout.h"
#include "kernels/relayout_cuda.h"

namespace ptq::cuda {

struct Nf4Linear::Impl {
  int64_t N = 0, K = 0;
  int B = 64;
  DeviceBuffer<uint32_t> codes;   // fragment order
  DeviceBuffer<float> absmax;     // [tiles][blocks][8][2]
  uint32_t lo[4] = {}, hi[4] = {};
  a16::Nf4Format format() const {
    a16::Nf4Format f{};
    for (int i = 0; i < 4; ++i) f.lo[i] = lo[i], f.hi[i] = hi[i];
    f.absmax = reinterpret_cast<const float2*>(absmax.get());
    f.blocks = int(K / B);
    f.block = a16::GroupOf::make(K / B, B);
    return f;
  }
};

Nf4Linear::Nf4Linear() : p_(new Impl) {}
Nf4Linear::~Nf4Linear() = default;
int64_t Nf4Linear::out() const { return p_->N; }
int64_t Nf4Linear::in() const { return p_->K; }
size_t Nf4Linear::weight_bytes() const { return size_t(p_->N * p_->K / 2) + size_t(p_->N * p_->K / p_->B) * 4; }

std::unique_ptr<Nf4Linear> Nf4Linear::clone() const {
  std::unique_ptr<Nf4Linear> L(new Nf4Linear);
  Impl& m = *L->p_;
  const Impl& o = *p_;
  m.N = o.N; m.K = o.K; m.B = o.B;
  for (int i = 0; i < 4; ++i) m.lo[i] = o.lo[i], m.hi[i] = o.hi[i];
  m.codes = DeviceBuffer<uint32_t>(o.codes.size(), "NF4 codes");
  m.absmax = DeviceBuffer<float>(o.absmax.size(), "NF4 absmax");
  PTQ_CUDA(cudaMemcpy(m.codes.get(), o.codes.get(), o.codes.size() * 4, cudaMemcpyDeviceToDevice));
  PTQ_CUDA(cudaMemcpy(m.absmax.get(), o.absmax.get(), o.absmax.size() * 4, cudaMemcpyDeviceToDevice));
  return L;
}

std::unique_ptr<Nf4Linear> Nf4Linear::from_nf4(const Nf4Tensor& t, int64_t out, int64_t in) {
  if (int64_t(t.packed.size()) != out * in / 2) fail(Errc::usage, "", "packed", "holds " + std::to_string(t.packed.size()) + " bytes, expected " + std::to_string(out * in / 2));
  return from_nf4(t, out, in, {{t.packed.data(), out}});
}

std::unique_ptr<Nf4Linear> Nf4Linear::from_nf4(const Nf4Tensor& t, int64_t out, int64_t in, const std::vector<StoredRows>& codes) {
  const int B = t.blocksize;
  if (B != 32 && B != 64 && B != 128 && B != 256) fail(Errc::usage, "", "blocksize", "the NF4 kernel takes blocks of 32, 64, 128 or 256, got " + std::to_string(B));
  if (in % 16 || in % B) fail(Errc::usage, "", "in_features", "must be a multiple of 16 and of the block size, got " + std::to_string(in));
  const int64_t blocks = in / B;
  const size_t need = size_t(out * blocks);   // absmax values, one a block
  if ((t.nested ? t.absmax_q.size() : t.absmax.size()) < need || (t.nested && (t.nested_map.size() < 256 || t.nested_blocksize < 1 ||
                                                                                 t.nested_absmax.size() < (need + size_t(t.nested_blocksize) - 1) / size_t(t.nested_blocksize))))
    fail(Errc::usage, "", "absmax", "holds fewer values than the " + std::to_string(need) + " blocks of " + std::to_string(out) + " x " + std::to_string(in));
  const int64_t tiles = (out + 15) / 16;
  std::vector<float> am(static_cast<size_t>(tiles * 16 * blocks), 0.0f);
#pragma omp parallel for schedule(static) if (out * blocks > (int64_t(1) << 16))
  for (int64_t r = 0; r < out; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t i = r * blocks + b;   // block i of the flattening (in % B == 0: blocks do not straddle rows)
      const float v = nf4_block_absmax(t, i);
      am[size_t(((r / 16 * blocks + b) * 8 + r % 8) * 2 + (r % 16) / 8)] = v;
    }
  std::unique_ptr<Nf4Linear> L(new Nf4Linear);
  Impl& m = *L->p_;
  m.N = out;
  m.K = in;
  m.B = B;
  for (int c = 0; c < 16; ++c) {
    const __half hv = __float2half_rn(kNf4Code[size_t(c)]);
    const uint16_t h = reinterpret_cast<const __half_raw&>(hv).x;
    m.lo[c / 4] |= uint32_t(h & 255u) << (8 * (c % 4));
    m.hi[c / 4] |= uint32_t(h >> 8) << (8 * (c % 4));
  }
  m.absmax = DeviceBuffer<float>(am.size(), "NF4 absmax");
  copy_to_device(m.absmax.get(), am.data(), am.size() * 4);
  // The codes go up as stored (bitsandbytes' bytes, the first element in the high nibble; in is
  // even, so rows start on a byte) and are laid out in fragment order on the device
  // (kernels/relayout.cu; relayout_rows is its host reference).
  m.codes = DeviceBuffer<uint32_t>(fragment_words(out, in, FragmentCodes::nf4), "NF4 codes");
  upload_relayout(codes, StoredCodes::nf4_bytes, 4, out, in, nullptr, FragmentCodes::nf4, m.codes.get());
  return L;
}

A16Path Nf4Linear::path_for(int64_t M) const { return a16::resolve(A16Path::automatic, M, p_->N, p_->K, 0, ""); }
void Nf4Linear::gemm(const void* x, int64_t M, void* y, A16Path path) const { run(x, M, y, false, 0.0f, path); }
void Nf4Linear::gemm_f32(const void* x, int64_t M, float* y, float beta, A16Path path) const { run(x, M, y, true, beta, path); }

void Nf4Linear::run(const void* x, int64_t M, void* y, bool f32, float beta, A16Path path) const {
  const Impl& m = *p_;
  if (M < 1) return;
  path = a16::resolve(path, M, m.N, m.K, 0, "NF4");
  const auto* xh = static_cast<const __half*>(x);
  auto* cw = reinterpret_cast<const uint4*>(m.codes.get());
  if (path != A16Path::dequant) {
    a16::run_tensor_cores(path, m.format(), m.B % 64 == 0, cw, xh, f32 ? nullptr : static_cast<__half*>(y), f32 ? static_cast<float*>(y) : nullptr, beta, M, m.N, m.K);
    return;
  }
  DeviceBuffer<__half> wf(size_t(m.N * m.K), "NF4 dequantized workspace");
  a16::run_dequant(m.format(), cw, wf.get(), m.N, m.K);
  const float one = 1.0f, b = f32 ? beta : 0.0f;
  PTQ_CUBLAS(cublasGemmEx(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(m.N), int(M), int(m.K), &one, wf.get(), CUDA_R_16F, int(m.K), xh,
                          CUDA_R_16F, int(m.K), &b, y, f32 ? CUDA_R_32F : CUDA_R_16F, int(m.N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace ptq::cuda
