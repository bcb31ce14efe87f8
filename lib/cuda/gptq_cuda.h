// gptq_cuda.h — Hessians and the GPTQ solve on the GPU (cuBLAS, cuSOLVER, one fused kernel per
// block of 128 columns). Same math as lib/gptq (CPU), which is its reference.
#pragma once
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/runtime.h"
#include "gptq/gptq.h"

namespace ptq::cuda {

// H = (2/n) sum x x^T on tensor cores: each chunk of <= 1024 tokens is cast to `dtype` (F16 or
// BF16: 16-bit x 16-bit products are exact in fp32; F32: SGEMM on CUDA cores) and multiplied with
// fp32 accumulation (upper triangle only, in 2048 x 2048 blocks); eight chunks are summed in fp32,
// then added to an fp64 sum on the device. Each add_device / add call is summed in groups of
// 8 x 1024 rows from its first row (the forward passes whole 8192-token chunks).
class HessianCuda {
 public:
  HessianCuda(int64_t cols, DType dtype);
  ~HessianCuda();
  void add(const MatF& X);                              // host rows [n, cols]
  void add_device(const void* X, int64_t rows);         // device rows [rows, cols] in `dtype`
  MatD finalize() const;                                // to the host, symmetric, scaled by 2/n
  double* device_sum();                                 // the fp64 sum on the device (not scaled)
  int64_t tokens() const { return n_; }
 private:
  struct Impl;
  Impl* p_;
  int64_t cols_, n_ = 0;
  DType dtype_;
};

// Whether the fused kernel serves this spec: groups must start at block boundaries (group_size
// divides 128), or be static, or be one per row.
bool gptq_supported(const QuantSpec& s, std::string* why);

// H on the host, or the fp64 sum of a HessianCuda (unscaled; scaled by 2/tokens here, read only).
QuantizedLinear gptq_quantize(const MatF& W, const MatD& H, const QuantSpec& s, SolveStats* stats = nullptr);
QuantizedLinear gptq_quantize_device(const MatF& W, const double* H_sum_device, int64_t tokens, const QuantSpec& s, SolveStats* stats = nullptr);

// Rows of W for a resident solve: from the host (fp32), or already on the device (F16, BF16 or
// F32; the 16-bit forms are widened exactly, so they must hold the model's weights exactly).
struct WeightRows {
  int64_t rows = 0;
  const MatF* host = nullptr;
  const void* device = nullptr;
  DType dtype = DType::F32;
};
// GPTQ's output error from its own column loop. With H_d = H + lambda I the damped Hessian the
// solve factors (H_d^-1 = U^T U) and err_j = (w_j - q_j) / U_jj the errors it propagates, the
// weights' error is e = err U, so e H_d e^T = err U (U^T U)^-1 U^T err^T = |err|^2 for each row,
// and the output error is e H e^T / 2 = (|err|^2 - lambda |e|^2) / 2 (dead columns: e = 0).
// err2[r] = |err_r|^2 and e2[r] = |e_r|^2 (live columns), fp64 sums of fp32 terms.
struct DampedLoss {
  std::vector<double> err2, e2;
  double lambda = 0;
  // (sum err2 - lambda sum e2) / 2 over rows [r0, r1); NaN when the damping term cancels more than
  // 90% of the sum (then the fp32 rounding of err is amplified past 1e-4: use the exact form).
  double loss(int64_t r0, int64_t r1) const;
};
// A solve whose weights stay on the device for what follows (the loss, the next forward stage).
struct ResidentSolve {
  std::vector<QuantizedLinear> parts;   // per part: codes packed on the device (QuantizedLinear::packed) and grids, natural column order
  DeviceBuffer<float> W, Wq, Wr; // [rows, cols] fp32: W as given, GPTQ's dequantized weights, RTN's (if asked)
  DampedLoss damped;             // GPTQ's output error by rows, from the column loop
};
// One GPTQ solve of the parts stacked by rows (q/k/v, or gate/up: the same Hessian and spec give
// each row the same result as solving the parts apart — GPTQ treats rows independently).
ResidentSolve gptq_quantize_resident(const std::vector<WeightRows>& parts, int64_t cols, const double* H_sum_device, int64_t tokens,
                                     const QuantSpec& s, bool with_rtn, SolveStats* stats = nullptr);

// words [rows, packed_words(n, bits)] = each row of codes [rows, n] packed as core/bits.h's
// pack_rows does on the host (device pointers; asynchronous).
void pack_rows_device(const uint8_t* codes, int64_t rows, int64_t n, int bits, uint32_t* words);

// Timings of the last gptq_quantize* call's phases, for benchmarks (seconds).
// pack: the codes bit-packed on the device and downloaded (resident solves); download: the rest of
// the results (natural order, grids, Wq, RTN).
struct GptqPhaseTimes { double prepare = 0, factorization = 0, potrf = 0, trtri = 0, column_loop = 0, pack = 0, download = 0; };
GptqPhaseTimes last_phase_times();

// Fills a device buffer with deterministic pseudo-random normal values (benchmarks).
void fill_random_normal(void* dst, DType dtype, int64_t n, uint64_t seed, float stddev);

}  // namespace ptq::cuda
