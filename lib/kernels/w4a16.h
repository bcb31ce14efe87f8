// w4a16.h — the W4A16 / W8A16 GPU kernels for codes on a grid in 4- and 8-bit layouts: GPTQ's
// (1..8 bits), compressed-tensors' and GGUF's blocks (contract and layout in w4a16.cu). The
// references: ref_gemm_gptq (lib/kernels/reference.h), QuantizedLinear::dequantize.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "formats/packed.h"
#include "kernels/a16_path.h"
#include "kernels/relayout_cuda.h"

namespace ptq::cuda {

class W4A16Linear {
 public:
  // Converts the canonical GPTQ layout (v1/v2, sym or asym, act-order g_idx; 1..8 bits) at load
  // time. 4- and 8-bit codes run as stored; narrower ones (GPTQ's 2 and 3 bits) are held in the
  // 4-bit kernel's nibbles, 5..7 bits in the 8-bit kernel's bytes, with their zero points as they
  // are: the same (q - z) * s, so the same products. Refuses (Errc::usage, naming the field and
  // the reason) what a16_takes (kernels/a16_grid.h) refuses: other bit widths, in_features not a
  // multiple of 16, groups whose sizes share no multiple of 16, scales past f16's range. Groups of
  // unequal sizes (256 and 128) run as equal runs of their common divisor, each with its group's grid.
  static std::unique_ptr<W4A16Linear> from_gptq(const GptqPacked& p, bool v2);
  // The same from the quantizer's representation (codes of 1..8 bits, g_idx, scales and zero
  // points), and also grids with mins (w = s q + m: GGUF's Q4_1, Q5_1, Q4_K and Q5_K, in groups of
  // 16 columns or more), which run the kernels with s and m in f16 and s q + m by one f16 FMA.
  static std::unique_ptr<W4A16Linear> from_quantized(const QuantizedLinear& q);
  // The same, its codes given apart as stored (q.packed is not read): parts of q's rows in order,
  // each as QuantizedLinear::packed holds them or as GPTQ's qweight (StoredRows::by_column). They
  // go to the device as they are and are laid out there (kernels/relayout.cu): a loader's stacked
  // Linear (q, k, v) part by part, a GPTQ checkpoint's codes straight from the mapped file.
  static std::unique_ptr<W4A16Linear> from_quantized(const QuantizedLinear& q, const std::vector<StoredRows>& codes);
  ~W4A16Linear();
  // y [M, out] (f16, device) = x [M, in] (f16, device) · Wᵀ. Tensor cores, weights dequantized in
  // registers: mma.sync with x through L1 up to 32 rows; on sm_90 wgmma for 33..128 rows (and
  // 129..256 rows of layers larger than 4096², 17..32 rows of those at 4 bits); elsewhere x staged in shared memory for 33..64
  // rows of a large layer, and dequantize to an f16 workspace + cuBLAS above. path_for(M) says which.
  // Calls on one Linear are stream-ordered (the thread's current stream, cuda/runtime.h).
  void gemm(const void* x, int64_t M, void* y, A16Path path = A16Path::automatic) const;
  // y [M, out] (fp32, device) = x · Wᵀ + beta * y, fp32 accumulation, by the same paths (a
  // prefill, the evaluation forward: its M is a whole window, dequantize + cuBLAS).
  void gemm_f32(const void* x, int64_t M, float* y, float beta, A16Path path = A16Path::automatic) const;
  A16Path path_for(int64_t M) const;   // the kernel automatic picks for M rows
  // A second copy of the device buffers (benchmarks rotate through copies to keep L2 cold).
  std::unique_ptr<W4A16Linear> clone() const;
  int64_t out() const;
  int64_t in() const;
  size_t weight_bytes() const;   // bytes the kernel reads for W (codes + scales/offsets)
  int bits() const;              // the kernel's: 4 (W4A16) or 8 (W8A16)
  int code_bits() const;         // the checkpoint's: 1..8 (3 for a W3A16 model on the 4-bit kernel)
  bool has_min() const;          // a grid with mins (w = s q + m)
 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
  W4A16Linear();
  void run(const void* x, int64_t M, void* y, bool f32, float beta, A16Path path) const;
};

}  // namespace ptq::cuda
