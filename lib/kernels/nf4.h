// nf4.h — the NF4 GPU kernel for bitsandbytes NF4 weights (contract and layout in nf4.cu). The
// reference is ref_gemm_nf4 (lib/kernels/reference.h).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "formats/nf4.h"
#include "kernels/a16_path.h"
#include "kernels/relayout_cuda.h"

namespace ptq::cuda {

class Nf4Linear {
 public:
  // W [out, in] as bitsandbytes stores it (row-major flattening, two codes per byte, absmax per
  // block, nested or not). Refuses (Errc::usage) in_features not a multiple of the block size or
  // of 32, and block sizes other than 32, 64, 128 or 256.
  static std::unique_ptr<Nf4Linear> from_nf4(const Nf4Tensor& t, int64_t out, int64_t in);
  // The same, its codes given apart as stored (t.packed is not read): bitsandbytes' bytes of parts
  // of W's rows in order (a loader's stacked q, k, v, each part where the checkpoint maps it),
  // which go to the device as they are and are laid out there (kernels/relayout.cu).
  static std::unique_ptr<Nf4Linear> from_nf4(const Nf4Tensor& t, int64_t out, int64_t in, const std::vector<StoredRows>& codes);
  ~Nf4Linear();
  // y [M, out] f16 = x [M, in] f16 · Wᵀ (device). The paths of W4A16Linear (kernels/a16_path.h):
  // tensor cores up to 128 rows on sm_90 (256 on large layers; wgmma from 17 rows there), 64 elsewhere; dequantize to f16 +
  // cuBLAS above. path_for(M) says which. Calls on one Linear are stream-ordered (the thread's current stream, cuda/runtime.h).
  void gemm(const void* x, int64_t M, void* y, A16Path path = A16Path::automatic) const;
  // y [M, out] fp32 = x · Wᵀ + beta · y, fp32 accumulation, by the same paths.
  void gemm_f32(const void* x, int64_t M, float* y, float beta, A16Path path = A16Path::automatic) const;
  A16Path path_for(int64_t M) const;   // the kernel automatic picks for M rows
  // A second copy of the device buffers (benchmarks rotate through copies to keep L2 cold).
  std::unique_ptr<Nf4Linear> clone() const;
  int64_t out() const;
  int64_t in() const;
  size_t weight_bytes() const;   // codes + absmax bytes the kernel reads
 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
  Nf4Linear();
  void run(const void* x, int64_t M, void* y, bool f32, float beta, A16Path path) const;
};

}  // namespace ptq::cuda
