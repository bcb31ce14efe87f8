// w4a16.h — the W4A16 GPU kernel for GPTQ 4-bit weights (contract and layout in w4a16.cu) and
// its benchmark. The reference is ref_gemm_gptq (lib/kernels/reference.h).
#pragma once
#include <cstdint>
#include <memory>

#include "formats/packed.h"

namespace ptq::cuda {

class W4A16Linear {
 public:
  // Converts the canonical GPTQ layout (v1/v2, sym or asym, act-order g_idx) at load time.
  // Refuses (Errc::usage, naming the reason) bits != 4, in % 32, groups of a size not a multiple
  // of 32, or groups of unequal sizes.
  static std::unique_ptr<W4A16Linear> from_gptq(const GptqPacked& p, bool v2);
  ~W4A16Linear();
  // y [M, out] (f16, device) = x [M, in] (f16, device) · Wᵀ. M <= 4: the fused GEMV kernel; larger
  // M: dequantize to a 16-bit workspace and cuBLAS (correct, not fast).
  void gemm(const void* x, int64_t M, void* y) const;
  int64_t out() const;
  int64_t in() const;
  size_t weight_bytes() const;   // bytes the kernel reads for W (codes + scales/offsets)
 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
  W4A16Linear();
};

}  // namespace ptq::cuda
